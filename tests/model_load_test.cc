// Model loading: the other model types over the same weights, the fused expert layout,
// MTP tensors, and bad inputs (missing tensors, wrong shapes, configs the runner cannot
// run, bad forward arguments), each a Status naming the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "mlakv/model.h"
#include "mlakv/numerics.h"
#include "mlakv/safetensors.h"

namespace mlakv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fixture(const std::string& name) { return std::string(MLAKV_TEST_DATA_DIR) + "/model_parity/" + name; }

struct OwnedTensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
using Tensors = std::map<std::string, OwnedTensor>;

Tensors read_tensors(const std::string& path) {
  Tensors out;
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f.ok()) << f.status().message();
  for (const auto& info : (*f)->tensors()) {
    const auto v = (*f)->find(info.name);
    const auto* p = static_cast<const uint8_t*>(v->data);
    out[info.name] = OwnedTensor{info.dtype, info.shape, std::vector<uint8_t>(p, p + info.nbytes())};
  }
  return out;
}

TensorView view(const OwnedTensor& t) {
  TensorView v;
  v.data = const_cast<uint8_t*>(t.bytes.data());
  v.dtype = t.dtype;
  v.ndim = static_cast<int>(t.shape.size());
  int64_t stride = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.shape[static_cast<std::size_t>(d)] = t.shape[static_cast<std::size_t>(d)];
    v.strides[static_cast<std::size_t>(d)] = stride;
    stride *= t.shape[static_cast<std::size_t>(d)];
  }
  return v;
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

// A copy of fixture `name` in a fresh temporary directory, with its tensors and config
// edited by the callbacks.
class Variant {
 public:
  Variant(const std::string& name, const std::function<void(Tensors&)>& edit_tensors,
          const std::function<void(json&)>& edit_config) {
    dir_ = fs::temp_directory_path() /
           ("mlakv_model_" + name + "_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            std::to_string(counter_++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Tensors t = read_tensors(fixture(name) + "/model.safetensors");
    if (edit_tensors) edit_tensors(t);
    std::vector<std::pair<std::string, TensorView>> list;
    for (const auto& [n, v] : t) list.emplace_back(n, view(v));
    EXPECT_TRUE(write_safetensors((dir_ / "model.safetensors").string(), list).ok());
    json c = read_json(fixture(name) + "/config.json");
    if (edit_config) edit_config(c);
    std::ofstream(dir_ / "config.json") << c.dump(2);
  }
  ~Variant() { fs::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }

 private:
  fs::path dir_;
  static inline int counter_ = 0;
};

std::vector<float> run_logits(Model& m, const std::vector<int32_t>& tokens) {
  auto ref = m.create_reference_cache();
  EXPECT_TRUE(ref.ok());
  const SeqId s = (*ref)->add_sequence();
  const int64_t T = static_cast<int64_t>(tokens.size());
  std::vector<float> logits(static_cast<std::size_t>(T * m.vocab_size()));
  const Status st = m.forward(**ref, s, tokens, TensorView::contiguous(logits.data(), DType::kF32, {T, m.vocab_size()}));
  EXPECT_TRUE(st.ok()) << st.message();
  return logits;
}

const std::vector<int32_t> kTokens = {3, 17, 42, 5, 88, 1, 64, 29};

std::vector<float> baseline(const std::string& name) {
  auto m = Model::load(fixture(name));
  EXPECT_TRUE(m.ok()) << m.status().message();
  return run_logits(**m, kTokens);
}

void expect_error(const std::string& dir, StatusCode code, const std::vector<std::string>& needles) {
  auto m = Model::load(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), code) << m.status().message();
  for (const auto& n : needles) EXPECT_NE(m.status().message().find(n), std::string::npos) << m.status().message();
}

// The same weights under the other model types of the V3 architecture give the same
// network: bit-identical logits.
TEST(ModelLoad, OtherModelTypesSameNetwork) {
  const std::vector<float> want = baseline("v3_moe");
  for (const char* type : {"kimi_k2", "glm4_moe_lite", "deepseek_v32", "glm_moe_dsa"}) {
    Variant v("v3_moe", nullptr, [&](json& c) {
      c["model_type"] = type;
      c["mlp_layer_types"] = {"dense", "sparse"};
      if (std::string(type) == "deepseek_v32" || std::string(type) == "glm_moe_dsa") {
        c["index_topk"] = 4;  // the indexer's weights are absent: it is not run
        c["index_n_heads"] = 2;
        c["index_head_dim"] = 16;
      }
    });
    auto m = Model::load(v.dir());
    ASSERT_TRUE(m.ok()) << type << ": " << m.status().message();
    EXPECT_EQ(run_logits(**m, kTokens), want) << type;
    const bool dsa = std::string(type) == "deepseek_v32" || std::string(type) == "glm_moe_dsa";
    EXPECT_EQ((*m)->dense_beyond_topk(), dsa) << type;  // 8 tokens > index_topk 4
    bool noted = false;
    for (const auto& n : (*m)->notes()) noted |= n.find("index_topk = 4") != std::string::npos;
    EXPECT_EQ(noted, dsa) << type;
  }
}

