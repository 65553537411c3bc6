// Regression tests for issue 15 (hostile input and faults), library level. Every
// hostile input is built here, in the test; docs/security.md lists the limits.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/checked_math.h"
#include "core/untrusted_json.h"
#include "mlakv/cache.h"
#include "mlakv/codec.h"
#include "mlakv/file_io.h"
#include "mlakv/formats.h"
#include "mlakv/hf_config.h"
#include "mlakv/kv_b_proj.h"
#include "mlakv/mla_layer.h"
#include "mlakv/numerics.h"
#include "mlakv/outer_scales.h"
#include "mlakv/plan.h"
#include "mlakv/safetensors.h"
#include "mlakv/tensor_source.h"
#include "mlakv/untrusted.h"

namespace mlakv {
namespace {

namespace fs = std::filesystem;

class Hostile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mlakv_hostile_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string put(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  static std::string slurp(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  // Entries of the test directory whose name contains `part`.
  int count_entries(const std::string& part) const {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir_)) n += e.path().filename().string().find(part) != std::string::npos;
    return n;
  }
  fs::path dir_;
};

// A safetensors file: u64 header length, the header, the data.
std::string st_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

bool has_control_bytes(const std::string& s) {
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) return true;
  }
  return false;
}

std::string nested(int depth) { return std::string(static_cast<std::size_t>(depth), '[') + std::string(static_cast<std::size_t>(depth), ']'); }

// ---- High: the fp8 block grid --------------------------------------------------------

TEST(HostileFp8Grid, HugeBlockSizeIsRefusedByTheConfigParser) {
  for (const char* block : {"[9223372036854775807, 128]", "[128, 9223372036854775807]", "[1048577, 128]", "[0, 128]"}) {
    const std::string q = std::string(R"({"quant_method": "fp8", "weight_block_size": )") + block + "}";
    auto r = parse_weight_quant_options(q);
    ASSERT_FALSE(r.ok()) << block;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("weight_block_size"), std::string::npos) << r.status().to_string();
  }
  auto ok = parse_weight_quant_options(R"({"quant_method": "fp8", "weight_block_size": [1048576, 1]})");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->fp8_block_rows, kMaxFp8BlockExtent);
}

TEST(HostileFp8Grid, ZeroRowScaleGridNoLongerPassesAndTheOneRowGridIsExact) {
  // N = 3, K = 4, block [2^63 - 1, 128]: the grid is ceil(3 / (2^63-1)) x ceil(4 / 128) =
  // [1, 1]. The old (N + bn - 1) / bn wrapped to 0 rows, so a [0, 1] scale tensor passed
  // and the dequantizer read the scale out of bounds.
  const int64_t N = 3, K = 4;
  std::vector<uint8_t> w(N * K);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint8_t>(0x30 + i);  // finite e4m3 codes
  WeightQuantOptions opt;
  opt.fp8_block_rows = std::numeric_limits<int64_t>::max();
  opt.fp8_block_cols = 128;
  {
    TensorMap src;
    ASSERT_TRUE(src.add("l.weight", DType::kF8E4M3, {N, K}, w.data(), w.size()).ok());
    ASSERT_TRUE(src.add("l.weight_scale_inv", DType::kF32, {0, 1}, nullptr, 0).ok());
    std::vector<float> out(N * K, -1.0f);
    const Status st = dequantize_weight(src, "l", N, K, opt, TensorView::contiguous(out.data(), DType::kF32, {N, K}));
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("weight_scale_inv"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("[1, 1]"), std::string::npos) << st.to_string();
    EXPECT_FALSE(check_weight_storage(src, "l", N, K, opt).ok());
  }
  {
    TensorMap src;
    const float scale = 0.5f;
    ASSERT_TRUE(src.add("l.weight", DType::kF8E4M3, {N, K}, w.data(), w.size()).ok());
    ASSERT_TRUE(src.add("l.weight_scale_inv", DType::kF32, {1, 1}, &scale, sizeof scale).ok());
    EXPECT_TRUE(check_weight_storage(src, "l", N, K, opt).ok());
    std::vector<float> out(N * K, -1.0f);
    ASSERT_TRUE(dequantize_weight(src, "l", N, K, opt, TensorView::contiguous(out.data(), DType::kF32, {N, K})).ok());
    for (std::size_t i = 0; i < w.size(); ++i) EXPECT_EQ(out[i], e4m3_to_f32(w[i]) * 0.5f) << i;
  }
}

