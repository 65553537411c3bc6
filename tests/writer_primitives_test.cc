// The CUDA writers' fast element primitives (format/record_codec.h, "the writers' fast
// element primitives") against the scalar codec they must equal, on the host: the same
// formulas the device runs (the hardware e4m3 / bf16 conversions are checked on the device
// by cuda_harness's WriterPrimitivesEqualTheScalarCodec). The expectations are the scalar
// functions (f32_to_e2m1_satfinite, IEEE division, encode_nvfp4_latent, fp8_quantize).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "format/record_codec.h"

namespace mlakv {
namespace {

float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// Every float32 with one of the 2^12 top bit patterns' low bits swept densely around each
// e2m1 threshold and value, plus every bf16 value.
TEST(WriterPrimitives, E2m1MagnitudeCodeIsTheScalarRounding) {
  std::vector<float> xs;
  for (uint32_t c = 0; c < 65536; ++c) xs.push_back(from_bits(c << 16));
  for (double t : {0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0}) {
    const uint32_t centre = std::bit_cast<uint32_t>(static_cast<float>(t));
    for (int64_t d = -4096; d <= 4096; ++d) {
      const int64_t b = static_cast<int64_t>(centre) + d;
      if (b >= 0 && b < 0x7F800000) xs.push_back(from_bits(static_cast<uint32_t>(b)));
    }
  }
  for (uint32_t u = 0; u < 0x7F800000u; u += 4093) xs.push_back(from_bits(u));  // every binade, subnormals too
  xs.push_back(std::numeric_limits<float>::infinity());
  for (float x : xs) {
    if (std::isnan(x)) continue;  // NaN inputs are not specified on the device
    for (float v : {x, -x}) {
      const uint32_t got = codec::e2m1_code(std::fabs(v), v);
      ASSERT_EQ(got, f32_to_e2m1_satfinite(v)) << v << " (bits " << std::hex << std::bit_cast<uint32_t>(v) << ")";
    }
  }
}

// The floating-point e2m1 code of the writers' fast path for 0 <= q < 7: every 5th float32
// of [0, 7) (every binade, subnormals too) and every float within 4096 ulps of each e2m1
// value and threshold. cuda_harness checks every float32 of [0, 7) on the device.
TEST(WriterPrimitives, E2m1CodeBelowSevenIsTheScalarRounding) {
  auto check = [](uint32_t u) {
    const float q = from_bits(u);
    const uint32_t got = std::bit_cast<uint32_t>(codec::e2m1_code_below7_f(q)) - 0x4B000000u;
    ASSERT_EQ(got, static_cast<uint32_t>(f32_to_e2m1_satfinite(q))) << q << " (bits " << std::hex << u << ")";
  };
  const uint32_t seven = std::bit_cast<uint32_t>(7.0f);
  for (uint32_t u = 0; u < seven; u += 5) check(u);
  for (double t : {0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0}) {
    const uint32_t centre = std::bit_cast<uint32_t>(static_cast<float>(t));
    for (uint32_t u = centre - 4096; u <= centre + 4096 && u < seven; ++u) check(u);
  }
  for (uint32_t u = seven - 4096; u < seven; ++u) check(u);
}

// Division through RN(1/b): every e4m3 divisor (the nvfp4 group scales) against dividends
// over two whole binades (the sequence commutes with scaling by powers of two away from
// under/overflow), every 61st float of the relevant range, and random divisors in the
// reciprocal path's range with random dividends.
TEST(WriterPrimitives, DivisionByTheReciprocalIsTheIeeeQuotient) {
  for (int c = 1; c <= kE4m3MaxCode; ++c) {
    const float b = e4m3_to_f32(static_cast<uint8_t>(c));
    const float rb = codec::reciprocal_rn(b);
    for (uint32_t u = 0x3F800000u; u < 0x40800000u; u += 37) {  // [1, 4), every 37th
      const float a = from_bits(u);
      ASSERT_EQ(std::bit_cast<uint32_t>(codec::div_rn_by_reciprocal(a, b, rb)), std::bit_cast<uint32_t>(a / b))
          << a << " / " << b;
    }
    for (uint32_t u = 0x39800000u; u < 0x7E000000u; u += 61 * 4099) {  // [2^-12, 2^125)
      const float a = from_bits(u);
      if (!(a / b < 1.32922800e+36f)) continue;
      ASSERT_EQ(std::bit_cast<uint32_t>(codec::div_rn_by_e4m3(a, b, rb)), std::bit_cast<uint32_t>(a / b))
          << a << " / " << b;
    }
  }
  // div_rn_by_e4m3's proof by exhaustion: the 8 mantissas of e4m3 values x every float in
  // [1, 4) (two binades: dividend mantissas below and above the divisor's).
  for (int m = 0; m < 8; ++m) {
    const float b = 1.0f + static_cast<float>(m) / 8.0f, rb = codec::reciprocal_rn(b);
    uint64_t bad = 0;
    for (uint32_t u = 0x3F800000u; u < 0x40800000u; ++u) {
      const float a = from_bits(u);
      bad += std::bit_cast<uint32_t>(codec::div_rn_by_e4m3(a, b, rb)) != std::bit_cast<uint32_t>(a / b);
    }
    ASSERT_EQ(bad, 0u) << "divisor " << b;
    for (uint32_t u = 0x39800000u; u < 0x7E000000u; u += 61 * 4099) {  // [2^-12, 2^125)
      const float a = from_bits(u);
      if (!(a / b < 1.32922800e+36f)) continue;  // quotients up to 2^120 (nvfp4_group_fast's)
      ASSERT_EQ(std::bit_cast<uint32_t>(codec::div_rn_by_reciprocal(a, b, rb)), std::bit_cast<uint32_t>(a / b))
          << a << " / " << b;
    }
  }
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> mant(0, 0x7FFFFF);
  std::uniform_int_distribution<int> exp_b(-60, 99), exp_a(-100, 20);
  for (int k = 0; k < 2000000; ++k) {
    const float b = std::ldexp(from_bits(0x3F800000u | mant(rng)), exp_b(rng));
    const float a = std::ldexp(from_bits(0x3F800000u | mant(rng)), exp_a(rng) + std::ilogb(b));
    const float rb = codec::reciprocal_rn(b);
    if (!(a >= 7.88860905e-31f)) continue;  // 2^-100: below it only tiny quotients are promised
    if (codec::div_path(b, a, rb) != codec::DivPath::kReciprocal) continue;
    const float want = a / b;
    if (!(std::fabs(want) >= std::numeric_limits<float>::min())) continue;  // subnormal quotients: only tiny
    ASSERT_EQ(std::bit_cast<uint32_t>(codec::div_rn_by_reciprocal(a, b, rb)), std::bit_cast<uint32_t>(want))
        << a << " / " << b;
  }
}

// Latent values that land on e2m1 ties and their neighbours after both divisions, group
// amaxes around e4m3's subnormal / normal / saturation edges, signed zeros, tiny and huge
// groups, at divisors on every path (powers of two, the reciprocal path, the IEEE path).
std::vector<float> adversarial_latent(std::mt19937& rng, float s) {
  std::vector<float> lat(kLatentDim);
  std::uniform_int_distribution<int> pick(0, 9), nb(-2, 2);
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 0.5f, 3.0f};
  std::normal_distribution<float> nd;
  for (int g = 0; g < 32; ++g) {
    float* x = lat.data() + 16 * g;
    const int kind = g % 8;
    // The group's scale: the e4m3 value its amax maps to, chosen first.
    const float sf = e4m3_to_f32(static_cast<uint8_t>(1 + (g * 37) % kE4m3MaxCode));
    for (int i = 0; i < 16; ++i) {
      float v;
      if (kind == 0) {
        v = 0.0f;  // a zero group
      } else if (kind == 1) {
        v = (i % 2 ? -0.0f : 1e-38f * static_cast<float>(i));  // tiny
      } else if (kind == 2) {
        v = nd(rng) * 1e30f;  // huge (overflow on small divisors)
      } else {
        // y / sf on a tie (or a neighbour), with the group's max at 6 sf.
        const float t = i == 0 ? 6.0f : ties[pick(rng)];
        v = t * sf * s;
        v = from_bits(std::bit_cast<uint32_t>(v) + static_cast<uint32_t>(nb(rng)));
        if (kind >= 6) v = nd(rng) * sf * s * 2.0f;
        if (i % 3 == 1) v = -v;
      }
      x[i] = v;
    }
  }
  return lat;
}

TEST(WriterPrimitives, Nvfp4GroupsAreTheScalarCodecs) {
  namespace N = layout::nvfp4_ds_mla;
  std::mt19937 rng(21);
  const float divisors[] = {1.0f, 0.5f, 0.3f, 7.44e-6f, 37.0f, 1e-20f, 1e-35f, 3e-38f, 1e35f, 1.5e30f, 9e-19f, 1.0f / 2688.0f};
  for (float s : divisors) {
    for (int rep = 0; rep < 200; ++rep) {
      const std::vector<float> lat = adversarial_latent(rng, s);
      uint8_t want[N::kRecordBytes] = {};
      codec::encode_nvfp4_latent(lat.data(), s, want);
      for (int g = 0; g < 32; ++g) {
        uint32_t w[2];
        const uint8_t sf = codec::nvfp4_group_fast(lat.data() + 16 * g, s, w);
        ASSERT_EQ(sf, want[N::kScaleOffset + g]) << "s " << s << " group " << g;
        for (int b = 0; b < 8; ++b) {
          ASSERT_EQ(static_cast<uint8_t>(w[b / 4] >> (8 * (b % 4))), want[N::kLatentOffset + 8 * g + b])
              << "s " << s << " group " << g << " byte " << b;
        }
      }
    }
  }
}

// The writers' nvfp4 fast path (nvfp4_fast_mode, nvfp4_fast_applies, nvfp4_group_codes_fast)
// against encode_nvfp4_latent wherever it applies, for divisors of both kinds (powers of two
// inside and outside [2^-64, 2^64], the reciprocal path's range and both its ends, s_t-like
// divisors) on the adversarial latents; and that it does apply to ordinary groups.
TEST(WriterPrimitives, Nvfp4FastPathIsTheScalarCodecWhereItApplies) {
  namespace N = layout::nvfp4_ds_mla;
  std::mt19937 rng(37);
  std::normal_distribution<float> nd;
  const float divisors[] = {1.0f,    0.5f,     0x1p-64f, 0x1p64f, 0x1p-65f, 0x1p65f, 0x1p90f,  0x1p-70f, 0.3f,
                            7.44e-6f, 37.0f,   9e-19f,   1.2e30f, 1e-20f,   1e35f,   1.0f / 2688.0f, 0.7f};
  int applied = 0;
  for (float s : divisors) {
    const float rs = codec::reciprocal_rn(s);
    const codec::Nvfp4Fast mode = codec::nvfp4_fast_mode(s);
    for (int rep = 0; rep < 300; ++rep) {
      std::vector<float> lat = adversarial_latent(rng, s);
      if (rep % 3 == 0) {
        for (float& v : lat) v = nd(rng) * s * (rep % 2 ? 3.0f : 0.01f);  // ordinary groups
      }
      uint8_t want[N::kRecordBytes] = {};
      codec::encode_nvfp4_latent(lat.data(), s, want);
      for (int g = 0; g < 32; ++g) {
        const float* x = lat.data() + 16 * g;
        float amax = 0.0f;
        for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[i]));
        if (mode == codec::Nvfp4Fast::kNone) break;
        const float amax_y = codec::nvfp4_fast_amax_y(mode, amax, s, rs);
        const uint8_t sf_code = codec::nvfp4_group_scale_code_fast(amax_y);
        if (!codec::nvfp4_fast_applies(mode, sf_code, amax_y, amax, rs)) continue;
        ++applied;
        const float sf = e4m3_to_f32(sf_code), rsf = codec::reciprocal_rn(sf);
        uint32_t w[2];
        if (mode == codec::Nvfp4Fast::kPow2) {
          codec::nvfp4_group_codes_fast(mode, x, s, rs, sf * s, rsf * rs, w);
        } else {
          codec::nvfp4_group_codes_fast(mode, x, s, rs, sf, rsf, w);
        }
        ASSERT_EQ(sf_code, want[N::kScaleOffset + g]) << "s " << s << " group " << g;
        for (int b = 0; b < 8; ++b) {
          ASSERT_EQ(static_cast<uint8_t>(w[b / 4] >> (8 * (b % 4))), want[N::kLatentOffset + 8 * g + b])
              << "s " << s << " group " << g << " byte " << b;
        }
      }
    }
  }
  EXPECT_GT(applied, 50000);  // of 163,200 groups (a quarter of them on divisors without a fast path)
  // The modes: powers of two in [2^-64, 2^64], then the reciprocal range, then none.
  EXPECT_EQ(codec::nvfp4_fast_mode(0x1p-64f), codec::Nvfp4Fast::kPow2);
  EXPECT_EQ(codec::nvfp4_fast_mode(0x1p64f), codec::Nvfp4Fast::kPow2);
  EXPECT_EQ(codec::nvfp4_fast_mode(0x1p65f), codec::Nvfp4Fast::kReciprocal);
  EXPECT_EQ(codec::nvfp4_fast_mode(0x1p-65f), codec::Nvfp4Fast::kNone);
  EXPECT_EQ(codec::nvfp4_fast_mode(0.3f), codec::Nvfp4Fast::kReciprocal);
  EXPECT_EQ(codec::nvfp4_fast_mode(1e-20f), codec::Nvfp4Fast::kNone);
  EXPECT_EQ(codec::nvfp4_fast_mode(1e35f), codec::Nvfp4Fast::kNone);
}

