#include "cpu/output_projection.h"

#include <algorithm>
#include <cstddef>
#include <functional>
#include <vector>

#include "mlakv/thread_pool.h"

namespace mlakv {
namespace {

void for_each(ThreadPool* pool, int64_t n, const std::function<void(int64_t)>& fn) {
  if (pool == nullptr || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  pool->parallel_for(n, [&](int64_t i, int) { fn(i); });
}

// Tokens per pass: bounds the float64 intermediate at kChunk * H * V doubles (32 MiB for
// H*V = 16384) while each o_proj row is still read once per kChunk tokens.
constexpr int64_t kChunk = 256;
// Output rows per work item: a block of o_proj rows against every token of the pass.
constexpr int64_t kRows = 16;

}  // namespace

void mla_output_projection(const float* o_lat, const float* w_uv, const float* o_proj, const float* bias, int64_t T,
                           int64_t H, int64_t L, int64_t V, int64_t D, float* out, ThreadPool* pool) {
  const int64_t HV = H * V;
  std::vector<double> z(static_cast<std::size_t>(std::min(T, kChunk) * HV));
  for (int64_t t0 = 0; t0 < T; t0 += kChunk) {
    const int64_t nt = std::min(kChunk, T - t0);
    // z[t, h*V + v] = sum_l o_lat[t, h, l] W_UV[h, l, v]
    for_each(pool, nt * H, [&](int64_t item) {
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
    for_each(pool, (D + kRows - 1) / kRows, [&](int64_t blk) {
      const int64_t n1 = std::min(D, (blk + 1) * kRows);
      for (int64_t n = blk * kRows; n < n1; ++n) {
        const float* w = o_proj + n * HV;
        const double b = bias == nullptr ? 0.0 : static_cast<double>(bias[n]);
        for (int64_t t = 0; t < nt; ++t) {
          const double* zr = z.data() + t * HV;
          double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
          int64_t k = 0;
          for (; k + 4 <= HV; k += 4) {
            s0 += static_cast<double>(w[k]) * zr[k];
            s1 += static_cast<double>(w[k + 1]) * zr[k + 1];
            s2 += static_cast<double>(w[k + 2]) * zr[k + 2];
            s3 += static_cast<double>(w[k + 3]) * zr[k + 3];
          }
          for (; k < HV; ++k) s0 += static_cast<double>(w[k]) * zr[k];
          out[(t0 + t) * D + n] = static_cast<float>((s0 + s1) + (s2 + s3) + b);
        }
      }
    });
  }
}

}  // namespace mlakv