// transformers' in-memory fused layout (experts.gate_up_proj [E, 2I, D],
// experts.down_proj [E, D, I]) holds the same numbers: bit-identical logits.
TEST(ModelLoad, FusedExpertLayout) {
  const std::vector<float> want = baseline("v3_moe");
  Variant v("v3_moe",
            [](Tensors& t) {
              const std::string p = "model.layers.1.mlp.experts.";
              OwnedTensor gu{DType::kBF16, {8, 32, 32}, {}}, dn{DType::kBF16, {8, 32, 16}, {}};
              for (int e = 0; e < 8; ++e) {
                const std::string q = p + std::to_string(e) + ".";
                for (const char* part : {"gate_proj", "up_proj"}) {
                  const auto& w = t.at(q + part + ".weight").bytes;
                  gu.bytes.insert(gu.bytes.end(), w.begin(), w.end());
                  t.erase(q + part + ".weight");
                }
                const auto& d = t.at(q + "down_proj.weight").bytes;
                dn.bytes.insert(dn.bytes.end(), d.begin(), d.end());
                t.erase(q + "down_proj.weight");
              }
              t[p + "gate_up_proj"] = gu;
              t[p + "down_proj"] = dn;
            },
            nullptr);
  auto m = Model::load(v.dir());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(run_logits(**m, kTokens), want);
}

// An MTP layer (model.layers.<num_hidden_layers>.*) is recognised, noted and not loaded.
TEST(ModelLoad, MtpLayerSkipped) {
  const std::vector<float> want = baseline("v3_moe");
  Variant v("v3_moe",
            [](Tensors& t) {
              Tensors extra;
              for (const auto& [n, x] : t) {
                if (n.rfind("model.layers.1.", 0) == 0) extra["model.layers.2." + n.substr(15)] = x;
              }
              extra["model.layers.2.eh_proj.weight"] = OwnedTensor{DType::kBF16, {32, 64}, std::vector<uint8_t>(4096)};
              t.insert(extra.begin(), extra.end());
            },
            [](json& c) { c["num_nextn_predict_layers"] = 1; });
  auto m = Model::load(v.dir());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(run_logits(**m, kTokens), want);
  bool noted = false;
  for (const auto& n : (*m)->notes()) noted |= n.find("MTP") != std::string::npos;
  EXPECT_TRUE(noted);
  EXPECT_EQ((*m)->num_layers(), 2);
}

