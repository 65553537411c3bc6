// mlakv eval / generate / reparam / calibrate --model from the command line: the output on
// a tiny fixture model, and every bad input giving `error: ...` that names the problem with
// no output file left behind.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "support/cli_run.h"

namespace mlakv {
namespace {

namespace fs = std::filesystem;
using testing::CliFixture;

const std::string kTiny = std::string(MLAKV_TEST_DATA_DIR) + "/model_parity/v3_moe";  // vocab 96, 2 layers

class EvalCli : public CliFixture {
 protected:
  // n random ids below 96 as a --tokens file.
  std::string tokens(int n, uint64_t seed = 3) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> t(static_cast<std::size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng() % 96);
    const std::string p = path("tokens.bin");
    spit(p, t.data(), t.size() * sizeof(int32_t));
    return p;
  }
};

TEST_F(EvalCli, JsonHasEveryFormatAndTheReference) {
  const std::string tk = tokens(4 * 32);
  const auto r = run("eval --model " + kTiny + " --tokens " + tk +
                     " --context 32 --windows 2 --scales auto --calib-windows 2 --json --plot " + path("p.svg"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["reference"]["ppl"].get<double>(), 1.0);
  // 5 formats + calibrated rows for the three nvfp4 formats.
  ASSERT_EQ(j["formats"].size(), 8u);
  for (const auto& row : j["formats"]) {
    for (const char* k : {"format", "scales", "kld_mean", "kld_p99", "top1_agree", "ppl", "needle_found", "needle_total"}) {
      EXPECT_TRUE(row.contains(k)) << k;
    }
    EXPECT_GT(row["kld_mean"].get<double>(), 0.0) << row["format"];  // every format rounds the cache
  }
  EXPECT_TRUE(fs::exists(path("p.svg")));
}

// "+token-scale" rows: the nvfp4 per-token scale mode, one row each (no --scales variant).
TEST_F(EvalCli, TokenScaleRows) {
  const std::string tk = tokens(2 * 32);
  auto r = run("eval --model " + kTiny + " --tokens " + tk +
               " --context 32 --windows 2 --formats "
               "nvfp4_ds_mla_int8rope,nvfp4_ds_mla_fp8rope+token-scale,nvfp4_ds_mla_int8rope+token-scale --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  std::vector<std::string> got;
  for (const auto& row : j["formats"]) {
    got.push_back(row["format"].get<std::string>() + "/" + row["scales"].get<std::string>() + "/" +
                  (row["token_scale"].get<bool>() ? "ts" : "-"));
    EXPECT_GT(row["kld_mean"].get<double>(), 0.0) << row["format"];
  }
  const std::vector<std::string> want = {"nvfp4_ds_mla_int8rope/none/-", "nvfp4_ds_mla_fp8rope/token/ts",
                                         "nvfp4_ds_mla_int8rope/token/ts"};
  EXPECT_EQ(got, want);
  r = run("eval --model " + kTiny + " --tokens " + tk + " --context 32 --windows 1 --formats fp8_ds_mla+token-scale");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("+token-scale is a mode of the nvfp4 formats only"), std::string::npos) << r.err;
}

TEST_F(EvalCli, TooShortInputNamesWhatIsNeeded) {
  const std::string tk = tokens(50);
  const auto r = run("eval --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --plot " + path("p.svg"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("error: the input has 50 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("need 64"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("p.svg")));
}

TEST_F(EvalCli, BadInputs) {
  const std::string tk = tokens(64);
  auto r = run("eval --model " + kTiny + " --tokens " + tk + " --context 32 --windows 1 --formats bf16,fp9");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("unknown format 'fp9'"), std::string::npos) << r.err;
  r = run("eval --model " + path("nowhere") + " --tokens " + tk);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("error:"), std::string::npos);
  EXPECT_NE(r.err.find("nowhere"), std::string::npos) << r.err;
  // A token id outside the vocabulary.
  std::vector<int32_t> bad = {1, 2, 500};
  spit(path("bad.bin"), bad.data(), bad.size() * 4);
  r = run("eval --model " + kTiny + " --tokens " + path("bad.bin") + " --context 2 --windows 1");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("500"), std::string::npos) << r.err;
  // Empty text; no tokenizer in the fixture directory for --text.
  spit(path("empty.txt"), "", 0);
  r = run("eval --model " + kTiny + " --text " + path("empty.txt"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("error:"), std::string::npos);
  // --context past max_position_embeddings (256).
  r = run("eval --model " + kTiny + " --tokens " + tokens(1024) + " --context 512 --windows 1");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("max_position_embeddings"), std::string::npos) << r.err;
}

TEST_F(EvalCli, AConfigTheRunnerCannotRun) {
  fs::create_directories(path("m"));
  fs::copy_file(kTiny + "/model.safetensors", path("m/model.safetensors"));
  std::string cfg = slurp(kTiny + "/config.json");
  const auto j = nlohmann::json::parse(cfg);
  auto k = j;
  k["model_type"] = "llama";
  const std::string s = k.dump();
  spit(path("m/config.json"), s.data(), s.size());
  const auto r = run("eval --model " + path("m") + " --tokens " + tokens(64) + " --context 32 --windows 1");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("llama"), std::string::npos) << r.err;
}

// Missing tensors and wrong shapes are model_load_test's; here the CLI path of a damaged file.
TEST_F(EvalCli, TruncatedCheckpointIsNamed) {
  fs::create_directories(path("m"));
  fs::copy_file(kTiny + "/config.json", path("m/config.json"));
  const std::string st = slurp(kTiny + "/model.safetensors");
  spit(path("m/model.safetensors"), st.data(), st.size() / 2);
  const auto r = run("eval --model " + path("m") + " --tokens " + tokens(64) + " --context 32 --windows 1");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
}

TEST_F(EvalCli, GenerateReportsSpeedAndRefusesBadFormats) {
  auto r = run("generate --model " + kTiny + " --prompt x --format fp9");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("fp9"), std::string::npos) << r.err;
  // The fixture has no tokenizer.json and a 96-id vocabulary: --prompt cannot be encoded.
  r = run("generate --model " + kTiny + " --prompt hello");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("tokenizer"), std::string::npos) << r.err;
  // The per-token scale mode on the shipped model (it has a tokenizer); only nvfp4 formats.
  const std::string shipped = std::string(MLAKV_SOURCE_DIR) + "/models/mlakv-ds3-tiny";
  r = run("generate --model " + shipped + " --prompt Hello --max-tokens 3 --format nvfp4_ds_mla_int8rope+token-scale --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["format"], "nvfp4_ds_mla_int8rope");
  EXPECT_EQ(nlohmann::json::parse(r.out)["token_scale"], true);
  r = run("generate --model " + shipped + " --prompt Hello --format fp8_ds_mla+token-scale");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("+token-scale is a mode of the nvfp4 formats only"), std::string::npos) << r.err;
}

