// The nvfp4_ds_mla_outer_scale_v1 file (include/mlakv/outer_scales.h): hand-written
// files, good and bad, whose errors must name the file, field and layer; the writer;
// per-layer scales in the cache writer and reader (hand-computed record bytes); the
// calibrator and `mlakv calibrate`.
#include "mlakv/outer_scales.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "mlakv/cache.h"
#include "mlakv/codec.h"
#include "mlakv/numerics.h"
#include "mlakv/safetensors.h"

namespace mlakv {
namespace {

namespace fs = std::filesystem;

const std::string kGood = R"({
  "format": "nvfp4_ds_mla_outer_scale_v1",
  "num_layers": 3,
  "latent_dim": 512,
  "denominator": 2688.0,
  "scales": [0.0000074404761904761905, 0.001, 0.0019345238095238095],
  "max_abs": [0.02, 2.688, 5.2],
  "comment": "other keys are ignored"
})";

TEST(OuterScales, ParsesAHandWrittenFile) {
  auto s = parse_outer_scales(kGood, "good.json");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_EQ(s->num_layers(), 3);
  EXPECT_EQ(s->scales[0], 0.0000074404761904761905);  // 0.02 / 2688
  EXPECT_EQ(s->scales[1], 0.001);
  EXPECT_EQ(s->max_abs[2], 5.2);
  EXPECT_EQ(s->scale_for(1), 0.001f);
  EXPECT_EQ(s->scale_for(3), 1.0f);  // past num_layers: the MTP layer keeps 1.0
  EXPECT_EQ(s->scale_for(-1), 1.0f);
  // max_abs is optional; denominator may be written as an integer
  auto t = parse_outer_scales(R"({"format": "nvfp4_ds_mla_outer_scale_v1", "num_layers": 1, "latent_dim": 512,
                                  "denominator": 2688, "scales": [1]})",
                              "t.json");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_TRUE(t->max_abs.empty());
}

// Each bad variant: {what to replace in kGood, with what, words the error must contain}.
struct Bad {
  const char* from;
  const char* to;
  std::vector<std::string> words;
};

TEST(OuterScales, StrictLoaderNamesFileFieldAndLayer) {
  const Bad bad[] = {
      {"\"nvfp4_ds_mla_outer_scale_v1\"", "\"nvfp4_ds_mla_outer_scale_v2\"", {"'format'"}},
      {"\"format\": \"nvfp4_ds_mla_outer_scale_v1\",", "", {"'format'", "missing"}},
      {"\"num_layers\": 3", "\"num_layers\": 3.0", {"'num_layers'", "integer"}},
      {"\"num_layers\": 3", "\"num_layers\": true", {"'num_layers'"}},
      {"\"num_layers\": 3", "\"num_layers\": 0", {"'num_layers'"}},
      {"\"num_layers\": 3", "\"num_layers\": 4", {"'scales'", "4 numbers"}},
      {"\"latent_dim\": 512", "\"latent_dim\": 576", {"'latent_dim'", "512"}},
      {"\"latent_dim\": 512", "\"latent_dim\": \"512\"", {"'latent_dim'"}},
      {"\"denominator\": 2688.0", "\"denominator\": 2688.5", {"'denominator'", "2688"}},
      {"\"denominator\": 2688.0", "\"denominator\": 448", {"'denominator'"}},
      {"\"denominator\": 2688.0,", "", {"'denominator'", "missing"}},
      {"0.001, ", "true, ", {"'scales'[1]", "layer 1"}},
      {"0.001, ", "-0.001, ", {"'scales'[1]", "layer 1"}},
      {"0.001, ", "0, ", {"'scales'[1]", "layer 1"}},
      {"0.001, ", "\"0.001\", ", {"'scales'[1]", "layer 1"}},
      {"0.001, ", "1e-50, ", {"'scales'[1]", "float32"}},        // zero in float32
      {"0.0019345238095238095]", "1e999]", {"not valid JSON"}},  // no inf in JSON: an overflow
      {"0.0019345238095238095]", "NaN]", {"not valid JSON"}},
      {"[0.0000074404761904761905, 0.001, 0.0019345238095238095]", "[0.1, 0.2]", {"'scales'", "3 numbers"}},
      {"[0.02, 2.688, 5.2]", "[0.02, -2.688, 5.2]", {"'max_abs'[1]", "layer 1"}},
      {"[0.02, 2.688, 5.2]", "[0.02, 2.688, false]", {"'max_abs'[2]", "layer 2"}},
      {"[0.02, 2.688, 5.2]", "[0.02]", {"'max_abs'"}},
      {"{\n", "[\n", {"not valid JSON"}},
  };
  for (const Bad& b : bad) {
    std::string text = kGood;
    const auto at = text.find(b.from);
    ASSERT_NE(at, std::string::npos) << b.from;
    text.replace(at, std::string(b.from).size(), b.to);
    auto s = parse_outer_scales(text, "/models/x/scales.json");
    ASSERT_FALSE(s.ok()) << "accepted: " << b.from << " -> " << b.to;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    const std::string m = s.status().message();
    EXPECT_NE(m.find("/models/x/scales.json"), std::string::npos) << m;
    for (const std::string& w : b.words) EXPECT_NE(m.find(w), std::string::npos) << "'" << w << "' not in: " << m;
  }
  EXPECT_NE(parse_outer_scales("[1, 2]", "a.json").status().message().find("object"), std::string::npos);
  auto missing = load_outer_scales("/nonexistent/scales.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/scales.json"), std::string::npos);
}

