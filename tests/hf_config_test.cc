// config.json reader. The configs below are modelled on the published ones (DeepSeek-V3,
// DeepSeek-V2-Lite, Kimi K2, GLM-5, MiniCPM3-4B), each in both conventions: the
// original `rope_theta` + `rope_scaling`, and transformers 5's `rope_parameters`.
// Expected values are the published geometry and hand-computed scales:
//   softmax_scale = (P+R)^-0.5 * (0.1 * mscale_all_dim * ln(factor) + 1)^2
//   DeepSeek-V3  192^-0.5 * (1 + 0.1 ln 40)^2        = 0.135234 (published)
//   Kimi K2      192^-0.5 * (1 + 0.1 ln 32)^2        = 0.130861 (published)
//   GLM-5        256^-0.5                             = 0.0625   (published)
//   V2-Lite      192^-0.5 * (1 + 0.0707 ln 40)^2      = 0.1147214
//   MiniCPM3     96^-0.5                              = 0.1020621
#include "mlakv/hf_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace mlakv {
namespace {

constexpr const char* kSource = "/models/x/config.json";

ModelConfig parse_ok(const std::string& text) {
  auto c = parse_hf_config(text, kSource);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (!c.ok()) return ModelConfig{};
  return *c;
}

// Parsing must fail with `code`; the message must name the file and each of `mentions`.
void expect_error(const std::string& text, StatusCode code, const std::vector<std::string>& mentions) {
  auto c = parse_hf_config(text, kSource);
  ASSERT_FALSE(c.ok()) << "accepted: " << text;
  EXPECT_EQ(c.status().code(), code) << c.status().to_string();
  EXPECT_NE(c.status().message().find(kSource), std::string::npos) << c.status().to_string();
  for (const std::string& m : mentions) {
    EXPECT_NE(c.status().message().find(m), std::string::npos) << "missing '" << m << "' in " << c.status().to_string();
  }
}

// ---- published configs ---------------------------------------------------------------

const char* kDeepSeekV3Legacy = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 3, "hidden_act": "silu",
  "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
  "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": false,
  "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "transformers_version": "4.33.1",
  "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})";

// As transformers 5 saves it: rope_theta moved into rope_parameters, rope_type added.
const char* kDeepSeekV3Tf5 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "dtype": "bfloat16", "first_k_dense_replace": 3,
  "hidden_size": 7168, "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
  "num_attention_heads": 128, "num_hidden_layers": 61, "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06, "rope_interleave": true,
  "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                      "original_max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_type": "yarn",
                      "type": "yarn"},
  "transformers_version": "5.23.0", "v_head_dim": 128, "vocab_size": 129280})";

void expect_deepseek_v3(const ModelConfig& c) {
  EXPECT_EQ(c.name, kSource);
  EXPECT_EQ(c.model_type, "deepseek_v3");
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_layers, 61);
  EXPECT_EQ(c.num_mtp_layers, 1);
  EXPECT_EQ(c.cache_layers(), 62);
  EXPECT_EQ(c.num_heads, 128);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.kv_norm_eps, 1e-6);
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.rope.scaling, RopeScaling::kYarn);
  EXPECT_EQ(c.rope.factor, 40.0);
  EXPECT_EQ(c.rope.original_max_position, 4096);
  EXPECT_EQ(c.rope.beta_fast, 32.0);
  EXPECT_EQ(c.rope.beta_slow, 1.0);
  EXPECT_EQ(c.rope.mscale, 1.0);
  EXPECT_EQ(c.rope.mscale_all_dim, 1.0);
  EXPECT_EQ(c.rope.attention_factor, 1.0);  // get_mscale(40, 1) / get_mscale(40, 1)
  EXPECT_TRUE(c.rope.interleaved);
  EXPECT_EQ(c.indexer_layers, 0);
  EXPECT_NEAR(c.softmax_scale(), 0.135234, 1e-6);
}

TEST(HfConfigTest, DeepSeekV3BothConventions) {
  expect_deepseek_v3(parse_ok(kDeepSeekV3Legacy));
  expect_deepseek_v3(parse_ok(kDeepSeekV3Tf5));
}

