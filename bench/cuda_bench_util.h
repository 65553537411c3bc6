// Shared by the CUDA benchmark binaries: fail-fast checks (a benchmark has no one to
// hand a Status to, so it prints "error: ..." and exits non-zero) and the L2 flush size.
// CHECK_CUDA is the benchmarks' one CUDA check: frontends include only public headers,
// so they cannot use the library's src/cuda/common/status.h.
#pragma once

#include <cuda_runtime.h>
#include <curand.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <string>
#include <vector>

#include "mlakv/cuda.h"
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

// Fills slots [0, tokens) of a device cache layer with records of random N(0, 1)
// latents and rope, through mlakv's own CUDA writer, 64K tokens at a time, on `stream`.
inline void fill_random_records(const CacheLayerView& view, int64_t tokens, curandGenerator_t gen,
                                cudaStream_t stream) {
  const int64_t chunk = 65536;
  float *lat = nullptr, *rope = nullptr;
  int64_t* slots = nullptr;
  CHECK_CUDA(cudaMalloc(&lat, static_cast<std::size_t>(chunk * kLatentDim) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&rope, static_cast<std::size_t>(chunk * kRopeDim) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&slots, static_cast<std::size_t>(chunk) * sizeof(int64_t)));
  curandSetStream(gen, stream);
  std::vector<int64_t> hs(static_cast<std::size_t>(chunk));
  for (int64_t start = 0; start < tokens; start += chunk) {
    const int64_t n = std::min(chunk, tokens - start);
    for (int64_t i = 0; i < n; ++i) hs[static_cast<std::size_t>(i)] = start + i;
    CHECK_CUDA(cudaMemcpyAsync(slots, hs.data(), static_cast<std::size_t>(n) * sizeof(int64_t), cudaMemcpyHostToDevice,
                               stream));
    curandGenerateNormal(gen, lat, static_cast<std::size_t>(chunk * kLatentDim), 0.0f, 1.0f);
    curandGenerateNormal(gen, rope, static_cast<std::size_t>(chunk * kRopeDim), 0.0f, 1.0f);
    check(cuda::write_cache(view, TensorView::contiguous(slots, DType::kI64, {n}, view.device),
                            TensorView::contiguous(lat, DType::kF32, {n, kLatentDim}, view.device),
                            TensorView::contiguous(rope, DType::kF32, {n, kRopeDim}, view.device), Fp8ScaleMode::kPow2,
                            stream),
          "write_cache");
    CHECK_CUDA(cudaStreamSynchronize(stream));  // hs is reused by the next chunk
  }
  cudaFree(lat);
  cudaFree(rope);
  cudaFree(slots);
}

}  // namespace mlakv::bench
