# Third-party dependencies, all from Debian packages (scripts/install-deps.sh installs them).
find_package(fmt CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(hwy CONFIG REQUIRED)
find_package(Threads REQUIRED)
# PCRE2 (libpcre2-dev), 8-bit library, for the tokenizer's pre-tokenizer regexes
# (Unicode classes). Found by path rather than pkg-config so a private prefix
# (CMAKE_PREFIX_PATH, tools/gpu_check.sh's unpacked .debs) works too.
find_path(MLAKV_PCRE2_INCLUDE_DIR pcre2.h)
find_library(MLAKV_PCRE2_LIBRARY NAMES pcre2-8)
if(NOT MLAKV_PCRE2_INCLUDE_DIR OR NOT MLAKV_PCRE2_LIBRARY)
  message(FATAL_ERROR "PCRE2 not found (pcre2.h, libpcre2-8): install libpcre2-dev (scripts/install-deps.sh)")
endif()
add_library(mlakv_pcre2 INTERFACE IMPORTED)
set_target_properties(mlakv_pcre2 PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${MLAKV_PCRE2_INCLUDE_DIR}"
  INTERFACE_LINK_LIBRARIES "${MLAKV_PCRE2_LIBRARY}")
if(MLAKV_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()
if(MLAKV_BUILD_BENCH)
  find_package(benchmark CONFIG REQUIRED)
endif()

# NVIDIA's host-callable fp8/fp4/bf16 conversions are the independent oracle of the
# number-format tests; they are header-only, so the toolkit's include dir is enough.
find_path(MLAKV_CUDA_FP_HEADERS_DIR cuda_fp8.h
  HINTS ENV CUDA_PATH /usr/local/cuda
  PATH_SUFFIXES include targets/x86_64-linux/include)
if(MLAKV_CUDA_FP_HEADERS_DIR AND EXISTS "${MLAKV_CUDA_FP_HEADERS_DIR}/cuda_fp4.h")
  set(MLAKV_HAVE_CUDA_FP_HEADERS ON)
else()
  set(MLAKV_HAVE_CUDA_FP_HEADERS OFF)
endif()
