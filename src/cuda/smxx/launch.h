// Launchers of the architecture-neutral kernels (smxx/: sm_80 and later, built for
// every CUDA architecture in the list). Each takes its params struct (params/) and a
// stream (a cudaStream_t as void*), and returns the launch's cudaError_t as an int
// (0 = success); an empty problem launches nothing and returns 0.
#pragma once

#include "cuda/params/attention.h"
#include "cuda/params/cache_writer.h"
#include "cuda/params/merge.h"
#include "cuda/params/ops.h"
#include "mlakv/formats.h"

namespace mlakv::cuda::kernels {

// smxx/combine.cu: one CTA per row, 128 threads (4 columns each) per group of splits
// (1 to 4 groups); p.programmatic launches it as a programmatic dependent (sm_90+).
int launch_combine(const CombineParams& p, void* stream);
// smxx/merge_attn_states.cu: one CTA per row.
int launch_merge(const MergeParams& p, void* stream);
// smxx/cache_writer.cu: one warp per token; the format picks the kernel.
int launch_write_cache(KvFormat format, const WriterParams& p, void* stream);

// smxx/ops/.
int launch_rmsnorm(const RmsNormParams& p, void* stream);
int launch_add_bias(const AddBiasParams& p, void* stream);
int launch_rope(const RopeParams& p, void* stream);

// Positional spellings of the two above, as the GPU layer calls them.
inline int launch_rmsnorm(const float* x, int64_t x_stride, int n, const float* w, float eps, float* y,
                          int64_t y_stride, int64_t rows, void* stream) {
  return launch_rmsnorm(RmsNormParams{x, x_stride, n, w, eps, y, y_stride, rows}, stream);
}
inline int launch_add_bias(float* x, int64_t stride, const float* b, int n, int64_t rows, void* stream) {
  return launch_add_bias(AddBiasParams{x, stride, b, n, rows}, stream);
}

}  // namespace mlakv::cuda::kernels
