// Capacity planner: the published GLM-5.2 bytes/token, hand-computed token counts,
// DCP accounting, and argument errors.
#include <gtest/gtest.h>

#include "mlakv/plan.h"

namespace mlakv {
namespace {

ModelPreset preset(const char* name) {
  auto p = find_model_preset(name);
  EXPECT_TRUE(p.has_value()) << name;
  return *p;
}

PlanParams defaults(const ModelPreset& p, KvFormat f) {
  PlanParams q;
  q.format = f;
  q.gpus = p.deploy.gpus;
  q.gpu_mem_gib = p.deploy.gpu_mem_gib;
  q.tp = p.deploy.tp;
  q.dcp = p.deploy.dcp;
  q.mem_util = p.deploy.mem_util;
  q.reserved_gib = p.deploy.reserved_gib;
  return q;
}

TEST(Plan, PublishedGlm52BytesPerToken) {
  const auto p = preset("glm-5.2");
  // docs/reference.md section 5: 79 x 656 + 22 x 132 = 54,728 and 79 x 432 + 22 x 132 = 37,032.
  auto fp8 = plan_capacity(p.config, defaults(p, KvFormat::kFp8DsMla));
  ASSERT_TRUE(fp8.ok()) << fp8.status().to_string();
  EXPECT_EQ(fp8->bytes_per_token, 54728);
  EXPECT_EQ(fp8->record_bytes, 656);
  EXPECT_EQ(fp8->cache_layers, 79);
  EXPECT_EQ(fp8->indexer_layers, 22);
  auto fp4 = plan_capacity(p.config, defaults(p, KvFormat::kNvfp4DsMla));
  ASSERT_TRUE(fp4.ok());
  EXPECT_EQ(fp4->bytes_per_token, 37032);
  auto fp4r = plan_capacity(p.config, defaults(p, KvFormat::kNvfp4DsMlaFp8Rope));
  EXPECT_EQ(fp4r->bytes_per_token, 79 * 368 + 22 * 132);
}

TEST(Plan, Glm52PoolsMatchThePublishedOrder) {
  // Published pools: ~373k (fp8), 550k (nvfp4), 600k+ (fp8 rope); the 368 B record
  // allows a 1,048,576-token request with DCP4.
  const auto p = preset("glm-5.2");
  auto fp8 = plan_capacity(p.config, defaults(p, KvFormat::kFp8DsMla));
  auto fp4 = plan_capacity(p.config, defaults(p, KvFormat::kNvfp4DsMla));
  auto q = defaults(p, KvFormat::kNvfp4DsMlaFp8Rope);
  q.dcp = 4;
  auto fp4r = plan_capacity(p.config, q);
  EXPECT_NEAR(static_cast<double>(fp8->tokens_per_gpu), 373000, 3000);
  EXPECT_NEAR(static_cast<double>(fp4->tokens_per_gpu), 550000, 5000);
  EXPECT_GT(fp4r->tokens_per_gpu, 600000);
  EXPECT_GE(fp4r->pool_request_tokens, 1048576);
  EXPECT_EQ(fp4r->max_request_tokens, 202752);  // capped at max_position_embeddings
}

TEST(Plan, HandComputedTokenCounts) {
  // DeepSeek-V3 bf16 on one 80 GiB GPU, util 0.5, 8 GiB reserved, block 16:
  // bytes/token = 62 x 1152 = 71,424; KV = 32 GiB = 34,359,738,368 B;
  // block = 1,142,784 B -> floor(30066.3) = 30,066 blocks = 481,056 tokens.
  const auto p = preset("deepseek-v3");
  PlanParams q;
  q.format = KvFormat::kBf16;
  q.gpus = 8;
  q.tp = 8;
  q.gpu_mem_gib = 80;
  q.mem_util = 0.5;
  q.reserved_gib = 8;
  q.block_size = 16;
  auto r = plan_capacity(p.config, q);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->bytes_per_token, 71424);
  EXPECT_EQ(r->block_bytes, 1142784);
  EXPECT_EQ(r->blocks_per_gpu, 30066);
  EXPECT_EQ(r->tokens_per_gpu, 481056);
  EXPECT_EQ(r->replicas, 1);
  EXPECT_EQ(r->pool_request_tokens, 481056);
  EXPECT_EQ(r->max_request_tokens, 163840);
  // DCP 4 spreads one request over 4 ranks: 4x the longest request.
  q.dcp = 4;
  r = plan_capacity(p.config, q);
  EXPECT_EQ(r->pool_request_tokens, 4 * 481056);
  EXPECT_EQ(r->tokens_per_gpu, 481056);
  // TP 4 on 8 GPUs: two replicas.
  q.tp = 4;
  r = plan_capacity(p.config, q);
  EXPECT_EQ(r->replicas, 2);
  EXPECT_EQ(r->total_tokens, 2 * 4 * 481056);
}

TEST(Plan, WeightsPerGpuConcurrencyAndMtp) {
  const auto p = preset("deepseek-v3");
  // The preset's weights (640 GiB) at its TP 8 reproduce its 84 GiB reservation: 80 + 4.
  PlanParams q = defaults(p, KvFormat::kFp8DsMla);
  q.reserved_gib = p.deploy.activation_gib;
  q.weight_gib = p.deploy.weight_gib;
  auto r = plan_capacity(p.config, q);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_DOUBLE_EQ(r->weight_gib_per_gpu, 80.0);
  EXPECT_DOUBLE_EQ(r->reserved_gib_per_gpu, 84.0);
  // TP 4: 160 GiB of weights per GPU exceed an H200's 126 usable GiB.
  q.gpus = 4;
  q.tp = 4;
  r = plan_capacity(p.config, q);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("does not fit"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("160.00 GiB per GPU"), std::string::npos) << r.status().message();

  // Concurrency (vLLM's formula): the hand-computed 30,066 blocks of 16 tokens over
  // requests of 163,840 tokens = 10,240 blocks each -> 2.936x; with DCP 4 each rank holds
  // 40,960 tokens = 2,560 blocks -> 11.74x.
  PlanParams h;
  h.format = KvFormat::kBf16;
  h.gpus = 8;
  h.tp = 8;
  h.gpu_mem_gib = 80;
  h.mem_util = 0.5;
  h.reserved_gib = 8;
  h.block_size = 16;
  r = plan_capacity(p.config, h);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->concurrency_tokens, 163840);
  EXPECT_DOUBLE_EQ(r->max_concurrency, 30066.0 / 10240.0);
  h.dcp = 4;
  r = plan_capacity(p.config, h);
  EXPECT_DOUBLE_EQ(r->max_concurrency, 30066.0 / 2560.0);
  h.dcp = 1;
  h.max_model_len = 8192;  // 512 blocks per request
  r = plan_capacity(p.config, h);
  EXPECT_EQ(r->max_request_tokens, 8192);
  EXPECT_DOUBLE_EQ(r->max_concurrency, 30066.0 / 512.0);
  h.max_model_len = 163841;
  r = plan_capacity(p.config, h);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_position_embeddings 163840"), std::string::npos);

