// float32 -> bf16 / e4m3 / e2m1 / ue8m0 must agree bit for bit with NVIDIA's
// host-callable conversions in the CUDA toolkit headers (an independent oracle):
// over every bf16 value (as float32, both signs) plus a dense float32 sweep of 2^12
// consecutive floats around every rounding threshold of each format.
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "mlakv/numerics.h"

namespace mlakv {
namespace {

uint16_t nv_bf16(float x) {
  const __nv_bfloat16 b = __float2bfloat16(x);
  return std::bit_cast<__nv_bfloat16_raw>(b).x;
}
uint8_t nv_e4m3(float x, Saturation s) {
  return __nv_cvt_float_to_fp8(x, s == Saturation::kSatFinite ? __NV_SATFINITE : __NV_NOSAT, __NV_E4M3);
}
uint8_t nv_e2m1(float x) { return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest); }
uint8_t nv_ue8m0(float x, Ue8m0Rounding r, Saturation s) {
  return __nv_cvt_float_to_e8m0(x, s == Saturation::kSatFinite ? __NV_SATFINITE : __NV_NOSAT,
                                r == Ue8m0Rounding::kUp ? cudaRoundPosInf : cudaRoundZero);
}

// Every bf16 value as a float, then 2^12 consecutive floats centred on each threshold.
std::vector<float> sweep(const std::vector<double>& thresholds) {
  std::vector<float> v;
  v.reserve(65536 + thresholds.size() * 2 * 4096);
  for (uint32_t c = 0; c < 65536; ++c) v.push_back(std::bit_cast<float>(c << 16));
  for (double t : thresholds) {
    const uint32_t centre = std::bit_cast<uint32_t>(static_cast<float>(t));
    for (int64_t d = -2048; d < 2048; ++d) {
      const int64_t b = static_cast<int64_t>(centre) + d;
      if (b < 0 || b >= 0x7F800000) continue;
      const float f = std::bit_cast<float>(static_cast<uint32_t>(b));
      v.push_back(f);
      v.push_back(-f);
    }
  }
  return v;
}

// Midpoints between consecutive representable magnitudes (the rounding thresholds),
// the values themselves, and the overflow threshold.
template <class Decode>
std::vector<double> thresholds_of(int max_code, Decode decode, double overflow) {
  std::vector<double> t;
  for (int c = 0; c <= max_code; ++c) {
    t.push_back(decode(c));
    if (c < max_code) t.push_back(0.5 * (decode(c) + decode(c + 1)));
  }
  t.push_back(overflow);
  return t;
}

TEST(NumericsOracle, Bf16) {
  std::vector<double> t;
  for (int e = -133; e <= 127; ++e) {  // midpoints at every binade, subnormals included
    t.push_back(std::ldexp(1.0 + 1.0 / 256, e));
    t.push_back(std::ldexp(1.0 + 3.0 / 256, e));
    t.push_back(std::ldexp(2.0 - 1.0 / 256, e));
  }
  std::size_t n = 0;
  for (float x : sweep(t)) {
    ASSERT_EQ(f32_to_bf16(x), nv_bf16(x)) << "x = " << x << " bits " << std::bit_cast<uint32_t>(x);
    ++n;
  }
  for (float x : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::max()}) {
    EXPECT_EQ(f32_to_bf16(x), nv_bf16(x)) << x;
  }
  EXPECT_GT(n, 65536u);
}

TEST(NumericsOracle, E4m3) {
  const auto t = thresholds_of(0x7E, [](int c) { return static_cast<double>(e4m3_to_f32(static_cast<uint8_t>(c))); },
                               464.0);
  std::vector<float> xs = sweep(t);
  xs.push_back(std::numeric_limits<float>::infinity());
  xs.push_back(-std::numeric_limits<float>::infinity());
  xs.push_back(std::numeric_limits<float>::quiet_NaN());
  xs.push_back(-std::numeric_limits<float>::quiet_NaN());
  for (float x : xs) {
    for (Saturation s : {Saturation::kSatFinite, Saturation::kNoSat}) {
      ASSERT_EQ(f32_to_e4m3(x, s), nv_e4m3(x, s))
          << "x = " << x << " bits " << std::bit_cast<uint32_t>(x) << " sat " << (s == Saturation::kSatFinite);
    }
  }
}

TEST(NumericsOracle, E2m1) {
  const auto t = thresholds_of(7, [](int c) { return static_cast<double>(e2m1_to_f32(static_cast<uint8_t>(c))); },
                               6.0);
  std::vector<float> xs = sweep(t);
  xs.push_back(std::numeric_limits<float>::infinity());
  xs.push_back(-std::numeric_limits<float>::infinity());
  xs.push_back(std::numeric_limits<float>::quiet_NaN());
  for (float x : xs) {
    ASSERT_EQ(f32_to_e2m1_satfinite(x), nv_e2m1(x) & 0xF) << "x = " << x << " bits " << std::bit_cast<uint32_t>(x);
  }
}

TEST(NumericsOracle, Ue8m0) {
  std::vector<double> t;
  for (int e = -149; e <= 127; ++e) t.push_back(std::ldexp(1.0, e));  // every power of two
  t.push_back(std::numeric_limits<float>::max());
  std::vector<float> xs = sweep(t);
  xs.push_back(std::numeric_limits<float>::infinity());
  xs.push_back(-std::numeric_limits<float>::infinity());
  xs.push_back(std::numeric_limits<float>::quiet_NaN());
  xs.push_back(0.0f);
  xs.push_back(-0.0f);
  for (float x : xs) {
    for (Ue8m0Rounding r : {Ue8m0Rounding::kTowardZero, Ue8m0Rounding::kUp}) {
      for (Saturation s : {Saturation::kSatFinite, Saturation::kNoSat}) {
        ASSERT_EQ(f32_to_ue8m0(x, r, s), nv_ue8m0(x, r, s))
            << "x = " << x << " bits " << std::bit_cast<uint32_t>(x) << " up " << (r == Ue8m0Rounding::kUp)
            << " sat " << (s == Saturation::kSatFinite);
      }
    }
  }
}

}  // namespace
}  // namespace mlakv