const char* kDeepSeekV2Lite = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false, "aux_loss_alpha": 0.001,
  "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
  "hidden_size": 2048, "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
  "model_type": "deepseek_v2", "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
  "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
  "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000, "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 102400})";

const char* kDeepSeekV2LiteTf5 = R"({
  "hidden_size": 2048, "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
  "num_attention_heads": 16, "num_hidden_layers": 27, "q_lora_rank": null, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "v_head_dim": 128,
  "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 40.0, "mscale": 0.707, "mscale_all_dim": 0.707,
                      "original_max_position_embeddings": 4096, "rope_theta": 10000, "rope_type": "yarn"}})";

TEST(HfConfigTest, DeepSeekV2LiteBothConventions) {
  for (const char* text : {kDeepSeekV2Lite, kDeepSeekV2LiteTf5}) {
    const ModelConfig c = parse_ok(text);
    EXPECT_EQ(c.model_type, "deepseek_v2");
    EXPECT_EQ(c.hidden_size, 2048);
    EXPECT_EQ(c.num_layers, 27);
    EXPECT_EQ(c.num_mtp_layers, 0);
    EXPECT_EQ(c.num_heads, 16);
    EXPECT_EQ(c.q_lora_rank, 0);  // null: plain q_proj
    EXPECT_EQ(c.kv_lora_rank, 512);
    EXPECT_EQ(c.qk_nope_head_dim, 128);
    EXPECT_EQ(c.qk_rope_head_dim, 64);
    EXPECT_EQ(c.v_head_dim, 128);
    EXPECT_EQ(c.rope.scaling, RopeScaling::kYarn);
    EXPECT_EQ(c.rope.mscale, 0.707);
    EXPECT_EQ(c.rope.mscale_all_dim, 0.707);
    EXPECT_EQ(c.rope.attention_factor, 1.0);
    EXPECT_TRUE(c.rope.interleaved);
    EXPECT_NEAR(c.softmax_scale(), 0.1147214, 1e-6);
  }
}

const char* kKimiK2 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "bos_token_id": 163584,
  "eos_token_id": 163585, "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 7168,
  "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 131072, "model_type": "kimi_k2",
  "moe_intermediate_size": 2048, "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1,
  "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 64,
  "num_nextn_predict_layers": 0, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "topk_method": "noaux_tc", "v_head_dim": 128,
  "vocab_size": 163840})";

const char* kKimiK2Tf5 = R"({
  "hidden_size": 7168, "kv_lora_rank": 512, "max_position_embeddings": 131072, "model_type": "kimi_k2",
  "num_attention_heads": 64, "num_hidden_layers": 61, "num_nextn_predict_layers": 0, "q_lora_rank": 1536,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "v_head_dim": 128,
  "rope_parameters": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                      "original_max_position_embeddings": 4096, "rope_theta": 50000.0, "rope_type": "yarn"}})";

void expect_kimi_k2(const ModelConfig& c) {
  EXPECT_EQ(c.model_type, "kimi_k2");
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_layers, 61);
  EXPECT_EQ(c.num_mtp_layers, 0);
  EXPECT_EQ(c.num_heads, 64);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.rope.theta, 50000.0);
  EXPECT_EQ(c.rope.factor, 32.0);
  EXPECT_EQ(c.rope.beta_fast, 1.0);
  EXPECT_EQ(c.rope.beta_slow, 1.0);
  EXPECT_EQ(c.rope.attention_factor, 1.0);
  EXPECT_TRUE(c.rope.interleaved);
  EXPECT_NEAR(c.softmax_scale(), 0.130861, 1e-6);
}

TEST(HfConfigTest, KimiK2BothConventions) {
  expect_kimi_k2(parse_ok(kKimiK2));
  expect_kimi_k2(parse_ok(kKimiK2Tf5));
}

