# The one place the version of pins is written: CMakeLists.txt reads it for
# project(VERSION), the wheel's metadata for its version, the package for __version__.
__version__ = "0.1.0"
