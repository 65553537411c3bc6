// Shared by the CUDA benchmark binaries: fail-fast checks (a benchmark has no one to
// hand a Status to, so it prints "error: ..." and exits non-zero) and the L2 flush size.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "mlakv/status.h"

#define CHECK_CUDA(x)                                                                                 \
  do {                                                                                                \
    cudaError_t e_ = (x);                                                                             \
    if (e_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "error: %s: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

namespace mlakv::bench {

inline void check(const Status& st, const std::string& what) {
  if (!st.ok()) {
    std::fprintf(stderr, "error: %s: %s\n", what.c_str(), st.to_string().c_str());
    std::exit(1);
  }
}

// Bytes memset between timed repetitions: several times the H100/H200's 50-60 MiB L2.
inline constexpr std::size_t kFlushBytes = std::size_t{512} << 20;

}  // namespace mlakv::bench
