// The whole-model runner (include/mlakv/model.h) against transformers.
//
// tests/data/model_parity/<name>/ holds a tiny checkpoint written by transformers'
// save_pretrained (one dense layer, one MoE layer; bf16 or f16 weights) and the logits
// transformers computes for 12 tokens in float32 (logits_f32) and float64 (logits_f64);
// tools/make_model_parity_fixtures.py made them.
//
// Tolerance (derived, not tuned): the checkpoint's 16-bit weights widen exactly to
// float32, so mlakv and transformers-float32 run the same network on the same numbers
// and differ only in float32 rounding and summation order (mlakv: lane-blocked FMA
// sums, float64 norm and softmax statistics; torch: its own blocking). Each therefore
// lands within a distance of the same order from the float64 result; the test allows
// mlakv 4 e_ref, e_ref = max |logits_f32 - logits_f64| being transformers' own float32
// cost on that model (the same rule as the MLA layer's parity test, with a factor 4 for
// the two layers and the MoE sum instead of 2 for one layer). A routing decision that
// differed would move logits by O(0.1), far outside it.
//
// The float32 reference cache is exact (no record rounding), so it is what is compared;
// the paged formats are checked for chunking invariance (bit for bit) and for their
// deviation from the reference being ordered by the formats' precision.
#include "mlakv/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mlakv/outer_scales.h"
#include "mlakv/safetensors.h"

namespace mlakv {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return std::string(MLAKV_TEST_DATA_DIR) + "/model_parity/" + name; }

struct Expected {
  std::vector<int32_t> tokens;
  std::vector<float> logits32;
  std::vector<double> logits64;
  std::vector<double> kv_max;
  double e_ref = 0;
};

Expected load_expected(const std::string& name) {
  Expected e;
  auto f = SafetensorsFile::open(fixture(name) + "/expected.safetensors");
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (!f.ok()) return e;
  const auto tok = (*f)->find("tokens");
  const auto l32 = (*f)->find("logits_f32");
  const auto l64 = (*f)->find("logits_f64");
  const auto kv = (*f)->find("kv_max_abs");
  e.tokens.assign(tok->ptr<const int32_t>(), tok->ptr<const int32_t>() + tok->numel());
  e.logits32.assign(l32->ptr<const float>(), l32->ptr<const float>() + l32->numel());
  e.logits64.assign(l64->ptr<const double>(), l64->ptr<const double>() + l64->numel());
  e.kv_max.assign(kv->ptr<const double>(), kv->ptr<const double>() + kv->numel());
  for (std::size_t i = 0; i < e.logits32.size(); ++i) e.e_ref = std::max(e.e_ref, std::fabs(e.logits32[i] - e.logits64[i]));
  return e;
}

class ModelParity : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelParity, ReferenceCacheMatchesTransformers) {
  const std::string name = GetParam();
  const Expected e = load_expected(name);
  ASSERT_FALSE(e.tokens.empty());
  auto model = Model::load(fixture(name), {.threads = 2});
  ASSERT_TRUE(model.ok()) << model.status().message();
  Model& m = **model;
  const int V = m.vocab_size();
  const int64_t T = static_cast<int64_t>(e.tokens.size());
  ASSERT_EQ(static_cast<int64_t>(e.logits64.size()), T * V);

  // One prefill of all tokens, with the latent observer.
  auto ref = m.create_reference_cache();
  ASSERT_TRUE(ref.ok());
  const SeqId s = (*ref)->add_sequence();
  std::vector<float> logits(static_cast<std::size_t>(T * V));
  std::vector<double> kv_max(static_cast<std::size_t>(m.num_layers()), 0.0);
  ForwardOptions fo;
  fo.observer = [&](int layer, const TensorView& lat) {
    for (int64_t i = 0; i < lat.numel(); ++i)
      kv_max[static_cast<std::size_t>(layer)] =
          std::max(kv_max[static_cast<std::size_t>(layer)], static_cast<double>(std::fabs(lat.ptr<const float>()[i])));
  };
  ASSERT_TRUE(m.forward(**ref, s, e.tokens, TensorView::contiguous(logits.data(), DType::kF32, {T, V}), fo).ok());
  double err = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) err = std::max(err, std::fabs(logits[i] - e.logits64[i]));
  std::printf("[model parity] %-8s |mlakv-hf64| %.3e  |hf32-hf64| e_ref %.3e  (tolerance 4 e_ref)\n", name.c_str(),
              err, e.e_ref);
  EXPECT_LE(err, 4 * e.e_ref);
  if (const char* dump = std::getenv("MLAKV_DUMP_LOGITS")) {
    std::ofstream(std::string(dump) + "/" + name + ".f32", std::ios::binary)
        .write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
  }
  // max |kv_c_normed| per layer: the same 4 e_ref-style bound relative to the value
  // (these are O(1) numbers one norm away from the logits' arithmetic).
  for (std::size_t l = 0; l < kv_max.size(); ++l) {
    EXPECT_NEAR(kv_max[l], e.kv_max[l], 4 * e.e_ref * std::max(1.0, e.kv_max[l])) << "layer " << l;
  }

  // Chunked: 5 + 4 tokens of prefill, then 3 decode steps: bit-identical to the single
  // call (every output element's float32 operations do not depend on the chunking).
  const SeqId s2 = (*ref)->add_sequence();
  int64_t at = 0;
  for (int64_t n : {5, 4, 1, 1, 1}) {
    std::vector<float> part(static_cast<std::size_t>(n * V));
    ASSERT_TRUE(m.forward(**ref, s2, std::span<const int32_t>(e.tokens.data() + at, static_cast<std::size_t>(n)),
                          TensorView::contiguous(part.data(), DType::kF32, {n, V}))
                    .ok());
    for (int64_t i = 0; i < n * V; ++i)
      ASSERT_EQ(part[static_cast<std::size_t>(i)], logits[static_cast<std::size_t>(at * V + i)]) << "chunk at " << at;
    at += n;
  }
  // last_token_only gives the last row.
  const SeqId s3 = (*ref)->add_sequence();
  std::vector<float> last(static_cast<std::size_t>(V));
  fo.last_token_only = true;
  fo.observer = nullptr;
  ASSERT_TRUE(m.forward(**ref, s3, e.tokens, TensorView::contiguous(last.data(), DType::kF32, {1, V}), fo).ok());
  for (int v = 0; v < V; ++v) ASSERT_EQ(last[static_cast<std::size_t>(v)], logits[static_cast<std::size_t>((T - 1) * V + v)]);
}

