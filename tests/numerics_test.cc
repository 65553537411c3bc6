// Number formats against independent expectations: every code of every narrow format
// decoded from its field definition (ldexp in double), and float32 -> format rounding
// checked against a brute-force "nearest representable value, ties to even" search
// over the format's whole code space.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "mlakv/numerics.h"

namespace mlakv {
namespace {

// ---- decoding from the format definitions ------------------------------------------------
double e4m3_reference(int c) {  // bias 7, 3 mantissa bits, subnormals, S.1111.111 = NaN
  const int s = (c >> 7) & 1, e = (c >> 3) & 0xF, m = c & 7;
  if (e == 0xF && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

TEST(Numerics, AllE4m3CodesDecode) {
  int nan_codes = 0;
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3_reference(c);
    const float got = e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      ++nan_codes;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;
    }
  }
  EXPECT_EQ(nan_codes, 2);
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0.001953125f);
  EXPECT_EQ(e4m3_to_f32(0x08), 0.015625f);
}

TEST(Numerics, AllE2m1CodesDecode) {
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    const double want = (c & 8) ? -mags[c & 7] : mags[c & 7];
    EXPECT_EQ(static_cast<double>(e2m1_to_f32(static_cast<uint8_t>(c))), want) << "code " << c;
    // the upper nibble of the byte is ignored
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c | 0xA0)), e2m1_to_f32(static_cast<uint8_t>(c)));
  }
}

TEST(Numerics, AllBf16CodesDecode) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const int s = (c >> 15) & 1, e = (c >> 7) & 0xFF, m = c & 0x7F;
    const float got = bf16_to_f32(static_cast<uint16_t>(c));
    if (e == 0xFF) {
      if (m == 0) {
        EXPECT_TRUE(std::isinf(got)) << c;
      } else {
        EXPECT_TRUE(std::isnan(got)) << c;
      }
      continue;
    }
    const double mag = e == 0 ? std::ldexp(m / 128.0, -126) : std::ldexp(1.0 + m / 128.0, e - 127);
    ASSERT_EQ(static_cast<double>(got), s ? -mag : mag) << "code " << c;
  }
}

TEST(Numerics, AllF16CodesDecode) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const int s = (c >> 15) & 1, e = (c >> 10) & 0x1F, m = c & 0x3FF;
    const float got = f16_to_f32(static_cast<uint16_t>(c));
    ASSERT_EQ(std::signbit(got), s != 0) << "code " << c;
    if (e == 0x1F) {
      if (m == 0) {
        ASSERT_TRUE(std::isinf(got)) << c;
      } else {
        ASSERT_TRUE(std::isnan(got)) << c;
        // the payload moves to the top of float32's mantissa
        ASSERT_EQ(std::bit_cast<uint32_t>(got) & 0x7FFFFFu, static_cast<uint32_t>(m) << 13) << c;
      }
      continue;
    }
    const double mag = e == 0 ? std::ldexp(m / 1024.0, -14) : std::ldexp(1.0 + m / 1024.0, e - 15);
    ASSERT_EQ(static_cast<double>(got), s ? -mag : mag) << "code " << c;
  }
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
}

TEST(Numerics, AllUe8m0CodesDecode) {
  for (int c = 0; c < 255; ++c) {
    EXPECT_EQ(static_cast<double>(ue8m0_to_f32(static_cast<uint8_t>(c))), std::ldexp(1.0, c - 127)) << c;
  }
  EXPECT_TRUE(std::isnan(ue8m0_to_f32(0xFF)));
}

// ---- encoding against brute force -----------------------------------------------------------
// Nearest finite code by |x - v|, ties to the code with an even mantissa LSB. Returns
// the magnitude code; `max_code` bounds the search.
template <class Decode>
int nearest_code(double ax, int max_code, Decode decode) {
  int best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= max_code; ++c) {
    const double err = std::fabs(ax - decode(c));
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return best;
}

uint8_t e4m3_brute(float x, bool satfinite) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double ax = std::fabs(static_cast<double>(x));
  // Overflow: above 448 + half an ulp (the would-be next value is 480).
  if (ax > 464.0) return static_cast<uint8_t>(sign | (satfinite ? 0x7E : 0x7F));
  return static_cast<uint8_t>(sign | nearest_code(ax, 0x7E, [](int c) { return e4m3_reference(c); }));
}