TEST(HostileFp8Grid, GroupSizeNearInt64MaxDoesNotWrap) {
  WeightQuantOptions opt;
  opt.group_size = std::numeric_limits<int64_t>::max();
  // GPTQ, K = 8, N = 8: ceil(8 / G) = 1 scale row; a 0-row scales tensor must fail.
  TensorMap src;
  std::vector<int32_t> qw(8, 0);
  ASSERT_TRUE(src.add("l.qweight", DType::kI32, {1, 8}, qw.data(), qw.size() * 4).ok());
  ASSERT_TRUE(src.add("l.scales", DType::kF16, {0, 8}, nullptr, 0).ok());
  ASSERT_TRUE(src.add("l.qzeros", DType::kI32, {0, 1}, nullptr, 0).ok());
  opt.encoding = WeightEncoding::kGptq;
  std::vector<float> out(64);
  const Status st = dequantize_weight(src, "l", 8, 8, opt, TensorView::contiguous(out.data(), DType::kF32, {8, 8}));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("expects shape [1, 8]"), std::string::npos) << st.to_string();
}

TEST(HostileFp8Grid, KvBProjGeometryOverflowIsAnError) {
  TensorMap src;
  MlaGeometry g;  // 2^30 heads x (2^30 + 1) x 512: past 2^63
  g.num_heads = 1 << 30;
  g.qk_nope_head_dim = 1 << 30;
  g.v_head_dim = 1;
  g.kv_lora_rank = 512;
  std::vector<float> out(1);
  const Status st = dequantize_kv_b_proj(src, "x", g, {}, TensorView::contiguous(out.data(), DType::kF32, {1, 1, 1}));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("overflows"), std::string::npos) << st.to_string();
}

// ---- Medium: deep JSON nesting --------------------------------------------------------

TEST(HostileJson, DeepNestingIsRefusedByEveryParser) {
  const std::string deep = nested(200000);  // would overflow the stack in a recursive walk
  const std::string in_config = R"({"kv_lora_rank": 512, "x": )" + deep + "}";
  const std::string in_quant = R"({"quant_method": "fp8", "weight_block_size": )" + deep + "}";
  const std::string in_wrapped = R"({"quantization_config": )" + deep + "}";
  for (const auto& [what, st] : std::vector<std::pair<std::string, Status>>{
           {"parse_hf_config", parse_hf_config(in_config, "config.json").status()},
           {"parse_weight_quant_options", parse_weight_quant_options(in_quant).status()},
           {"parse_weight_quant_options wrapped", parse_weight_quant_options(in_wrapped).status()},
           {"parse_outer_scales", parse_outer_scales(R"({"scales": )" + deep + "}", "s.json").status()}}) {
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_NE(st.message().find("nests deeper than 32 levels"), std::string::npos) << what << ": " << st.to_string();
  }
}

TEST(HostileJson, TheLimitIsExactlyThirtyTwoLevels) {
  // 32 levels parse (the root object is level 1); 33 do not.
  const std::string ok = "{\"a\": " + nested(31) + "}";
  const std::string bad = "{\"a\": " + nested(32) + "}";
  EXPECT_EQ(json_util::nesting_depth(ok, 100), 32);
  EXPECT_TRUE(json_util::parse(ok, "t").ok());
  auto r = json_util::parse(bad, "t");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "t: JSON nests deeper than 32 levels");
  // Brackets inside strings do not count.
  EXPECT_TRUE(json_util::parse("{\"a\": \"" + std::string(100, '[') + "\"}", "t").ok());
}

