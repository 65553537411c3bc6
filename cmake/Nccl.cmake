# MLAKV_NCCL = AUTO | ON | OFF. The NCCL communicator and the device DCP combine
# (library mlakv_nccl, src/parallel) need the CUDA backend and NCCL's header and library.
# AUTO builds them when both are found; NCCL_ROOT / NCCL_HOME point at a non-standard install.
set(MLAKV_NCCL AUTO CACHE STRING "Build the NCCL communicator (mlakv_nccl): AUTO (when CUDA and NCCL are found), ON or OFF")
set_property(CACHE MLAKV_NCCL PROPERTY STRINGS AUTO ON OFF)

set(MLAKV_NCCL_ENABLED OFF)
if(NOT MLAKV_NCCL STREQUAL "OFF")
  if(MLAKV_CUDA_ENABLED)
    find_path(MLAKV_NCCL_INCLUDE_DIR nccl.h
      HINTS ${NCCL_ROOT} ENV NCCL_ROOT ENV NCCL_HOME ${CUDAToolkit_INCLUDE_DIRS}
      PATHS /usr/include /usr/local/include /usr/local/cuda/include
      PATH_SUFFIXES include)
    find_library(MLAKV_NCCL_LIBRARY nccl
      HINTS ${NCCL_ROOT} ENV NCCL_ROOT ENV NCCL_HOME ${CUDAToolkit_LIBRARY_DIR}
      PATHS /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib /usr/local/cuda/lib64
      PATH_SUFFIXES lib lib64)
    if(MLAKV_NCCL_INCLUDE_DIR AND MLAKV_NCCL_LIBRARY)
      file(STRINGS "${MLAKV_NCCL_INCLUDE_DIR}/nccl.h" _mlakv_nccl_version REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
      string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*" "\\1.\\2.\\3"
             MLAKV_NCCL_VERSION "${_mlakv_nccl_version}")
      # ncclCommInitRankConfig and ncclGetLastError need NCCL >= 2.14.
      if(MLAKV_NCCL_VERSION VERSION_LESS 2.14)
        message(STATUS "mlakv: NCCL ${MLAKV_NCCL_VERSION} at ${MLAKV_NCCL_LIBRARY} is older than 2.14; not used")
      else()
        add_library(mlakv_nccl_lib UNKNOWN IMPORTED)
        set_target_properties(mlakv_nccl_lib PROPERTIES
          IMPORTED_LOCATION "${MLAKV_NCCL_LIBRARY}"
          INTERFACE_INCLUDE_DIRECTORIES "${MLAKV_NCCL_INCLUDE_DIR}")
        set(MLAKV_NCCL_ENABLED ON)
      endif()
    endif()
  endif()
  if(NOT MLAKV_NCCL_ENABLED AND MLAKV_NCCL STREQUAL "ON")
    message(FATAL_ERROR "MLAKV_NCCL=ON needs the CUDA backend (MLAKV_CUDA ${MLAKV_CUDA_ENABLED}) and NCCL >= 2.14 "
                        "(nccl.h: ${MLAKV_NCCL_INCLUDE_DIR}, libnccl: ${MLAKV_NCCL_LIBRARY}); set NCCL_ROOT")
  endif()
endif()
if(MLAKV_NCCL_ENABLED)
  message(STATUS "mlakv: NCCL ${MLAKV_NCCL_VERSION} (${MLAKV_NCCL_LIBRARY}): building mlakv_nccl")
else()
  message(STATUS "mlakv: NCCL communicator off (MLAKV_NCCL ${MLAKV_NCCL})")
endif()
