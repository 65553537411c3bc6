// The runner's SIMD matrix products (src/model/linear.h) against a float64 reference.
//
// Bound (derived): any float32 summation of K products, in any order and with fused or
// separate multiply-adds, is within gamma_K * sum_k |x_k w_k| of the exact sum,
// gamma_K = K u / (1 - K u), u = 2^-24 (Higham, Accuracy and Stability, 3.1). The
// weights widen exactly from bf16/f16/f32, so the float64 product of the widened values
// is exact to far below that bound. Every tail case (K and N not multiples of the
// vector width, 1..4-token remainders, odd row counts) and both threaded and single-
// threaded runs are covered; the threaded result must equal the single-threaded one bit
// for bit (threads split rows, not sums).
#include "model/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "mlakv/model.h"
#include "mlakv/numerics.h"
#include "mlakv/thread_pool.h"

namespace mlakv::model {
namespace {

uint16_t f32_to_f16_bits(float f) {  // round to nearest even (test data only: |f| < 8)
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int e = static_cast<int>((u >> 23) & 0xFF) - 127 + 15;
  uint32_t m = u & 0x7FFFFFu;
  if (e <= 0) {  // subnormal f16
    if (e < -10) return static_cast<uint16_t>(sign);
    m |= 0x800000u;
    const int shift = 14 - e;
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = (static_cast<uint32_t>(e) << 10) | (m >> 13);
  const uint32_t rem = m & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) ++r;
  return static_cast<uint16_t>(sign | r);
}

struct Weights {
  DType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  std::vector<float> widened;  // the exact values the kernel sees
  WeightMatrix matrix(int64_t rows, int64_t cols, int64_t ld) const {
    return WeightMatrix{dtype == DType::kF32 ? static_cast<const void*>(f32.data()) : u16.data(), dtype, rows, cols, ld};
  }
};

Weights make_weights(DType dt, int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Weights w{dt, {}, {}, {}};
  w.widened.resize(static_cast<std::size_t>(n));
  if (dt == DType::kF32) w.f32.resize(static_cast<std::size_t>(n));
  else w.u16.resize(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float v = nd(rng);
    if (dt == DType::kF32) {
      w.f32[static_cast<std::size_t>(i)] = v;
    } else if (dt == DType::kBF16) {
      w.u16[static_cast<std::size_t>(i)] = f32_to_bf16(v);
    } else {
      w.u16[static_cast<std::size_t>(i)] = f32_to_f16_bits(v);
    }
  }
  const WeightMatrix m = w.matrix(1, n, n);
  for (int64_t i = 0; i < n; ++i) w.widened[static_cast<std::size_t>(i)] = m.at(0, i);
  return w;
}

TEST(ModelLinear, MatmulNtWithinFloat32SummationBound) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  ThreadPool pool(2);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t K : {1, 7, 16, 33, 64, 127, 515}) {
      for (int64_t N : {1, 3, 4, 9, 37}) {
        for (int64_t T : {1, 2, 3, 4, 5, 11}) {
          const int64_t ld = K + 3;  // a row stride past cols
          const Weights w = make_weights(dt, N * ld, rng);
          std::vector<float> x(static_cast<std::size_t>(T * (K + 1)));
          for (float& v : x) v = nd(rng);
          std::vector<float> y(static_cast<std::size_t>(T * (N + 2))), y1(y.size());
          const WeightMatrix W = w.matrix(N, K, ld);
          matmul_nt(x.data(), T, K + 1, W, y.data(), N + 2, &pool);
          matmul_nt(x.data(), T, K + 1, W, y1.data(), N + 2, nullptr);
          const double gamma = K * std::ldexp(1.0, -24) / (1 - K * std::ldexp(1.0, -24));
          for (int64_t t = 0; t < T; ++t) {
            for (int64_t n = 0; n < N; ++n) {
              double exact = 0, mag = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double p = static_cast<double>(x[static_cast<std::size_t>(t * (K + 1) + k)]) *
                                 w.widened[static_cast<std::size_t>(n * ld + k)];
                exact += p;
                mag += std::fabs(p);
              }
              const float got = y[static_cast<std::size_t>(t * (N + 2) + n)];
              ASSERT_LE(std::fabs(got - exact), gamma * mag)
                  << dtype_name(dt) << " K " << K << " N " << N << " T " << T << " [" << t << ", " << n << "]";
              ASSERT_EQ(got, y1[static_cast<std::size_t>(t * (N + 2) + n)]) << "threaded != single-threaded";
            }
          }
        }
      }
    }
  }
}