// The scale search's screened path (record_codec.h, "the nvfp4 scale search's screened
// path"): its per-element magic number M rounds every candidate's quotient onto the e2m1 grid.
// For every RN code c0 in [9, 0x7E], each candidate c0 - 1, c0, c0 + 1, and |y| from 2^-12 sf_c0
// to 6.4 sf_c0 (the quotients the fast path sees: every 4099th float32, and every float within
// 64 ulps of each candidate's e2m1 midpoints and values times sf and of the magic's two
// thresholds): the codes path (div_rn_by_e4m3, RN(q + M) capped at 2^24 + 6, code k + 2 log2 P)
// is f32_to_e2m1_satfinite of the IEEE quotient exactly, and the screen's grid value (RN(|y|
// RN(1/sf) + M) - M, capped at 6) is the spec's e2m1 value, or its neighbour across a midpoint
// mu with | |y| - mu sf | <= 2^-24 |y|. (Run over every float32 of those ranges once: 4.35e10
// grid values, 1,240 such neighbours, no other difference; the codes path: no difference.)
TEST(WriterPrimitives, ScaleSearchMagicRoundsOntoTheE2m1Grid) {
  static const float kGrid[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  int64_t checked = 0, neighbours = 0;
  for (uint32_t c0 = codec::kNvfp4SearchMinCode; c0 <= 0x7Eu; ++c0) {
    const float sf0 = e4m3_to_f32(static_cast<uint8_t>(c0));
    const float k0 = codec::mul_rn(codec::reciprocal_rn(sf0), codec::kNvfp4SearchMagicScale);
    const uint32_t lo = std::bit_cast<uint32_t>(sf0 * 0x1p-12f), hi = std::bit_cast<uint32_t>(6.4f * sf0);
    std::vector<uint32_t> as;
    for (uint32_t b = lo; b <= hi; b += 4099) as.push_back(b);
    auto around = [&](float centre) {
      const uint32_t cb = std::bit_cast<uint32_t>(centre);
      for (int d = -64; d <= 64; ++d) {
        const uint32_t b = cb + static_cast<uint32_t>(d);
        if (b >= lo && b <= hi) as.push_back(b);
      }
    };
    around(0x1p23f / k0);
    around(0x1p24f / k0);
    for (uint32_t c = c0 - 1; c <= std::min(c0 + 1, 0x7Eu); ++c) {
      const float sf = e4m3_to_f32(static_cast<uint8_t>(c));
      for (float v : {0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f, 7.0f}) around(v * sf);
    }
    for (uint32_t c = c0 - 1; c <= std::min(c0 + 1, 0x7Eu); ++c) {
      const float sf = e4m3_to_f32(static_cast<uint8_t>(c)), rsf = codec::reciprocal_rn(sf);
      for (uint32_t b : as) {
        const float a = from_bits(b);
        const float m = codec::nvfp4_search_magic(a, k0);
        const uint32_t want = f32_to_e2m1_satfinite(a / sf) & 7u;
        // the codes path
        const float t = codec::fmin_nonnan(codec::add_rn(codec::div_rn_by_e4m3(a, sf, rsf), m), 16777222.0f);
        const uint32_t code = (std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(m)) +
                              2 * ((std::bit_cast<uint32_t>(m) >> 23) - 149);
        ASSERT_EQ(code, want) << "c0 " << c0 << " c " << c << " |y| " << a;
        // the screen's grid value
        const float v = std::min(codec::sub_rn(codec::fma_f(a, rsf, m), m), 6.0f);
        ++checked;
        if (v == kGrid[want]) continue;
        const double mu = 0.5 * (static_cast<double>(v) + kGrid[want]);
        const bool adjacent = (want > 0 && v == kGrid[want - 1]) || (want < 7 && v == kGrid[want + 1]);
        ASSERT_TRUE(adjacent && std::abs(static_cast<double>(a) - mu * sf) <= 0x1p-24 * a)
            << "c0 " << c0 << " c " << c << " |y| " << a << ": screen " << v << ", spec " << kGrid[want];
        ++neighbours;
      }
    }
  }
  EXPECT_GT(checked, 10000000);
  std::printf("[search magic] %lld grid values, %lld neighbours across a midpoint\n", static_cast<long long>(checked),
              static_cast<long long>(neighbours));
}

// The group-scale code from the group's max |y|: every 31st non-negative float32 (Inf
// included), and every float within 256 ulps of each boundary 6 (v_c + v_c+1) / 2 between
// neighbouring e4m3 values, of 6 * 448 (saturation), of 4096 (the clamp) and of 6 * 2^-126
// (where the quotient turns subnormal). cuda_harness checks every non-negative float32 on
// the device.
TEST(WriterPrimitives, Nvfp4GroupScaleCodeIsTheScalarCode) {
  auto check = [](uint32_t u) {
    const float a = from_bits(u);
    ASSERT_EQ(codec::nvfp4_group_scale_code_fast(a), codec::nvfp4_group_scale_code(a)) << "amax bits 0x" << std::hex << u;
  };
  for (uint64_t u = 0; u <= 0x7F800000u; u += 31) check(static_cast<uint32_t>(u));
  check(0x7F800000u);
  std::vector<float> edges = {6.0f * 448.0f, 4096.0f, 6.0f * 1.17549435e-38f};
  for (uint32_t c = 0; c < kE4m3MaxCode; ++c) {
    edges.push_back(6.0f * ((e4m3_to_f32(static_cast<uint8_t>(c)) + e4m3_to_f32(static_cast<uint8_t>(c + 1))) / 2.0f));
  }
  for (float e : edges) {
    const uint32_t b = std::bit_cast<uint32_t>(e);
    for (uint32_t u = b - 256; u <= b + 256; ++u) check(u);
  }
}

// The e4m3 decode of every non-NaN code (the host path is the scalar one; cuda_harness
// checks the hardware path).
TEST(WriterPrimitives, E4m3DecodeIsTheScalarDecode) {
  for (uint32_t c = 0; c < 256; ++c) {
    if ((c & 0x7Fu) == 0x7Fu) continue;
    EXPECT_EQ(std::bit_cast<uint32_t>(codec::e4m3_to_f32_fast(c)), std::bit_cast<uint32_t>(e4m3_to_f32(static_cast<uint8_t>(c))))
        << "code " << c;
  }
}

// nvfp4_group_fast with the caller's max |x| (token-scale mode) equals it without.
TEST(WriterPrimitives, Nvfp4GroupsWithTheMaxHintAreTheSame) {
  namespace N = layout::nvfp4_ds_mla;
  std::mt19937 rng(29);
  const float divisors[] = {0.3f, 37.0f, 1e-20f, 1e35f, 1.5e30f, 9e-19f, 1.0f / 2688.0f};
  for (float s : divisors) {
    for (int rep = 0; rep < 50; ++rep) {
      const std::vector<float> lat = adversarial_latent(rng, s);
      uint8_t want[N::kRecordBytes] = {};
      codec::encode_nvfp4_latent(lat.data(), s, want);
      for (int g = 0; g < 32; ++g) {
        float amax = 0.0f;
        for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(lat[16 * g + i]));
        uint32_t w[2];
        const uint8_t sf = codec::nvfp4_group_fast(lat.data() + 16 * g, s, w, amax);
        ASSERT_EQ(sf, want[N::kScaleOffset + g]) << "s " << s << " group " << g;
        for (int b = 0; b < 8; ++b) {
          ASSERT_EQ(static_cast<uint8_t>(w[b / 4] >> (8 * (b % 4))), want[N::kLatentOffset + 8 * g + b]) << "s " << s;
        }
      }
    }
  }
}