TEST_F(EvalCli, CalibrateFromTokensEqualsTheLibrary) {
  const std::string tk = tokens(2 * 32);
  const auto r = run("calibrate --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --out " +
                     path("s.json") + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["num_layers"].get<int>(), 2);
  for (const auto& l : j["layers"]) {
    EXPECT_DOUBLE_EQ(l["scale"].get<double>(), l["max_abs"].get<double>() / 2688.0);
  }
  // Too little text: error, no scale file.
  const auto bad = run("calibrate --model " + kTiny + " --tokens " + tk + " --context 32 --windows 3 --out " +
                       path("t.json"));
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("need 96"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(path("t.json")));
}

TEST_F(EvalCli, ReparamPreservesTheFunction) {
  const std::string tk = tokens(4 * 32);
  auto r = run("reparam --model " + kTiny + " --out " + path("rp") + " --tokens " + tk +
               " --context 32 --windows 2 --min 0.02 --max 5 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["layers"].size(), 2u);
  for (const auto& l : j["layers"]) {
    const double f = l["factor"].get<double>();
    EXPECT_EQ(std::exp2(std::round(std::log2(f))), f);  // a power of two
  }
  // Same logits (bf16 cache KLD against the same reference): eval on both directories.
  const auto a = run("eval --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --formats bf16 --json");
  const auto b = run("eval --model " + path("rp") + " --tokens " + tk + " --context 32 --windows 2 --formats bf16 --json");
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  const double pa = nlohmann::json::parse(a.out)["reference"]["ppl"], pb = nlohmann::json::parse(b.out)["reference"]["ppl"];
  EXPECT_NEAR(pa, pb, 1e-4 * pa);
  // The output directory must not exist already.
  r = run("reparam --model " + kTiny + " --out " + path("rp") + " --tokens " + tk + " --context 32 --windows 2");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("exists"), std::string::npos) << r.err;
}