TEST(HfConfigTest, KimiK25WrapperReadsTextConfig) {
  const std::string text = std::string(R"({"model_type": "kimi_k25", "vision_config": {"hidden_size": 1152},
                                           "text_config": )") +
                           kKimiK2 + "}";
  expect_kimi_k2(parse_ok(text));
  // Errors inside the wrapper name the nested field.
  expect_error(R"({"model_type": "kimi_k25", "text_config": {"model_type": "kimi_k2", "kv_lora_rank": 512,
                   "hidden_size": "7168"}})",
               StatusCode::kInvalidArgument, {"'text_config.hidden_size'", "\"7168\""});
}

// GLM-5 as published (transformers 5 natively): rope_parameters with rope_type default.
const char* kGlm5 = R"({
  "architectures": ["GlmMoeDsaForCausalLM"], "attention_bias": false, "dtype": "bfloat16",
  "first_k_dense_replace": 3, "head_dim": 64, "hidden_act": "silu", "hidden_size": 6144,
  "index_head_dim": 128, "index_n_heads": 32, "index_topk": 2048, "intermediate_size": 12288,
  "kv_lora_rank": 512, "max_position_embeddings": 202752, "model_type": "glm_moe_dsa",
  "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "num_attention_heads": 64,
  "num_experts_per_tok": 8, "num_hidden_layers": 78, "num_key_value_heads": 64, "num_nextn_predict_layers": 1,
  "q_lora_rank": 2048, "qk_head_dim": 256, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-05, "rope_interleave": true, "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
  "routed_scaling_factor": 2.5, "transformers_version": "5.0.2.dev0", "v_head_dim": 256, "vocab_size": 154880})";

const char* kGlm5Legacy = R"({
  "hidden_size": 6144, "index_head_dim": 128, "index_n_heads": 32, "index_topk": 2048, "kv_lora_rank": 512,
  "max_position_embeddings": 202752, "model_type": "glm_moe_dsa", "num_attention_heads": 64,
  "num_hidden_layers": 78, "num_nextn_predict_layers": 1, "q_lora_rank": 2048, "qk_nope_head_dim": 192,
  "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 1000000,
  "v_head_dim": 256})";

TEST(HfConfigTest, Glm5BothConventions) {
  for (const char* text : {kGlm5, kGlm5Legacy}) {
    const ModelConfig c = parse_ok(text);
    EXPECT_EQ(c.model_type, "glm_moe_dsa");
    EXPECT_EQ(c.hidden_size, 6144);
    EXPECT_EQ(c.num_layers, 78);
    EXPECT_EQ(c.num_mtp_layers, 1);
    EXPECT_EQ(c.num_heads, 64);
    EXPECT_EQ(c.q_lora_rank, 2048);
    EXPECT_EQ(c.kv_lora_rank, 512);
    EXPECT_EQ(c.qk_nope_head_dim, 192);
    EXPECT_EQ(c.qk_rope_head_dim, 64);
    EXPECT_EQ(c.v_head_dim, 256);
    EXPECT_EQ(c.rms_norm_eps, 1e-5);
    EXPECT_EQ(c.kv_norm_eps, 1e-6);  // transformers: RMSNorm class default, not rms_norm_eps
    EXPECT_EQ(c.rope.theta, 1e6);
    EXPECT_EQ(c.rope.scaling, RopeScaling::kNone);
    EXPECT_TRUE(c.rope.interleaved);
    EXPECT_EQ(c.index_topk, 2048);
    EXPECT_EQ(c.index_n_heads, 32);
    EXPECT_EQ(c.index_head_dim, 128);
    EXPECT_EQ(c.indexer_layers, 79);  // every layer runs the indexer, plus the MTP layer
    EXPECT_NEAR(c.softmax_scale(), 0.0625, 1e-6);
  }
}