TEST_P(ModelParity, PagedFormatsChunkInvariantAndOrdered) {
  const std::string name = GetParam();
  const Expected e = load_expected(name);
  auto model = Model::load(fixture(name), {.threads = 2});
  ASSERT_TRUE(model.ok()) << model.status().message();
  Model& m = **model;
  const int V = m.vocab_size();
  const int64_t T = static_cast<int64_t>(e.tokens.size());
  double prev = -1;
  for (KvFormat f : {KvFormat::kF32, KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla}) {
    auto cache = m.create_cache({LayerFormat{f, 1.0f}}, 64, 4);  // block 4: several blocks per sequence
    ASSERT_TRUE(cache.ok()) << cache.status().message();
    const SeqId a = (*cache)->add_sequence(), b = (*cache)->add_sequence();
    std::vector<float> one(static_cast<std::size_t>(T * V));
    ASSERT_TRUE(m.forward(**cache, a, e.tokens, TensorView::contiguous(one.data(), DType::kF32, {T, V})).ok());
    int64_t at = 0;
    for (int64_t n : {7, 1, 3, 1}) {
      std::vector<float> part(static_cast<std::size_t>(n * V));
      ASSERT_TRUE(m.forward(**cache, b, std::span<const int32_t>(e.tokens.data() + at, static_cast<std::size_t>(n)),
                            TensorView::contiguous(part.data(), DType::kF32, {n, V}))
                      .ok());
      for (int64_t i = 0; i < n * V; ++i)
        ASSERT_EQ(part[static_cast<std::size_t>(i)], one[static_cast<std::size_t>(at * V + i)])
            << format_name(f) << " chunk at " << at;
      at += n;
    }
    double dev = 0;
    for (std::size_t i = 0; i < one.size(); ++i) dev = std::max(dev, std::fabs(one[i] - e.logits64[i]));
    std::printf("[model parity] %-8s %-14s max |logit - hf64| %.3e\n", name.c_str(), std::string(format_name(f)).c_str(),
                dev);
    // f32 records hold the latent as computed: within transformers' own float32 error,
    // like the reference cache (the f32 paged cache is eval's reference). bf16 records
    // round each latent by <= 2^-9 relative, fp8 by <= 2^-4, nvfp4 by <= 1/4 of a group
    // step: the deviations must be ordered, and bf16's above the float32 noise (it is a
    // real rounding).
    EXPECT_GT(dev, prev) << format_name(f);
    if (f == KvFormat::kF32) {
      EXPECT_LE(dev, 4 * e.e_ref);
    }
    if (f == KvFormat::kBf16) {
      EXPECT_GT(dev, 4 * e.e_ref);
    }
    prev = dev;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelParity, ::testing::Values("v3_moe", "v2_moe"));

TEST(ModelLoad, ArchAndMemory) {
  auto model = Model::load(fixture("v3_moe"));
  ASSERT_TRUE(model.ok()) << model.status().message();
  const ModelArch& a = (*model)->arch();
  EXPECT_EQ(a.mla.model_type, "deepseek_v3");
  EXPECT_EQ(a.vocab_size, 96);
  EXPECT_EQ(a.moe_layer, (std::vector<bool>{false, true}));
  EXPECT_EQ(a.routing.num_experts, 8);
  EXPECT_EQ(a.routing.top_k, 3);
  EXPECT_EQ(a.routing.n_group, 4);
  EXPECT_EQ(a.routing.topk_group, 2);
  EXPECT_TRUE(a.routing.norm_topk_prob);
  EXPECT_EQ(a.routing.scoring, MoeScoring::kSigmoid);
  EXPECT_FALSE(a.tie_word_embeddings);
  // bf16 stays bf16: resident weights within 1.1x of the checkpoint file.
  const ModelMemory& mem = (*model)->memory();
  const auto file = fs::file_size(fixture("v3_moe") + "/model.safetensors");
  std::printf("[model memory] checkpoint file %ju B, used %zu B, mapped %zu B, owned f32 %zu B\n",
              static_cast<uintmax_t>(file), mem.checkpoint_bytes, mem.mapped_bytes, mem.dequantized_bytes);
  EXPECT_LE(static_cast<double>(mem.resident_bytes()), 1.1 * static_cast<double>(file));
  EXPECT_GE(mem.checkpoint_bytes, file * 9 / 10);  // every tensor counted

  auto v2 = Model::load(fixture("v2_moe"));
  ASSERT_TRUE(v2.ok()) << v2.status().message();
  EXPECT_TRUE((*v2)->arch().tie_word_embeddings);
  EXPECT_EQ((*v2)->arch().routing.method, MoeTopkMethod::kGroupLimitedGreedy);
  EXPECT_EQ((*v2)->config().q_lora_rank, 0);
}

}  // namespace
}  // namespace mlakv
