// Record layouts: each format's regions tile [0, record_bytes) exactly, names parse,
// and the sizes are the published ones (docs/reference.md section 3).
#include <gtest/gtest.h>

#include "mlakv/formats.h"

namespace mlakv {
namespace {

TEST(Formats, PublishedSizes) {
  EXPECT_EQ(format_info(KvFormat::kBf16).record_bytes, 1152);
  EXPECT_EQ(format_info(KvFormat::kFp8DsMla).record_bytes, 656);
  EXPECT_EQ(format_info(KvFormat::kNvfp4DsMla).record_bytes, 432);
  EXPECT_EQ(format_info(KvFormat::kNvfp4DsMlaFp8Rope).record_bytes, 368);
  EXPECT_EQ(format_info(KvFormat::kNvfp4DsMlaInt8Rope).record_bytes, 368);
  EXPECT_EQ(format_info(KvFormat::kNvfp4DsMlaInt8Rope).name, "nvfp4_ds_mla_int8rope");
  EXPECT_EQ(static_cast<int>(KvFormat::kNvfp4DsMlaInt8Rope), 5);  // the record-file format id
  EXPECT_EQ(layout::indexer::kRecordBytes, 132);
}

TEST(Formats, RegionsTileTheRecord) {
  for (const FormatInfo& f : all_formats()) {
    int at = 0;
    for (const RecordRegion& r : f.regions) {
      EXPECT_EQ(r.offset, at) << f.name << ": gap or overlap before " << r.what;
      EXPECT_GT(r.bytes, 0) << f.name;
      at = r.offset + r.bytes;
    }
    EXPECT_EQ(at, f.record_bytes) << f.name;
    EXPECT_EQ(f.record_bytes % 16, 0) << f.name << ": records stay 16-byte aligned in a contiguous buffer";
  }
}

TEST(Formats, PublishedOffsets) {
  EXPECT_EQ(layout::fp8_ds_mla::kScaleOffset, 512);
  EXPECT_EQ(layout::fp8_ds_mla::kRopeOffset, 528);
  EXPECT_EQ(layout::nvfp4_ds_mla::kScaleOffset, 256);
  EXPECT_EQ(layout::nvfp4_ds_mla::kPadOffset, 288);
  EXPECT_EQ(layout::nvfp4_ds_mla::kRopeOffset, 304);
  EXPECT_EQ(layout::nvfp4_ds_mla_fp8rope::kRopeScaleOffset, 288);
  EXPECT_EQ(layout::nvfp4_ds_mla_fp8rope::kPadOffset, 292);
  EXPECT_EQ(layout::nvfp4_ds_mla_fp8rope::kRopeOffset, 304);
  EXPECT_EQ(layout::nvfp4_ds_mla_int8rope::kScaleOffset, 256);
  EXPECT_EQ(layout::nvfp4_ds_mla_int8rope::kRopeScaleOffset, 288);
  EXPECT_EQ(layout::nvfp4_ds_mla_int8rope::kPadOffset, 292);
  EXPECT_EQ(layout::nvfp4_ds_mla_int8rope::kRopeOffset, 304);
  // The fork's per-token scale (b12x kv_cache.py _LATENT_SCALE_OFFSET, _TWO_LEVEL_RCP).
  EXPECT_EQ(layout::nvfp4_token_scale::kOffset, 292);
  EXPECT_EQ(layout::nvfp4_token_scale::kFactor, 1.0f / 2688.0f);
  EXPECT_EQ(layout::nvfp4_ds_mla_int8rope::kRopeScaleFactor, 1.0f / 127.0f);
}

TEST(Formats, Nvfp4FormatsAreTheOuterScaleFormats) {
  for (const FormatInfo& f : all_formats()) EXPECT_EQ(is_nvfp4_format(f.format), f.has_outer_scale) << f.name;
}

TEST(Formats, NamesRoundTrip) {
  for (const FormatInfo& f : all_formats()) {
    auto parsed = parse_format(f.name);
    ASSERT_TRUE(parsed.has_value()) << f.name;
    EXPECT_EQ(*parsed, f.format);
  }
  EXPECT_FALSE(parse_format("fp8").has_value());
  EXPECT_FALSE(parse_format("").has_value());
}

TEST(Formats, GeometryOtherThan512Plus64) {
  EXPECT_EQ(record_bytes(KvFormat::kBf16, 256, 32), 576);  // MiniCPM3
  EXPECT_EQ(record_bytes(KvFormat::kFp8DsMla, 256, 32), -1);
  EXPECT_EQ(record_bytes(KvFormat::kNvfp4DsMla, 512, 32), -1);
}

// visit_format reaches each format's own tag, once; a value outside the enum calls nothing
// (the returning form gives its fallback).
TEST(Formats, VisitFormatReachesEveryTagOnce) {
  for (const FormatInfo& f : all_formats()) {
    int calls = 0;
    KvFormat seen = KvFormat::kBf16;
    visit_format(f.format, [&](auto tag) {
      ++calls;
      seen = decltype(tag)::value;
    });
    EXPECT_EQ(calls, 1) << f.name;
    EXPECT_EQ(seen, f.format) << f.name;
    EXPECT_EQ(visit_format(f.format, -1, [](auto tag) { return record_bytes(decltype(tag)::value); }), f.record_bytes)
        << f.name;
  }
  const auto bad = static_cast<KvFormat>(kNumKvFormats);
  int calls = 0;
  visit_format(bad, [&](auto) { ++calls; });
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(visit_format(bad, -1, [](auto) { return 7; }), -1);
}

}  // namespace
}  // namespace mlakv
