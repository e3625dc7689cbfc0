# Detects CUDA without requiring it. Sets MPSIM_HAVE_CUDA and says loudly what
# was found and what is skipped.
set(MPSIM_HAVE_CUDA OFF)
if(NOT MPSIM_ENABLE_CUDA)
  message(STATUS "mpsim: CUDA disabled (MPSIM_ENABLE_CUDA=OFF): gpu/ is skipped")
  return()
endif()
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(STATUS "mpsim: no CUDA compiler found: gpu/ is skipped; everything else builds and tests on the CPU")
  return()
endif()
# sm_90 is H100/H200; override with -DCMAKE_CUDA_ARCHITECTURES=...
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures")
endif()
enable_language(CUDA)
# CMake 3.25 predates nvcc's C++20 support (nvcc 12+): give it the flag, so
# that CUDA sources get the project's C++20 like the C++ sources.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
find_package(CUDAToolkit)
if(CUDAToolkit_FOUND)
  set(MPSIM_HAVE_CUDA ON)
  message(STATUS "mpsim: CUDA ${CMAKE_CUDA_COMPILER_VERSION} at ${CMAKE_CUDA_COMPILER}, "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES}, cuBLAS ${CUDAToolkit_VERSION}: gpu/ is built")
else()
  message(STATUS "mpsim: nvcc found but no CUDA toolkit libraries: gpu/ is skipped")
endif()