TEST(HfConfigTest, Glm52IndexerSchedules) {
  std::string base = kGlm5;
  base.pop_back();  // drop the closing brace
  // index_topk_freq 4, offset 2 (default): full layers i = 0 and i = 1 + 4k (k = 0..19) -> 21, + MTP = 22.
  EXPECT_EQ(parse_ok(base + R"(, "index_topk_freq": 4})").indexer_layers, 22);
  // offset 0, freq 3: i + 1 divisible by 3 -> i = 2, 5, ..., 77 -> 26, + MTP = 27.
  EXPECT_EQ(parse_ok(base + R"(, "index_topk_freq": 3, "index_skip_topk_offset": 0})").indexer_layers, 27);
  // An explicit pattern: F, then S x 76, then F -> 2 full, + MTP = 3.
  EXPECT_EQ(parse_ok(base + R"(, "index_topk_pattern": "F)" + std::string(76, 'S') + R"(F"})").indexer_layers, 3);
  std::string types = R"(, "indexer_types": ["full")";
  for (int i = 1; i < 78; ++i) types += i % 2 == 0 ? R"(, "full")" : R"(, "shared")";
  EXPECT_EQ(parse_ok(base + types + "]}").indexer_layers, 39 + 1);
  expect_error(base + R"(, "indexer_types": ["full", "shared"]})", StatusCode::kInvalidArgument,
               {"'indexer_types'", "78"});
  expect_error(base + R"(, "index_topk_pattern": "FX"})", StatusCode::kInvalidArgument, {"'index_topk_pattern'"});
}

TEST(HfConfigTest, DeepSeekV32HasAnIndexerOnEveryLayer) {
  std::string text = kDeepSeekV3Legacy;
  text.replace(text.find("deepseek_v3"), 11, "deepseek_v32");
  const ModelConfig c = parse_ok(text);
  EXPECT_EQ(c.index_topk, 2048);     // DeepseekV32Config defaults
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.indexer_layers, 62);
  EXPECT_NEAR(c.softmax_scale(), 0.135234, 1e-6);
}

// MiniCPM3-4B: longrope with 16 factors (R/2), no v_head_dim, no rope_theta.
std::string minicpm3(const std::string& rope_key, const std::string& extra) {
  return R"({"architectures": ["MiniCPM3ForCausalLM"], "bos_token_id": 1, "eos_token_id": [2, 73440],
    "hidden_act": "silu", "hidden_size": 2560, "num_hidden_layers": 62, "intermediate_size": 6400,
    "max_position_embeddings": 32768, "num_attention_heads": 40, "num_key_value_heads": 40,
    "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "q_lora_rank": 768, "kv_lora_rank": 256,
    "rms_norm_eps": 1e-05, "scale_emb": 12, "dim_model_base": 256, "scale_depth": 1.4, "model_type": "minicpm3",
    ")" + rope_key + R"(": {)" + extra + R"(
      "long_factor": [1.0591234137867171, 1.1241891283591912, 1.2596935748670968, 1.5380380402321725,
                      2.093982484742214, 3.1446935650329037, 4.937952430962769, 7.524877415917719,
                      10.653927484064795, 13.873006911748349, 16.725602340736525, 19.04732429137549,
                      20.79338672048725, 22.034981005458005, 22.88624802957895, 23.46141508749498],
      "short_factor": [1.0591234137867171, 1.1241891283591912, 1.2596935748670968, 1.5380380402321725,
                       2.093982484742214, 3.1446935650329037, 4.937952430962769, 7.524877415917719,
                       10.653927484064795, 13.873006911748349, 16.725602340736525, 19.04732429137549,
                       20.79338672048725, 22.034981005458005, 22.88624802957895, 23.46141508749498],
      "original_max_position_embeddings": 32768}})";
}