TEST(OuterScales, WriterRoundTripsAndMatchesTheFormula) {
  const std::vector<double> m = {0.02, 5.2, 1.0 / 3.0};
  auto s = outer_scales_from_max_abs(m);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->scales[1], 5.2 / 2688.0);
  const std::string file =
      (fs::temp_directory_path() / ("mlakv_scales_" + std::to_string(::getpid()) + ".json")).string();
  ASSERT_TRUE(write_outer_scales(file, *s).ok());
  auto back = load_outer_scales(file);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->scales, s->scales);  // exact: JSON numbers round-trip doubles
  EXPECT_EQ(back->max_abs, m);
  std::ifstream f(file);
  std::stringstream ss;
  ss << f.rdbuf();
  const auto j = nlohmann::json::parse(ss.str());
  EXPECT_EQ(j["format"], "nvfp4_ds_mla_outer_scale_v1");
  EXPECT_TRUE(j["denominator"].is_number_float());
  EXPECT_EQ(j["denominator"].get<double>(), 2688.0);
  EXPECT_TRUE(j["num_layers"].is_number_integer());
  fs::remove(file);
  // invalid inputs: a zero or non-finite max, no layers
  EXPECT_NE(outer_scales_from_max_abs(std::vector<double>{0.1, 0.0}).status().message().find("layer 1"),
            std::string::npos);
  EXPECT_FALSE(outer_scales_from_max_abs(std::vector<double>{NAN}).ok());
  EXPECT_FALSE(outer_scales_from_max_abs(std::vector<double>{}).ok());
  OuterScales bad = *s;
  bad.scales[2] = -1;
  EXPECT_FALSE(write_outer_scales(file, bad).ok());
  EXPECT_FALSE(fs::exists(file));
}

TEST(OuterScales, CacheLayerFormatsApplyOrWarn) {
  auto s = parse_outer_scales(kGood, "good.json");
  ASSERT_TRUE(s.ok());
  auto f = cache_layer_formats(KvFormat::kNvfp4DsMla, 4, &*s);
  ASSERT_TRUE(f.ok());
  // The 3-layer file does not cover layer 3: it uses 1.0, and the warning says so.
  EXPECT_NE(f->warning.find("covers layers [0, 3); layer 3 is past it and uses outer scale 1.0"), std::string::npos)
      << f->warning;
  EXPECT_TRUE(cache_layer_formats(KvFormat::kNvfp4DsMla, 3, &*s)->warning.empty());
  ASSERT_EQ(f->layers.size(), 4u);
  EXPECT_EQ(f->layers[0].outer_scale, static_cast<float>(0.02 / 2688));
  EXPECT_EQ(f->layers[2].outer_scale, static_cast<float>(0.0019345238095238095));
  EXPECT_EQ(f->layers[3].outer_scale, 1.0f);  // the MTP layer
  for (KvFormat other : {KvFormat::kBf16, KvFormat::kFp8DsMla}) {
    f = cache_layer_formats(other, 4, &*s);
    ASSERT_TRUE(f.ok());
    EXPECT_NE(f->warning.find("no outer scale"), std::string::npos) << f->warning;
    for (const LayerFormat& l : f->layers) EXPECT_EQ(l.outer_scale, 1.0f);
  }
  f = cache_layer_formats(KvFormat::kFp8DsMla, 2, nullptr);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->warning.empty());
  EXPECT_FALSE(cache_layer_formats(KvFormat::kBf16, 0, nullptr).ok());
}

