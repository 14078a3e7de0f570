# Cross-compiling the torch-free core and its tests for 64-bit Windows with
# mingw-w64 (Debian g++-mingw-w64-x86-64-posix), as scripts/check_windows.sh
# does:  cmake -S . -B build-win -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64.cmake
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(_pins_mingw x86_64-w64-mingw32)
# The posix-threads variant: GCC 12's libstdc++ has std::thread and std::mutex
# only there (the win32 variant has them from GCC 13).
set(CMAKE_C_COMPILER ${_pins_mingw}-gcc-posix)
set(CMAKE_CXX_COMPILER ${_pins_mingw}-g++-posix)
set(CMAKE_RC_COMPILER ${_pins_mingw}-windres)
# Libraries and packages from the mingw-w64 tree only, never the host's.
set(CMAKE_FIND_ROOT_PATH /usr/${_pins_mingw})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# The C++ runtime and winpthreads linked in: an .exe runs (under wine, or on
# Windows) without the mingw DLLs beside it.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")
# The test programs run under wine, not on the build machine: ctest lists
# their tests when it runs, not the build (scripts/check_windows.sh runs them
# itself).
set(CMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE PRE_TEST)
