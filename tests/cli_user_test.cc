// What a new user trips over (issue 11), through the mlakv binary: planner figures that
// follow the deployment, quality traps that warn, layer-forward's input checks, the
// demo's figures, self-describing record files, and one exit-code / JSON convention.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "mlakv/safetensors.h"
#include "support/cli_run.h"

namespace mlakv {
namespace {

using testing::CliRun;
using Json = nlohmann::json;

class CliUser : public testing::CliFixture {
 protected:
  Json json_of(const CliRun& r) {
    Json j = Json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.out << r.err;
    return j;
  }
  void write_text(const std::string& name, const std::string& text) { spit(path(name), text.data(), text.size()); }
};

constexpr const char* kV3Config =
    R"({"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "num_nextn_predict_layers": 1, "rope_theta": 10000, "max_position_embeddings": 4096})";

// ---- plan ------------------------------------------------------------------------------

TEST_F(CliUser, PlanWeightsFollowTheTpDegreeAndSayWhenTheyDoNotFit) {
  // DeepSeek-V3's 640 GiB of fp8 weights: 80 GiB per GPU at TP 8, 160 at TP 4 (> 126 usable).
  CliRun r = run("plan --model deepseek-v3 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  Json j = json_of(r);
  EXPECT_EQ(j["tp"], 8);
  EXPECT_DOUBLE_EQ(j["weight_gib_per_gpu"].get<double>(), 80.0);
  EXPECT_DOUBLE_EQ(j["reserved_gib"].get<double>(), 84.0);
  r = run("plan --model deepseek-v3 --gpus 4");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err.rfind("error: does not fit", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("640.0 GiB / tp 4 = 160.00 GiB per GPU"), std::string::npos) << r.err;
  r = run("plan --model deepseek-v3 --gpus 4 --json");
  EXPECT_EQ(r.rc, 1);
  j = json_of(r);
  EXPECT_EQ(j["error"]["code"], "resource_exhausted");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("does not fit"), std::string::npos);
}

TEST_F(CliUser, PlanGpusImpliesTpAndTpAloneWorks) {
  write_text("config.json", kV3Config);
  CliRun r = run("plan --model " + path("config.json") + " --gpus 8 --gpu-mem 140 --reserved 84 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  Json j = json_of(r);
  EXPECT_EQ(j["tp"], 8);
  EXPECT_EQ(j["replicas"], 1);
  EXPECT_EQ(j["defaults_note"], "") << "every deployment value was given";
  r = run("plan --model " + path("config.json") + " --tp 8 --gpu-mem 140 --reserved 84 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  j = json_of(r);
  EXPECT_EQ(j["gpus"], 8);
  EXPECT_EQ(j["tp"], 8);
  // The note names exactly the values that fell back to a default.
  r = run("plan --model " + path("config.json") + " --gpus 2 --reserved 10");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("generic defaults: 80 GiB per GPU (--gpu-mem)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("--gpus/--tp"), std::string::npos) << r.out;
  r = run("plan --model " + path("config.json") + " --gpus 2 --gpu-mem 80 --reserved 10");
  EXPECT_EQ(r.out.find("defaults"), std::string::npos) << r.out;
}

TEST_F(CliUser, PlanCheckpointDirectoryWeightsAreItsTensorBytes) {
  write_text("config.json", kV3Config);
  std::vector<float> w(3 * 1024 * 1024, 0.5f);  // 12 MiB
  ASSERT_TRUE(write_safetensors(path("model.safetensors"),
                                {{"model.embed_tokens.weight",
                                  TensorView::contiguous(w.data(), DType::kF32, {3 * 1024, 1024})}},
                                {})
                  .ok());
  CliRun r = run("plan --model " + dir_.string() + " --gpus 2 --gpu-mem 80 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  Json j = json_of(r);
  EXPECT_DOUBLE_EQ(j["weight_gib"].get<double>(), 12.0 / 1024.0);
  EXPECT_DOUBLE_EQ(j["weight_gib_per_gpu"].get<double>(), 6.0 / 1024.0);
  EXPECT_DOUBLE_EQ(j["reserved_gib"].get<double>(), 4.0 + 6.0 / 1024.0);
}

TEST_F(CliUser, PlanLongestRequestIsCappedAtTheModelsContext) {
  // A 4,096-token model: the request is capped, the pool shown beside it.
  write_text("config.json", kV3Config);
  CliRun r = run("plan --model " + path("config.json") + " --gpus 1 --gpu-mem 80 --reserved 8 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  Json j = json_of(r);
  EXPECT_EQ(j["max_position_embeddings"], 4096);
  EXPECT_EQ(j["max_request_tokens"], 4096);
  EXPECT_GT(j["pool_request_tokens"].get<int64_t>(), 1000000);
  // vLLM: blocks / ceil(4096 / 64) requests of 4,096 tokens.
  EXPECT_DOUBLE_EQ(j["max_concurrency"].get<double>(), j["blocks_per_gpu"].get<double>() / 64.0);
  r = run("plan --model " + path("config.json") + " --gpus 1 --gpu-mem 80 --reserved 8");
  EXPECT_NE(r.out.find("longest request  4,096 tokens (the model's max_position_embeddings; the pool alone would hold"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Maximum concurrency for 4,096 tokens per request"), std::string::npos) << r.out;
  // --context N: vLLM's figure for requests of N tokens; past the model's context, refused.
  r = run("plan --model glm-5.2 --context 8192 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  j = json_of(r);
  EXPECT_EQ(j["max_request_tokens"], 8192);
  EXPECT_DOUBLE_EQ(j["max_concurrency"].get<double>(), j["blocks_per_gpu"].get<double>() / 128.0);
  r = run("plan --model glm-5.2 --context 300000");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("exceeds the model's max_position_embeddings 202752"), std::string::npos) << r.err;
}

TEST_F(CliUser, PlanNoMtpDropsTheMtpLayersCaches) {
  CliRun r = run("plan --model glm-5.2 --no-mtp --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  Json j = json_of(r);
  EXPECT_EQ(j["cache_layers"], 78);
  EXPECT_EQ(j["indexer_layers"], 21);
  EXPECT_EQ(j["bytes_per_token"], 78 * 656 + 21 * 132);
}

TEST_F(CliUser, PlanHelpSaysWhatModelAccepts) {
  CliRun r = run("plan --help");
  ASSERT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("checkpoint directory"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("config.json"), std::string::npos) << r.out;
}

// ---- exit codes and JSON errors ----------------------------------------------------------

TEST_F(CliUser, UsageErrorsExitTwoOtherErrorsOne) {
  CliRun r = run("plan --bogus-flag");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u);
  r = run("plan --gpus notanumber");
  EXPECT_EQ(r.rc, 2) << r.err;
  r = run("codec decode --format bf16");  // --in/--out missing
  EXPECT_EQ(r.rc, 2) << r.err;
  r = run("plan --model no-such-model");
  EXPECT_EQ(r.rc, 1) << r.err;
  r = run("plan --model no-such-model --json");
  EXPECT_EQ(r.rc, 1);
  Json j = json_of(r);
  EXPECT_EQ(j["error"]["code"], "not_found");
  r = run("plan --bogus-flag --json");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(json_of(r)["error"]["code"], "usage");
}

}  // namespace
}  // namespace mlakv