TEST(WriterPrimitives, Fp8TilesAreTheScalarCodecs) {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> nb(-2, 2);
  for (Fp8ScaleMode mode : {Fp8ScaleMode::kPow2, Fp8ScaleMode::kExact}) {
    for (float mag : {1.0f, 1e-3f, 1e-30f, 1e-38f, 3e30f, 0.0f}) {
      for (int rep = 0; rep < 3000; ++rep) {
        float x[16];
        for (float& v : x) v = nd(rng) * mag;
        float amax = 0.0f;
        for (float v : x) amax = std::max(amax, std::fabs(v));
        const float s = codec::fp8_tile_scale(amax * (rep % 2 ? 1.0f : 4.0f), mode);  // also a tile max elsewhere
        // Ties of e4m3 after the division: values k/16 * s and neighbours.
        for (int i = 0; i < 4; ++i) {
          x[i] = from_bits(std::bit_cast<uint32_t>(s * (static_cast<float>(rep % 64) + 0.5f) / 16.0f) +
                           static_cast<uint32_t>(nb(rng)));
        }
        uint32_t w[4];
        codec::fp8_codes16(x, s, amax, w);
        for (int i = 0; i < 16; ++i) {
          ASSERT_EQ(static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4))), codec::fp8_quantize(x[i], s))
              << "x " << x[i] << " s " << s << " mode " << static_cast<int>(mode);
        }
      }
    }
  }
}