uint8_t e2m1_brute(float x) {
  if (std::isnan(x)) return 0x7;
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  const double ax = std::fabs(static_cast<double>(x));
  if (ax > 6.0) return static_cast<uint8_t>(sign | 7);
  return static_cast<uint8_t>(sign | nearest_code(ax, 7, [&](int c) { return mags[c]; }));
}

std::vector<float> interesting_floats() {
  std::vector<float> v;
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 20000; ++i) v.push_back(std::bit_cast<float>(bits(rng)));
  std::uniform_real_distribution<float> uni(-500.0f, 500.0f);
  for (int i = 0; i < 20000; ++i) v.push_back(uni(rng));
  std::uniform_real_distribution<float> small(-0.02f, 0.02f);
  for (int i = 0; i < 20000; ++i) v.push_back(small(rng));
  std::uniform_real_distribution<float> fp4(-7.0f, 7.0f);
  for (int i = 0; i < 20000; ++i) v.push_back(fp4(rng));
  for (float f : {0.0f, -0.0f, 448.0f, 464.0f, 465.0f, 480.0f, 6.0f, 5.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f,
                  std::ldexp(1.0f, -10), std::ldexp(3.0f, -10), std::ldexp(1.0f, -9)}) {
    v.push_back(f);
    v.push_back(-f);
  }
  return v;
}

TEST(Numerics, E4m3RoundingMatchesBruteForce) {
  for (float x : interesting_floats()) {
    if (std::isinf(x)) continue;
    ASSERT_EQ(f32_to_e4m3(x, Saturation::kSatFinite), e4m3_brute(x, true)) << "x = " << x;
    ASSERT_EQ(f32_to_e4m3(x, Saturation::kNoSat), e4m3_brute(x, false)) << "x = " << x;
  }
}

TEST(Numerics, E2m1RoundingMatchesBruteForce) {
  for (float x : interesting_floats()) {
    if (std::isinf(x)) continue;
    ASSERT_EQ(f32_to_e2m1_satfinite(x), e2m1_brute(x)) << "x = " << x;
  }
}

TEST(Numerics, Bf16RoundingMatchesBruteForce) {
  for (float x : interesting_floats()) {
    if (std::isnan(x) || std::isinf(x)) continue;
    const uint16_t got = f32_to_bf16(x);
    // Candidates: truncation and its successor (in magnitude); nearest, ties to even.
    const uint16_t lo = static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16);
    const uint16_t hi = static_cast<uint16_t>(lo + 1);
    const double dx = x, dlo = bf16_to_f32(lo), dhi = bf16_to_f32(hi);
    const double elo = std::fabs(dx - dlo), ehi = std::fabs(dx - dhi);
    const uint16_t want = elo < ehi ? lo : ehi < elo ? hi : ((lo & 1) ? hi : lo);
    ASSERT_EQ(got, want) << "x = " << x;
  }
}

TEST(Numerics, RoundTripEveryCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(f32_to_e4m3_satfinite(e4m3_to_f32(static_cast<uint8_t>(c))), c) << c;
  }
  for (int c = 0; c < 16; ++c) EXPECT_EQ(f32_to_e2m1_satfinite(e2m1_to_f32(static_cast<uint8_t>(c))), c) << c;
  for (uint32_t c = 0; c < 65536; ++c) {
    if ((c & 0x7F80) == 0x7F80 && (c & 0x7F) != 0) continue;  // NaN payloads canonicalize
    ASSERT_EQ(f32_to_bf16(bf16_to_f32(static_cast<uint16_t>(c))), c) << c;
  }
  for (int c = 0; c < 255; ++c) {
    EXPECT_EQ(f32_to_ue8m0(ue8m0_to_f32(static_cast<uint8_t>(c)), Ue8m0Rounding::kTowardZero, Saturation::kNoSat), c);
    EXPECT_EQ(f32_to_ue8m0(ue8m0_to_f32(static_cast<uint8_t>(c)), Ue8m0Rounding::kUp, Saturation::kNoSat), c);
  }
}