// A latent of constant 0.02 in layer 0 (s_0 = 0.02/2688) and layer 1 (s_1 = 1.0): with
// its scale, y = 0.02 / s_0 = 2688, the group scale is e4m3(2688/6 = 448) = 0x7E and
// every e2m1 code is 6 (0x7); without, e4m3(0.02/6 = 0.00333) is the subnormal 2 * 2^-9
// (0x02) and 0.02 / 0.00390625 = 5.12 rounds to 6 (0x7) -> 0.0234, a 17% error.
TEST(OuterScales, CacheWriterAndReaderApplyEachLayersScale) {
  const float s0 = static_cast<float>(0.02 / 2688.0);
  KvCache::Config cc;
  cc.num_layers = 2;
  cc.num_blocks = 1;
  cc.block_size = 1;
  cc.layers = {{KvFormat::kNvfp4DsMla, s0}, {KvFormat::kNvfp4DsMla, 1.0f}};
  auto cache = KvCache::create_cpu(cc);
  ASSERT_TRUE(cache.ok());
  std::vector<float> lat(kLatentDim, 0.02f), rope(kRopeDim, 0.5f);
  const int64_t slot = 0;
  for (int l = 0; l < 2; ++l) {
    ASSERT_TRUE((*cache)
                    ->write(l, TensorView::contiguous(&slot, DType::kI64, {1}),
                            TensorView::contiguous(lat.data(), DType::kF32, {1, kLatentDim}),
                            TensorView::contiguous(rope.data(), DType::kF32, {1, kRopeDim}))
                    .ok());
  }
  namespace nv = layout::nvfp4_ds_mla;
  auto v0 = (*cache)->layer(0);
  auto v1 = (*cache)->layer(1);
  ASSERT_TRUE(v0.ok() && v1.ok());
  EXPECT_EQ(v0->outer_scale, s0);
  EXPECT_EQ(v0->record(0)[nv::kScaleOffset], 0x7E);
  EXPECT_EQ(v0->record(0)[nv::kLatentOffset], 0x77);
  EXPECT_EQ(v1->record(0)[nv::kScaleOffset], 0x02);
  EXPECT_EQ(v1->record(0)[nv::kLatentOffset], 0x77);
  // The reader multiplies s_l back (and never touches rope).
  std::vector<float> out_lat(kLatentDim), out_rope(kRopeDim);
  for (int l = 0; l < 2; ++l) {
    const CacheLayerView& v = l == 0 ? *v0 : *v1;
    CodecParams p{v.format, v.outer_scale};
    ASSERT_TRUE(decode_records(p, TensorView::contiguous(v.record(0), DType::kU8, {1, v.record_bytes}),
                               TensorView::contiguous(out_lat.data(), DType::kF32, {1, kLatentDim}),
                               TensorView::contiguous(out_rope.data(), DType::kF32, {1, kRopeDim}))
                    .ok());
    EXPECT_FLOAT_EQ(out_lat[5], l == 0 ? 6.0f * 448.0f * s0 : 6.0f * 0.00390625f);
    EXPECT_EQ(out_rope[3], 0.5f);
  }
}