// The 368 B records' rope codes (two per writer lane) against rope_fp8_quantize /
// rope_int8_quantize: ropes over 60 decades (every division path), values on the codes'
// ties (k + 0.5 for int8, e4m3 midpoints) and their neighbours, zeros of both signs.
TEST(WriterPrimitives, RopeCodesAreTheScalarCodecs) {
  std::mt19937 rng(29);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> nb(-1, 1), pick(0, 127);
  for (float mag : {1.0f, 1e-3f, 1e-25f, 1e-36f, 1e25f, 1e36f}) {
    for (int rep = 0; rep < 4000; ++rep) {
      float r[kRopeDim];
      for (float& v : r) v = nd(rng) * mag;
      r[0] = rep % 7 == 0 ? -0.0f : r[0];
      float amax = 0.0f;
      for (float v : r) amax = std::max(amax, std::fabs(v));
      for (KvFormat f : {KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kNvfp4DsMlaInt8Rope}) {
        const bool fp8 = f == KvFormat::kNvfp4DsMlaFp8Rope;
        float rs = fp8 ? codec::rope_fp8_scale(amax) : codec::rope_int8_scale(amax);
        if (rep % 11 == 5) rs = from_bits(std::bit_cast<uint32_t>(rs) & 0xFF800000u);  // a power of two (rope_codes2 takes any rs)
        float t[kRopeDim];
        std::copy(r, r + kRopeDim, t);
        for (int i = 2; i < 10; ++i) {  // ties after the division, and neighbours
          const float tie = fp8 ? 0.5f * (e4m3_to_f32(static_cast<uint8_t>(pick(rng) % 126)) +
                                          e4m3_to_f32(static_cast<uint8_t>(pick(rng) % 126 + 1)))
                                : static_cast<float>(pick(rng) % 127) + 0.5f;
          t[i] = from_bits(std::bit_cast<uint32_t>(tie * rs) + static_cast<uint32_t>(nb(rng)));
          if (std::fabs(t[i]) > amax) t[i] = r[i];
        }
        for (int i = 0; i < kRopeDim; i += 2) {
          const float lane_max = std::max(std::fabs(t[i]), std::fabs(t[i + 1]));
          const uint32_t got = fp8 ? codec::rope_codes2<KvFormat::kNvfp4DsMlaFp8Rope>(t[i], t[i + 1], rs, lane_max)
                                   : codec::rope_codes2<KvFormat::kNvfp4DsMlaInt8Rope>(t[i], t[i + 1], rs, lane_max);
          const uint32_t want =
              fp8 ? (codec::rope_fp8_quantize(t[i], rs) | (static_cast<uint32_t>(codec::rope_fp8_quantize(t[i + 1], rs)) << 8))
                  : (static_cast<uint8_t>(codec::rope_int8_quantize(t[i], rs)) |
                     (static_cast<uint32_t>(static_cast<uint8_t>(codec::rope_int8_quantize(t[i + 1], rs))) << 8));
          ASSERT_EQ(got, want) << format_name(f) << " " << t[i] << ", " << t[i + 1] << " rs " << rs;
        }
      }
    }
  }
}

}  // namespace
}  // namespace mlakv
