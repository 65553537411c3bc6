#include "cpu/ops/linear.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "mlakv/thread_pool.h"

namespace mlakv::cpu {
namespace {

// Output rows per work item of linear / the output projection.
constexpr int64_t kRows = 16;
// Tokens per pass of the output projection: bounds its float64 intermediate at
// kChunk * H * V doubles (32 MiB for H*V = 16384) while each o_proj row is still read
// once per kChunk tokens.
constexpr int64_t kChunk = 256;

}  // namespace

void parallel_items(ThreadPool* pool, int64_t n, const std::function<void(int64_t)>& fn) {
  if (pool == nullptr || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  pool->parallel_for(n, [&](int64_t i, int) { fn(i); });
}

void linear(const float* W, const float* bias, int64_t N, int64_t K, const float* x, int64_t xs, int64_t T, float* y,
            int64_t ys, ThreadPool* pool) {
  parallel_items(pool, (N + kRows - 1) / kRows, [&](int64_t blk) {
    const int64_t n1 = std::min(N, (blk + 1) * kRows);
    for (int64_t n = blk * kRows; n < n1; ++n) {
      const float* w = W + n * K;
      const double b = bias == nullptr ? 0.0 : static_cast<double>(bias[n]);
      for (int64_t t = 0; t < T; ++t) y[t * ys + n] = static_cast<float>(dot_f64(w, x + t * xs, K) + b);
    }
  });
}

void vecmat(const float* x, const float* W, int64_t K, int64_t N, double* acc, float* y) {
  std::fill(acc, acc + N, 0.0);
  for (int64_t k = 0; k < K; ++k) {
    const double xk = x[k];
    const float* w = W + k * N;
    for (int64_t n = 0; n < N; ++n) acc[n] += xk * w[n];
  }
  for (int64_t n = 0; n < N; ++n) y[n] = static_cast<float>(acc[n]);
}

void mla_output_projection(const float* o_lat, const float* w_uv, const float* o_proj, const float* bias, int64_t T,
                           int64_t H, int64_t L, int64_t V, int64_t D, float* out, ThreadPool* pool) {
  const int64_t HV = H * V;
  std::vector<double> z(static_cast<std::size_t>(std::min(T, kChunk) * HV));
  for (int64_t t0 = 0; t0 < T; t0 += kChunk) {
    const int64_t nt = std::min(kChunk, T - t0);
    // z[t, h*V + v] = sum_l o_lat[t, h, l] W_UV[h, l, v]
    parallel_items(pool, nt * H, [&](int64_t item) {
      const int64_t t = item / H, h = item % H;
      const float* x = o_lat + ((t0 + t) * H + h) * L;
      const float* w = w_uv + h * L * V;
      double* zr = z.data() + t * HV + h * V;
      std::fill(zr, zr + V, 0.0);
      for (int64_t l = 0; l < L; ++l) {
        const double xl = x[l];
        const float* wl = w + l * V;
        for (int64_t v = 0; v < V; ++v) zr[v] += xl * wl[v];
      }
    });
    // out[t, n] = sum_k o_proj[n, k] z[t, k] + bias[n]
    parallel_items(pool, (D + kRows - 1) / kRows, [&](int64_t blk) {
      const int64_t n1 = std::min(D, (blk + 1) * kRows);
      for (int64_t n = blk * kRows; n < n1; ++n) {
        const double b = bias == nullptr ? 0.0 : static_cast<double>(bias[n]);
        for (int64_t t = 0; t < nt; ++t) {
          out[(t0 + t) * D + n] = static_cast<float>(dot_f64(o_proj + n * HV, z.data() + t * HV, HV) + b);
        }
      }
    });
  }
}

}  // namespace mlakv::cpu
