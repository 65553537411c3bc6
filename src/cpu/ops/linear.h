// Dense float32 linear algebra for the CPU model code, every product accumulated in
// float64 and rounded once: what the MLA layer (src/model/mla_layer.cc) and tensor
// parallelism (src/parallel/tp.cc) multiply with. Internal: callers validate shapes,
// dtypes and sizes first; nothing here checks or fails.
#pragma once

#include <cstdint>
#include <functional>

namespace mlakv {

class ThreadPool;

namespace cpu {

// fn(i) for every i in [0, n): on `pool` when there is one and n > 1, else in order on
// the calling thread.
void parallel_items(ThreadPool* pool, int64_t n, const std::function<void(int64_t)>& fn);

// sum_k a[k] b[k] in float64 (four partial sums, then (s0 + s1) + (s2 + s3)).
template <class A, class B>
double dot_f64(const A* a, const B* b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    s0 += static_cast<double>(a[k]) * static_cast<double>(b[k]);
    s1 += static_cast<double>(a[k + 1]) * static_cast<double>(b[k + 1]);
    s2 += static_cast<double>(a[k + 2]) * static_cast<double>(b[k + 2]);
    s3 += static_cast<double>(a[k + 3]) * static_cast<double>(b[k + 3]);
  }
  for (; k < n; ++k) s0 += static_cast<double>(a[k]) * static_cast<double>(b[k]);
  return (s0 + s1) + (s2 + s3);
}

// nn.Linear: y[t, n] = sum_k W[n, k] x[t, k] + bias[n].
//   W [N, K] row-major, bias [N] or nullptr, x [T, K] (row stride xs), y [T, N] (row
//   stride ys). Threads take blocks of output rows, so each weight row is read once
//   per call.
void linear(const float* W, const float* bias, int64_t N, int64_t K, const float* x, int64_t xs, int64_t T, float* y,
            int64_t ys, ThreadPool* pool);

// y[n] = sum_k x[k] W[k, n]: x [K], W [K, N] row-major; acc [N] is float64 scratch.
void vecmat(const float* x, const float* W, int64_t K, int64_t N, double* acc, float* y);

// The MLA output stage, out = o_proj . concat_h(o_lat[h] @ W_UV[h]) + bias
// (REFERENCE.md section 1): one float64 accumulation per output element (the per-head
// W_UV products stay float64, not rounded to float32 in between), plus bias, rounded
// once. The CPU layer (mla_layer_output) and tp_output_partial (a rank's heads, no
// bias) both run it.
//   o_lat  [T, H, L] f32 row-major   attention output per head
//   w_uv   [H, L, V] f32 row-major   absorbed W_UV
//   o_proj [D, H*V]  f32 row-major   nn.Linear weight
//   bias   [D] f32, or nullptr
//   out    [T, D] f32 row-major (may not alias the inputs)
void mla_output_projection(const float* o_lat, const float* w_uv, const float* o_proj, const float* bias, int64_t T,
                           int64_t H, int64_t L, int64_t V, int64_t D, float* out, ThreadPool* pool);

}  // namespace cpu
}  // namespace mlakv