// The mlakv recipe from the command line: calibrate --recipe mlakv writes a
// mlakv_latent_transform_v2 file, eval --scales FILE detects its kind, and --recipe both
// with --scales auto reports rows per recipe x format with the recipe in the JSON.
TEST_F(EvalCli, MlakvRecipeCalibrateAndEval) {
  const std::string tk = tokens(4 * 32);
  const std::string out = path("t.json");
  auto r = run("calibrate --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --recipe mlakv " +
               "--importance uniform --json --out " + out);
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto cj = nlohmann::json::parse(r.out);
  EXPECT_EQ(cj["format"], "mlakv_latent_transform_v2");
  EXPECT_EQ(cj["importance"], "uniform");
  EXPECT_EQ(cj["nvfp4_scales"], "search");
  const auto file = nlohmann::json::parse(slurp(out));
  EXPECT_EQ(file["format"], "mlakv_latent_transform_v2");
  EXPECT_EQ(file["nvfp4_scales"], "search");  // calibrate's default
  ASSERT_EQ(file["layers"].size(), 2u);
  EXPECT_EQ(file["layers"][0]["rope_rotate"], true);
  EXPECT_DOUBLE_EQ(file["layers"][1]["outer_scale"].get<double>(),
                   static_cast<double>(static_cast<float>(file["layers"][1]["max_abs"].get<double>() / 2688.0)));
  // eval with the file: its kind is detected; the rows say mlakv.
  r = run("eval --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --formats nvfp4_ds_mla --scales " +
          out + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["formats"].size(), 2u);
  EXPECT_EQ(j["formats"][0]["recipe"], "none");
  EXPECT_EQ(j["formats"][1]["recipe"], "mlakv");
  EXPECT_EQ(j["formats"][1]["scales"], "t.json");
  // Both recipes calibrated on the text after the eval windows, the 5 default formats:
  // 5 none + 3 fork (the nvfp4 family) + 5 mlakv rows.
  r = run("eval --model " + kTiny + " --tokens " + tk +
          " --context 32 --windows 2 --scales auto --calib-windows 2 --recipe both --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["formats"].size(), 13u);
  int fork = 0, mlakv = 0;
  for (const auto& row : j["formats"]) {
    fork += row["recipe"] == "fork";
    mlakv += row["recipe"] == "mlakv";
    EXPECT_GT(row["kld_mean"].get<double>(), 0.0);
  }
  EXPECT_EQ(fork, 3);
  EXPECT_EQ(mlakv, 5);
  // The table has the recipe column.
  r = run("eval --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --formats nvfp4_ds_mla --scales " +
          out);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("recipe"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mlakv"), std::string::npos) << r.out;
}

// calibrate --recipe mlakv selects the sign seed: by default 4 candidates (seed + k * 2^20),
// recorded in the file with their calibration KLDs, the chosen one the minimum and the
// layers' base; --seed-candidates 1 is the seed as given (no record, the same layer seeds as
// candidate 0); bad values are refused before anything is written.
TEST_F(EvalCli, MlakvRecipeSelectsTheSignSeed) {
  const std::string tk = tokens(4 * 32);
  const std::string base = "calibrate --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --recipe mlakv";
  auto r = run(base + " --seed 40 --json --out " + path("k4.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto file = nlohmann::json::parse(slurp(path("k4.json")));
  const auto& ss = file["seed_search"];
  ASSERT_EQ(ss["candidates"].size(), 4u);
  EXPECT_EQ(ss["format"], "nvfp4_ds_mla");
  EXPECT_EQ(ss["windows"], 2);
  double best = 1e30;
  uint64_t best_seed = 0;
  for (std::size_t k = 0; k < 4; ++k) {
    const auto& c = ss["candidates"][k];
    EXPECT_EQ(c["seed"].get<uint64_t>(), 40 + k * (uint64_t{1} << 20));
    if (c["kld_mean"].get<double>() < best) best = c["kld_mean"].get<double>(), best_seed = c["seed"].get<uint64_t>();
  }
  EXPECT_EQ(ss["chosen"].get<uint64_t>(), best_seed);
  EXPECT_EQ(file["layers"][1]["sign_seed"].get<uint64_t>(), best_seed + 2);
  EXPECT_EQ(nlohmann::json::parse(r.out)["seed_search"]["chosen"].get<uint64_t>(), best_seed);
  r = run(base + " --seed 40 --seed-candidates 1 --out " + path("k1.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto one = nlohmann::json::parse(slurp(path("k1.json")));
  EXPECT_FALSE(one.contains("seed_search"));
  EXPECT_EQ(one["layers"][1]["sign_seed"], 42);
  for (const char* bad : {" --seed-candidates 0", " --seed-candidates 65", " --select-format f32",
                          " --select-format nvfp5"}) {
    r = run(base + bad + " --out " + path("no.json"));
    EXPECT_EQ(r.rc, 1) << bad;
    EXPECT_NE(r.err.find(std::string(bad).substr(1, std::string(bad).find(' ', 1) - 1)), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(path("no.json"))) << bad;
  }
}

// --nvfp4-scales: calibrate --recipe mlakv records it (search by default, rn on request) and
// eval applies what the file says: a v1 file (no such key) evaluates exactly as the rn file
// it was made from, the search file differently; bad values and the fork recipe are refused.
TEST_F(EvalCli, Nvfp4ScalesRecordedAndApplied) {
  const std::string tk = tokens(4 * 32);
  const std::string base = "calibrate --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --recipe mlakv "
                           "--seed-candidates 1";
  auto r = run(base + " --nvfp4-scales rn --out " + path("rn.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("nvfp4 scales rn"), std::string::npos) << r.out;
  r = run(base + " --out " + path("search.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  auto rn = nlohmann::json::parse(slurp(path("rn.json")));
  EXPECT_EQ(rn["nvfp4_scales"], "rn");
  EXPECT_EQ(nlohmann::json::parse(slurp(path("search.json")))["nvfp4_scales"], "search");
  // The same transform as a version-1 file.
  nlohmann::json v1 = rn;
  v1["format"] = "mlakv_latent_transform_v1";
  v1.erase("nvfp4_scales");
  {
    std::ofstream f(path("v1.json"));
    f << v1.dump(1);
  }
  r = run("eval --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --formats nvfp4_ds_mla,bf16 --scales " +
          path("rn.json") + " --scales " + path("v1.json") + " --scales " + path("search.json") + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["formats"].size(), 8u);  // per format: none + 3 files
  for (int f = 0; f < 2; ++f) {
    const auto& rows = j["formats"];
    const auto& a = rows[4 * f + 1];
    const auto& b = rows[4 * f + 2];
    const auto& c = rows[4 * f + 3];
    EXPECT_EQ(a["scales"], "rn.json");
    EXPECT_EQ(b["scales"], "v1.json");
    EXPECT_EQ(c["scales"], "search.json");
    EXPECT_EQ(a["kld_mean"].get<double>(), b["kld_mean"].get<double>()) << rows[4 * f]["format"];
    if (rows[4 * f]["format"] == "nvfp4_ds_mla") {
      EXPECT_NE(a["kld_mean"].get<double>(), c["kld_mean"].get<double>());
    } else {  // bf16: no nvfp4 groups, the same records
      EXPECT_EQ(a["kld_mean"].get<double>(), c["kld_mean"].get<double>());
    }
  }
  // The seed selection runs with the file's mode in effect: two candidates' calibration KLDs
  // differ between rn and search (the same transforms otherwise).
  const std::string sel = "calibrate --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --recipe mlakv "
                          "--seed-candidates 2";
  ASSERT_EQ(run(sel + " --nvfp4-scales rn --out " + path("sel_rn.json")).rc, 0);
  ASSERT_EQ(run(sel + " --out " + path("sel_search.json")).rc, 0);
  const auto srn = nlohmann::json::parse(slurp(path("sel_rn.json")))["seed_search"]["candidates"];
  const auto sse = nlohmann::json::parse(slurp(path("sel_search.json")))["seed_search"]["candidates"];
  ASSERT_EQ(srn.size(), 2u);
  ASSERT_EQ(sse.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(srn[k]["seed"], sse[k]["seed"]);
    EXPECT_NE(srn[k]["kld_mean"].get<double>(), sse[k]["kld_mean"].get<double>()) << k;
  }
  // Refused before anything is written.
  r = run(base + " --nvfp4-scales nearest --out " + path("bad.json"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--nvfp4-scales: expected \"rn\" or \"search\", got \"nearest\""), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("bad.json")));
  r = run("calibrate --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --nvfp4-scales search --out " +
          path("fork.json"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--nvfp4-scales is an option of --recipe mlakv"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("fork.json")));
  r = run("eval --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --scales auto --recipe mlakv "
          "--nvfp4-scales maybe");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--nvfp4-scales"), std::string::npos) << r.err;
  // A file whose nvfp4_scales is not a mode: the strict parser's error, naming the file.
  nlohmann::json bad = rn;
  bad["nvfp4_scales"] = "fast";
  {
    std::ofstream f(path("badfile.json"));
    f << bad.dump(1);
  }
  r = run("eval --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --formats nvfp4_ds_mla --scales " +
          path("badfile.json"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("badfile.json: field 'nvfp4_scales' must be \"rn\" or \"search\""), std::string::npos) << r.err;
}

TEST_F(EvalCli, MlakvRecipeBadInputs) {
  const std::string tk = tokens(4 * 32);
  const std::string out = path("t.json");
  ASSERT_EQ(run("calibrate --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --recipe mlakv --out " +
                out)
                .rc,
            0);
  // A file of the other recipe than --recipe asks for.
  auto r = run("eval --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --recipe fork --scales " + out);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("mlakv-recipe file"), std::string::npos) << r.err;
  r = run("eval --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --recipe best --scales auto");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--recipe must be fork, mlakv or both"), std::string::npos) << r.err;
  r = run("calibrate --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --recipe mlakv --importance "
          "gradient --out " + path("u.json"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--importance"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("u.json")));
  // --importance file:PATH: a damaged importance file names itself and the field; nothing written.
  {
    std::ofstream(path("imp.json")) << R"({"format": "mlakv_latent_importance_v1", "num_layers": 2,
      "latent_dim": 512, "estimate": "fisher", "layers": [{"w2": [1]}, {"w2": [1]}]})";
  }
  r = run("calibrate --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --recipe mlakv --importance "
          "file:" + path("imp.json") + " --out " + path("u.json"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("imp.json: layers[0].w2 must be a list of 512 numbers"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("u.json")));
  {
    nlohmann::json good = {{"format", "mlakv_latent_importance_v1"}, {"num_layers", 2}, {"latent_dim", 512},
                           {"estimate", "gradient"}};
    std::vector<double> w2(512);
    for (int i = 0; i < 512; ++i) w2[static_cast<std::size_t>(i)] = 1.0 + i % 3;
    good["layers"] = {{{"w2", w2}}, {{"w2", w2}}};
    std::ofstream(path("imp.json")) << good.dump();
  }
  r = run("calibrate --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --recipe mlakv --importance "
          "file:" + path("imp.json") + " --seed-candidates 1 --json --out " + path("v.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["importance"], "file");
  EXPECT_EQ(nlohmann::json::parse(slurp(path("v.json")))["importance"], "file");
  r = run("eval --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --recipe mlakv --scales auto "
          "--calib-windows 1 --importance file:" + path("none.json"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("none.json"), std::string::npos) << r.err;
  r = run("calibrate --activations x.safetensors --recipe mlakv --out " + path("u.json"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_FALSE(fs::exists(path("u.json")));
  // A damaged transform file: the error names the file and field.
  auto j = nlohmann::json::parse(slurp(out));
  j["layers"][1]["d"][3] = -1.0;
  const std::string bad = j.dump();
  spit(path("bad.json"), bad.data(), bad.size());
  r = run("eval --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --scales " + path("bad.json"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("layers[1].d[3]"), std::string::npos) << r.err;
  // A transform of another depth than the model.
  j = nlohmann::json::parse(slurp(out));
  j["layers"].push_back(j["layers"][0]);
  j["num_layers"] = 3;
  // (the copied layer's seeds no longer follow the seed_search record's base, which the parser
  // checks: drop the optional audit record, as a hand-made file would not have it)
  j.erase("seed_search");
  const std::string deep = j.dump();
  spit(path("deep.json"), deep.data(), deep.size());
  r = run("eval --model " + kTiny + " --tokens " + tk + " --context 32 --windows 2 --scales " + path("deep.json"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("3 layers given for a model of 2"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace mlakv