TEST_F(Hostile, DeepNestingInFilesIsRefused) {
  const std::string deep = nested(100000);
  fs::create_directories(dir_ / "m");
  put("m/config.json", R"({"kv_lora_rank": 512, "quantization_config": )" + deep + "}");
  auto c = load_hf_config(path("m"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("nests deeper"), std::string::npos) << c.status().to_string();
  auto q = load_weight_quant_options(path("m"));
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("nests deeper"), std::string::npos) << q.status().to_string();
  put("m/model.safetensors.index.json", R"({"weight_map": )" + deep + "}");
  auto ck = Checkpoint::open(path("m"));
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(ck.status().message().find("nests deeper"), std::string::npos) << ck.status().to_string();
}

// ---- Medium: allocation before validation ---------------------------------------------

TEST(HostileAlloc, HugeGeometryWithoutTensorsAllocatesNothing) {
  // Inside every accepted range: q_a_proj alone would be 2^17 x 2^17 f32 = 64 GiB, and
  // the old loader zero-filled it before looking for the tensor.
  ModelConfig c;
  c.name = "huge";
  c.hidden_size = 1 << 17;
  c.num_layers = 1;
  c.num_heads = 1;
  c.q_lora_rank = 1 << 17;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  TensorMap src;
  std::vector<uint16_t> small(16, 0);
  ASSERT_TRUE(src.add("model.layers.0.self_attn.q_a_proj.weight", DType::kBF16, {4, 4}, small.data(), 32).ok());
  auto w = load_mla_layer(src, c, 0, {});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << w.status().to_string();
  EXPECT_NE(w.status().message().find("q_a_proj.weight: expected shape [131072, 131072]"), std::string::npos)
      << w.status().to_string();
}

TEST(HostileAlloc, BlockManagerAppendNearInt64MaxIsExhaustionNotAThrow) {
  auto bm = BlockManager::create(4, 16);
  ASSERT_TRUE(bm.ok());
  const SeqId s = bm->add_sequence();
  ASSERT_TRUE(bm->append(s, 5).ok());
  for (int64_t n : {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max() - 4, int64_t{1} << 62,
                    int64_t{60}}) {
    auto r = bm->append(s, n);
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().to_string();
  }
  EXPECT_EQ(*bm->length(s), 5);
  EXPECT_EQ(bm->num_free_blocks(), 3);
  EXPECT_TRUE(bm->append(s, 59).ok());  // exactly what is left: 64 - 5
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MLAKV_TEST_ASAN 1
#endif
#endif
#if !defined(__SANITIZE_ADDRESS__) && !defined(MLAKV_TEST_ASAN)
void create_under_a_1gib_limit() {
  rlimit lim{};
  lim.rlim_cur = lim.rlim_max = std::size_t{1} << 30;
  ::setrlimit(RLIMIT_AS, &lim);
  auto bm = BlockManager::create(std::numeric_limits<int32_t>::max(), 16);
  std::_Exit(!bm.ok() && bm.status().code() == StatusCode::kResourceExhausted ? 0 : 3);
}

TEST(HostileAllocDeathTest, BlockManagerCreateUnderAMemoryLimitReportsExhaustion) {
  // A child under a 1 GiB address-space limit asks for 2^31 - 1 blocks (16 GiB of tables).
  EXPECT_EXIT(create_under_a_1gib_limit(), ::testing::ExitedWithCode(0), "");
}
#endif

TEST(HostileAlloc, TensorMapAddRejectsAWrappingElementCount) {
  TensorMap m;
  // 2^62 x 4 u8 = 2^64 bytes, which wraps to 0 and matched nbytes 0.
  const Status st = m.add("x", DType::kU8, {int64_t{1} << 62, 4}, nullptr, 0);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("overflows"), std::string::npos) << st.to_string();
  EXPECT_FALSE(m.find("x").has_value());
  // f32 [2^61, 2]: numel fits, bytes do not.
  EXPECT_FALSE(m.add("y", DType::kF32, {int64_t{1} << 61, 2}, nullptr, 0).ok());
  const TensorView z = m.add_zeros("z", DType::kU8, {int64_t{1} << 62, 4});
  EXPECT_EQ(z.data, nullptr);
  EXPECT_FALSE(m.find("z").has_value());
  EXPECT_FALSE(m.add("w", DType::kU8, {4}, nullptr, 4).ok());  // null data for 4 bytes
}