TEST(Numerics, TiesGoToEven) {
  // e4m3 at scale 1: 1.0625 lies halfway between 1.0 (0x38) and 1.125 (0x39).
  EXPECT_EQ(f32_to_e4m3_satfinite(1.0625f), 0x38);
  EXPECT_EQ(f32_to_e4m3_satfinite(1.1875f), 0x3A);
  EXPECT_EQ(f32_to_e4m3_satfinite(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal
  EXPECT_EQ(f32_to_e4m3_satfinite(std::ldexp(3.0f, -10)), 0x02);  // 1.5 subnormal quanta -> 2
  EXPECT_EQ(f32_to_e4m3_satfinite(-std::ldexp(1.0f, -11)), 0x80); // underflow keeps the sign
  EXPECT_EQ(f32_to_e4m3_satfinite(464.0f), 0x7E);                   // tie 448|480 -> 448 (even)
  EXPECT_EQ(f32_to_e4m3(464.5f, Saturation::kNoSat), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-1000.0f, Saturation::kNoSat), 0xFF);
  EXPECT_EQ(f32_to_e4m3_satfinite(-1000.0f), 0xFE);
  // e2m1 thresholds 0.25 0.75 1.25 1.75 2.5 3.5 5 -> 0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0
  const float ties[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const uint8_t want[7] = {0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(f32_to_e2m1_satfinite(ties[i]), want[i]) << ties[i];
    EXPECT_EQ(f32_to_e2m1_satfinite(-ties[i]), want[i] | 8) << -ties[i];
  }
  // bf16: 1 + 2^-8 is halfway between 1.0 and 1 + 2^-7 -> 1.0; 1 + 3*2^-8 -> 1 + 2^-6.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
}

TEST(Numerics, NanAndInfPolicy) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_bf16(nan), kBf16NaN);
  EXPECT_EQ(f32_to_bf16(-nan), kBf16NaN);
  EXPECT_EQ(f32_to_bf16(inf), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-inf), 0xFF80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to Inf
  EXPECT_EQ(f32_to_e4m3_satfinite(nan), 0x7F);
  EXPECT_EQ(f32_to_e4m3_satfinite(inf), 0x7E);
  EXPECT_EQ(f32_to_e4m3_satfinite(-inf), 0xFE);
  EXPECT_EQ(f32_to_e4m3(inf, Saturation::kNoSat), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-inf, Saturation::kNoSat), 0xFF);
  EXPECT_EQ(f32_to_e2m1_satfinite(nan), 0x7);
  EXPECT_EQ(f32_to_e2m1_satfinite(-inf), 0xF);
  EXPECT_EQ(f32_to_ue8m0(nan, Ue8m0Rounding::kUp, Saturation::kSatFinite), 0xFF);
  EXPECT_EQ(f32_to_ue8m0(inf, Ue8m0Rounding::kUp, Saturation::kSatFinite), 0xFE);
  EXPECT_EQ(f32_to_ue8m0(inf, Ue8m0Rounding::kTowardZero, Saturation::kNoSat), 0xFF);
}

TEST(Numerics, Ue8m0Rounding) {
  EXPECT_EQ(f32_to_ue8m0(1.0f, Ue8m0Rounding::kTowardZero, Saturation::kSatFinite), 127);
  EXPECT_EQ(f32_to_ue8m0(1.5f, Ue8m0Rounding::kTowardZero, Saturation::kSatFinite), 127);
  EXPECT_EQ(f32_to_ue8m0(1.5f, Ue8m0Rounding::kUp, Saturation::kSatFinite), 128);
  EXPECT_EQ(f32_to_ue8m0(-3.0f, Ue8m0Rounding::kUp, Saturation::kSatFinite), 129);  // sign ignored
  EXPECT_EQ(f32_to_ue8m0(0.0f, Ue8m0Rounding::kUp, Saturation::kSatFinite), 0);
  // Ceil is the smallest power of two >= |x|, for random x.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> lg(-120, 120);
  for (int i = 0; i < 10000; ++i) {
    const float x = static_cast<float>(std::exp2(lg(rng)));
    const int up = f32_to_ue8m0(x, Ue8m0Rounding::kUp, Saturation::kSatFinite);
    const int dn = f32_to_ue8m0(x, Ue8m0Rounding::kTowardZero, Saturation::kSatFinite);
    EXPECT_GE(std::ldexp(1.0, up - 127), x);
    EXPECT_LT(std::ldexp(1.0, up - 128), x);
    EXPECT_LE(std::ldexp(1.0, dn - 127), x);
    EXPECT_GT(std::ldexp(1.0, dn - 126), x);
  }
}

}  // namespace
}  // namespace mlakv
