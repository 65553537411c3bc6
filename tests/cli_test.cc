// The mlakv binary end to end: JSON outputs parse and carry the right numbers, files
// round-trip through codec encode/decode, and bad input gives "error: ..." and a
// non-zero exit code.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "mlakv/numerics.h"

namespace {

namespace fs = std::filesystem;

struct CliRun {
  int rc;
  std::string out, err;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("mlakv_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  CliRun run(const std::string& args) {
    const std::string out = (dir_ / "stdout").string(), err = (dir_ / "stderr").string();
    const std::string cmd = std::string(MLAKV_CLI_PATH) + " " + args + " >" + out + " 2>" + err;
    const int status = std::system(cmd.c_str());
    return {WEXITSTATUS(status), slurp(out), slurp(err)};
  }
  static std::string slurp(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  std::string path(const char* name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(CliTest, FormatsJson) {
  CliRun r = run("formats --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out)["formats"];
  ASSERT_EQ(j.size(), 6u);
  std::map<std::string, int> want = {{"bf16", 1152}, {"fp8_ds_mla", 656}, {"nvfp4_ds_mla", 432},
                                     {"nvfp4_ds_mla_fp8rope", 368}, {"f32", 2304}, {"nvfp4_ds_mla_int8rope", 368}};
  for (const auto& f : j) EXPECT_EQ(f["bytes_per_token_per_layer"].get<int>(), want.at(f["name"].get<std::string>()));
}

TEST_F(CliTest, EverySubcommandHasHelp) {
  EXPECT_EQ(run("codec --help").rc, 0);  // a group: its leaves carry --json
  for (const char* c : {"formats", "codec encode", "codec decode", "plan"}) {
    CliRun r = run(std::string(c) + " --help");
    EXPECT_EQ(r.rc, 0) << c;
    EXPECT_NE(r.out.find("--json"), std::string::npos) << c << " has no --json:\n" << r.out;
  }
}

TEST_F(CliTest, CodecRoundTripBf16IsExactOnBf16Values) {
  const int n = 3;
  std::vector<float> rows(static_cast<std::size_t>(n) * 576);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(static_cast<int>(i % 61) - 30) * 0.125f;
  { std::ofstream f(path("in.f32"), std::ios::binary); f.write(reinterpret_cast<const char*>(rows.data()), static_cast<std::streamsize>(rows.size() * 4)); }
  CliRun e = run("codec encode --format bf16 --raw --in " + path("in.f32") + " --out " + path("r.bin") + " --json");
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_EQ(nlohmann::json::parse(e.out)["tokens"].get<int>(), n);
  EXPECT_EQ(fs::file_size(path("r.bin")), static_cast<std::uintmax_t>(n * 1152));
  CliRun d = run("codec decode --raw --format bf16 --in " + path("r.bin") + " --out " + path("out.f32"));
  ASSERT_EQ(d.rc, 0) << d.err;
  std::string back = slurp(path("out.f32"));
  ASSERT_EQ(back.size(), rows.size() * 4);
  EXPECT_EQ(std::memcmp(back.data(), rows.data(), back.size()), 0);
}

TEST_F(CliTest, CodecEncodeNvfp4WithOuterScale) {
  std::vector<float> row(576, 0.0f);
  row[0] = 1.5f;  // s_l = 0.25: y = 6 -> sf = e4m3(1) = 0x38, q = 7 (low nibble of byte 0)
  { std::ofstream f(path("in.f32"), std::ios::binary); f.write(reinterpret_cast<const char*>(row.data()), 576 * 4); }
  CliRun e = run("codec encode --format nvfp4_ds_mla --raw --outer-scale 0.25 --in " + path("in.f32") + " --out " + path("r.bin"));
  ASSERT_EQ(e.rc, 0) << e.err;
  std::string rec = slurp(path("r.bin"));
  ASSERT_EQ(rec.size(), 432u);
  EXPECT_EQ(static_cast<uint8_t>(rec[0]), 0x07);
  EXPECT_EQ(static_cast<uint8_t>(rec[256]), 0x38);
}

TEST_F(CliTest, BadSizesAndArgumentsFailCleanly) {
  { std::ofstream f(path("odd.f32"), std::ios::binary); f << std::string(577 * 4, '\0'); }
  CliRun r = run("codec encode --format fp8_ds_mla --in " + path("odd.f32") + " --out " + path("x.bin"));
  EXPECT_NE(r.rc, 0);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("2308 B"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("x.bin"))) << "no output on failure";

  { std::ofstream f(path("odd.rec"), std::ios::binary); f << std::string(656 + 10, '\0'); }
  r = run("codec decode --raw --format fp8_ds_mla --in " + path("odd.rec") + " --out " + path("y.f32"));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("656"), std::string::npos) << r.err;

  r = run("codec encode --format fp9 --in " + path("odd.f32") + " --out " + path("x.bin"));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("unknown format 'fp9'"), std::string::npos) << r.err;

  r = run("codec encode --format fp8_ds_mla --in " + path("missing.f32") + " --out " + path("x.bin"));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("no such file"), std::string::npos) << r.err;

  r = run("codec encode --format fp8_ds_mla --outer-scale 2 --in " + path("odd.f32") + " --out " + path("x.bin"));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("no outer scale"), std::string::npos) << r.err;
}

TEST_F(CliTest, PlanJsonReproducesPublishedFigures) {
  CliRun r = run("plan --model glm-5.2 --format fp8_ds_mla --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["bytes_per_token"].get<int64_t>(), 54728);
  EXPECT_EQ(j["bytes_per_token_per_layer"].get<int>(), 656);
  r = run("plan --model glm-5.2 --format nvfp4_ds_mla --json");
  EXPECT_EQ(nlohmann::json::parse(r.out)["bytes_per_token"].get<int64_t>(), 37032);
  EXPECT_GT(nlohmann::json::parse(r.out)["tokens_per_gpu"].get<int64_t>(), 0);
}

TEST_F(CliTest, PlanFromConfigJsonAndErrors) {
  {
    std::ofstream f(path("config.json"));
    f << R"({"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
            "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "num_nextn_predict_layers": 1, "rope_theta": 10000,
            "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                             "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}})";
  }
  CliRun r = run("plan --model " + path("config.json") + " --format fp8_ds_mla --gpus 8 --tp 8 --gpu-mem 140 --reserved 84 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["bytes_per_token"].get<int64_t>(), 62 * 656);
  r = run("plan --model nonexistent-model --format fp8_ds_mla");
  EXPECT_NE(r.rc, 0);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u);
  EXPECT_NE(r.err.find("glm-5.2"), std::string::npos) << "lists the presets: " << r.err;
  r = run("plan --model glm-5.2 --format fp8_ds_mla --dcp 3");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("dcp 3"), std::string::npos) << r.err;
  r = run("plan --model glm-5.2 --bogus-flag");
  EXPECT_NE(r.rc, 0);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
}

}  // namespace