// ---- Medium: the atomic writer --------------------------------------------------------

TEST_F(Hostile, PlantedSymlinkAtTheOldTemporaryNameIsNeverFollowed) {
  const std::string victim = put("victim", "precious");
  const std::string out = path("out.bin");
  fs::create_symlink(victim, out + ".tmp-mlakv");  // the name every earlier version used
  ASSERT_TRUE(io::write_file(out, std::string("new")).ok());
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_EQ(slurp(out), "new");
  const float v = 1.0f;
  ASSERT_TRUE(write_safetensors(path("x.safetensors"), {{"a", TensorView::contiguous(&v, DType::kF32, {1})}}).ok());
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_EQ(count_entries(".tmp-mlakv-"), 0);  // no temporary left behind
}

TEST_F(Hostile, TemporariesAreExclusiveAndUnpredictable) {
  auto a = io::AtomicFile::create(path("o"));
  auto b = io::AtomicFile::create(path("o"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->temp_path(), b->temp_path());
  EXPECT_EQ(fs::path(a->temp_path()).parent_path(), dir_);  // same directory: rename stays atomic
  EXPECT_EQ(count_entries(".o.tmp-mlakv-"), 2);
  ASSERT_TRUE(a->write("A", 1).ok());
  ASSERT_TRUE(a->commit().ok());
  EXPECT_FALSE(a->commit().ok());  // once
  b->discard();
  EXPECT_EQ(count_entries(".tmp-mlakv-"), 0);
  EXPECT_EQ(slurp(path("o")), "A");
}

TEST_F(Hostile, ReplacingKeepsTheOldModeAndNewFilesFollowTheUmask) {
  const std::string p = put("keep", "old");
  ::chmod(p.c_str(), 0640);
  ASSERT_TRUE(io::write_file(p, std::string("new")).ok());
  struct stat st {};
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(slurp(p), "new");
  const mode_t old = ::umask(022);
  ASSERT_TRUE(io::write_file(path("fresh"), std::string("x")).ok());
  ::umask(old);
  ASSERT_EQ(::stat(path("fresh").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);  // not mkstemp's 0600
}

TEST_F(Hostile, AFailedWriteLeavesTheOldFileAndNoTemporary) {
  const std::string p = put("keep", "old");
  {
    auto f = io::AtomicFile::create(p);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->write("partial", 7).ok());
  }  // destroyed without commit
  EXPECT_EQ(slurp(p), "old");
  EXPECT_EQ(count_entries(".tmp-mlakv-"), 0);
  const Status st = io::write_file(path("no/such/dir/out"), std::string("x"));
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
  EXPECT_FALSE(io::write_file(path(""), std::string("x")).ok());  // the directory itself
}

TEST_F(Hostile, SameFileSeesLinksAndNotYetExistingTwins) {
  const std::string a = put("a", "x");
  fs::create_hard_link(a, path("hard"));
  fs::create_symlink(a, path("soft"));
  EXPECT_TRUE(io::same_file(a, path("hard")));
  EXPECT_TRUE(io::same_file(a, path("soft")));
  EXPECT_FALSE(io::same_file(a, put("b", "x")));
  EXPECT_TRUE(io::same_file(path("new"), (dir_ / "sub" / ".." / "new").string()));
  EXPECT_FALSE(io::same_file(path("new"), a));
  const Status st = io::check_not_same_file(path("hard"), "--out", a, "--in");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--out"), std::string::npos);
  EXPECT_NE(st.message().find("same file as --in"), std::string::npos) << st.to_string();
}

// ---- Low: FIFOs, devices and sizes -----------------------------------------------------

// Runs `fn` on a thread; if it has not returned after 20 s (a blocking open on the
// FIFO), opens the FIFO for writing to release it and fails.
template <class Fn>
Status within_20s(const std::string& fifo, Fn fn) {
  auto task = std::make_shared<std::packaged_task<Status()>>(fn);
  std::future<Status> f = task->get_future();
  std::thread t([task] { (*task)(); });
  if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    t.join();
    if (fd >= 0) ::close(fd);
    ADD_FAILURE() << "hung on the FIFO " << fifo;
    return internal_error("hung");
  }
  t.join();
  return f.get();
}