TEST(HfConfigTest, MiniCPM3BothConventions) {
  for (const std::string& text : {minicpm3("rope_scaling", R"("type": "longrope",)"),
                                  minicpm3("rope_parameters", R"("rope_type": "longrope", "rope_theta": 10000.0,)")}) {
    const ModelConfig c = parse_ok(text);
    EXPECT_EQ(c.model_type, "minicpm3");
    EXPECT_EQ(c.hidden_size, 2560);
    EXPECT_EQ(c.num_layers, 62);
    EXPECT_EQ(c.num_mtp_layers, 0);
    EXPECT_EQ(c.num_heads, 40);
    EXPECT_EQ(c.q_lora_rank, 768);
    EXPECT_EQ(c.kv_lora_rank, 256);
    EXPECT_EQ(c.qk_nope_head_dim, 64);
    EXPECT_EQ(c.qk_rope_head_dim, 32);
    EXPECT_EQ(c.v_head_dim, 64);  // 2560 / 40
    EXPECT_EQ(c.rms_norm_eps, 1e-5);
    EXPECT_EQ(c.rope.theta, 10000.0);
    EXPECT_EQ(c.rope.scaling, RopeScaling::kLongRope);
    EXPECT_EQ(c.rope.original_max_position, 32768);
    EXPECT_EQ(c.rope.factor, 1.0);  // implied: 32768 / 32768
    EXPECT_EQ(c.rope.attention_factor, 1.0);
    ASSERT_EQ(c.rope.long_factor.size(), 16u);
    ASSERT_EQ(c.rope.short_factor.size(), 16u);
    EXPECT_EQ(c.rope.long_factor[0], 1.0591234137867171);
    EXPECT_EQ(c.rope.long_factor[15], 23.46141508749498);
    EXPECT_FALSE(c.rope.interleaved);  // half-split rotation
    EXPECT_NEAR(c.softmax_scale(), 0.1020621, 1e-6);
  }
}

// ---- conventions -----------------------------------------------------------------------

// A minimal deepseek_v3 geometry; `rope` is spliced in as the last fields.
std::string small(const std::string& rope, const std::string& type = "deepseek_v3") {
  return R"({"model_type": ")" + type + R"(", "hidden_size": 1024, "num_hidden_layers": 2,
    "num_attention_heads": 8, "q_lora_rank": 256, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "max_position_embeddings": 16384)" +
         (rope.empty() ? "" : ", " + rope) + "}";
}

TEST(HfConfigTest, YarnAttentionFactorFollowsTransformers) {
  // No mscale keys: get_mscale(4) = 1 + 0.1 ln 4 = 1.1386294; no softmax correction.
  ModelConfig c = parse_ok(small(R"("rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 4096})"));
  EXPECT_NEAR(c.rope.attention_factor, 1.1386294, 1e-7);
  EXPECT_EQ(c.rope.mscale_all_dim, 0.0);
  EXPECT_NEAR(c.softmax_scale(), 0.0721688, 1e-7);  // 192^-0.5
  // mscale alone, or mscale_all_dim alone: still get_mscale(4) on cos/sin ...
  c = parse_ok(small(R"("rope_scaling": {"type": "yarn", "factor": 4, "mscale": 0.5})"));
  EXPECT_NEAR(c.rope.attention_factor, 1.1386294, 1e-7);
  c = parse_ok(small(R"("rope_scaling": {"type": "yarn", "factor": 4, "mscale_all_dim": 1})"));
  EXPECT_NEAR(c.rope.attention_factor, 1.1386294, 1e-7);
  // ... and mscale_all_dim alone still scales the softmax: 192^-0.5 * 1.1386294^2 = 0.0935652.
  EXPECT_NEAR(c.softmax_scale(), 0.0935652, 1e-7);
  // Both: get_mscale(4, 2) / get_mscale(4, 1) = (1 + 0.2 ln 4) / (1 + 0.1 ln 4) = 1.2772589 / 1.1386294.
  c = parse_ok(small(R"("rope_scaling": {"type": "yarn", "factor": 4, "mscale": 2, "mscale_all_dim": 1})"));
  EXPECT_NEAR(c.rope.attention_factor, 1.2772589 / 1.1386294, 1e-7);
  // An explicit attention_factor wins.
  c = parse_ok(small(R"("rope_parameters": {"rope_type": "yarn", "factor": 4, "attention_factor": 0.75})"));
  EXPECT_EQ(c.rope.attention_factor, 0.75);
  // beta 0 means the default (`or` in Python); absent original -> max_position_embeddings.
  c = parse_ok(small(R"("rope_scaling": {"type": "yarn", "factor": 4, "beta_fast": 0, "beta_slow": 0})"));
  EXPECT_EQ(c.rope.beta_fast, 32.0);
  EXPECT_EQ(c.rope.beta_slow, 1.0);
  EXPECT_EQ(c.rope.original_max_position, 16384);
  // A factor <= 1 gets no magnitude correction at all.
  c = parse_ok(small(R"("rope_scaling": {"type": "yarn", "factor": 1, "mscale_all_dim": 1})"));
  EXPECT_EQ(c.rope.attention_factor, 1.0);
  EXPECT_NEAR(c.softmax_scale(), 0.0721688, 1e-7);
}

