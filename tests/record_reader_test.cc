// The CPU SIMD record reader (cpu/attention_kernels.cc, the dequantization of CPU
// attention) against the scalar codec (format/record_codec.h), code by code: every
// code of every format (tests/support/record_sweep.h) under every scale, on every
// instruction set Highway compiled in that this machine runs. Both compute the same
// single-rounded products (e4m3 * s; (e2m1 * sf) * s_l, or * s_t in the token-scale
// mode; int8 * rs), so the floats must be equal bit for bit.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "cpu/attention_kernels.h"
#include "format/record_codec.h"
#include "support/record_sweep.h"

namespace mlakv {

void PrintTo(KvFormat f, std::ostream* os) { *os << format_name(f); }

namespace {

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

class SimdRecordReader : public ::testing::TestWithParam<KvFormat> {};

TEST_P(SimdRecordReader, MatchesTheScalarCodecCodeByCode) {
  const KvFormat f = GetParam();
  const int rb = record_bytes(f);
  const std::vector<uint8_t> recs = test::sweep_records(f);
  const int64_t n = test::kSweepRecords;
  std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string name = hwy::TargetName(target);
    ASSERT_EQ(name, cpu::attention_simd_target()) << "the dispatcher did not switch to the target under test";
    std::printf("  %s on %s: %lld records x %zu outer scales\n", std::string(format_name(f)).c_str(), name.c_str(),
                static_cast<long long>(n), test::sweep_outer_scales(f).size());
    // Each outer scale, then (nvfp4 formats) the token-scale mode: s_t from each record.
    std::vector<std::pair<float, bool>> modes;
    for (float outer : test::sweep_outer_scales(f)) modes.push_back({outer, false});
    if (is_nvfp4_format(f)) modes.push_back({1.0f, true});
    for (auto [outer, token_scale] : modes) {
      SCOPED_TRACE(std::string(format_name(f)) + " on " + name + ", outer scale " + std::to_string(outer) +
                   (token_scale ? ", token-scale mode" : ""));
      CacheLayerView view;
      view.data = const_cast<uint8_t*>(recs.data());
      view.num_blocks = n;
      view.block_size = 1;
      view.record_bytes = rb;
      view.format = f;
      view.outer_scale = outer;
      view.token_scale = token_scale;
      std::vector<float> got(static_cast<std::size_t>(n) * kQkDim, -1.0f);
      cpu::dequantize_records_simd(view, recs.data(), n, got.data());
      int64_t checked = 0;
      for (int64_t r = 0; r < n; ++r) {
        float want[kQkDim];
        codec::decode_record(f, recs.data() + r * rb, outer, want, want + kLatentDim, token_scale);
        for (int d = 0; d < kQkDim; ++d) {
          const float g = got[static_cast<std::size_t>(r * kQkDim + d)];
          ASSERT_EQ(bits(g), bits(want[d])) << "record " << r << " dim " << d << ": SIMD " << g << ", codec " << want[d];
          ++checked;
        }
      }
      EXPECT_EQ(checked, n * kQkDim);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

INSTANTIATE_TEST_SUITE_P(EveryFormat, SimdRecordReader,
                         ::testing::Values(KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla,
                                           KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kF32, KvFormat::kNvfp4DsMlaInt8Rope),
                         [](const ::testing::TestParamInfo<KvFormat>& info) {
                           return std::string(format_name(info.param));
                         });

// The sweep covers what it claims: every non-NaN code appears where the header says.
TEST(RecordSweep, CoversEveryCode) {
  const auto e4m3 = test::non_nan_e4m3_codes();
  ASSERT_EQ(e4m3.size(), 254u);
  ASSERT_EQ(test::non_nan_bf16_codes().size(), 65536u - 254u);
  {  // fp8: (code, tile scale) pairs
    const auto recs = test::sweep_records(KvFormat::kFp8DsMla);
    namespace F = layout::fp8_ds_mla;
    const int S = static_cast<int>(sizeof(test::kSweepTileScales) / sizeof(float));
    std::vector<std::vector<bool>> seen(static_cast<std::size_t>(S), std::vector<bool>(256, false));
    for (int64_t r = 0; r < test::kSweepRecords; ++r) {
      const uint8_t* rec = recs.data() + r * F::kRecordBytes;
      for (int t = 0; t < F::kNumTiles; ++t) {
        float s;
        std::memcpy(&s, rec + F::kScaleOffset + 4 * t, 4);
        int k = 0;
        while (k < S && test::kSweepTileScales[k] != s) ++k;
        ASSERT_LT(k, S);
        for (int j = 0; j < F::kTileDim; ++j) seen[static_cast<std::size_t>(k)][rec[t * F::kTileDim + j]] = true;
      }
    }
    for (int k = 0; k < S; ++k) {
      for (uint8_t c : e4m3) EXPECT_TRUE(seen[static_cast<std::size_t>(k)][c]) << "scale " << k << " code " << int(c);
    }
  }
  {  // nvfp4: (e2m1 code, group scale code) pairs
    const auto recs = test::sweep_records(KvFormat::kNvfp4DsMla);
    namespace N = layout::nvfp4_ds_mla;
    std::vector<std::vector<bool>> seen(256, std::vector<bool>(16, false));
    for (int64_t r = 0; r < test::kSweepRecords; ++r) {
      const uint8_t* rec = recs.data() + r * N::kRecordBytes;
      for (int g = 0; g < N::kNumGroups; ++g) {
        for (int i = 0; i < N::kGroupDim / 2; ++i) {
          const uint8_t b = rec[g * N::kGroupDim / 2 + i];
          seen[rec[N::kScaleOffset + g]][b & 0xF] = true;
          seen[rec[N::kScaleOffset + g]][b >> 4] = true;
        }
      }
    }
    for (uint8_t sc : e4m3) {
      for (int c = 0; c < 16; ++c) EXPECT_TRUE(seen[sc][static_cast<std::size_t>(c)]) << "scale " << int(sc) << " code " << c;
    }
  }
  {  // bf16 rope codes (fp8_ds_mla; nvfp4_ds_mla fills its rope the same way)
    const auto recs = test::sweep_records(KvFormat::kFp8DsMla);
    namespace F = layout::fp8_ds_mla;
    std::vector<bool> seen(65536, false);
    for (int64_t r = 0; r < test::kSweepRecords; ++r) {
      const uint8_t* rope = recs.data() + r * F::kRecordBytes + F::kRopeOffset;
      for (int i = 0; i < kRopeDim; ++i) seen[static_cast<std::size_t>(rope[2 * i] | (rope[2 * i + 1] << 8))] = true;
    }
    for (uint16_t c : test::non_nan_bf16_codes()) ASSERT_TRUE(seen[c]) << "bf16 rope code " << c;
  }
  {  // fp8 rope: (code, rope scale) pairs
    const auto recs = test::sweep_records(KvFormat::kNvfp4DsMlaFp8Rope);
    namespace R = layout::nvfp4_ds_mla_fp8rope;
    const int S = static_cast<int>(sizeof(test::kSweepRopeScales) / sizeof(float));
    std::vector<std::vector<bool>> seen(static_cast<std::size_t>(S), std::vector<bool>(256, false));
    for (int64_t r = 0; r < test::kSweepRecords; ++r) {
      const uint8_t* rec = recs.data() + r * R::kRecordBytes;
      float s;
      std::memcpy(&s, rec + R::kRopeScaleOffset, 4);
      int k = 0;
      while (k < S && test::kSweepRopeScales[k] != s) ++k;
      ASSERT_LT(k, S);
      for (int i = 0; i < kRopeDim; ++i) seen[static_cast<std::size_t>(k)][rec[R::kRopeOffset + i]] = true;
    }
    for (int k = 0; k < S; ++k) {
      for (uint8_t c : e4m3) EXPECT_TRUE(seen[static_cast<std::size_t>(k)][c]) << "rope scale " << k << " code " << int(c);
    }
  }
  {  // int8 rope: (code, rope scale) pairs, all 256 codes; token scales: every one of the list
    const auto recs = test::sweep_records(KvFormat::kNvfp4DsMlaInt8Rope);
    namespace R = layout::nvfp4_ds_mla_int8rope;
    const int S = static_cast<int>(sizeof(test::kSweepRopeScales) / sizeof(float));
    const int T = static_cast<int>(sizeof(test::kSweepTokenScales) / sizeof(float));
    std::vector<std::vector<bool>> seen(static_cast<std::size_t>(S), std::vector<bool>(256, false));
    std::vector<bool> seen_t(static_cast<std::size_t>(T), false);
    for (int64_t r = 0; r < test::kSweepRecords; ++r) {
      const uint8_t* rec = recs.data() + r * R::kRecordBytes;
      float s, st;
      std::memcpy(&s, rec + R::kRopeScaleOffset, 4);
      std::memcpy(&st, rec + layout::nvfp4_token_scale::kOffset, 4);
      int k = 0, kt = 0;
      while (k < S && test::kSweepRopeScales[k] != s) ++k;
      while (kt < T && test::kSweepTokenScales[kt] != st) ++kt;
      ASSERT_LT(k, S);
      ASSERT_LT(kt, T);
      seen_t[static_cast<std::size_t>(kt)] = true;
      for (int i = 0; i < kRopeDim; ++i) seen[static_cast<std::size_t>(k)][rec[R::kRopeOffset + i]] = true;
    }
    for (int k = 0; k < S; ++k) {
      for (int c = 0; c < 256; ++c) EXPECT_TRUE(seen[static_cast<std::size_t>(k)][static_cast<std::size_t>(c)]) << "rope scale " << k << " code " << c;
    }
    for (int k = 0; k < T; ++k) EXPECT_TRUE(seen_t[static_cast<std::size_t>(k)]) << "token scale " << k;
  }
}

}  // namespace
}  // namespace mlakv