// A DeepSeek fp8-block kv_b_proj and expert (e4m3 codes + weight_scale_inv) is
// dequantized at load to float32; the same values stored as a float32 checkpoint give
// bit-identical logits, and the memory report counts the owned copy.
TEST(ModelLoad, Fp8BlockWeightsDequantized) {
  // fp8 codes from the bf16 weights: q = e4m3(w / s) with one scale per 128x128 block.
  std::map<std::string, std::vector<float>> dequant;  // name -> q * s, exact in f32
  const auto quantize = [&](Tensors& t, bool as_fp8) {
    for (const char* base : {"model.layers.0.self_attn.kv_b_proj", "model.layers.1.mlp.experts.3.down_proj"}) {
      OwnedTensor& w = t.at(std::string(base) + ".weight");
      const int64_t N = w.shape[0], K = w.shape[1];
      const int64_t bn = (N + 127) / 128, bk = (K + 127) / 128;
      std::vector<float> vals(static_cast<std::size_t>(N * K));
      for (int64_t i = 0; i < N * K; ++i) {
        uint16_t h;
        std::memcpy(&h, w.bytes.data() + 2 * i, 2);
        vals[static_cast<std::size_t>(i)] = bf16_to_f32(h);
      }
      std::vector<float> scale(static_cast<std::size_t>(bn * bk), 0.0f);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          float& s = scale[static_cast<std::size_t>((n / 128) * bk + k / 128)];
          s = std::max(s, std::fabs(vals[static_cast<std::size_t>(n * K + k)]) / 448.0f);
        }
      for (float& s : scale) s = std::ldexp(1.0f, static_cast<int>(std::ceil(std::log2(s))));  // powers of 2: q*s exact
      OwnedTensor q{DType::kF8E4M3, {N, K}, std::vector<uint8_t>(static_cast<std::size_t>(N * K))};
      std::vector<float> deq(static_cast<std::size_t>(N * K));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const float s = scale[static_cast<std::size_t>((n / 128) * bk + k / 128)];
          const uint8_t c = f32_to_e4m3_satfinite(vals[static_cast<std::size_t>(n * K + k)] / s);
          q.bytes[static_cast<std::size_t>(n * K + k)] = c;
          deq[static_cast<std::size_t>(n * K + k)] = e4m3_to_f32(c) * s;
        }
      if (as_fp8) {
        w = q;
        OwnedTensor st{DType::kF32, {bn, bk}, std::vector<uint8_t>(scale.size() * 4)};
        std::memcpy(st.bytes.data(), scale.data(), st.bytes.size());
        t[std::string(base) + ".weight_scale_inv"] = st;
      } else {
        w = OwnedTensor{DType::kF32, {N, K}, std::vector<uint8_t>(deq.size() * 4)};
        std::memcpy(w.bytes.data(), deq.data(), w.bytes.size());
      }
    }
  };
  Variant fp8("v3_moe", [&](Tensors& t) { quantize(t, true); }, nullptr);
  Variant f32("v3_moe", [&](Tensors& t) { quantize(t, false); }, nullptr);
  auto a = Model::load(fp8.dir());
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = Model::load(f32.dir());
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(run_logits(**a, kTokens), run_logits(**b, kTokens));
  // Owned f32 copies: kv_b_proj [64, 512] and one expert's down_proj [32, 16].
  EXPECT_GE((*a)->memory().dequantized_bytes, (64 * 512 + 32 * 16) * 4u);
  bool noted = false;
  for (const auto& n : (*a)->notes()) noted |= n.find("fp8_block") != std::string::npos;
  EXPECT_TRUE(noted);
}