TEST(ModelLinear, MatmulNnWithinFloat32SummationBound) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t K : {1, 5, 16, 64}) {
      for (int64_t N : {1, 7, 16, 17, 64, 100, 512}) {
        for (int64_t T : {1, 3, 4, 6}) {
          const int64_t ld = N + 5;
          const Weights b = make_weights(dt, K * ld, rng);
          std::vector<float> x(static_cast<std::size_t>(T * K));
          for (float& v : x) v = nd(rng);
          std::vector<float> y(static_cast<std::size_t>(T * N));
          matmul_nn(x.data(), T, K, b.matrix(K, N, ld), y.data(), N);
          const double gamma = K * std::ldexp(1.0, -24) / (1 - K * std::ldexp(1.0, -24));
          for (int64_t t = 0; t < T; ++t) {
            for (int64_t n = 0; n < N; ++n) {
              double exact = 0, mag = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double p = static_cast<double>(x[static_cast<std::size_t>(t * K + k)]) *
                                 b.widened[static_cast<std::size_t>(k * ld + n)];
                exact += p;
                mag += std::fabs(p);
              }
              ASSERT_LE(std::fabs(y[static_cast<std::size_t>(t * N + n)] - exact), gamma * mag)
                  << dtype_name(dt) << " K " << K << " N " << N << " T " << T;
            }
          }
        }
      }
    }
  }
}

// f16 widening is exact for every one of the 63488 finite codes (the scalar tail and
// the SIMD path must agree with the bit-level definition).
TEST(ModelLinear, F16AndBf16WideningExhaustive) {
  std::vector<uint16_t> codes;
  for (uint32_t c = 0; c < 65536; ++c) {
    if (((c >> 10) & 0x1F) != 0x1F) codes.push_back(static_cast<uint16_t>(c));  // finite f16
  }
  const int64_t n = static_cast<int64_t>(codes.size());
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const WeightMatrix W{codes.data(), dt, n, 1, 1};  // one column: y[n] = 1 * W[n]
    const float one = 1.0f;
    std::vector<float> y(static_cast<std::size_t>(n));
    matmul_nt(&one, 1, 1, W, y.data(), n, nullptr);
    const WeightMatrix B{codes.data(), dt, 1, n, n};  // matmul_nn: y = 1 * row
    std::vector<float> y2(static_cast<std::size_t>(n));
    matmul_nn(&one, 1, 1, B, y2.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t c = codes[static_cast<std::size_t>(i)];
      float want;
      if (dt == DType::kBF16) {
        want = bf16_to_f32(c);
        if (std::isnan(want)) continue;
      } else {
        const int e = (c >> 10) & 0x1F, m = c & 0x3FF;
        want = static_cast<float>((e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25)) * ((c & 0x8000) ? -1 : 1));
      }
      ASSERT_EQ(y[static_cast<std::size_t>(i)], want) << dtype_name(dt) << " code " << c;
      ASSERT_EQ(y2[static_cast<std::size_t>(i)], want) << dtype_name(dt) << " code " << c;
    }
  }
}

// The public, validated entry point computes the same bits and names bad arguments.
TEST(ModelLinear, PublicLinearCpu) {
  std::mt19937 rng(3);
  const Weights w = make_weights(DType::kBF16, 7 * 40, rng);
  std::vector<float> x(3 * 40, 0.5f), y(3 * 7), y2(3 * 7);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) * 0.1f - 0.6f;
  const TensorView W = TensorView::contiguous(w.u16.data(), DType::kBF16, {7, 40});
  ASSERT_TRUE(linear_cpu(TensorView::contiguous(x.data(), DType::kF32, {3, 40}), W,
                         TensorView::contiguous(y.data(), DType::kF32, {3, 7}))
                  .ok());
  matmul_nt(x.data(), 3, 40, w.matrix(7, 40, 40), y2.data(), 7, nullptr);
  EXPECT_EQ(y, y2);
  Status st = linear_cpu(TensorView::contiguous(x.data(), DType::kF32, {3, 39}), W,
                         TensorView::contiguous(y.data(), DType::kF32, {3, 7}));
  EXPECT_NE(st.message().find("x"), std::string::npos) << st.message();
  st = linear_cpu(TensorView::contiguous(x.data(), DType::kF32, {3, 40}), W,
                  TensorView::contiguous(y.data(), DType::kF32, {3, 6}));
  EXPECT_NE(st.message().find("y"), std::string::npos) << st.message();
  st = linear_cpu(TensorView::contiguous(x.data(), DType::kF32, {3, 40}),
                  TensorView::contiguous(w.u16.data(), DType::kI16, {7, 40}),
                  TensorView::contiguous(y.data(), DType::kF32, {3, 7}));
  EXPECT_NE(st.message().find("w"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace mlakv::model
