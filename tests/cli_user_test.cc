// What a new user trips over (issue 11), through the mlakv binary: planner figures that
// follow the deployment, quality traps that warn, layer-forward's input checks, the
// demo's figures, self-describing record files, and one exit-code / JSON convention.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "mlakv/cache.h"
#include "mlakv/latent_calib.h"
#include "mlakv/numerics.h"
#include "mlakv/rng.h"
#include "mlakv/safetensors.h"
#include "support/cli_run.h"

namespace mlakv {
namespace {

using testing::CliFixture;
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

// ---- record files -------------------------------------------------------------------------

// Rows whose values are exact in bf16 (and e4m3 after fp8_ds_mla's power-of-two scale).
std::vector<float> exact_rows(int n, float latent_value) {
  std::vector<float> rows(static_cast<std::size_t>(n) * 576);
  for (int t = 0; t < n; ++t) {
    for (int d = 0; d < 576; ++d) {
      rows[static_cast<std::size_t>(t * 576 + d)] = d < 512 ? latent_value : 0.25f * static_cast<float>((d % 9) - 4);
    }
  }
  return rows;
}

uint32_t u32_at(const std::string& b, int off) {
  uint32_t v;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}

TEST_F(CliUser, RecordFilesDescribeThemselves) {
  std::vector<float> rows = exact_rows(2, 1.5f);
  spit(path("in.f32"), rows.data(), rows.size() * 4);
  CliRun r = run("codec encode --format nvfp4_ds_mla --outer-scale 0.25 --in " + path("in.f32") + " --out " +
                 path("r.rec"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string file = slurp(path("r.rec"));
  ASSERT_EQ(file.size(), 64u + 2 * 432u);
  EXPECT_EQ(file.substr(0, 8), "MLAKVREC");
  EXPECT_EQ(u32_at(file, 8), 1u);      // version
  EXPECT_EQ(u32_at(file, 16), 2u);     // nvfp4_ds_mla
  EXPECT_EQ(u32_at(file, 20), 432u);   // record bytes
  float s;
  std::memcpy(&s, file.data() + 24, 4);
  EXPECT_EQ(s, 0.25f);
  EXPECT_EQ(u32_at(file, 32), 2u);     // tokens (low word)
  // The records after the header are the --raw ones: y = 6 -> sf 0x38, q = 7.
  EXPECT_EQ(static_cast<uint8_t>(file[64]), 0x77);
  EXPECT_EQ(static_cast<uint8_t>(file[64 + 256]), 0x38);

  // decode needs no --format: the header says it, and decodes exactly 1.5 back.
  r = run("codec decode --in " + path("r.rec") + " --out " + path("back.f32") + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json_of(r)["format"], "nvfp4_ds_mla");
  const std::string back = slurp(path("back.f32"));
  ASSERT_EQ(back.size(), rows.size() * 4);
  EXPECT_EQ(std::memcmp(back.data(), rows.data(), back.size()), 0);

  // Options that contradict the header are refused, not obeyed.
  r = run("codec decode --format bf16 --in " + path("r.rec") + " --out " + path("x.f32"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("holds nvfp4_ds_mla records"), std::string::npos) << r.err;
  r = run("codec decode --outer-scale 1 --in " + path("r.rec") + " --out " + path("x.f32"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("was written with outer scale 0.25"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("x.f32")));
  // Bare records need the explicit flag.
  spit(path("bare.rec"), file.data() + 64, file.size() - 64);
  r = run("codec decode --in " + path("bare.rec") + " --out " + path("x.f32"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("not an mlakv record file"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--raw"), std::string::npos) << r.err;
  r = run("codec decode --raw --format nvfp4_ds_mla --outer-scale 0.25 --in " + path("bare.rec") + " --out " +
          path("x.f32"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(slurp(path("x.f32")), back);
  // A truncated file is caught by the header's token count.
  spit(path("cut.rec"), file.data(), file.size() - 1);
  r = run("codec decode --in " + path("cut.rec") + " --out " + path("y.f32"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("header says 2 tokens"), std::string::npos) << r.err;
}

// --token-scale: the nvfp4 per-token scale mode, carried by the record file's flags.
TEST_F(CliUser, CodecTokenScaleMode) {
  // Latent 1.5 everywhere: s_t = 1.5 * f32(1/2688); y = 1.5 / s_t ~ 2688 -> sf = e4m3(448) =
  // 0x7E, q = y / 448 ~ 6 -> e2m1 7 (both nibbles: 0x77).
  std::vector<float> rows = exact_rows(2, 1.5f);
  spit(path("in.f32"), rows.data(), rows.size() * 4);
  CliRun r = run("codec encode --format nvfp4_ds_mla_int8rope --token-scale --in " + path("in.f32") + " --out " +
                 path("t.rec") + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json_of(r)["token_scale"], true);
  const std::string file = slurp(path("t.rec"));
  ASSERT_EQ(file.size(), 64u + 2 * 368u);
  EXPECT_EQ(u32_at(file, 16), 5u);  // nvfp4_ds_mla_int8rope
  EXPECT_EQ(u32_at(file, 48), 1u);  // flags: token-scale mode
  EXPECT_EQ(static_cast<uint8_t>(file[64]), 0x77);
  EXPECT_EQ(static_cast<uint8_t>(file[64 + 256]), 0x7E);
  float st;
  std::memcpy(&st, file.data() + 64 + 292, 4);
  EXPECT_EQ(st, 1.5f * static_cast<float>(1.0 / 2688.0));
  r = run("codec decode --in " + path("t.rec") + " --out " + path("back.f32") + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json_of(r)["token_scale"], true);
  const std::string back = slurp(path("back.f32"));
  ASSERT_EQ(back.size(), rows.size() * 4);
  std::vector<float> b(rows.size());
  std::memcpy(b.data(), back.data(), back.size());
  EXPECT_EQ(b[0], 2688.0f * st);  // (e2m1 6 * e4m3 448) * s_t, one rounding
  EXPECT_NEAR(b[0], 1.5f, 1e-6f);
  // Raw records need the flag given again; a contradicting flag is refused.
  spit(path("bare.rec"), file.data() + 64, file.size() - 64);
  r = run("codec decode --raw --format nvfp4_ds_mla_int8rope --token-scale --in " + path("bare.rec") + " --out " +
          path("x.f32"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(slurp(path("x.f32")), back);
  r = run("codec encode --format nvfp4_ds_mla --in " + path("in.f32") + " --out " + path("s.rec"));
  ASSERT_EQ(r.rc, 0) << r.err;
  r = run("codec decode --token-scale --in " + path("s.rec") + " --out " + path("y.f32"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("without the token-scale mode"), std::string::npos) << r.err;
  // Only the nvfp4 formats, and not with an outer scale.
  r = run("codec encode --format fp8_ds_mla --token-scale --in " + path("in.f32") + " --out " + path("z.rec"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("token_scale is a mode of the nvfp4 formats"), std::string::npos) << r.err;
  r = run("codec encode --format nvfp4_ds_mla --token-scale --outer-scale 0.5 --in " + path("in.f32") + " --out " +
          path("z.rec"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("replaces the outer scale"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("z.rec")));
  EXPECT_FALSE(std::filesystem::exists(path("y.f32")));
  // stats --token-scale: group scales against amax(latent / s_t) / 6 (448 / 448: exact here).
  r = run("codec stats --format all --token-scale --in " + path("in.f32") + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const Json stats = json_of(r);  // (a range-for over json_of(r)["formats"] reads a destroyed temporary)
  for (const Json& f : stats["formats"]) {
    if (f["format"].get<std::string>().rfind("nvfp4", 0) != 0) continue;
    EXPECT_NE(f["scales"]["what"].get<std::string>().find("s_t"), std::string::npos) << f;
    EXPECT_EQ(f["scales"]["subnormal_group_scales"], 0) << f;
  }
}

// --nvfp4-scales search: the encoder option (header flag bit 1), records decoded as any others,
// a lower round-trip error in stats; refused with --token-scale and for other formats.
TEST_F(CliUser, CodecNvfp4ScaleSearch) {
  std::vector<float> rows(static_cast<std::size_t>(64) * kQkDim);
  SplitMix64 rng(9);
  for (float& x : rows) x = rng.normal();
  spit(path("in.f32"), rows.data(), rows.size() * 4);
  CliRun r = run("codec encode --format nvfp4_ds_mla --nvfp4-scales search --in " + path("in.f32") + " --out " +
                 path("s.rec") + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json_of(r)["nvfp4_scales"], "search");
  r = run("codec encode --format nvfp4_ds_mla --in " + path("in.f32") + " --out " + path("n.rec"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string s = slurp(path("s.rec")), n = slurp(path("n.rec"));
  ASSERT_EQ(s.size(), n.size());
  EXPECT_EQ(u32_at(s, 48), 2u);  // flags: nvfp4 scale search
  EXPECT_EQ(u32_at(n, 48), 0u);
  EXPECT_NE(s.substr(64), n.substr(64));
  r = run("codec decode --in " + path("s.rec") + " --out " + path("back.f32"));
  ASSERT_EQ(r.rc, 0) << r.err;
  // stats: the search's latent error is lower than RN's.
  auto err = [&](const std::string& extra) {
    CliRun st = run("codec stats --format nvfp4_ds_mla " + extra + " --in " + path("in.f32") + " --json");
    EXPECT_EQ(st.rc, 0) << st.err;
    const Json j = json_of(st);
    return j["formats"][0]["latent"]["rel_l2"].get<double>();
  };
  EXPECT_LT(err("--nvfp4-scales search"), err(""));
  r = run("codec encode --format nvfp4_ds_mla --token-scale --nvfp4-scales search --in " + path("in.f32") +
          " --out " + path("z.rec"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("does not apply to the per-token scale mode"), std::string::npos) << r.err;
  r = run("codec encode --format fp8_ds_mla --nvfp4-scales search --in " + path("in.f32") + " --out " + path("z.rec"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("encoder option of the nvfp4 formats"), std::string::npos) << r.err;
  r = run("codec encode --format nvfp4_ds_mla --nvfp4-scales best --in " + path("in.f32") + " --out " + path("z.rec"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--nvfp4-scales: expected \"rn\" or \"search\""), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("z.rec")));
  // stats --format all with the search: the nvfp4 rows use it, the others are unaffected.
  r = run("codec stats --format all --nvfp4-scales search --in " + path("in.f32") + " --json");
  EXPECT_EQ(r.rc, 0) << r.err;
}

TEST_F(CliUser, DecodeRefusesNonFiniteValues) {
  // 0xFF bytes read as bf16 are NaN: refused, no output written.
  const std::string junk(2 * 1152, '\xff');
  spit(path("junk.rec"), junk.data(), junk.size());
  CliRun r = run("codec decode --raw --format bf16 --in " + path("junk.rec") + " --out " + path("x.f32"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("record 0: latent dimension 0 decodes to -nan"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("x.f32")));
}

TEST_F(CliUser, CodecReadsNpySafetensorsAndBf16Rows) {
  const std::vector<float> rows = exact_rows(3, 1.5f);
  spit(path("in.f32"), rows.data(), rows.size() * 4);
  ASSERT_EQ(run("codec encode --format fp8_ds_mla --in " + path("in.f32") + " --out " + path("ref.rec")).rc, 0);
  const std::string ref = slurp(path("ref.rec"));
  // raw bf16
  std::vector<uint16_t> b16(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) b16[i] = f32_to_bf16(rows[i]);
  spit(path("in.bf16"), b16.data(), b16.size() * 2);
  CliRun r = run("codec encode --format fp8_ds_mla --in-dtype bf16 --in " + path("in.bf16") + " --out " + path("a.rec"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(slurp(path("a.rec")), ref);
  // .safetensors bf16 [1, n, 576]
  ASSERT_TRUE(write_safetensors(path("in.safetensors"),
                                {{"kv", TensorView::contiguous(b16.data(), DType::kBF16, {1, 3, 576})}})
                  .ok());
  r = run("codec encode --format fp8_ds_mla --in " + path("in.safetensors") + " --out " + path("b.rec"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(slurp(path("b.rec")), ref);
  // .npy <f4, written by hand (version 1.0 header padded to 64 B)
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 576), }";
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string npy = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(h.size()) + '\0' + h;
  npy.append(reinterpret_cast<const char*>(rows.data()), rows.size() * 4);
  spit(path("in.npy"), npy.data(), npy.size());
  r = run("codec encode --format fp8_ds_mla --in " + path("in.npy") + " --out " + path("c.rec"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(slurp(path("c.rec")), ref);
  // decode to .npy: the same header shape, the same data.
  r = run("codec decode --in " + path("c.rec") + " --out " + path("back.npy"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(slurp(path("back.npy")), npy);
  // A wrong shape is named.
  ASSERT_TRUE(write_safetensors(path("bad.safetensors"),
                                {{"kv", TensorView::contiguous(b16.data(), DType::kBF16, {3, 288, 2})}})
                  .ok());
  r = run("codec encode --format fp8_ds_mla --in " + path("bad.safetensors") + " --out " + path("d.rec"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("shape [3, 288, 2] must be [n, 576]"), std::string::npos) << r.err;
}

TEST_F(CliUser, Fp8ScalesOptionOnlyForFp8DsMla) {
  const std::vector<float> rows = exact_rows(1, 1.0f);
  spit(path("in.f32"), rows.data(), rows.size() * 4);
  CliRun r = run("codec encode --format nvfp4_ds_mla --fp8-scales exact --in " + path("in.f32") + " --out " +
                 path("r.rec"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--fp8-scales applies to fp8_ds_mla"), std::string::npos) << r.err;
  r = run("codec encode --format fp8_ds_mla --fp8-scales exact --in " + path("in.f32") + " --out " + path("r.rec"));
  EXPECT_EQ(r.rc, 0) << r.err;
}

TEST_F(CliUser, CodecStatsPerPart) {
  // Latent 1.0 everywhere: fp8_ds_mla's pow2 tile scale is 2^-8 against amax/448 (rel err
  // 448/256 - 1 = 0.75) and stores 256 exactly; nvfp4's group scale is e4m3(1/6) = 0.171875
  // (rel err 0.03125), decoding 6 x 0.171875 = 1.03125 (latent rel err 0.03125). The rope
  // values are bf16-exact.
  const std::vector<float> rows = exact_rows(2, 1.0f);
  spit(path("in.f32"), rows.data(), rows.size() * 4);
  CliRun r = run("codec stats --format all --in " + path("in.f32") + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  Json j = json_of(r);
  ASSERT_EQ(j["formats"].size(), 6u);
  std::map<std::string, Json> by;
  for (const Json& f : j["formats"]) by[f["format"].get<std::string>()] = f;
  EXPECT_EQ(by["f32"]["latent"]["rel_l2"].get<double>(), 0.0);
  EXPECT_EQ(by["bf16"]["latent"]["rel_l2"].get<double>(), 0.0);
  EXPECT_EQ(by["bf16"]["scales"]["count"], 0);
  EXPECT_EQ(by["fp8_ds_mla"]["latent"]["rel_l2"].get<double>(), 0.0);
  EXPECT_EQ(by["fp8_ds_mla"]["rope"]["rel_l2"].get<double>(), 0.0);
  EXPECT_EQ(by["fp8_ds_mla"]["scales"]["count"], 8);
  EXPECT_NEAR(by["fp8_ds_mla"]["scales"]["mean_rel_err"].get<double>(), 0.75, 1e-6);
  EXPECT_NEAR(by["nvfp4_ds_mla"]["latent"]["rel_l2"].get<double>(), 0.03125, 1e-7);
  EXPECT_NEAR(by["nvfp4_ds_mla"]["scales"]["max_rel_err"].get<double>(), 0.03125, 1e-6);
  EXPECT_EQ(by["nvfp4_ds_mla"]["scales"]["subnormal_group_scales"], 0);
  EXPECT_GT(by["nvfp4_ds_mla_fp8rope"]["rope"]["rel_l2"].get<double>(), 0.0);
  // int8 rope (amax 1, rs = f32(1/127)): 0.25 / rs = 31.75 -> 32, so 0.25 decodes to 32/127 and
  // 0.75 to 95/127; 0.5 to 64/127 (63.5 ties to even), 1 to 127/127 exactly. The latent is nvfp4's.
  {
    double num = 0, den = 0;
    for (int d = 512; d < 576; ++d) {
      const int k = (d % 9) - 4;  // v = k / 4, q = its int8 code derived above
      const int q = k == 0 ? 0 : (k < 0 ? -1 : 1) * (std::abs(k) == 4 ? 127 : std::abs(k) == 3 ? 95 : std::abs(k) == 2 ? 64 : 32);
      const double e = q / 127.0 - k / 4.0;
      num += e * e;
      den += (k / 4.0) * (k / 4.0);
    }
    EXPECT_NEAR(by["nvfp4_ds_mla_int8rope"]["rope"]["rel_l2"].get<double>(), std::sqrt(num / den), 1e-6);
  }
  EXPECT_NEAR(by["nvfp4_ds_mla_int8rope"]["latent"]["rel_l2"].get<double>(), 0.03125, 1e-7);
  EXPECT_LT(by["nvfp4_ds_mla_int8rope"]["rope"]["rel_l2"].get<double>(),
            by["nvfp4_ds_mla_fp8rope"]["rope"]["rel_l2"].get<double>());
  r = run("codec stats --format nvfp4_ds_mla --in " + path("in.f32"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("3.125e-02"), std::string::npos) << r.out;
}

// ---- quality traps ---------------------------------------------------------------------------

TEST_F(CliUser, Nvfp4WithoutOuterScaleOnSmallLatentsWarns) {
  // max |latent| 0.01: every group scale 0.01/6 is below e4m3's 2^-6.
  const std::vector<float> rows = exact_rows(4, 0.01f);
  spit(path("in.f32"), rows.data(), rows.size() * 4);
  CliRun r = run("codec encode --format nvfp4_ds_mla --in " + path("in.f32") + " --out " + path("r.rec"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("warning: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("128 of 128 group scales (4 tokens) fell into e4m3 subnormals"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("s_l = 3.72024e-06"), std::string::npos) << r.err;  // 0.01 / 2688
  // With that scale: no warning.
  r = run("codec encode --format nvfp4_ds_mla --outer-scale 3.72024e-06 --in " + path("in.f32") + " --out " +
          path("r.rec"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
}

// A copy of the deepseek_v3 parity fixture, with kv_a_layernorm scaled by `norm_scale`
// (a power of two: exact in bf16) and, with `mtp`, the layer moved to index 1 as the MTP
// layer of a one-layer model. `compensate`: kv_b_proj's fp8 block scales (weight_scale_inv,
// f32) divided by `norm_scale` too (exact), so that the copy computes the same function with
// its latents norm_scale times the original's (`mlakv reparam`'s rewrite).
std::string fixture_copy(const std::filesystem::path& dir, float norm_scale, bool mtp, bool compensate = false) {
  const std::string src = std::string(MLAKV_TEST_DATA_DIR) + "/hf_parity/deepseek_v3";
  std::filesystem::create_directories(dir);
  auto f = SafetensorsFile::open(src + "/model.safetensors");
  EXPECT_TRUE(f.ok());
  std::vector<std::vector<uint16_t>> keep;
  std::vector<std::vector<float>> keep_f32;
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const std::string& name : (*f)->names()) {
    TensorView t = *(*f)->find(name);
    std::string out = name;
    if (mtp) out.replace(out.find("layers.0."), 9, "layers.1.");
    if (compensate && name.find("kv_b_proj.weight_scale_inv") != std::string::npos) {
      EXPECT_EQ(t.dtype, DType::kF32);
      keep_f32.emplace_back(t.ptr<const float>(), t.ptr<const float>() + t.numel());
      for (float& v : keep_f32.back()) v /= norm_scale;
      t = TensorView::contiguous(keep_f32.back().data(), DType::kF32, {t.size(0), t.size(1)});
    }
    if (name.find("kv_a_layernorm.weight") != std::string::npos) {
      keep.emplace_back(static_cast<std::size_t>(t.numel()));
      for (int64_t i = 0; i < t.numel(); ++i) {
        keep.back()[static_cast<std::size_t>(i)] = f32_to_bf16(bf16_to_f32(t.ptr<const uint16_t>()[i]) * norm_scale);
      }
      t = TensorView::contiguous(keep.back().data(), DType::kBF16, {t.size(0)});
    }
    tensors.emplace_back(out, t);
  }
  EXPECT_TRUE(write_safetensors((dir / "model.safetensors").string(), tensors).ok());
  std::string cfg = CliFixture::slurp(src + "/config.json");
  if (mtp) cfg.replace(cfg.find("\"num_nextn_predict_layers\": 0"), 29, "\"num_nextn_predict_layers\": 1");
  CliFixture::spit(dir / "config.json", cfg.data(), cfg.size());
  std::filesystem::copy_file(src + "/io.safetensors", dir / "io.safetensors");
  return dir.string();
}

TEST_F(CliUser, LayerForwardWarnsNamingTheLayerAndTheScale) {
  const std::string m = fixture_copy(dir_ / "small", 1.0f / 256, false);
  CliRun r = run("layer-forward --model " + m + " --layer 0 --input " + m + "/io.safetensors --output " +
                 path("y.safetensors") + " --format nvfp4_ds_mla");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err.rfind("warning: layer 0: nvfp4_ds_mla at outer scale 1: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("fell into e4m3 subnormals"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("an outer scale s_l = "), std::string::npos) << r.err;
  // The unmodified fixture's latents are large enough: no warning.
  const std::string src = std::string(MLAKV_TEST_DATA_DIR) + "/hf_parity/deepseek_v3";
  r = run("layer-forward --model " + src + " --layer 0 --input " + src + "/io.safetensors --output " +
          path("z.safetensors") + " --format nvfp4_ds_mla");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
}

// layer-forward --format NAME+token-scale: the per-token scale mode (s_t = amax / 2688 per
// record). Exact expectation: the mode is invariant to the latents' magnitude, so on the
// fixture rewritten function-preservingly with latents 2^-8 as large (kv_a_layernorm x 2^-8,
// kv_b_proj x 2^8: every scaling a power of two, so every rounding in the writer, the reader
// and the attention scales with it) the output is bit-identical to the original's, as the
// f32 cache's is; the plain mode at outer scale 1 is not (its e4m3 group scales fall into
// subnormals, and it warns), and its error against the f32 output grows.
TEST_F(CliUser, LayerForwardTokenScaleModeIsInvariantToTheLatentMagnitude) {
  const std::string src = std::string(MLAKV_TEST_DATA_DIR) + "/hf_parity/deepseek_v3";
  const std::string m = fixture_copy(dir_ / "small_same_function", 1.0f / 256, false, /*compensate=*/true);
  std::map<std::string, std::vector<float>> outs;
  auto forward = [&](const std::string& model, const std::string& format, const std::string& key,
                     bool expect_warning = false) {
    const std::string out = path((key + ".safetensors").c_str());
    CliRun r = run("layer-forward --model " + model + " --layer 0 --threads 1 --input " + model +
                   "/io.safetensors --output " + out + " --format " + format + " --json");
    EXPECT_EQ(r.rc, 0) << key << ": " << r.err;
    EXPECT_EQ(r.err.find("warning") != std::string::npos, expect_warning) << key << ": " << r.err;
    if (r.rc != 0) return;
    const Json j = json_of(r);
    EXPECT_EQ(j["token_scale"], format.ends_with("+token-scale")) << key;
    EXPECT_EQ(j["outer_scale"].get<double>(), 1.0) << key;
    auto y = SafetensorsFile::open(out);
    ASSERT_TRUE(y.ok());
    const TensorView t = *(*y)->find("output");
    outs[key].assign(t.ptr<const float>(), t.ptr<const float>() + t.numel());
    EXPECT_EQ((*y)->metadata().at("token_scale"), format.ends_with("+token-scale") ? "true" : "false") << key;
  };
  auto max_diff = [&](const std::string& a, const std::string& b) {
    double e = 0;
    for (std::size_t i = 0; i < outs[a].size(); ++i)
      e = std::max(e, std::fabs(static_cast<double>(outs[a][i]) - outs[b][i]));
    return e;
  };
  forward(src, "f32", "f32");
  forward(m, "f32", "f32_small");
  ASSERT_FALSE(outs["f32"].empty());
  EXPECT_EQ(max_diff("f32", "f32_small"), 0.0) << "the rewritten fixture computes the same function";
  for (const std::string f : {"nvfp4_ds_mla", "nvfp4_ds_mla_fp8rope", "nvfp4_ds_mla_int8rope"}) {
    forward(src, f + "+token-scale", f + "_ts");
    forward(m, f + "+token-scale", f + "_ts_small");
    forward(src, f, f);
    forward(m, f, f + "_small", /*expect_warning=*/true);
    EXPECT_EQ(max_diff(f + "_ts", f + "_ts_small"), 0.0) << f << ": the token-scale output moved with the magnitude";
    const double e_ts = max_diff(f + "_ts", "f32"), e_plain = max_diff(f, "f32"),
                 e_small = max_diff(f + "_small", "f32");
    EXPECT_GT(e_ts, 0.0) << f << ": the mode is lossy";
    // The plain mode at outer scale 1 on the original latents is about as good (0.27 vs 0.26
    // when written); on the small ones its error more than doubles (0.66), the mode's does not move.
    EXPECT_GT(e_small, 2 * e_plain) << f;
    EXPECT_GT(e_small, 2 * e_ts) << f;
  }
  // Refused: the mode on a format without it, and beside a calibration file.
  CliRun r = run("layer-forward --model " + src + " --layer 0 --input " + src + "/io.safetensors --output " +
                 path("x.safetensors") + " --format fp8_ds_mla+token-scale");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--format fp8_ds_mla+token-scale: +token-scale is a mode of the nvfp4 formats only"),
            std::string::npos)
      << r.err;
  write_text("scales.json", R"({"format": "nvfp4_ds_mla_outer_scale_v1", "num_layers": 1, "latent_dim": 512,
                                 "denominator": 2688.0, "scales": [0.001]})");
  r = run("layer-forward --model " + src + " --layer 0 --input " + src + "/io.safetensors --output " +
          path("x.safetensors") + " --format nvfp4_ds_mla+token-scale --scales " + path("scales.json"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("the per-token scale mode replaces the outer scale"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("x.safetensors")));
}

TEST_F(CliUser, ScaleFileNotCoveringTheLayerWarns) {
  // A one-layer model with an MTP layer (index 1) and a one-layer scale file.
  const std::string m = fixture_copy(dir_ / "mtp", 1.0f, true);
  write_text("scales.json", R"({"format": "nvfp4_ds_mla_outer_scale_v1", "num_layers": 1, "latent_dim": 512,
                                 "denominator": 2688.0, "scales": [0.001]})");
  CliRun r = run("layer-forward --model " + m + " --layer 1 --input " + m + "/io.safetensors --output " +
                 path("y.safetensors") + " --format nvfp4_ds_mla --scales " + path("scales.json") + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("warning: --scales"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("covers layers [0, 1); layer 1 is past it and uses outer scale 1.0"), std::string::npos)
      << r.err;
  EXPECT_EQ(json_of(r)["outer_scale"].get<double>(), 1.0);
}

TEST_F(CliUser, CalibrateRefusesDroppedLayersAndRepeatedCaptures) {
  std::vector<float> a(4 * 512, 0.5f), b(4 * 512, 2.0f);
  ASSERT_TRUE(write_safetensors(path("c0.safetensors"),
                                {{"layers.0.kv_c_normed", TensorView::contiguous(a.data(), DType::kF32, {4, 512})}})
                  .ok());
  ASSERT_TRUE(write_safetensors(path("c1.safetensors"),
                                {{"layers.1.kv_c_normed", TensorView::contiguous(b.data(), DType::kF32, {4, 512})}})
                  .ok());
  CliRun r = run("calibrate --activations " + path("c0.safetensors") + " --activations " + path("c1.safetensors") +
                 " --num-layers 1 --out " + path("s.json"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("num_layers 1 leaves out captured layer(s) 1"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("s.json")));
  r = run("calibrate --activations " + path("c0.safetensors") + " --activations " + dir_.string() + "/./c0.safetensors" +
          " --out " + path("s.json"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("are the same capture"), std::string::npos) << r.err;
  r = run("calibrate --activations " + path("c0.safetensors") + " --activations " + path("c1.safetensors") +
          " --out " + path("s.json") + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json_of(r)["num_layers"], 2);
}

// ---- layer-forward input ------------------------------------------------------------------------

TEST_F(CliUser, LayerForwardTakesBf16BatchedInputAndRefusesLongPositions) {
  const std::string src = std::string(MLAKV_TEST_DATA_DIR) + "/hf_parity/deepseek_v3";
  auto io = SafetensorsFile::open(src + "/io.safetensors");
  ASSERT_TRUE(io.ok());
  const TensorView h = *(*io)->find("hidden_states");
  const TensorView pos = *(*io)->find("positions");
  const int64_t T = h.size(0), D = h.size(1);
  std::vector<uint16_t> hb(static_cast<std::size_t>(T * D));
  std::vector<float> hf(hb.size());
  for (std::size_t i = 0; i < hb.size(); ++i) {
    hb[i] = f32_to_bf16(h.ptr<const float>()[i]);
    hf[i] = bf16_to_f32(hb[i]);
  }
  std::vector<int32_t> p32(static_cast<std::size_t>(T));
  for (int64_t t = 0; t < T; ++t) p32[static_cast<std::size_t>(t)] = static_cast<int32_t>(pos.ptr<const int64_t>()[t]);
  ASSERT_TRUE(write_safetensors(path("bf16.safetensors"),
                                {{"hidden_states", TensorView::contiguous(hb.data(), DType::kBF16, {1, T, D})},
                                 {"positions", TensorView::contiguous(p32.data(), DType::kI32, {1, T})}})
                  .ok());
  ASSERT_TRUE(write_safetensors(path("f32.safetensors"),
                                {{"hidden_states", TensorView::contiguous(hf.data(), DType::kF32, {T, D})}, {"positions", pos}})
                  .ok());
  const std::string base = "layer-forward --model " + src + " --layer 0 --threads 1 --input ";
  CliRun r = run(base + path("bf16.safetensors") + " --output " + path("a.safetensors"));
  ASSERT_EQ(r.rc, 0) << r.err;
  r = run(base + path("f32.safetensors") + " --output " + path("b.safetensors"));
  ASSERT_EQ(r.rc, 0) << r.err;
  auto oa = SafetensorsFile::open(path("a.safetensors"));
  auto ob = SafetensorsFile::open(path("b.safetensors"));
  ASSERT_TRUE(oa.ok() && ob.ok());
  const TensorView ya = *(*oa)->find("output"), yb = *(*ob)->find("output");
  ASSERT_EQ(ya.numel(), T * D);
  EXPECT_EQ(std::memcmp(ya.data, yb.data, static_cast<std::size_t>(T * D) * 4), 0) << "bf16 input = its f32 widening";
  // A position at max_position_embeddings (163840) is refused.
  std::vector<int64_t> far(static_cast<std::size_t>(T));
  for (int64_t t = 0; t < T; ++t) far[static_cast<std::size_t>(t)] = 163835 + t;
  ASSERT_TRUE(write_safetensors(path("far.safetensors"),
                                {{"hidden_states", h}, {"positions", TensorView::contiguous(far.data(), DType::kI64, {T})}})
                  .ok());
  r = run(base + path("far.safetensors") + " --output " + path("c.safetensors"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("positions[5] = 163840 is outside [0, 163840)"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("c.safetensors")));
  EXPECT_EQ((*oa)->metadata().at("model"), "deepseek_v3") << "the checkpoint's name, not its path";
  r = run("layer-forward --help");
  EXPECT_NE(r.out.find("AFTER input_layernorm"), std::string::npos) << r.out;
}

// ---- demo ----------------------------------------------------------------------------------

TEST_F(CliUser, DemoFiguresAreRightAndDiscriminate) {
  CliRun r = run("demo --context 2048 --heads 4 --threads 1 --reps 1 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  Json j = json_of(r);
  EXPECT_TRUE(j["threads"].is_number_integer()) << j["threads"];
  EXPECT_EQ(j["threads"], 1);
  EXPECT_EQ(j["simd"].get<std::string>().find("AVX3"), std::string::npos) << j["simd"];
  // The needle holds half of head 0's attention in the float64 reference (up to the float32
  // rounding of its planted latent).
  EXPECT_NEAR(j["needle_weight_reference"].get<double>(), 0.5, 1e-6);
  std::map<std::string, Json> by;
  for (const Json& f : j["formats"]) {
    by[f["format"].get<std::string>()] = f;
    EXPECT_GE(f["needle_weight"].get<double>(), 0.0);
    EXPECT_LE(f["needle_weight"].get<double>(), 1.0);
  }
  ASSERT_EQ(by.size(), 6u);
  // The query's RoPE part is live: fp8 RoPE changes the output (it was identical to 16 digits).
  EXPECT_NE(by["nvfp4_ds_mla"]["out_rel_l2"].get<double>(), by["nvfp4_ds_mla_fp8rope"]["out_rel_l2"].get<double>());
  // The needle's weight separates the formats: bf16 stays close to the reference, nvfp4 not.
  const double e_bf16 = std::fabs(by["bf16"]["needle_weight_err"].get<double>());
  const double e_fp4 = std::fabs(by["nvfp4_ds_mla"]["needle_weight_err"].get<double>());
  EXPECT_LT(e_bf16, 0.01);
  EXPECT_GT(e_fp4, 5 * e_bf16);

  r = run("demo --context 1024 --heads 2 --threads 1 --reps 1 --format nvfp4_ds_mla");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.find("every format"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(ranked first) in nvfp4_ds_mla"), std::string::npos) << r.out;
  r = run("demo --threads -1");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--threads must be >= 0"), std::string::npos) << r.err;
  // Every command with --threads refuses a negative count (0 is "all").
  for (const char* c : {"demo --threads -1",
                               "layer-forward --model m --layer 0 --input x --output y --threads -1",
                               "eval --model m --text t --threads -1", "generate --model m --prompt p --threads -1",
                               "reparam --model m --out o --text t --threads -1"}) {
    r = run(c);
    EXPECT_NE(r.rc, 0) << c;
    EXPECT_NE(r.err.find("--threads must be >= 0"), std::string::npos) << c << ": " << r.err;
  }
}

// ---- formats -------------------------------------------------------------------------------

TEST_F(CliUser, FormatsListTheIndexerRecordAndVllmNames) {
  CliRun r = run("formats --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  Json j = json_of(r);
  EXPECT_EQ(j["indexer_record"]["bytes_per_token_per_indexer_layer"], 132);
  int tiled = 0;
  for (const Json& reg : j["indexer_record"]["layout"]) {
    EXPECT_EQ(reg["offset"], tiled);
    tiled += reg["bytes"].get<int>();
  }
  EXPECT_EQ(tiled, 132);
  std::map<std::string, std::string> want = {{"bf16", "auto"},
                                             {"fp8_ds_mla", "fp8_ds_mla"},
                                             {"nvfp4_ds_mla", "nvfp4_ds_mla"},
                                             {"nvfp4_ds_mla_fp8rope", "nvfp4_ds_mla with KV_FP8_ROPE=1"},
                                             {"f32", "none"},
                                             {"nvfp4_ds_mla_int8rope", "none"}};
  for (const Json& f : j["formats"]) {
    const std::string v = f["vllm_kv_cache_dtype"].get<std::string>();
    EXPECT_EQ(v.rfind(want.at(f["name"].get<std::string>()), 0), 0u) << v;
  }
  r = run("formats");
  EXPECT_NE(r.out.find("vLLM: --kv-cache-dtype fp8_ds_mla"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dsa_indexer_key  132 B per token per indexer layer"), std::string::npos) << r.out;
}

// ---- absorb ---------------------------------------------------------------------------------

TEST_F(CliUser, AbsorbTakesModelDetectsMissingMtpAndWritesNoAbsolutePath) {
  // Two decoder layers shipped, one MTP layer declared but not shipped (as many checkpoints do).
  std::filesystem::create_directories(dir_ / "ckpt");
  const std::string ckpt = (dir_ / "ckpt").string();
  const std::string cfg = R"({"model_type": "deepseek_v3", "hidden_size": 8, "num_hidden_layers": 2,
      "num_attention_heads": 2, "kv_lora_rank": 4, "qk_nope_head_dim": 3, "qk_rope_head_dim": 2, "v_head_dim": 2,
      "q_lora_rank": null, "num_nextn_predict_layers": 1, "rope_theta": 10000})";
  spit(ckpt + "/config.json", cfg.data(), cfg.size());
  std::vector<float> w(10 * 4);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.25f * static_cast<float>(static_cast<int>(i % 7) - 3);
  ASSERT_TRUE(write_safetensors(ckpt + "/model.safetensors",
                                {{"model.layers.0.self_attn.kv_b_proj.weight",
                                  TensorView::contiguous(w.data(), DType::kF32, {10, 4})},
                                 {"model.layers.1.self_attn.kv_b_proj.weight",
                                  TensorView::contiguous(w.data(), DType::kF32, {10, 4})}})
                  .ok());
  CliRun r = run("absorb --model " + ckpt + " --json --out " + path("abs.safetensors"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json_of(r)["layers"], 2);
  EXPECT_NE(r.err.find("declares 1 MTP layer(s) but the checkpoint ships no model.layers.2.self_attn.kv_b_proj"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("as --no-mtp"), std::string::npos) << r.err;
  auto f = SafetensorsFile::open(path("abs.safetensors"));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->metadata().at("model"), "ckpt");
  for (const auto& [k, v] : (*f)->metadata()) EXPECT_EQ(v.find(dir_.string()), std::string::npos) << k << " = " << v;
  // The positional form still works, with a deprecation note.
  r = run("absorb " + ckpt + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("deprecated"), std::string::npos) << r.err;
  // An MTP layer that is shipped but cannot be absorbed: the error says how to skip it.
  ASSERT_TRUE(write_safetensors(ckpt + "/model.safetensors",
                                {{"model.layers.0.self_attn.kv_b_proj.weight",
                                  TensorView::contiguous(w.data(), DType::kF32, {10, 4})},
                                 {"model.layers.1.self_attn.kv_b_proj.weight",
                                  TensorView::contiguous(w.data(), DType::kF32, {10, 4})},
                                 {"model.layers.2.self_attn.kv_b_proj.weight",
                                  TensorView::contiguous(w.data(), DType::kF32, {5, 4})}})
                  .ok());
  r = run("absorb --model " + ckpt);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--no-mtp skips them"), std::string::npos) << r.err;
  r = run("absorb --model " + ckpt + " --no-mtp --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json_of(r)["layers"], 2);
}

// ---- f32: the unquantized parity-check format ----------------------------------------------

TEST_F(CliUser, F32CacheIsExactAndGivesTransformersParity) {
  // Any float survives a round trip bit for bit (bf16 would round these).
  std::vector<float> rows(2 * 576);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = 1.0f / static_cast<float>(i + 3) - 0.1f;
  spit(path("in.f32"), rows.data(), rows.size() * 4);
  CliRun r = run("codec encode --format f32 --in " + path("in.f32") + " --out " + path("r.rec"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(std::filesystem::file_size(path("r.rec")), 64u + 2 * 2304u);
  r = run("codec decode --in " + path("r.rec") + " --out " + path("back.f32"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string back = slurp(path("back.f32"));
  ASSERT_EQ(back.size(), rows.size() * 4);
  EXPECT_EQ(std::memcmp(back.data(), rows.data(), back.size()), 0);

  // layer-forward over an f32 cache is as close to transformers' float64 output as
  // transformers' own float32 run (the fixture's e_ref); a bf16 cache is far from it.
  const std::string src = std::string(MLAKV_TEST_DATA_DIR) + "/hf_parity/deepseek_v3";
  const Json manifest = Json::parse(slurp(std::string(MLAKV_TEST_DATA_DIR) + "/hf_parity/manifest.json"));
  double e_ref = -1;
  for (const Json& m : manifest["results"]) {
    if (m["name"] == "deepseek_v3") e_ref = m["e_ref"].get<double>();
  }
  ASSERT_GT(e_ref, 0);
  auto io = SafetensorsFile::open(src + "/io.safetensors");
  ASSERT_TRUE(io.ok());
  const TensorView ref = *(*io)->find("output_f64");
  auto max_err = [&](const std::string& format) {
    const std::string out = path(("y_" + format + ".safetensors").c_str());
    CliRun fr = run("layer-forward --model " + src + " --layer 0 --threads 1 --input " + src +
                    "/io.safetensors --output " + out + " --format " + format);
    EXPECT_EQ(fr.rc, 0) << fr.err;
    auto y = SafetensorsFile::open(out);
    if (!y.ok()) return 1e30;
    const TensorView t = *(*y)->find("output");
    double e = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
      e = std::max(e, std::fabs(static_cast<double>(t.ptr<const float>()[i]) - ref.ptr<const double>()[i]));
    }
    return e;
  };
  const double e32 = max_err("f32"), e16 = max_err("bf16");
  EXPECT_LE(e32, e_ref) << "f32 cache vs transformers float64";
  EXPECT_GT(e16, 100 * e32);
}

// layer-forward --scales with a mlakv_latent_transform_v2 file: the layer's latent is written
// transformed and its weights folded, so over the lossless f32 cache it still matches
// transformers' float64 output to float32 rounding (within twice transformers' own float32
// error: the transform adds one more set of roundings of the same size); the JSON says
// recipe mlakv, and a file that does not cover --layer is refused.
TEST_F(CliUser, LayerForwardAppliesALatentTransformFile) {
  const std::string src = std::string(MLAKV_TEST_DATA_DIR) + "/hf_parity/deepseek_v3";
  const Json manifest = Json::parse(slurp(std::string(MLAKV_TEST_DATA_DIR) + "/hf_parity/manifest.json"));
  double e_ref = -1;
  for (const Json& m : manifest["results"]) {
    if (m["name"] == "deepseek_v3") e_ref = m["e_ref"].get<double>();
  }
  ASSERT_GT(e_ref, 0);
  LatentTransform t;
  LatentTransformLayer l = LatentTransformLayer::identity();
  SplitMix64 rng(4);
  for (float& m : l.mu) m = 0.05f * rng.normal();
  for (float& d : l.d) d = std::exp(0.3f * rng.normal());
  l.rotate = true;
  l.sign_seed = 17;
  l.rope_rotate = true;
  l.rope_sign_seed = 18;
  t.layers = {l};
  ASSERT_TRUE(write_latent_transform(path("t.json"), t).ok());
  CliRun r = run("layer-forward --model " + src + " --layer 0 --threads 1 --input " + src +
                 "/io.safetensors --output " + path("y.safetensors") + " --format f32 --scales " + path("t.json") +
                 " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(Json::parse(r.out)["recipe"], "mlakv");
  auto io = SafetensorsFile::open(src + "/io.safetensors");
  auto y = SafetensorsFile::open(path("y.safetensors"));
  ASSERT_TRUE(io.ok() && y.ok());
  const TensorView ref = *(*io)->find("output_f64");
  const TensorView out = *(*y)->find("output");
  double e = 0;
  for (int64_t i = 0; i < ref.numel(); ++i)
    e = std::max(e, std::fabs(static_cast<double>(out.ptr<const float>()[i]) - ref.ptr<const double>()[i]));
  EXPECT_LE(e, 2 * e_ref) << "transformed f32 cache vs transformers float64";
  EXPECT_GT(e, 0.0);
  // nvfp4 with the transform runs and stays in nvfp4's error range of the output.
  r = run("layer-forward --model " + src + " --layer 0 --threads 1 --input " + src + "/io.safetensors --output " +
          path("q.safetensors") + " --format nvfp4_ds_mla --scales " + path("t.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("mlakv latent transform, nvfp4 scales rn"), std::string::npos) << r.out;
  EXPECT_EQ(Json::parse(run("layer-forward --model " + src + " --layer 0 --threads 1 --input " + src +
                            "/io.safetensors --output " + path("y2.safetensors") + " --format f32 --scales " +
                            path("t.json") + " --json")
                            .out)["nvfp4_scales"],
            "rn");
  // The same transform with the scale search: applied (the nvfp4 output changes), reported.
  t.nvfp4_scales = Nvfp4ScaleMode::kSearch;
  ASSERT_TRUE(write_latent_transform(path("ts.json"), t).ok());
  r = run("layer-forward --model " + src + " --layer 0 --threads 1 --input " + src + "/io.safetensors --output " +
          path("qs.safetensors") + " --format nvfp4_ds_mla --scales " + path("ts.json") + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(Json::parse(r.out)["nvfp4_scales"], "search");
  {
    auto q = SafetensorsFile::open(path("q.safetensors"));
    auto qs = SafetensorsFile::open(path("qs.safetensors"));
    ASSERT_TRUE(q.ok() && qs.ok());
    const TensorView a = *(*q)->find("output"), b = *(*qs)->find("output");
    ASSERT_EQ(a.numel(), b.numel());
    EXPECT_NE(0, std::memcmp(a.data, b.data, static_cast<std::size_t>(a.numel()) * sizeof(float)));
  }
  // A model with an MTP layer (cache layer 1) and the one-layer transform.
  const std::string m = fixture_copy(dir_ / "mtp_t", 1.0f, true);
  r = run("layer-forward --model " + m + " --layer 1 --threads 1 --input " + m + "/io.safetensors --output " +
          path("z.safetensors") + " --format f32 --scales " + path("t.json"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("covers layers [0, 1), not --layer 1"), std::string::npos) << r.err;
}

TEST(F32Format, CudaViewsAreRefusedClearly) {
  std::vector<uint8_t> bytes(2304 * 4);
  CacheLayerView v;
  v.data = bytes.data();
  v.num_blocks = 1;
  v.block_size = 4;
  v.format = KvFormat::kF32;
  v.record_bytes = 2304;
  EXPECT_TRUE(check_cache_view(v, "cache").ok());  // CPU
  v.device = Device::cuda(0);
  const Status st = check_cache_view(v, "cache");
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("CPU parity-check format"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace mlakv