TEST(HfConfigTest, RopeDictPrecedence) {
  // rope_scaling beats rope_parameters (`rope_scaling or rope_parameters`), including its theta.
  ModelConfig c = parse_ok(small(R"("rope_theta": 500, "rope_scaling": {"type": "linear", "factor": 2},
                                    "rope_parameters": {"rope_type": "yarn", "factor": 40, "rope_theta": 7})"));
  EXPECT_EQ(c.rope.scaling, RopeScaling::kLinear);
  EXPECT_EQ(c.rope.factor, 2.0);
  EXPECT_EQ(c.rope.theta, 500.0);
  // An empty rope_scaling is falsy: rope_parameters applies; its rope_theta beats the top level.
  c = parse_ok(small(R"("rope_theta": 500, "rope_scaling": {}, "rope_parameters": {"rope_type": "default", "rope_theta": 7})"));
  EXPECT_EQ(c.rope.scaling, RopeScaling::kNone);
  EXPECT_EQ(c.rope.theta, 7.0);
  // No rope keys at all: theta 10000, no scaling.
  c = parse_ok(small(""));
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.rope.scaling, RopeScaling::kNone);
  // A top-level original_max_position_embeddings overrides the dict's.
  c = parse_ok(small(R"("original_max_position_embeddings": 2048,
                        "rope_scaling": {"type": "yarn", "factor": 8, "original_max_position_embeddings": 4096})"));
  EXPECT_EQ(c.rope.original_max_position, 2048);
  // LongRoPE implies factor = max / original = 16384 / 8192 = 2; attention sqrt(1 + ln 2 / ln 8192) = sqrt(14/13).
  std::string list = "[1";
  for (int i = 1; i < 32; ++i) list += ", 1";  // qk_rope_head_dim / 2 = 32 factors
  list += "]";
  c = parse_ok(small(R"("rope_scaling": {"type": "longrope", "original_max_position_embeddings": 8192,
                        "long_factor": )" + list + R"(, "short_factor": )" + list + "}"));
  EXPECT_EQ(c.rope.factor, 2.0);
  EXPECT_NEAR(c.rope.attention_factor, 1.0377490, 1e-7);
  // Per-layer-type nesting (transformers 5) with one entry per layer type.
  c = parse_ok(small(R"("layer_types": ["full_attention", "full_attention"],
                        "rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 40, "mscale_all_dim": 1,
                                                               "rope_theta": 10000}})"));
  EXPECT_EQ(c.rope.scaling, RopeScaling::kYarn);
  EXPECT_EQ(c.rope.factor, 40.0);
}

TEST(HfConfigTest, InterleaveByModelType) {
  EXPECT_TRUE(parse_ok(small("")).rope.interleaved);  // DeepseekV3Config default True
  EXPECT_FALSE(parse_ok(small(R"("rope_interleave": false)")).rope.interleaved);
  EXPECT_FALSE(parse_ok(small(R"("rope_interleave": false)", "glm4_moe_lite")).rope.interleaved);
  // deepseek_v2 / deepseek_v32 / glm_moe_dsa always rotate pairs; minicpm3 always half-splits.
  EXPECT_TRUE(parse_ok(small(R"("rope_interleave": false)", "deepseek_v2")).rope.interleaved);
  EXPECT_TRUE(parse_ok(small(R"("rope_interleave": false, "index_n_heads": 4)", "deepseek_v32")).rope.interleaved);
  EXPECT_FALSE(parse_ok(small(R"("rope_interleave": true)", "minicpm3")).rope.interleaved);
}