TEST_F(Hostile, FifosAreRefusedWithoutBlocking) {
  fs::create_directories(dir_ / "m");
  const std::string fifo = path("m/config.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string shard = path("m/model.safetensors");
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  for (const auto& [what, fn] : std::vector<std::pair<std::string, std::function<Status()>>>{
           {"read_file", [&] { return io::read_file(fifo, 1 << 20).status(); }},
           {"load_hf_config", [&] { return load_hf_config(path("m")).status(); }},
           {"load_outer_scales", [&] { return load_outer_scales(fifo).status(); }},
           {"load_weight_quant_options", [&] { return load_weight_quant_options(path("m")).status(); }},
           {"SafetensorsFile::open", [&] { return SafetensorsFile::open(shard).status(); }},
           {"Checkpoint::open", [&] { return Checkpoint::open(path("m")).status(); }}}) {
    const Status st = within_20s(what == "SafetensorsFile::open" || what == "Checkpoint::open" ? shard : fifo, fn);
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << what << ": " << st.to_string();
    EXPECT_NE(st.message().find("not a regular file (a FIFO)"), std::string::npos) << what << ": " << st.to_string();
  }
}

TEST_F(Hostile, DevicesAndDirectoriesAreRefusedAndSizesAreBounded) {
  for (const char* dev : {"/dev/zero", "/dev/urandom"}) {
    auto r = load_outer_scales(dev);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("not a regular file (a character device)"), std::string::npos)
        << r.status().to_string();
  }
  auto d = io::read_file(dir_.string(), 100);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("a directory"), std::string::npos) << d.status().to_string();
  const std::string p = put("hundred", std::string(100, 'x'));
  auto exact = io::read_file(p, 100);
  ASSERT_TRUE(exact.ok()) << exact.status().to_string();
  EXPECT_EQ(exact->size(), 100u);
  EXPECT_EQ(io::read_file(put("empty", ""), 0)->size(), 0u);
  // A regular file whose st_size is 0 but which has content is read to EOF.
  auto proc = io::read_file("/proc/self/status", 1 << 20);
  ASSERT_TRUE(proc.ok()) << proc.status().to_string();
  EXPECT_NE(std::string(proc->begin(), proc->end()).find("Name:"), std::string::npos);
  EXPECT_FALSE(io::read_file("/proc/self/status", 16).ok());  // ... and still bounded
  auto big = io::read_file(p, 99);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("100 bytes exceeds the 99-byte limit"), std::string::npos)
      << big.status().to_string();
  // A config.json past the 16 MiB limit is refused before parsing.
  put("config.json", std::string(io::kMaxConfigBytes + 1, ' '));
  auto c = load_hf_config(path("config.json"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("-byte limit"), std::string::npos) << c.status().to_string();
}

// ---- Low: integer overflows ------------------------------------------------------------

