// The CUDA backend's host-side layout helpers, checked on the CPU (no GPU needed):
//   - common/record_part.cuh: the parts the kernels address, per format, equal the
//     region table of formats.cc (the table docs/formats.md and `mlakv formats` show),
//     region by region; the reader's quarters and the writer's lanes tile those parts;
//   - common/dispatch_format.h: every KvFormat reaches its own tag; a value outside
//     the enum gets the fallback.
// (record_part.cuh also static_asserts its values against formats.h's constants.)
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "cuda/common/dispatch_format.h"
#include "cuda/common/record_part.cuh"
#include "mlakv/formats.h"

namespace mlakv::cuda {
namespace {

using Span = std::pair<int, int>;  // [offset, bytes)

template <KvFormat F>
std::vector<Span> parts() {
  using P = record::Parts<F>;
  std::vector<Span> v = {{P::kLatentOffset, record::kLatentBytes<F>}};
  if constexpr (requires { P::kScaleOffset; }) v.push_back({P::kScaleOffset, record::kNumScales<F> * P::kScaleBytes});
  if constexpr (requires { P::kRopeScaleOffset; }) v.push_back({P::kRopeScaleOffset, P::kRopeScaleBytes});
  if constexpr (requires { P::kPadOffset; }) v.push_back({P::kPadOffset, P::kPadBytes});
  v.push_back({P::kRopeOffset, record::kRopeBytes<F>});
  return v;
}

// Every format with CUDA kernels (f32, the CPU-only parity format, has none).
const KvFormat kAll[] = {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope,
                         KvFormat::kNvfp4DsMlaInt8Rope};
constexpr KernelSet kAllSet = KernelSet::kAll;

TEST(CudaRecordParts, EqualTheFormatsRegionTable) {
  for (KvFormat f : kAll) {
    SCOPED_TRACE(std::string(format_name(f)));
    const std::vector<Span> got = dispatch_format<kAllSet>(f, std::vector<Span>{}, [](auto tag) { return parts<decltype(tag)::value>(); });
    const auto& regions = format_info(f).regions;
    ASSERT_EQ(got.size(), regions.size());
    for (std::size_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(got[k].first, regions[k].offset) << "part " << k << " (" << regions[k].what << ")";
      EXPECT_EQ(got[k].second, regions[k].bytes) << "part " << k << " (" << regions[k].what << ")";
    }
    const int rb = dispatch_format<kAllSet>(f, 0, [](auto tag) { return record::Parts<decltype(tag)::value>::kRecordBytes; });
    EXPECT_EQ(rb, record_bytes(f));
    EXPECT_EQ(rb, format_info(f).record_bytes);
  }
}

template <KvFormat F>
void check_splits() {
  using P = record::Parts<F>;
  // Quarters, then lanes, cover the latent and rope parts exactly, back to back.
  EXPECT_EQ(record::kQuarters * record::Quarter<F>::kLatentBytes, record::kLatentBytes<F>);
  EXPECT_EQ(record::kQuarters * record::Quarter<F>::kRopeBytes, record::kRopeBytes<F>);
  EXPECT_EQ(record::kWriterLanes * record::Lane<F>::kLatentBytes, record::kLatentBytes<F>);
  EXPECT_EQ(record::kWriterLanes * record::Lane<F>::kRopeBytes, record::kRopeBytes<F>);
  if constexpr (requires { P::kScaleOffset; }) {
    EXPECT_EQ(record::kQuarters * record::QuarterScales<F>::kBytes, record::kNumScales<F> * P::kScaleBytes);
    EXPECT_EQ(record::kNumScales<F> * record::QuarterScales<F>::kGroupBytes, record::kLatentBytes<F>);
    EXPECT_EQ(record::kWriterLanes / record::kLanesPerScale<F>, record::kNumScales<F>);
  }
}

TEST(CudaRecordParts, QuartersAndLanesTileTheParts) {
  for (KvFormat f : kAll) {
    SCOPED_TRACE(std::string(format_name(f)));
    dispatch_format<kAllSet>(f, 0, [](auto tag) {
      check_splits<decltype(tag)::value>();
      return 0;
    });
  }
}

TEST(CudaDispatchFormat, EveryFormatReachesItsTagAndOthersTheFallback) {
  for (KvFormat f : kAll) {
    EXPECT_EQ(dispatch_format<kAllSet>(f, -1, [](auto tag) { return static_cast<int>(decltype(tag)::value); }),
              static_cast<int>(f));
    // The default set (the sm90 attention path's, interim) lacks only the int8-rope record.
    EXPECT_EQ(dispatch_format(f, -1, [](auto tag) { return static_cast<int>(decltype(tag)::value); }),
              f == KvFormat::kNvfp4DsMlaInt8Rope ? -1 : static_cast<int>(f));
  }
  EXPECT_EQ(dispatch_format<kAllSet>(KvFormat::kF32, -1, [](auto) { return 0; }), -1);  // no CUDA kernels
  EXPECT_EQ(dispatch_format(KvFormat::kF32, -1, [](auto) { return 0; }), -1);
  EXPECT_EQ(dispatch_format(static_cast<KvFormat>(kNumKvFormats), -1, [](auto) { return 0; }), -1);
  EXPECT_EQ(dispatch_format(static_cast<KvFormat>(255), -1, [](auto) { return 0; }), -1);
}

}  // namespace
}  // namespace mlakv::cuda
