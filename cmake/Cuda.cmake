# MLAKV_CUDA = AUTO | ON | OFF. AUTO enables the backend when a CUDA compiler is found.
# MLAKV_CUDA_ARCHS: the CUDA architectures the backend is built for (a CMake
# CUDA_ARCHITECTURES list). Default "90a;80": sm_90a (Hopper, where an sm90 path with
# wgmma/TMA can live) and sm_80 (Ampere and later, the portable sm80 path).
# An explicit -DCMAKE_CUDA_ARCHITECTURES=... wins over it.
set(MLAKV_CUDA_ARCHS "90a;80" CACHE STRING "CUDA architectures of the CUDA backend (feeds CMAKE_CUDA_ARCHITECTURES)")
set(MLAKV_CUDA_ENABLED OFF)
if(NOT MLAKV_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(_mlakv_nvcc nvcc HINTS ENV CUDA_PATH /usr/local/cuda/bin)
    if(_mlakv_nvcc)
      set(CMAKE_CUDA_COMPILER "${_mlakv_nvcc}" CACHE FILEPATH "CUDA compiler")
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(MLAKV_CUDA_ENABLED ON)
  elseif(MLAKV_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MLAKV_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()

if(MLAKV_CUDA_ENABLED)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES ${MLAKV_CUDA_ARCHS})
  elseif(NOT "${CMAKE_CUDA_ARCHITECTURES}" STREQUAL "${MLAKV_CUDA_ARCHS}")
    message(STATUS "mlakv: CMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES} given; MLAKV_CUDA_ARCHS not used")
  endif()
  enable_language(CUDA)
  # CMake 3.25 does not know nvcc's C++20 flag; teach it (nvcc >= 12 accepts -std=c++20).
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
endif()

# mlakv_cuda_arch_only_sources(<target> <arch> <sources...>): sources that only one
# architecture can run (e.g. the sm90 path's wgmma/TMA kernels: <arch> = 90a) compile for
# that architecture alone, as an object library linked into <target>, and only when
# <arch> is in the target's architecture list; <target> then gets the definition
# MLAKV_CUDA_HAVE_ARCH_<arch>=1 so that its path table (cuda/api/attention_path.cc)
# offers the path only when it was built.
function(mlakv_cuda_arch_only_sources target arch)
  if(NOT "${arch}" IN_LIST CMAKE_CUDA_ARCHITECTURES)
    message(STATUS "mlakv: ${arch} is not in CMAKE_CUDA_ARCHITECTURES (${CMAKE_CUDA_ARCHITECTURES}); "
                   "${target} is built without its ${arch}-only sources")
    return()
  endif()
  set(objects ${target}_arch_${arch})
  add_library(${objects} OBJECT ${ARGN})
  set_target_properties(${objects} PROPERTIES CUDA_ARCHITECTURES ${arch} POSITION_INDEPENDENT_CODE ON)
  target_include_directories(${objects} PRIVATE $<TARGET_PROPERTY:${target},INCLUDE_DIRECTORIES>)
  target_link_libraries(${objects} PRIVATE mlakv fmt::fmt CUDA::cudart_static)  # host .cc files include cuda_runtime.h
  target_compile_options(${objects} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
  target_sources(${target} PRIVATE $<TARGET_OBJECTS:${objects}>)
  target_compile_definitions(${target} PRIVATE MLAKV_CUDA_HAVE_ARCH_${arch}=1)
endfunction()