TEST(HfConfigTest, AbsentKeysTakeTransformersDefaultsPerType) {
  const char* bare = R"({"model_type": "%s", "hidden_size": 2048, "num_hidden_layers": 4,
    "num_attention_heads": 16, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64})";
  auto with_type = [&](const std::string& t) {
    std::string s = bare;
    s.replace(s.find("%s"), 2, t);
    return s;
  };
  ModelConfig c = parse_ok(with_type("deepseek_v3"));
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.num_mtp_layers, 1);  // DeepseekV3Config.num_mtp_layers
  c = parse_ok(with_type("glm4_moe_lite"));
  EXPECT_EQ(c.q_lora_rank, 768);
  EXPECT_EQ(c.v_head_dim, 256);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.num_mtp_layers, 0);
  c = parse_ok(with_type("minicpm3"));
  EXPECT_EQ(c.v_head_dim, 128);  // 2048 / 16
  // Unknown model types get no guesses for the geometry.
  expect_error(with_type("my_mla"), StatusCode::kInvalidArgument, {"'q_lora_rank'", "missing"});
  std::string no_v = with_type("my_mla");
  no_v.insert(no_v.size() - 1, R"(, "q_lora_rank": null)");
  expect_error(no_v, StatusCode::kInvalidArgument, {"'v_head_dim'", "missing"});
  // The transformers-5 name of the MTP count is accepted too.
  c = parse_ok(small(R"("num_mtp_layers": 2)"));
  EXPECT_EQ(c.num_mtp_layers, 2);
}

// ---- bad configs ------------------------------------------------------------------------

