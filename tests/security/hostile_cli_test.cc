// Regression tests for issue 15 at the command line: the built `mlakv` binary on
// hostile files and options (docs/security.md). Each hostile input is built here.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "mlakv/safetensors.h"

namespace mlakv {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int rc;
  std::string out, err;
};

class HostileCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mlakv_hcli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Under `timeout`: a hang on a FIFO shows up as rc 124 instead of a stuck suite.
  CliRun run(const std::string& args) {
    const std::string out = (dir_ / "stdout").string(), err = (dir_ / "stderr").string();
    const std::string cmd = "timeout 60 " + std::string(MLAKV_CLI_PATH) + " " + args + " >" + out + " 2>" + err;
    const int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), slurp(out), slurp(err)};
  }
  static std::string slurp(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string put(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  // A one-row codec input: 576 zero floats.
  std::string rows_file(const std::string& name) const { return put(name, std::string(4 * 576, '\0')); }
  static std::string fixture(const std::string& name) {
    return std::string(MLAKV_TEST_DATA_DIR) + "/hf_parity/" + name;
  }
  static void expect_error(const CliRun& r, const std::string& mention) {
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(mention), std::string::npos) << r.err;
  }
  fs::path dir_;
};

TEST_F(HostileCli, OutputEqualToInputIsRefused) {
  const std::string in = rows_file("x.bin");
  CliRun r = run("codec encode --format bf16 --in " + in + " --out " + in);
  expect_error(r, "--out");
  EXPECT_NE(r.err.find("is the same file as --in"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(in), std::string(4 * 576, '\0'));  // untouched
  fs::create_hard_link(in, path("link.bin"));
  expect_error(run("codec encode --format bf16 --in " + in + " --out " + path("link.bin")), "same file");
  fs::create_symlink(in, path("sym.bin"));
  expect_error(run("codec decode --format bf16 --in " + path("sym.bin") + " --out " + in), "same file");

  // calibrate --out over one of its --activations
  std::vector<float> lat(512, 0.25f);
  ASSERT_TRUE(write_safetensors(path("a.safetensors"),
                                {{"layers.0.kv_c_normed", TensorView::contiguous(lat.data(), DType::kF32, {1, 512})}})
                  .ok());
  const std::string before = slurp(path("a.safetensors"));
  expect_error(run("calibrate --activations " + path("a.safetensors") + " --out " + path("a.safetensors")),
               "same file as --activations");
  EXPECT_EQ(slurp(path("a.safetensors")), before);
}

TEST_F(HostileCli, LayerForwardWritesBothOutputsOrNeither) {
  const std::string dir = fixture("deepseek_v3");
  const std::string base = "layer-forward --model " + dir + " --layer 0 --input " + dir + "/io.safetensors --threads 1";
  // --output == --input, and --capture == --output, are refused before any work.
  expect_error(run(base + " --output " + dir + "/io.safetensors"), "same file as --input");
  expect_error(run(base + " --output " + dir + "/model.safetensors"), "same file as a --model shard");
  expect_error(run(base + " --output " + path("y.safetensors") + " --capture " + path("y.safetensors")),
               "--capture");
  EXPECT_FALSE(fs::exists(path("y.safetensors")));
  // A --capture that cannot be written leaves no --output (and no old one is replaced).
  put("y.safetensors", "old output");
  CliRun r = run(base + " --output " + path("y.safetensors") + " --capture " + path("no/such/dir/c.safetensors"));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(slurp(path("y.safetensors")), "old output");
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find("tmp-mlakv"), std::string::npos) << e.path();
  }
  // Both writable: both appear.
  r = run(base + " --output " + path("y.safetensors") + " --capture " + path("c.safetensors"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(SafetensorsFile::open(path("y.safetensors")).ok());
  EXPECT_TRUE(SafetensorsFile::open(path("c.safetensors")).ok());
}

TEST_F(HostileCli, FifosAndDevicesAreRefusedPromptly) {
  const std::string fifo = path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error(run("codec encode --format bf16 --in " + fifo + " --out " + path("o")), "not a regular file (a FIFO)");
  expect_error(run("codec decode --format bf16 --in /dev/zero --out " + path("o")), "not a regular file");
  const std::string dir = fixture("deepseek_v3");
  expect_error(run("layer-forward --model " + dir + " --layer 0 --input " + fifo + " --output " + path("y")),
               "not a regular file (a FIFO)");
  expect_error(run("layer-forward --model " + dir + " --layer 0 --input " + dir + "/io.safetensors --scales /dev/zero "
                   "--format nvfp4_ds_mla --output " + path("y")),
               "not a regular file (a character device)");
  fs::create_directories(dir_ / "m");
  ASSERT_EQ(::mkfifo(path("m/config.json").c_str(), 0600), 0);
  expect_error(run("plan --model " + path("m")), "not a regular file");
  EXPECT_FALSE(fs::exists(path("o")));
}

TEST_F(HostileCli, NumericOptionsOutsideTheirRangesAreErrors) {
  expect_error(run("plan --model deepseek-v3 --gpu-mem 1e20"), "overflow");
  expect_error(run("plan --model deepseek-v3 --gpu-mem inf"), "gpu-mem");
  expect_error(run("absorb --synthetic deepseek-v2-lite --report --gpu-mem inf --json"), "--gpu-mem inf");
  expect_error(run("absorb --synthetic deepseek-v2-lite --report --other-weights-mib inf --json"),
               "--other-weights-mib inf");
  expect_error(run("absorb --synthetic deepseek-v2-lite --gpu-mem 1e300 --layers 1"), "--gpu-mem");
  expect_error(run("demo --reps 2147483647"), "--reps must be in [1, 10000]");
  expect_error(run("demo --context 16777216"), "--context must be in [2, 4194304]");
}

TEST_F(HostileCli, JsonWithANonUtf8PathDoesNotAbort) {
  const std::string in = rows_file("x.bin");
  const std::string out = path("o\xff\xfe.bin");
  CliRun r = run("codec encode --format bf16 --in " + in + " --out '" + out + "' --json");
  ASSERT_EQ(r.rc, 0) << r.err;  // was: nlohmann type_error, abort (134) after writing the file
  EXPECT_NE(r.out.find("\"tokens\": 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\xef\xbf\xbd"), std::string::npos) << r.out;  // U+FFFD
  EXPECT_TRUE(fs::exists(out));
}

TEST_F(HostileCli, ControlCharactersFromFilesNeverReachTheTerminal) {
  // A safetensors --input whose only tensor name carries OSC (retitle) and CSI (clear).
  const std::string header =
      R"({"h\u001b]0;owned\u0007\u001b[2J": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}})";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[static_cast<std::size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
  put("evil.safetensors", file + header + "x");
  const std::string dir = fixture("deepseek_v3");
  CliRun r = run("layer-forward --model " + dir + " --layer 0 --input " + path("evil.safetensors") + " --output " +
                 path("y"));
  expect_error(r, "h\\x1b]0;owned\\x07\\x1b[2J");
  for (unsigned char c : r.err) EXPECT_TRUE(c >= 0x20 || c == '\n') << static_cast<int>(c);
}

TEST_F(HostileCli, DeeplyNestedConfigIsAnErrorNotACrash) {
  fs::create_directories(dir_ / "m");
  put("m/config.json", R"({"kv_lora_rank": 512, "a": )" + std::string(100000, '[') + std::string(100000, ']') + "}");
  expect_error(run("plan --model " + path("m")), "nests deeper than 32 levels");
  expect_error(run("absorb --model " + path("m")), "nests deeper than 32 levels");
}

}  // namespace
}  // namespace mlakv
