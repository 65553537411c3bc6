// The CPU SIMD record reader (cpu/attention_kernels.cc, the dequantization of CPU
// attention) against the scalar codec (format/record_codec.h), code by code: every
// code of every format (tests/support/record_sweep.h) under every scale, on every
// instruction set Highway compiled in that this machine runs. Both compute the same
// single-rounded products (e4m3 * s; (e2m1 * sf) * s_l), so the floats must be equal
// bit for bit.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
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
    for (float outer : test::sweep_outer_scales(f)) {
      SCOPED_TRACE(std::string(format_name(f)) + " on " + name + ", outer scale " + std::to_string(outer));
      CacheLayerView view;
      view.data = const_cast<uint8_t*>(recs.data());
      view.num_blocks = n;
      view.block_size = 1;
      view.record_bytes = rb;
      view.format = f;
      view.outer_scale = outer;
      std::vector<float> got(static_cast<std::size_t>(n) * kQkDim, -1.0f);
      cpu::dequantize_records_simd(view, recs.data(), n, got.data());
      int64_t checked = 0;
      for (int64_t r = 0; r < n; ++r) {
        float want[kQkDim];
        codec::decode_record(f, recs.data() + r * rb, outer, want, want + kLatentDim);
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
                                           KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kF32),
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
}

}  // namespace
}  // namespace mlakv