TEST(OuterScales, CalibratorFromCaptures) {
  TensorMap cap;
  std::vector<float> l0(2 * kLatentDim, 0.01f), l1(kLatentDim, -0.5f);
  l0[700] = -0.03f;  // token 1, dim 188
  l1[3] = 4.25f;
  ASSERT_TRUE(cap.add("layers.0.kv_c_normed", DType::kF32, {2, kLatentDim}, l0.data(), l0.size() * 4).ok());
  std::vector<uint16_t> b1(kLatentDim);
  for (int i = 0; i < kLatentDim; ++i) b1[static_cast<std::size_t>(i)] = f32_to_bf16(l1[static_cast<std::size_t>(i)]);
  ASSERT_TRUE(cap.add("layers.1.kv_c_normed", DType::kBF16, {1, kLatentDim}, b1.data(), b1.size() * 2).ok());
  ASSERT_TRUE(cap.add("layers.1.k_pe", DType::kF32, {1, 2}, l1.data(), 8).ok());  // ignored
  OuterScaleCalibrator cal;
  auto n = cal.add_capture(cap);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(*n, 2);
  auto s = cal.finish();
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_EQ(s->num_layers(), 2);
  EXPECT_EQ(s->max_abs[0], static_cast<double>(0.03f));
  EXPECT_EQ(s->max_abs[1], 4.25);
  EXPECT_EQ(s->scales[1], 4.25 / 2688);
  EXPECT_EQ(cal.tokens()[0], 2);
  // a second capture raises a max; a gap, a zero layer and NaN are errors
  std::vector<float> more(kLatentDim, 0.0f);
  more[0] = 0.5f;
  ASSERT_TRUE(cal.add(0, TensorView::contiguous(more.data(), DType::kF32, {1, kLatentDim})).ok());
  EXPECT_EQ(cal.finish()->max_abs[0], 0.5);
  auto gap = cal.finish(4);
  EXPECT_NE(gap.status().message().find("layer 2"), std::string::npos) << gap.status().to_string();
  OuterScaleCalibrator zero;
  std::vector<float> z(kLatentDim, 0.0f);
  ASSERT_TRUE(zero.add(0, TensorView::contiguous(z.data(), DType::kF32, {1, kLatentDim})).ok());
  EXPECT_NE(zero.finish().status().message().find("is 0"), std::string::npos);
  more[9] = INFINITY;
  auto st = cal.add(3, TensorView::contiguous(more.data(), DType::kF32, {1, kLatentDim}), "cap.safetensors: x");
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("[0, 9]"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("layer 3"), std::string::npos) << st.message();
  EXPECT_FALSE(cal.add(0, TensorView::contiguous(more.data(), DType::kF32, {1, 256})).ok());
  TensorMap none;
  ASSERT_TRUE(none.add("layers.0.k_pe", DType::kF32, {1, 2}, l1.data(), 8).ok());
  EXPECT_NE(OuterScaleCalibrator().add_capture(none).status().message().find("no layers.<i>.kv_c_normed"),
            std::string::npos);
  TensorMap odd;
  ASSERT_TRUE(odd.add("layers.01.kv_c_normed", DType::kF32, {1, kLatentDim}, l1.data(), l1.size() * 4).ok());
  EXPECT_NE(OuterScaleCalibrator().add_capture(odd).status().message().find("malformed"), std::string::npos);
}

class CalibrateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mlakv_calibrate_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  int run(const std::string& args, std::string* err = nullptr) {
    const std::string e = path("stderr");
    const int status = std::system((std::string(MLAKV_CLI_PATH) + " " + args + " >/dev/null 2>" + e).c_str());
    if (err != nullptr) {
      std::ifstream f(e);
      std::stringstream ss;
      ss << f.rdbuf();
      *err = ss.str();
    }
    return WEXITSTATUS(status);
  }
  std::string path(const char* name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(CalibrateCli, TwoCapturesAndErrors) {
  std::vector<float> a(3 * kLatentDim, 0.25f), b(kLatentDim, -1.5f);
  a[1000] = 0.75f;
  ASSERT_TRUE(
      write_safetensors(path("a.safetensors"),
                        {{"layers.0.kv_c_normed", TensorView::contiguous(a.data(), DType::kF32, {3, kLatentDim})}})
          .ok());
  ASSERT_TRUE(
      write_safetensors(path("b.safetensors"),
                        {{"layers.1.kv_c_normed", TensorView::contiguous(b.data(), DType::kF32, {1, kLatentDim})},
                         {"layers.0.kv_c_normed", TensorView::contiguous(b.data(), DType::kF32, {1, kLatentDim})}})
          .ok());
  ASSERT_EQ(run("calibrate --activations " + path("a.safetensors") + " --activations " + path("b.safetensors") +
                " --out " + path("s.json") + " --num-layers 2"),
            0);
  auto s = load_outer_scales(path("s.json"));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->max_abs, (std::vector<double>{1.5, 1.5}));
  EXPECT_EQ(s->scales[0], 1.5 / 2688);

  std::string err;
  EXPECT_NE(
      run("calibrate --activations " + path("a.safetensors") + " --out " + path("t.json") + " --num-layers 2", &err),
      0);
  EXPECT_NE(err.find("error:"), std::string::npos) << err;
  EXPECT_NE(err.find("layer 1"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(path("t.json")));
  a[5] = NAN;
  ASSERT_TRUE(
      write_safetensors(path("nan.safetensors"),
                        {{"layers.0.kv_c_normed", TensorView::contiguous(a.data(), DType::kF32, {3, kLatentDim})}})
          .ok());
  EXPECT_NE(run("calibrate --activations " + path("nan.safetensors") + " --out " + path("t.json"), &err), 0);
  EXPECT_NE(err.find("nan.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("layers.0.kv_c_normed"), std::string::npos) << err;
  EXPECT_NE(run("calibrate --activations " + path("missing.safetensors") + " --out " + path("t.json"), &err), 0);
  EXPECT_NE(err.find("missing.safetensors"), std::string::npos) << err;
}

}  // namespace
}  // namespace mlakv
