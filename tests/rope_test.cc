// RoPE (src/core/rope.h): inverse frequencies against hand-computed values and against
// transformers' own (the float32 inv_freq stored in the HF parity fixtures), the two
// rotation layouts on hand-computed vectors, the relative-position property, longrope's
// long/short switch, and argument errors.
#include "model/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "mlakv/hf_config.h"
#include "mlakv/safetensors.h"

namespace mlakv {
namespace {

RopeConfig yarn_v3() {  // DeepSeek-V3's rope_scaling
  RopeConfig r;
  r.theta = 10000.0;
  r.scaling = RopeScaling::kYarn;
  r.factor = 40.0;
  r.original_max_position = 4096;
  r.beta_fast = 32.0;
  r.beta_slow = 1.0;
  r.mscale = 1.0;
  r.mscale_all_dim = 1.0;
  return r;
}

TEST(Rope, DefaultFrequenciesByHand) {
  RopeConfig r;  // theta 10000, R = 8: theta^(-2i/8) = 10^(-i)
  auto inv = rope::inverse_frequencies(r, 8);
  ASSERT_TRUE(inv.ok()) << inv.status().to_string();
  const double want[] = {1.0, 0.1, 0.01, 0.001};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR((*inv)[static_cast<std::size_t>(i)], want[i], 1e-15 * want[i]) << i;
  r.scaling = RopeScaling::kLinear;
  r.factor = 4.0;
  inv = rope::inverse_frequencies(r, 8);
  ASSERT_TRUE(inv.ok());
  for (int i = 0; i < 4; ++i) EXPECT_NEAR((*inv)[static_cast<std::size_t>(i)], want[i] / 4, 1e-15 * want[i]) << i;
  EXPECT_EQ(rope::cos_sin_multiplier(r), 1.0);
}

// DeepSeek-V3 (R = 64): the correction range is d(32) = 10.47 -> 10 and d(1) = 22.51 -> 23,
// d(rot) = 64 ln(4096 / (2 pi rot)) / (2 ln 10000). Dims <= 10 keep theta^(-2i/64), dims
// >= 23 are divided by 40, dim 16 blends with ramp 6/13: (6/13)/(40*100) + (7/13)/100 = 0.0055.
TEST(Rope, YarnDeepSeekV3ByHand) {
  auto inv = rope::inverse_frequencies(yarn_v3(), 64);
  ASSERT_TRUE(inv.ok()) << inv.status().to_string();
  for (int i : {0, 5, 10}) EXPECT_NEAR((*inv)[static_cast<std::size_t>(i)], std::pow(1e4, -i / 32.0), 1e-15) << i;
  for (int i : {23, 31}) EXPECT_NEAR((*inv)[static_cast<std::size_t>(i)], std::pow(1e4, -i / 32.0) / 40, 1e-17) << i;
  EXPECT_NEAR((*inv)[16], 0.0055, 1e-16);
  // Without truncation the range is [10.472, 22.513]: values from a calculator.
  RopeConfig r = yarn_v3();
  r.truncate = false;
  inv = rope::inverse_frequencies(r, 64);
  ASSERT_TRUE(inv.ok());
  EXPECT_NEAR((*inv)[10], 0.056234132519034905, 1e-15);  // still below the ramp
  EXPECT_NEAR((*inv)[11], 0.04036758449441141, 1e-15);
  EXPECT_NEAR((*inv)[16], 0.005524062977468265, 1e-16);
  EXPECT_NEAR((*inv)[22], 0.00011838773159168898, 1e-18);
}

// beta_fast = beta_slow (Kimi K2): the range collapses and HF widens it by 0.001. At R = 8
// d(1) = 2.814: dims 0..2 keep their frequency, dim 3 is divided by the factor, with or
// without truncation (2 / 3 after floor / ceil).
TEST(Rope, YarnEqualBetasByHand) {
  for (bool truncate : {true, false}) {
    RopeConfig r = yarn_v3();
    r.beta_fast = r.beta_slow = 1.0;
    r.factor = 32.0;
    r.truncate = truncate;
    auto inv = rope::inverse_frequencies(r, 8);
    ASSERT_TRUE(inv.ok());
    EXPECT_NEAR((*inv)[0], 1.0, 1e-15);
    EXPECT_NEAR((*inv)[1], 0.1, 1e-15);
    EXPECT_NEAR((*inv)[2], 0.01, 1e-16);
    EXPECT_NEAR((*inv)[3], 0.001 / 32, 1e-18);
  }
}

// The fixtures' inv_freq is transformers' own (float32) for five configs: ours (float64)
// must equal it to within float32 evaluation error (HF's pow, division and blend in
// float32: a few ulps, bounded here by 4 ulps = 4 * 2^-23 relative).
TEST(Rope, MatchesTransformersInvFreq) {
  for (const char* name : {"deepseek_v3", "deepseek_v2_lite", "glm4_moe_lite", "kimi_k2", "deepseek_v3_halfsplit"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(MLAKV_TEST_DATA_DIR) + "/hf_parity/" + name;
    auto cfg = load_hf_config(dir);
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    auto io = SafetensorsFile::open(dir + "/io.safetensors");
    ASSERT_TRUE(io.ok()) << io.status().to_string();
    auto hf = (*io)->find("inv_freq");
    auto af = (*io)->find("attention_scaling");
    ASSERT_TRUE(hf && af);
    auto inv = rope::inverse_frequencies(cfg->rope, cfg->qk_rope_head_dim);
    ASSERT_TRUE(inv.ok());
    ASSERT_EQ(hf->numel(), static_cast<int64_t>(inv->size()));
    for (std::size_t i = 0; i < inv->size(); ++i) {
      const double h = hf->ptr<const float>()[i];
      EXPECT_LE(std::fabs((*inv)[i] - h), 4 * 0x1p-23 * std::fabs(h)) << "i " << i << " ours " << (*inv)[i];
    }
    // HF's attention_scaling is computed in float64 from the same formula: agree to rounding.
    EXPECT_NEAR(rope::cos_sin_multiplier(cfg->rope), af->ptr<const double>()[0], 1e-15);
  }
}

// R = 4, theta 10000: inv = {1, 0.01}; at position 2 the pair angles are 2 and 0.02.
TEST(Rope, RotationLayoutsByHand) {
  RopeConfig r;
  for (bool interleaved : {true, false}) {
    r.interleaved = interleaved;
    auto t = rope::RopeTable::create(r, 4);
    ASSERT_TRUE(t.ok());
    float x[4] = {1, 0, 0, 1};
    t->rotate(x, 2);
    const float c2 = std::cos(2.0), s2 = std::sin(2.0), c0 = std::cos(0.02), s0 = std::sin(0.02);
    // interleaved: pairs (x0,x1)=(1,0) at angle 2, (x2,x3)=(0,1) at 0.02;
    // half-split: pairs (x0,x2)=(1,0) at angle 2, (x1,x3)=(0,1) at 0.02.
    const float want_il[4] = {c2, s2, -s0, c0};
    const float want_hs[4] = {c2, -s0, s2, c0};
    for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(x[i], interleaved ? want_il[i] : want_hs[i]) << interleaved << " " << i;
  }
}

TEST(Rope, AttentionFactorScalesCosSin) {
  RopeConfig r = yarn_v3();
  r.attention_factor = 1.25;
  auto t = rope::RopeTable::create(r, 64);
  ASSERT_TRUE(t.ok());
  std::vector<double> c(32), s(32);
  t->cos_sin(0, false, c.data(), s.data());
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(c[static_cast<std::size_t>(i)], 1.25);
    EXPECT_EQ(s[static_cast<std::size_t>(i)], 0.0);
  }
}

// q(m) . k(n) depends on m - n only (the point of RoPE), in both layouts and at large
// positions; checked in float64 on float32 rotations.
TEST(Rope, DotProductIsRelative) {
  for (bool interleaved : {true, false}) {
    RopeConfig r = yarn_v3();
    r.interleaved = interleaved;
    auto t = rope::RopeTable::create(r, 64);
    ASSERT_TRUE(t.ok());
    std::vector<float> q(64), k(64);
    for (int i = 0; i < 64; ++i) {
      q[static_cast<std::size_t>(i)] = std::sin(0.7 * i + 0.3f);
      k[static_cast<std::size_t>(i)] = std::cos(1.3 * i);
    }
    auto score = [&](int64_t m, int64_t n) {
      std::vector<float> a = q, b = k;
      t->rotate(a.data(), m);
      t->rotate(b.data(), n);
      double s = 0;
      for (int i = 0; i < 64; ++i)
        s += static_cast<double>(a[static_cast<std::size_t>(i)]) * b[static_cast<std::size_t>(i)];
      return s;
    };
    for (int64_t base : {int64_t{0}, int64_t{4095}, int64_t{163839}}) {
      // float32 rounding of the rotated vectors: |error| <= 2 * 2^-24 * sum |q||k| ~ 64 * 2^-23
      EXPECT_NEAR(score(base + 7, base + 3), score(7, 3), 64 * 0x1p-22) << interleaved << " " << base;
    }
  }
}

TEST(Rope, LongRopeSwitchesOnTheLargestPosition) {
  RopeConfig r;
  r.scaling = RopeScaling::kLongRope;
  r.short_factor = {1.0, 2.0};
  r.long_factor = {4.0, 8.0};
  r.original_max_position = 16;
  r.attention_factor = 1.0;
  auto s = rope::inverse_frequencies(r, 4, false);
  auto l = rope::inverse_frequencies(r, 4, true);
  ASSERT_TRUE(s.ok() && l.ok());
  EXPECT_NEAR((*s)[0], 1.0, 1e-15);
  EXPECT_NEAR((*s)[1], 0.005, 1e-17);
  EXPECT_NEAR((*l)[0], 0.25, 1e-15);
  EXPECT_NEAR((*l)[1], 0.00125, 1e-17);
  auto t = rope::RopeTable::create(r, 4);
  ASSERT_TRUE(t.ok());
  const std::vector<int64_t> short_call = {0, 15}, long_call = {3, 16};
  EXPECT_FALSE(t->uses_long_factors(short_call));
  EXPECT_TRUE(t->uses_long_factors(long_call));
  float x[4] = {1, 0, 1, 0};  // interleaved pairs at angles p*inv
  t->rotate(x, 4, true);
  EXPECT_FLOAT_EQ(x[0], std::cos(1.0));    // 4 * 0.25
  EXPECT_FLOAT_EQ(x[2], std::cos(0.005));  // 4 * 0.00125
}

TEST(Rope, Errors) {
  RopeConfig r;
  EXPECT_EQ(rope::inverse_frequencies(r, 7).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rope::inverse_frequencies(r, 0).status().code(), StatusCode::kInvalidArgument);
  r.theta = 0;
  EXPECT_NE(rope::inverse_frequencies(r, 8).status().message().find("theta"), std::string::npos);
  r = yarn_v3();
  r.factor = -1;
  EXPECT_NE(rope::inverse_frequencies(r, 64).status().message().find("factor"), std::string::npos);
  r = RopeConfig{};
  r.scaling = RopeScaling::kLongRope;
  r.short_factor = {1.0};
  r.long_factor = {1.0, 1.0};
  auto st = rope::inverse_frequencies(r, 4).status();
  EXPECT_NE(st.message().find("short_factor"), std::string::npos) << st.message();
  r.short_factor = {1.0, 0.0};
  st = rope::RopeTable::create(r, 4).status();
  EXPECT_NE(st.message().find("short_factor[1]"), std::string::npos) << st.message();
  r = yarn_v3();
  r.attention_factor = 0.0;
  EXPECT_NE(rope::RopeTable::create(r, 64).status().message().find("attention_factor"), std::string::npos);
}

}  // namespace
}  // namespace mlakv