// A sharded checkpoint (model.safetensors.index.json + 2 shards, a layer split across
// them) is the same model.
TEST(ModelLoad, ShardedCheckpoint) {
  const std::vector<float> want = baseline("v3_moe");
  const fs::path dir = fs::temp_directory_path() / ("mlakv_model_sharded_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const Tensors t = read_tensors(fixture("v3_moe") + "/model.safetensors");
  std::vector<std::pair<std::string, TensorView>> a, b;
  json index;
  int i = 0;
  for (const auto& [n, x] : t) {
    const bool first = (i++ % 2) == 0;
    (first ? a : b).emplace_back(n, view(x));
    index["weight_map"][n] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  ASSERT_TRUE(write_safetensors((dir / "model-00001-of-00002.safetensors").string(), a).ok());
  ASSERT_TRUE(write_safetensors((dir / "model-00002-of-00002.safetensors").string(), b).ok());
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  fs::copy_file(fixture("v3_moe") + "/config.json", dir / "config.json");
  auto m = Model::load(dir.string());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(run_logits(**m, kTokens), want);
  fs::remove_all(dir);
}

// Absent keys take the transformers 5.17 config-class defaults (printed from the
// installed wheel: DeepseekV2Config(), DeepseekV3Config(), Glm4MoeLiteConfig(),
// GlmMoeDsaConfig()).
TEST(ModelArch, TypeDefaults) {
  const std::string geo = R"("hidden_size": 64, "num_hidden_layers": 5, "num_attention_heads": 2,
      "kv_lora_rank": 512, "qk_nope_head_dim": 16, "qk_rope_head_dim": 64)";
  struct Want {
    const char* type;
    int vocab, inter, moe_inter, experts, shared, top_k, n_group, topk_group;
    bool norm;
    double scale;
    std::vector<bool> moe;
  };
  const std::vector<Want> wants = {
      {"deepseek_v3", 129280, 18432, 2048, 256, 1, 8, 8, 4, true, 2.5, {false, false, false, true, true}},
      {"glm4_moe_lite", 154880, 10240, 1536, 64, 1, 4, 1, 1, true, 1.8, {false, true, true, true, true}},
      {"glm_moe_dsa", 154880, 12288, 2048, 256, 1, 8, 1, 1, true, 2.5, {false, false, false, true, true}},
  };
  for (const Want& w : wants) {
    const std::string extra = std::string(w.type) == "glm_moe_dsa" ? R"(, "index_n_heads": 2, "index_head_dim": 16)" : "";
    auto a = parse_model_arch("{\"model_type\": \"" + std::string(w.type) + "\", " + geo + extra + "}", "cfg");
    ASSERT_TRUE(a.ok()) << w.type << ": " << a.status().message();
    EXPECT_EQ(a->vocab_size, w.vocab) << w.type;
    EXPECT_EQ(a->intermediate_size, w.inter) << w.type;
    EXPECT_EQ(a->moe_intermediate_size, w.moe_inter) << w.type;
    EXPECT_EQ(a->routing.num_experts, w.experts) << w.type;
    EXPECT_EQ(a->n_shared_experts, w.shared) << w.type;
    EXPECT_EQ(a->routing.top_k, w.top_k) << w.type;
    EXPECT_EQ(a->routing.n_group, w.n_group) << w.type;
    EXPECT_EQ(a->routing.topk_group, w.topk_group) << w.type;
    EXPECT_EQ(a->routing.norm_topk_prob, w.norm) << w.type;
    EXPECT_EQ(a->routing.routed_scaling_factor, w.scale) << w.type;
    EXPECT_EQ(a->moe_layer, w.moe) << w.type;
    EXPECT_EQ(a->routing.scoring, MoeScoring::kSigmoid) << w.type;
  }
  // deepseek_v2 has no default num_experts_per_tok (None): a MoE config must give it.
  auto v2 = parse_model_arch("{\"model_type\": \"deepseek_v2\", \"q_lora_rank\": null, " + geo + "}", "cfg");
  ASSERT_FALSE(v2.ok());
  EXPECT_NE(v2.status().message().find("num_experts_per_tok"), std::string::npos) << v2.status().message();
  v2 = parse_model_arch(
      "{\"model_type\": \"deepseek_v2\", \"q_lora_rank\": null, \"num_experts_per_tok\": 6, " + geo + "}", "cfg");
  ASSERT_TRUE(v2.ok()) << v2.status().message();
  EXPECT_EQ(v2->routing.scoring, MoeScoring::kSoftmax);
  EXPECT_EQ(v2->routing.method, MoeTopkMethod::kGreedy);
  EXPECT_EQ(v2->routing.num_experts, 64);
  EXPECT_EQ(v2->n_shared_experts, 2);
  EXPECT_EQ(v2->moe_layer, (std::vector<bool>{true, true, true, true, true}));  // first_k_dense_replace 0
  EXPECT_FALSE(v2->routing.norm_topk_prob);
}

TEST(ModelLoad, MissingTensorsAreNamed) {
  for (const char* name : {"model.layers.1.mlp.experts.5.up_proj.weight", "model.layers.0.self_attn.kv_b_proj.weight",
                           "model.layers.1.mlp.gate.e_score_correction_bias", "lm_head.weight", "model.norm.weight",
                           "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight"}) {
    Variant v("v3_moe", [&](Tensors& t) { ASSERT_EQ(t.erase(name), 1u) << name; }, nullptr);
    auto m = Model::load(v.dir());
    ASSERT_FALSE(m.ok()) << name;
    EXPECT_EQ(m.status().code(), StatusCode::kNotFound) << m.status().message();
    // The message names the tensor (its prefix for linear weights).
    const std::string n(name);
    const std::string stem = n.substr(0, n.rfind(".weight") == std::string::npos ? n.size() : n.rfind(".weight"));
    EXPECT_NE(m.status().message().find(stem), std::string::npos) << m.status().message();
  }
}

TEST(ModelLoad, WrongShapesAreNamed) {
  {
    Variant v("v3_moe", [](Tensors& t) { t.at("model.layers.1.mlp.experts.2.down_proj.weight").shape = {16, 32}; },
              nullptr);
    expect_error(v.dir(), StatusCode::kInvalidArgument,
                 {"model.layers.1.mlp.experts.2.down_proj.weight", "[32, 16]", "[16, 32]"});
  }
  {
    Variant v("v3_moe", nullptr, [](json& c) { c["vocab_size"] = 97; });
    expect_error(v.dir(), StatusCode::kInvalidArgument, {"model.embed_tokens.weight", "[97, 32]"});
  }
  {
    Variant v("v3_moe", nullptr, [](json& c) { c["moe_intermediate_size"] = 8; });
    expect_error(v.dir(), StatusCode::kInvalidArgument, {"experts.0.gate_proj.weight", "[8, 32]"});
  }
  {
    Variant v("v3_moe", [](Tensors& t) { t.at("model.norm.weight").shape = {16, 2}; }, nullptr);
    expect_error(v.dir(), StatusCode::kInvalidArgument, {"model.norm.weight", "[32]"});
  }
}

TEST(ModelLoad, ConfigsTheRunnerCannotRun) {
  struct Case {
    std::function<void(json&)> edit;
    StatusCode code;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {[](json& c) { c["model_type"] = "minicpm3"; }, StatusCode::kUnimplemented, "minicpm3"},
      {[](json& c) { c["hidden_act"] = "gelu"; }, StatusCode::kUnimplemented, "hidden_act 'gelu'"},
      {[](json& c) { c["scoring_func"] = "softmax"; }, StatusCode::kUnimplemented, "scoring_func"},
      {[](json& c) { c["topk_method"] = "greedy"; }, StatusCode::kUnimplemented, "topk_method"},
      {[](json& c) { c["moe_layer_freq"] = 2; }, StatusCode::kUnimplemented, "moe_layer_freq"},
      {[](json& c) { c["n_group"] = 3; }, StatusCode::kInvalidArgument, "n_group"},
      {[](json& c) { c["num_experts_per_tok"] = 9; }, StatusCode::kInvalidArgument, "num_experts_per_tok"},
      {[](json& c) { c["vocab_size"] = "many"; }, StatusCode::kInvalidArgument, "vocab_size"},
      {[](json& c) { c.erase("kv_lora_rank"); }, StatusCode::kInvalidArgument, "kv_lora_rank"},
  };
  for (const Case& k : cases) {
    Variant v("v3_moe", nullptr, k.edit);
    auto m = Model::load(v.dir());
    ASSERT_FALSE(m.ok()) << k.needle;
    EXPECT_EQ(m.status().code(), k.code) << m.status().message();
    EXPECT_NE(m.status().message().find(k.needle), std::string::npos) << m.status().message();
  }
  auto none = Model::load("/nonexistent/model/dir");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
}

TEST(ModelForward, BadArgumentsChangeNothing) {
  auto mo = Model::load(fixture("v3_moe"));
  ASSERT_TRUE(mo.ok());
  Model& m = **mo;
  const int V = m.vocab_size();
  auto cache = m.create_cache({LayerFormat{}}, 16, 4);
  ASSERT_TRUE(cache.ok());
  const SeqId s = (*cache)->add_sequence();
  std::vector<float> logits(static_cast<std::size_t>(4 * V));
  const auto lv = [&](int64_t rows) { return TensorView::contiguous(logits.data(), DType::kF32, {rows, V}); };
  const std::vector<int32_t> bad_tok = {1, 2, 96};
  Status st = m.forward(**cache, s, bad_tok, lv(3));
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("token 96 at index 2"), std::string::npos) << st.message();
  st = m.forward(**cache, s, std::vector<int32_t>{1, 2}, lv(3));
  EXPECT_NE(st.message().find("logits"), std::string::npos) << st.message();
  st = m.forward(**cache, s, std::vector<int32_t>{}, lv(1));
  EXPECT_NE(st.message().find("no tokens"), std::string::npos) << st.message();
  st = m.forward(**cache, s + 7, std::vector<int32_t>{1}, lv(1));
  EXPECT_FALSE(st.ok());
  // More tokens than the cache holds (16): resource_exhausted, nothing appended.
  std::vector<int32_t> many(17, 1);
  std::vector<float> big(static_cast<std::size_t>(17 * V));
  st = m.forward(**cache, s, many, TensorView::contiguous(big.data(), DType::kF32, {17, V}));
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.message();
  EXPECT_EQ(*(*cache)->blocks().length(s), 0);
  // A cache with the wrong number of layers.
  KvCache::Config kc;
  kc.num_layers = 3;
  kc.num_blocks = 4;
  kc.block_size = 4;
  auto other = PagedKvCache::create_cpu(kc);
  ASSERT_TRUE(other.ok());
  const SeqId o = (*other)->add_sequence();
  st = m.forward(**other, o, std::vector<int32_t>{1}, lv(1));
  EXPECT_NE(st.message().find("3 layers"), std::string::npos) << st.message();
  EXPECT_EQ(*(*other)->blocks().length(o), 0);
  // Bad cache formats list.
  EXPECT_FALSE(m.create_cache({LayerFormat{}, LayerFormat{}, LayerFormat{}}, 16).ok());
  EXPECT_FALSE(m.create_cache({LayerFormat{}}, 0).ok());
  // Reference cache: unknown sequence.
  auto ref = m.create_reference_cache();
  ASSERT_TRUE(ref.ok());
  st = m.forward(**ref, 42, std::vector<int32_t>{1}, lv(1));
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.message();
}

}  // namespace
}  // namespace mlakv
