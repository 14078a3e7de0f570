# Included by the top-level CMakeLists.txt when scikit-build-core configures the
# project (pip install ., of the source tree or the source package), before
# the options: finds the torch of the Python that builds the wheel, with the
# arguments scripts/torch_cmake_args.sh --package gives (torch's CMake prefix,
# its variant, the CUDA backend on for a CUDA torch only; for a CUDA torch,
# what its CUDA config needs besides).
if(NOT Python_EXECUTABLE)
  message(FATAL_ERROR "pins: scikit-build-core gave no Python_EXECUTABLE; cannot find the torch to build against")
endif()
execute_process(
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/../scripts/torch_cmake_args.sh ${Python_EXECUTABLE} --package
  OUTPUT_VARIABLE _pins_torch_args ERROR_VARIABLE _pins_torch_error RESULT_VARIABLE _pins_torch_rc)
if(NOT _pins_torch_rc EQUAL 0)
  message(FATAL_ERROR
    "pins: the wheel builds against the torch of the installing Python (${Python_EXECUTABLE}), which cannot "
    "import torch:\n${_pins_torch_error}\nInstall torch there first, then build without isolation: "
    "pip install --no-build-isolation <this source tree or torch_pins-${PROJECT_VERSION}.tar.gz>")
endif()
string(REPLACE "\n" ";" _pins_torch_args "${_pins_torch_args}")
foreach(_pins_arg IN LISTS _pins_torch_args)
  if(_pins_arg MATCHES "^-DCMAKE_PREFIX_PATH=(.*)$")
    set(_pins_torch_prefix "${CMAKE_MATCH_1}")
    list(PREPEND CMAKE_PREFIX_PATH "${_pins_torch_prefix}")
  elseif(_pins_arg MATCHES "^-D([A-Za-z0-9_]+)=(.*)$")
    set(${CMAKE_MATCH_1} "${CMAKE_MATCH_2}" CACHE STRING "from scripts/torch_cmake_args.sh" FORCE)
  endif()
endforeach()
# A persistent build-dir (-C build-dir=...) keeps torch's cached paths: refuse one
# configured for another torch rather than link against it.
if(Torch_DIR AND NOT Torch_DIR STREQUAL "${_pins_torch_prefix}/Torch")
  message(FATAL_ERROR
    "pins: this build tree (${CMAKE_BINARY_DIR}) was configured for the torch at ${Torch_DIR}, but the "
    "installing Python's torch is at ${_pins_torch_prefix}/Torch: use another build-dir or remove this one")
endif()