TEST(HfConfigTest, RejectsBadConfigsNamingFileAndField) {
  expect_error("{\"model_type\": \"deepseek_v3\",", StatusCode::kInvalidArgument, {"not valid JSON"});
  expect_error("[1, 2]", StatusCode::kInvalidArgument, {"JSON object"});
  // Missing kv_lora_rank: not an MLA model.
  std::string text = kDeepSeekV3Legacy;
  text.replace(text.find("\"kv_lora_rank\": 512,"), 20, "");
  expect_error(text, StatusCode::kInvalidArgument, {"'kv_lora_rank'", "deepseek_v3"});
  // Missing geometry.
  text = kDeepSeekV3Legacy;
  text.replace(text.find("\"num_attention_heads\": 128,"), 27, "");
  expect_error(text, StatusCode::kInvalidArgument, {"'num_attention_heads'", "missing"});
  // Wrong types.
  expect_error(small(R"("rope_theta": "10000")"), StatusCode::kInvalidArgument,
               {"'rope_theta'", "must be a number", "\"10000\""});
  std::string s = small("");
  expect_error(std::string(s).replace(s.find("1024"), 4, "\"1024\""), StatusCode::kInvalidArgument,
               {"'hidden_size'", "must be an integer"});
  expect_error(std::string(s).replace(s.find("256"), 3, "256.5"), StatusCode::kInvalidArgument,
               {"'q_lora_rank'", "must be an integer"});
  expect_error(std::string(s).replace(s.find("\"num_hidden_layers\": 2"), 22, "\"num_hidden_layers\": true"),
               StatusCode::kInvalidArgument, {"'num_hidden_layers'"});
  expect_error(std::string(s).replace(s.find("\"num_hidden_layers\": 2"), 22, "\"num_hidden_layers\": -2"),
               StatusCode::kInvalidArgument, {"'num_hidden_layers'", "out of range"});
  expect_error(std::string(s).replace(s.find("\"deepseek_v3\""), 13, "5"), StatusCode::kInvalidArgument,
               {"'model_type'", "must be a string"});
  expect_error(small(R"("rms_norm_eps": "1e-6")"), StatusCode::kInvalidArgument, {"'rms_norm_eps'"});
  expect_error(small(R"("rms_norm_eps": 0)"), StatusCode::kInvalidArgument, {"'rms_norm_eps'", "> 0"});
  expect_error(small(R"("rope_interleave": "yes")"), StatusCode::kInvalidArgument,
               {"'rope_interleave'", "true or false"});
  expect_error(small(R"("rope_scaling": 5)"), StatusCode::kInvalidArgument, {"'rope_scaling'", "object or null"});
  expect_error(small(R"("rope_scaling": {"type": "yarn", "factor": "40"})"), StatusCode::kInvalidArgument,
               {"'rope_scaling.factor'", "must be a number"});
  expect_error(small(R"("rope_parameters": {"rope_type": 3})"), StatusCode::kInvalidArgument,
               {"'rope_parameters.rope_type'", "must be a string"});
  expect_error(small(R"("rope_scaling": {"type": "yarn"})"), StatusCode::kInvalidArgument,
               {"'rope_scaling.factor'", "missing"});
  expect_error(small(R"("rope_scaling": {"type": "yarn", "factor": -4})"), StatusCode::kInvalidArgument,
               {"'rope_scaling.factor'", "> 0"});
  expect_error(small(R"("rope_parameters": {"rope_type": "yarn", "factor": 4, "rope_theta": 0})"),
               StatusCode::kInvalidArgument, {"'rope_parameters.rope_theta'", "> 0"});
  expect_error(small(R"("rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 4096.5})"),
               StatusCode::kInvalidArgument, {"'rope_scaling.original_max_position_embeddings'"});
  // Unknown rope types.
  expect_error(small(R"("rope_scaling": {"type": "dynamic", "factor": 2})"), StatusCode::kUnimplemented,
               {"'rope_scaling.type'", "'dynamic'", "not supported"});
  expect_error(small(R"("rope_parameters": {"rope_type": "llama3", "factor": 8})"), StatusCode::kUnimplemented,
               {"'rope_parameters.rope_type'", "'llama3'"});
  // LongRoPE without its factor lists, or with non-numbers in them.
  expect_error(small(R"("rope_scaling": {"type": "longrope"})"), StatusCode::kInvalidArgument,
               {"'rope_scaling.long_factor'", "missing"});
  expect_error(small(R"("rope_scaling": {"type": "longrope", "long_factor": [1, "x"], "short_factor": [1]})"),
               StatusCode::kInvalidArgument, {"'rope_scaling.long_factor'", "array of numbers"});
  expect_error(small(R"("rope_scaling": {"type": "longrope", "long_factor": [1, 2], "short_factor": [1, 2]})"),
               StatusCode::kInvalidArgument, {"'rope_scaling.long_factor'", "qk_rope_head_dim / 2 = 32"});
  // mscale_all_dim outside YaRN would change the softmax scale in transformers: refused.
  expect_error(small(R"("rope_scaling": {"type": "linear", "factor": 4, "mscale_all_dim": 1})"),
               StatusCode::kUnimplemented, {"'rope_scaling.mscale_all_dim'", "linear"});
  // Geometry that parses but is invalid.
  expect_error(std::string(s).replace(s.find("\"num_attention_heads\": 8"), 24, "\"num_attention_heads\": 0"),
               StatusCode::kInvalidArgument, {"num_attention_heads", "> 0"});
  expect_error(std::string(s).replace(s.find("\"qk_rope_head_dim\": 64"), 22, "\"qk_rope_head_dim\": 63"),
               StatusCode::kInvalidArgument, {"qk_rope_head_dim", "even"});
  // An indexer model of unknown type must say how many indexer heads it has.
  expect_error(small(R"("index_topk": 2048)", "my_dsa"), StatusCode::kInvalidArgument, {"'index_n_heads'"});
}

// ---- files --------------------------------------------------------------------------------

TEST(HfConfigTest, LoadsFromFileOrDirectory) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("mlakv_hf_" + std::to_string(::getpid()) + "_LoadsFromFileOrDirectory");
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "config.json").string();
  {
    std::ofstream out(file);
    out << kKimiK2;
  }
  for (const std::string& p : {dir.string(), file}) {
    auto c = load_hf_config(p);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->name, file);
    EXPECT_NEAR(c->softmax_scale(), 0.130861, 1e-6);
  }
  {
    std::ofstream out(file);
    out << "{\"kv_lora_rank\": ";
  }
  auto bad = load_hf_config(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(file + ": not valid JSON"), std::string::npos) << bad.status().to_string();
  std::filesystem::remove(file);
  auto missing = load_hf_config(dir.string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(file), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mlakv