  // --no-mtp: V3.2 without its MTP layer drops one MLA and one indexer cache.
  PlanParams m{KvFormat::kFp8DsMla};
  m.include_mtp = false;
  r = plan_capacity(preset("deepseek-v3.2").config, m);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->cache_layers, 61);
  EXPECT_EQ(r->bytes_per_token, 61 * 656 + 61 * 132);
}

TEST(Plan, ModelsWithoutIndexerAndV32WithIndexer) {
  auto v3 = plan_capacity(preset("deepseek-v3").config, {KvFormat::kFp8DsMla});
  EXPECT_EQ(v3->bytes_per_token, 62 * 656);
  auto v32 = plan_capacity(preset("deepseek-v3.2").config, {KvFormat::kFp8DsMla});
  EXPECT_EQ(v32->bytes_per_token, 62 * 656 + 62 * 132);
  auto kimi = plan_capacity(preset("kimi-k2").config, {KvFormat::kNvfp4DsMla});
  EXPECT_EQ(kimi->bytes_per_token, 61 * 432);
}

TEST(Plan, ArgumentErrors) {
  const auto p = preset("glm-5.2");
  auto err = [&](auto mutate, const char* needle) {
    PlanParams q = defaults(p, KvFormat::kFp8DsMla);
    mutate(q);
    auto r = plan_capacity(p.config, q);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  err([](PlanParams& q) { q.gpus = 0; }, "gpus");
  err([](PlanParams& q) { q.tp = 3; }, "tp 3");
  err([](PlanParams& q) { q.dcp = 3; }, "dcp 3");
  err([](PlanParams& q) { q.mem_util = 1.5; }, "mem-util");
  err([](PlanParams& q) { q.reserved_gib = 1000; }, "no memory left");
  err([](PlanParams& q) { q.block_size = 0; }, "block-size");
  err([](PlanParams& q) { q.gpu_mem_gib = -1; }, "gpu-mem");
  err([](PlanParams& q) { q.gpus = 128; q.tp = 128; }, "attention heads");
  ModelConfig mini = p.config;
  mini.kv_lora_rank = 256;
  auto r = plan_capacity(mini, {KvFormat::kNvfp4DsMla});
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("use bf16"), std::string::npos);
  EXPECT_TRUE(plan_capacity(mini, {KvFormat::kBf16}).ok());
}

TEST(Plan, SoftmaxScalesOfThePresets) {
  // docs/reference.md section 1: DeepSeek-V3 0.135234; Kimi K2 (factor 32) 0.130861; GLM-5 0.0625.
  EXPECT_NEAR(preset("deepseek-v3").config.softmax_scale(), 0.135234, 1e-6);
  EXPECT_NEAR(preset("kimi-k2").config.softmax_scale(), 0.130861, 1e-6);
  EXPECT_NEAR(preset("glm-5").config.softmax_scale(), 0.0625, 1e-12);
}

}  // namespace
}  // namespace mlakv
