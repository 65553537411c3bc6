// The MLA output stage on the CPU: out = o_proj . concat_h(o_lat[h] @ W_UV[h]) + bias
// (REFERENCE.md section 1; mla_layer.h). One home for the math that the CPU layer
// (mla_layer_output) and tensor parallelism (tp_output_partial: a rank's heads, no bias)
// both run. Internal: callers validate shapes, dtypes and sizes first.
#pragma once

#include <cstdint>

namespace mlakv {

class ThreadPool;

// Every output element is one float64 accumulation of o_lat * W_UV * o_proj (the
// per-head products stay float64, they are not rounded to float32 in between), plus
// bias, rounded once to float32.
//   o_lat  [T, H, L] f32 row-major   attention output per head
//   w_uv   [H, L, V] f32 row-major   absorbed W_UV
//   o_proj [D, H*V]  f32 row-major   nn.Linear weight
//   bias   [D] f32, or nullptr
//   out    [T, D] f32 row-major (may not alias the inputs)
// pool may be null (then the calling thread does everything).
void mla_output_projection(const float* o_lat, const float* w_uv, const float* o_proj, const float* bias, int64_t T,
                           int64_t H, int64_t L, int64_t V, int64_t D, float* out, ThreadPool* pool);

}  // namespace mlakv