TEST(HostileInts, CheckedMath) {
  EXPECT_EQ(checked::ceil_div(5, std::numeric_limits<int64_t>::max()), 1);
  EXPECT_EQ(checked::ceil_div(0, 7), 0);
  EXPECT_EQ(checked::ceil_div(std::numeric_limits<int64_t>::max(), 2), int64_t{1} << 62);
  EXPECT_FALSE(checked::ceil_div(1, 0).has_value());
  EXPECT_FALSE(checked::mul<int64_t>(int64_t{1} << 32, int64_t{1} << 31).has_value());
  EXPECT_EQ(checked::mul<int64_t>(int64_t{1} << 31, int64_t{1} << 31), int64_t{1} << 62);
  EXPECT_FALSE(checked::add<int>(std::numeric_limits<int>::max(), 1).has_value());
  EXPECT_FALSE(checked::product({int64_t{1} << 40, int64_t{1} << 30}).has_value());
  EXPECT_FALSE(checked::product({4, -1}).has_value());
  EXPECT_FALSE(checked::floor_to_int64(1e20).has_value());
  EXPECT_FALSE(checked::floor_to_int64(INFINITY).has_value());
  EXPECT_FALSE(checked::floor_to_int64(NAN).has_value());
  EXPECT_FALSE(checked::floor_to_int64(9223372036854775808.0).has_value());
  EXPECT_EQ(checked::floor_to_int64(9223372036854774784.0), int64_t{9223372036854774784});
  EXPECT_EQ(checked::floor_to_int64(-0.5), -1);
  EXPECT_FALSE(checked::floor_to_int64(-0.5, 0).has_value());
  EXPECT_EQ(checked::narrow<int32_t>(int64_t{1} << 31), std::nullopt);
  EXPECT_EQ(checked::narrow<uint8_t>(-1), std::nullopt);
  EXPECT_EQ(checked::narrow<int>(uint64_t{7}), 7);
  EXPECT_FALSE(checked::bytes_from_units(INFINITY, 1024.0).has_value());
  EXPECT_EQ(checked::bytes_from_units(1.5, 1024.0), std::size_t{1536});
}

TEST(HostileInts, LayerCountsCannotOverflowCacheLayers) {
  const std::string cfg =
      R"({"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 1073741824,
          "num_nextn_predict_layers": 1073741824, "num_attention_heads": 128, "kv_lora_rank": 512,
          "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "index_topk": 2048, "index_n_heads": 64})";
  auto c = parse_hf_config(cfg, "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("at most 65536"), std::string::npos) << c.status().to_string();
  ModelConfig m = find_model_preset("deepseek-v3")->config;
  m.num_layers = 1 << 30;
  m.num_mtp_layers = 1 << 30;
  EXPECT_EQ(m.cache_layers(), int64_t{1} << 31);  // int64: no wrap
  EXPECT_FALSE(m.validate().ok());
}

TEST(HostileInts, Bf16RecordSizeOfAHugeRankIsRefused) {
  EXPECT_EQ(record_bytes(KvFormat::kBf16, 1 << 30, 64), -1);
  EXPECT_EQ(record_bytes(KvFormat::kBf16, (1 << 30) - 64, 0), 2147483520);
  EXPECT_EQ(record_bytes(KvFormat::kBf16, -1, 64), -1);
  CodecParams p;
  p.latent_dim = 1 << 30;
  EXPECT_FALSE(codec_record_bytes(p).ok());
  ModelConfig m = find_model_preset("deepseek-v3")->config;
  m.kv_lora_rank = 1 << 30;
  PlanParams pp;
  pp.format = KvFormat::kBf16;
  auto r = plan_capacity(m, pp);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("overflows"), std::string::npos) << r.status().to_string();
}

TEST(HostileInts, PlannerDoubleToIntConversionsAreChecked) {
  const ModelConfig m = find_model_preset("deepseek-v3")->config;
  PlanParams p;
  p.gpu_mem_gib = 1e20;
  auto r = plan_capacity(m, p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("overflow"), std::string::npos) << r.status().to_string();
  p.gpu_mem_gib = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(plan_capacity(m, p).ok());
  p.gpu_mem_gib = 1e6;  // a million GiB still fits: the count is exact
  auto ok = plan_capacity(m, p);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->blocks_per_gpu,
            static_cast<int64_t>(std::floor(1e6 * 0.9 * 1073741824.0 / static_cast<double>(ok->block_bytes))));
}

// ---- Low: control characters in messages ----------------------------------------------

