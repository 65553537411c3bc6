// src/cpu/ops/linear.h against float64 formulas written here: nn.Linear and the MLA
// output stage (o_proj . concat_h o_lat[h] @ W_UV[h] + bias), including token counts
// that cross the output stage's internal chunk, with and without a thread pool.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/ops/linear.h"
#include "mlakv/rng.h"
#include "mlakv/thread_pool.h"

namespace mlakv {
namespace {

constexpr double kU = 0x1p-24;  // float32 unit roundoff

std::vector<float> normals(std::size_t n, uint64_t seed) {
  SplitMix64 g(seed);
  std::vector<float> v(n);
  for (float& x : v) x = g.normal();
  return v;
}

// Each output is one float64 sum rounded once: |got - exact| <= u |exact| plus the float64
// summation-order difference, below 2^-40 of the sum of |terms|.
void expect_rounded_once(float got, double exact, double abs_terms, const char* what, int64_t t, int64_t n) {
  EXPECT_LE(std::fabs(static_cast<double>(got) - exact), kU * std::fabs(exact) + 0x1p-40 * abs_terms)
      << what << " t " << t << " n " << n;
}

TEST(CpuOps, OutputProjectionIsTheFormulaRoundedOnce) {
  const int64_t H = 3, L = 5, V = 4, D = 7;
  ThreadPool pool(2);
  for (int64_t T : {int64_t{1}, int64_t{300}}) {  // 300 crosses the 256-token chunk
    for (bool with_bias : {false, true}) {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        const std::vector<float> o_lat = normals(static_cast<std::size_t>(T * H * L), 1);
        const std::vector<float> w_uv = normals(static_cast<std::size_t>(H * L * V), 2);
        const std::vector<float> o_proj = normals(static_cast<std::size_t>(D * H * V), 3);
        const std::vector<float> bias = normals(static_cast<std::size_t>(D), 4);
        std::vector<float> out(static_cast<std::size_t>(T * D), NAN);
        cpu::mla_output_projection(o_lat.data(), w_uv.data(), o_proj.data(), with_bias ? bias.data() : nullptr, T, H,
                                   L, V, D, out.data(), p);
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t n = 0; n < D; ++n) {
            double exact = with_bias ? bias[static_cast<std::size_t>(n)] : 0.0;
            double abs_terms = std::fabs(exact);
            for (int64_t h = 0; h < H; ++h) {
              for (int64_t v = 0; v < V; ++v) {
                const double wo = o_proj[static_cast<std::size_t>(n * H * V + h * V + v)];
                for (int64_t l = 0; l < L; ++l) {
                  const double term = wo * o_lat[static_cast<std::size_t>((t * H + h) * L + l)] *
                                      w_uv[static_cast<std::size_t>((h * L + l) * V + v)];
                  exact += term;
                  abs_terms += std::fabs(term);
                }
              }
            }
            expect_rounded_once(out[static_cast<std::size_t>(t * D + n)], exact, abs_terms, "output", t, n);
          }
        }
      }
    }
  }
}

TEST(CpuOps, LinearIsTheFormulaRoundedOnceWithStridedRows) {
  const int64_t N = 37, K = 9, T = 3, xs = K + 2, ys = N + 1;  // 37 rows: a partial 16-row block
  ThreadPool pool(2);
  const std::vector<float> W = normals(static_cast<std::size_t>(N * K), 5);
  const std::vector<float> b = normals(static_cast<std::size_t>(N), 6);
  const std::vector<float> x = normals(static_cast<std::size_t>(T * xs), 7);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    std::vector<float> y(static_cast<std::size_t>(T * ys), -7.0f);
    cpu::linear(W.data(), b.data(), N, K, x.data(), xs, T, y.data(), ys, p);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t n = 0; n < N; ++n) {
        double exact = b[static_cast<std::size_t>(n)], abs_terms = std::fabs(exact);
        for (int64_t k = 0; k < K; ++k) {
          const double term = double{W[static_cast<std::size_t>(n * K + k)]} * x[static_cast<std::size_t>(t * xs + k)];
          exact += term;
          abs_terms += std::fabs(term);
        }
        expect_rounded_once(y[static_cast<std::size_t>(t * ys + n)], exact, abs_terms, "linear", t, n);
      }
      EXPECT_EQ(y[static_cast<std::size_t>(t * ys + N)], -7.0f) << "the row gap is not written";
    }
  }
}

}  // namespace
}  // namespace mlakv