TEST(HostileText, EscapeUntrusted) {
  EXPECT_EQ(escape_untrusted("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
  EXPECT_EQ(escape_untrusted("a\nb\tc\rd\x7f"), "a\\nb\\tc\\rd\\x7f");
  EXPECT_EQ(escape_untrusted("\xc2\x9b" "2J"), "\\xc2\\x9b2J");  // C1 CSI
  EXPECT_EQ(escape_untrusted("\xff\xfe"), "\\xff\\xfe");           // not UTF-8
  EXPECT_EQ(escape_untrusted("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(escape_untrusted("\xc0\xaf"), "\\xc0\\xaf");           // overlong '/'
  EXPECT_EQ(escape_untrusted("caf\xc3\xa9 \xe2\x82\xac"), "caf\xc3\xa9 \xe2\x82\xac");  // kept
  EXPECT_EQ(escape_untrusted(std::string(10, 'x'), 4), "xxxx... (10 bytes)");
  EXPECT_EQ(quote_untrusted("a\x1b"), "'a\\x1b'");
}

TEST_F(Hostile, TensorNamesFromFilesReachMessagesEscaped) {
  const std::string evil = "w\x1b]0;owned\x07\x1b[2J";
  const std::string header = "{\"" + std::string("w\\u001b]0;owned\\u0007\\u001b[2J") +
                             R"(": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}})";
  const std::string p = put("evil.safetensors", st_bytes(header, "x"));
  auto f = SafetensorsFile::open(p);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("w\\x1b]0;owned\\x07\\x1b[2J"), std::string::npos) << f.status().to_string();
  EXPECT_FALSE(has_control_bytes(f.status().message())) << f.status().to_string();
  // A weight_map key, a shard name and a missing tensor listed under a prefix.
  fs::create_directories(dir_ / "ck");
  std::ofstream(dir_ / "ck/model.safetensors.index.json")
      << R"({"weight_map": {"t\u001b[2J": "s\u001b[31m.safetensors"}})";
  auto ck = Checkpoint::open((dir_ / "ck").string());
  ASSERT_FALSE(ck.ok());
  EXPECT_FALSE(has_control_bytes(ck.status().message())) << ck.status().to_string();
  TensorMap m;
  const float v = 1;
  ASSERT_TRUE(m.add("p." + evil, DType::kF32, {1}, &v, 4).ok());
  const Status st = detect_weight_encoding(m, "p").status();
  ASSERT_FALSE(st.ok());
  EXPECT_FALSE(has_control_bytes(st.message())) << st.to_string();
  // JSON values in config.json messages.
  auto c = parse_hf_config(R"({"kv_lora_rank": 512, "model_type": "x\u001b[2J"})", "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_FALSE(has_control_bytes(c.status().message())) << c.status().to_string();
  auto q = parse_weight_quant_options(R"({"quant_method": "\u001b]0;t\u0007"})");
  ASSERT_FALSE(q.ok());
  EXPECT_FALSE(has_control_bytes(q.status().message())) << q.status().to_string();
  // Invalid UTF-8 in a JSON value shown in a message does not throw.
  auto bad = parse_hf_config("{\"kv_lora_rank\": 512, \"hidden_size\": \"\xff\"}", "config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().code(), StatusCode::kInternal) << bad.status().to_string();
}

TEST(HostileSafetensors, OpenMemoryValidatesLikeOpen) {
  const std::string good = st_bytes(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                                    std::string("\0\0\x80\x3f", 4));
  auto f = SafetensorsFile::open_memory(good.data(), good.size(), "mem");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(*(*f)->find("a")->ptr<const float>(), 1.0f);
  const std::string past = st_bytes(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", "1234");
  auto g = SafetensorsFile::open_memory(past.data(), past.size(), "mem");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kDataLoss);
  EXPECT_FALSE(SafetensorsFile::open_memory("1234", 4, "mem").ok());
  // Invalid UTF-8 inside a field is corruption (kDataLoss), never a nlohmann
  // type_error surfacing as kInternal.
  for (const std::string h : {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [\"\xff\", 4]}}",
                               "{\"a\": {\"dtype\": \"F32\", \"shape\": [\"\xff\"], \"data_offsets\": [0, 4]}}"}) {
    const std::string b = st_bytes(h, "1234");
    auto r = SafetensorsFile::open_memory(b.data(), b.size(), "mem");
    ASSERT_FALSE(r.ok()) << h;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
  }
}

}  // namespace
}  // namespace mlakv
