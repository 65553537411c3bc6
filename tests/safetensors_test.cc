// safetensors reader/writer and sharded checkpoints. Malformed files are built byte by
// byte here (header JSON written by hand, data bytes spelled out), never with the
// writer under test; expected values are hand-computed IEEE/two's-complement bytes.
#include "mlakv/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace mlakv {
namespace {

namespace fs = std::filesystem;

// "\x08\0\0\0\0\0\0\0" for 8: the u64 little-endian header length.
std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

// A complete file: length prefix, the header exactly as given, then the data bytes.
std::string st_file(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(static_cast<char>(x));
  return s;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("mlakv_st_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string put(const std::string& name, const std::string& content) {
    const fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::binary);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    return p.string();
  }

  std::string read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // Opening must fail with `code`, and the message must name the file and `mention`.
  void expect_open_fails(const std::string& content, StatusCode code, const std::string& mention) {
    const std::string path = put("bad.safetensors", content);
    auto f = SafetensorsFile::open(path);
    ASSERT_FALSE(f.ok()) << "opened a malformed file; expected: " << mention;
    EXPECT_EQ(f.status().code(), code) << f.status().to_string();
    EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status().to_string();
    EXPECT_NE(f.status().message().find(mention), std::string::npos) << f.status().to_string();
  }

  fs::path dir_;
};

// ---- round trip ---------------------------------------------------------------------

TEST_F(SafetensorsTest, RoundTripEveryDTypeWithKnownBytes) {
  // Source values and their little-endian encodings, written out by hand.
  const double f64[2] = {1.5, -2.25};                  // 3FF8000000000000, C002000000000000
  const float f32[3] = {1.0f, -0.5f, 3.25f};           // 3F800000, BF000000, 40500000
  const uint16_t f16[2] = {0x3C00, 0xC000};            // 1.0, -2.0
  const uint16_t bf16[2] = {0x3F80, 0xC040};           // 1.0, -3.0
  const uint8_t e4m3[2] = {0x38, 0xC0};                // 1.0, -2.0
  const uint8_t e8m0[2] = {127, 128};                  // 2^0, 2^1
  const uint8_t u8[2] = {0, 255};
  const int8_t i8[2] = {-128, 127};
  const int16_t i16[2] = {-32768, 1234};               // 0x8000, 0x04D2
  const int32_t i32[2] = {-7, 2147483647};             // FFFFFFF9, 7FFFFFFF
  const int64_t i64[2] = {INT64_MIN, 42};
  const std::vector<std::pair<std::string, TensorView>> tensors = {
      {"f64", TensorView::contiguous(f64, DType::kF64, {2})},
      {"f32", TensorView::contiguous(f32, DType::kF32, {1, 3})},
      {"f16", TensorView::contiguous(f16, DType::kF16, {2})},
      {"bf16", TensorView::contiguous(bf16, DType::kBF16, {2, 1})},
      {"e4m3", TensorView::contiguous(e4m3, DType::kF8E4M3, {2})},
      {"e8m0", TensorView::contiguous(e8m0, DType::kF8E8M0, {2})},
      {"u8", TensorView::contiguous(u8, DType::kU8, {2})},
      {"i8", TensorView::contiguous(i8, DType::kI8, {2})},
      {"i16", TensorView::contiguous(i16, DType::kI16, {2})},
      {"i32", TensorView::contiguous(i32, DType::kI32, {2})},
      {"i64", TensorView::contiguous(i64, DType::kI64, {2})},
  };
  const std::string path = (dir_ / "all.safetensors").string();
  ASSERT_TRUE(write_safetensors(path, tensors, {{"format", "pt"}}).ok());

  struct Want {
    const char* name;
    DType dtype;
    std::vector<int64_t> shape;
    std::string le;  // expected bytes
  };
  const std::vector<Want> want = {
      {"f64", DType::kF64, {2}, bytes({0, 0, 0, 0, 0, 0, 0xF8, 0x3F, 0, 0, 0, 0, 0, 0, 0x02, 0xC0})},
      {"f32", DType::kF32, {1, 3}, bytes({0, 0, 0x80, 0x3F, 0, 0, 0, 0xBF, 0, 0, 0x50, 0x40})},
      {"f16", DType::kF16, {2}, bytes({0x00, 0x3C, 0x00, 0xC0})},
      {"bf16", DType::kBF16, {2, 1}, bytes({0x80, 0x3F, 0x40, 0xC0})},
      {"e4m3", DType::kF8E4M3, {2}, bytes({0x38, 0xC0})},
      {"e8m0", DType::kF8E8M0, {2}, bytes({0x7F, 0x80})},
      {"u8", DType::kU8, {2}, bytes({0x00, 0xFF})},
      {"i8", DType::kI8, {2}, bytes({0x80, 0x7F})},
      {"i16", DType::kI16, {2}, bytes({0x00, 0x80, 0xD2, 0x04})},
      {"i32", DType::kI32, {2}, bytes({0xF9, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F})},
      {"i64", DType::kI64, {2}, bytes({0, 0, 0, 0, 0, 0, 0, 0x80, 42, 0, 0, 0, 0, 0, 0, 0})},
  };

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  EXPECT_EQ((*f)->names(), (std::vector<std::string>{"bf16", "e4m3", "e8m0", "f16", "f32", "f64", "i16", "i32",
                                                     "i64", "i8", "u8"}));
  // The data region is the tensors' bytes in the order given, with no gaps.
  std::string region;
  for (const Want& w : want) region += w.le;
  const std::string file = read(path);
  ASSERT_EQ(file.size(), (*f)->data_offset() + region.size());
  EXPECT_EQ(file.substr((*f)->data_offset()), region);
  EXPECT_EQ((*f)->data_offset() % 8, 0u);

  for (const Want& w : want) {
    SCOPED_TRACE(w.name);
    auto t = (*f)->find(w.name);
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->dtype, w.dtype);
    EXPECT_EQ(t->device, Device::cpu());
    ASSERT_EQ(t->ndim, static_cast<int>(w.shape.size()));
    for (int d = 0; d < t->ndim; ++d) EXPECT_EQ(t->size(d), w.shape[static_cast<std::size_t>(d)]);
    EXPECT_TRUE(t->is_contiguous());
    EXPECT_EQ(std::string(t->ptr<const char>(), w.le.size()), w.le);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t->data) % dtype_size(w.dtype), 0u);
  }
  EXPECT_FALSE((*f)->find("missing").has_value());
  EXPECT_FALSE((*f)->find("__metadata__").has_value());
}

TEST_F(SafetensorsTest, WriterProducesTheExactDocumentedBytes) {
  // Header keys sorted, entry keys sorted, compact, padded with spaces to 8 bytes.
  const float v[2] = {1.0f, 2.0f};     // 3F800000 40000000
  const int16_t w = -2;                // FEFF
  ASSERT_TRUE(write_safetensors((dir_ / "x.safetensors").string(),
                                {{"b", TensorView::contiguous(v, DType::kF32, {2})},
                                 {"a", TensorView::contiguous(&w, DType::kI16, {})}},
                                {{"k", "v"}})
                  .ok());
  std::string header =
      R"({"__metadata__":{"k":"v"},"a":{"data_offsets":[8,10],"dtype":"I16","shape":[]},)"
      R"("b":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})";
  ASSERT_EQ(header.size(), 132u);
  header += "    ";  // 132 -> 136
  const std::string want = st_file(header, bytes({0, 0, 0x80, 0x3F, 0, 0, 0, 0x40, 0xFE, 0xFF}));
  EXPECT_EQ(read((dir_ / "x.safetensors").string()), want);
  for (const auto& e : fs::directory_iterator(dir_)) {  // no temporary left behind
    EXPECT_EQ(e.path().filename().string().find("tmp-mlakv"), std::string::npos) << e.path();
  }
}

TEST_F(SafetensorsTest, ReadsHandBuiltFileWithZeroSizedScalarAndMisalignedTensors) {
  // u8 "odd" [0,1), f32 "g" at the odd offset [1,5) = 1.0f, zero-sized "e" [2,0,3] and
  // "z" [0], a scalar i32 "s" [5,9) = 7. The header is 271 bytes + 1 space, so the
  // data region starts at 280 and "g" sits at file offset 281 (misaligned for f32).
  std::string header =
      R"({"e":{"dtype":"F32","shape":[2,0,3],"data_offsets":[5,5]},)"
      R"("g":{"dtype":"F32","shape":[1],"data_offsets":[1,5]},)"
      R"("odd":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
      R"("s":{"dtype":"I32","shape":[],"data_offsets":[5,9]},)"
      R"("z":{"dtype":"BF16","shape":[0],"data_offsets":[9,9]}} )";
  ASSERT_EQ(header.size(), 272u);
  const std::string data = bytes({0xAB, 0, 0, 0x80, 0x3F, 7, 0, 0, 0});
  auto f = SafetensorsFile::open(put("ok.safetensors", st_file(header, data)));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->names(), (std::vector<std::string>{"e", "g", "odd", "s", "z"}));

  auto g = (*f)->find("g");
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(g->data) % 4, 0u);
  EXPECT_EQ(g->ptr<const float>()[0], 1.0f);
  EXPECT_EQ((*f)->find("odd")->ptr<const uint8_t>()[0], 0xAB);

  auto s = (*f)->find("s");
  EXPECT_EQ(s->ndim, 0);
  EXPECT_EQ(s->numel(), 1);
  EXPECT_EQ(s->ptr<const int32_t>()[0], 7);

  auto e = (*f)->find("e");
  ASSERT_EQ(e->ndim, 3);
  EXPECT_EQ(e->size(0), 2);
  EXPECT_EQ(e->size(1), 0);
  EXPECT_EQ(e->size(2), 3);
  EXPECT_EQ(e->numel(), 0);
  EXPECT_TRUE(e->empty());
  EXPECT_EQ((*f)->find("z")->numel(), 0);
  const SafetensorsTensorInfo* info = (*f)->info("s");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->begin, 5u);
  EXPECT_EQ(info->end, 9u);
  EXPECT_TRUE((*f)->metadata().empty());
}

TEST_F(SafetensorsTest, HeaderWithTrailingSpacesAndNullMetadataIsAccepted) {
  const std::string header = R"({"__metadata__":null,"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})" +
                             std::string(5, ' ');
  auto f = SafetensorsFile::open(put("ok.safetensors", st_file(header, bytes({1, 2}))));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->find("t")->ptr<const uint8_t>()[1], 2);
}

TEST_F(SafetensorsTest, EmptyFileWithOnlyAnEmptyHeader) {
  auto f = SafetensorsFile::open(put("empty.safetensors", st_file("{}      ", "")));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_TRUE((*f)->names().empty());
}

// ---- malformed files ------------------------------------------------------------------

TEST_F(SafetensorsTest, RejectsShortFiles) {
  expect_open_fails("", StatusCode::kDataLoss, "too short");
  expect_open_fails(std::string(5, '\0'), StatusCode::kDataLoss, "too short");
}

TEST_F(SafetensorsTest, RejectsHeaderLengthBeyondFileOrCap) {
  expect_open_fails(u64_le(1000) + "{}", StatusCode::kDataLoss, "header length 1000");
  expect_open_fails(u64_le(200ull << 20) + "{}", StatusCode::kDataLoss, "limit");
  expect_open_fails(u64_le(~0ull) + "{}", StatusCode::kDataLoss, "limit");
  expect_open_fails(u64_le(3) + "{}", StatusCode::kDataLoss, "header length 3");
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotAJsonObject) {
  expect_open_fails(st_file("{not json", ""), StatusCode::kDataLoss, "not valid JSON");
  expect_open_fails(st_file(R"({"a":{}} trailing)", ""), StatusCode::kDataLoss, "not valid JSON");
  expect_open_fails(st_file("[1, 2]  ", ""), StatusCode::kDataLoss, "must be a JSON object");
  expect_open_fails(st_file(std::string(3, '\0'), ""), StatusCode::kDataLoss, "not valid JSON");
  // 10,000 nested arrays: refused before the parser sees them.
  expect_open_fails(st_file(R"({"t":)" + std::string(10000, '[') + std::string(10000, ']') + "}", ""),
                    StatusCode::kDataLoss, "nests deeper");
}

TEST_F(SafetensorsTest, RejectsMalformedEntries) {
  const std::string d8(8, '\0');
  expect_open_fails(st_file(R"({"w": 5})", d8), StatusCode::kDataLoss, "tensor 'w': entry must be a JSON object");
  expect_open_fails(st_file(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", d8), StatusCode::kDataLoss,
                    "tensor 'w': missing 'dtype'");
  expect_open_fails(st_file(R"({"w":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", d8), StatusCode::kDataLoss,
                    "tensor 'w': 'dtype' must be a string");
  expect_open_fails(st_file(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", d8), StatusCode::kDataLoss,
                    "tensor 'w': missing 'shape'");
  expect_open_fails(st_file(R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", d8), StatusCode::kDataLoss,
                    "tensor 'w': 'shape' must be an array");
  expect_open_fails(st_file(R"({"w":{"dtype":"F32","shape":[2]}})", d8), StatusCode::kDataLoss,
                    "tensor 'w': missing 'data_offsets'");
  expect_open_fails(st_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":"0-8"}})", d8),
                    StatusCode::kDataLoss, "tensor 'w': 'data_offsets' must be [begin, end]");
}

TEST_F(SafetensorsTest, RejectsBadShapes) {
  const std::string d8(8, '\0');
  expect_open_fails(st_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}})", d8),
                    StatusCode::kDataLoss, "tensor 'w': shape entry 0 is -1");
  expect_open_fails(st_file(R"({"w":{"dtype":"F32","shape":[2,1.5],"data_offsets":[0,8]}})", d8),
                    StatusCode::kDataLoss, "tensor 'w': shape entry 1 is 1.5");
  expect_open_fails(st_file(R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", d8),
                    StatusCode::kDataLoss, "tensor 'w': shape entry 0");
  expect_open_fails(st_file(R"({"w":{"dtype":"F32","shape":[1,1,1,1,1,1,2],"data_offsets":[0,8]}})", d8),
                    StatusCode::kDataLoss, "tensor 'w': 7 dimensions, at most 6");
  // 2^32 * 2^32 elements overflows 64 bits; so does 2^62 f64 elements x 8 bytes, and a
  // zero extent does not excuse the 2^33 * 2^31 = 2^64 span of the other extents.
  expect_open_fails(st_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", d8),
                    StatusCode::kDataLoss, "tensor 'w': shape");
  expect_open_fails(st_file(R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", d8),
                    StatusCode::kDataLoss, "tensor 'w': shape");
  expect_open_fails(st_file(R"({"w":{"dtype":"U8","shape":[0,8589934592,2147483648],"data_offsets":[0,0]}})", d8),
                    StatusCode::kDataLoss, "overflows");
  // 2^64 itself does not even parse as an integer.
  expect_open_fails(st_file(R"({"w":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,8]}})", d8),
                    StatusCode::kDataLoss, "tensor 'w': shape entry 0");
}

TEST_F(SafetensorsTest, RejectsBadOffsets) {
  const std::string d8(8, '\0');
  for (const char* offsets : {"[8]", "[0,4,8]", R"(["0","8"])", "[-4,4]", "[0,8.0]", "[]"}) {
    SCOPED_TRACE(offsets);
    expect_open_fails(st_file(std::string(R"({"w":{"dtype":"U8","shape":[8],"data_offsets":)") + offsets + "}}", d8),
                      StatusCode::kDataLoss, "tensor 'w': 'data_offsets' must be [begin, end]");
  }
  expect_open_fails(st_file(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})", d8), StatusCode::kDataLoss,
                    "tensor 'w': data_offsets [8, 4] has begin > end");
  expect_open_fails(st_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", d8),
                    StatusCode::kDataLoss, "tensor 'w': data_offsets [0, 16] run past the 8-byte data region");
  expect_open_fails(st_file(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[9,9]}})", d8), StatusCode::kDataLoss,
                    "run past");
  expect_open_fails(st_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8),
                    StatusCode::kDataLoss, "tensor 'w': data_offsets [0, 8] hold 8 bytes, but F32 [3] needs 12");
}

TEST_F(SafetensorsTest, RejectsOverlappingTensors) {
  const std::string d12(12, '\0');
  expect_open_fails(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            d12),
                    StatusCode::kDataLoss, "tensors 'a' [0, 8) and 'b' [4, 12) overlap");
  // Identical ranges, and a range nested inside a longer one listed later by name.
  expect_open_fails(st_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
                            R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                            d12),
                    StatusCode::kDataLoss, "overlap");
  expect_open_fails(st_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[5,7]},)"
                            R"("b":{"dtype":"U8","shape":[12],"data_offsets":[0,12]}})",
                            d12),
                    StatusCode::kDataLoss, "tensors 'b' [0, 12) and 'a' [5, 7) overlap");
  // A zero-sized tensor inside another's range owns no bytes: accepted.
  const std::string ok = st_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[5,5]},)"
                                 R"("b":{"dtype":"U8","shape":[12],"data_offsets":[0,12]}})",
                                 d12);
  EXPECT_TRUE(SafetensorsFile::open(put("ok.safetensors", ok)).ok());
}

TEST_F(SafetensorsTest, RejectsUnknownAndUnsupportedDTypes) {
  const std::string d8(8, '\0');
  expect_open_fails(st_file(R"({"w":{"dtype":"F7","shape":[8],"data_offsets":[0,8]}})", d8), StatusCode::kDataLoss,
                    "tensor 'w': unknown dtype 'F7'");
  expect_open_fails(st_file(R"({"w":{"dtype":"BOOL","shape":[8],"data_offsets":[0,8]}})", d8),
                    StatusCode::kUnimplemented, "tensor 'w': unsupported dtype 'BOOL'");
  expect_open_fails(st_file(R"({"w":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", d8),
                    StatusCode::kDataLoss, "unknown dtype 'f32'");
}

TEST_F(SafetensorsTest, RejectsBadMetadataAndDuplicateNames) {
  const std::string d2(2, '\0');
  expect_open_fails(st_file(R"({"__metadata__":[1]})", ""), StatusCode::kDataLoss, "'__metadata__' must be an object");
  expect_open_fails(st_file(R"({"__metadata__":{"n":3}})", ""), StatusCode::kDataLoss,
                    "__metadata__ value of 'n' must be a string");
  expect_open_fails(st_file(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                            R"("w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                            d2),
                    StatusCode::kDataLoss, "header names 'w' twice");
}

TEST_F(SafetensorsTest, SurvivesEveryTruncationAndByteFlip) {
  // A valid file (header padded to 160 bytes, 14 data bytes, one gap byte at 11).
  std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]},)"
      R"("c":{"dtype":"I16","shape":[1,1],"data_offsets":[12,14]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string good = st_file(header, bytes({0, 0, 0x80, 0x3F, 0, 0, 0, 0x40, 1, 2, 3, 0, 0xFE, 0xFF}));
  ASSERT_TRUE(SafetensorsFile::open(put("good.safetensors", good)).ok());

  // Every strict prefix loses either header bytes or the end of "c": must fail.
  for (std::size_t n = 0; n < good.size(); ++n) {
    auto f = SafetensorsFile::open(put("cut.safetensors", good.substr(0, n)));
    EXPECT_FALSE(f.ok()) << "prefix of " << n << " bytes opened";
  }
  // Every single-byte corruption either fails with a Status or yields views that lie
  // inside the data region with byte counts matching shape x itemsize.
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (int mask : {0x01, 0x08, 0x20, 0x80, 0xFF}) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ mask);
      auto f = SafetensorsFile::open(put("flip.safetensors", bad));
      if (!f.ok()) {
        EXPECT_FALSE(f.status().message().empty());
        continue;
      }
      const uint64_t region = (*f)->file_size() - (*f)->data_offset();
      for (const SafetensorsTensorInfo& t : (*f)->tensors()) {
        EXPECT_LE(t.begin, t.end);
        EXPECT_LE(t.end, region);
        auto v = (*f)->find(t.name);
        ASSERT_TRUE(v.has_value());
        EXPECT_EQ(static_cast<uint64_t>(v->numel()) * dtype_size(v->dtype), t.nbytes()) << t.name;
        uint64_t sum = 0;  // touch every byte of the view
        for (uint64_t k = 0; k < t.nbytes(); ++k) sum += v->ptr<const uint8_t>()[k];
        (void)sum;
      }
    }
  }
}

TEST_F(SafetensorsTest, MissingFileAndDirectory) {
  const std::string path = (dir_ / "nope.safetensors").string();
  auto f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find(path), std::string::npos);
  auto d = SafetensorsFile::open(dir_.string());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("not a regular file"), std::string::npos);
  EXPECT_EQ(SafetensorsFile::open("").status().code(), StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsTest, DTypeNames) {
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), DType::kF8E4M3);
  EXPECT_EQ(dtype_from_safetensors("F8_E8M0"), DType::kF8E8M0);
  EXPECT_EQ(dtype_from_safetensors("BF16"), DType::kBF16);
  EXPECT_FALSE(dtype_from_safetensors("F8_E5M2").has_value());
  EXPECT_EQ(safetensors_dtype_name(DType::kI64), "I64");
  EXPECT_EQ(safetensors_dtype_name(DType::kF16), "F16");
}

// ---- writer argument checks -------------------------------------------------------

TEST_F(SafetensorsTest, WriterRejectsBadArgumentsAndKeepsTheOldFile) {
  const std::string path = put("keep.safetensors", "old contents");
  const float v[6] = {1, 2, 3, 4, 5, 6};
  const TensorView ok = TensorView::contiguous(v, DType::kF32, {6});
  auto fails = [&](const std::vector<std::pair<std::string, TensorView>>& ts, const std::string& mention) {
    const Status s = write_safetensors(path, ts);
    ASSERT_FALSE(s.ok()) << mention;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(mention), std::string::npos) << s.to_string();
    EXPECT_EQ(read(path), "old contents");
    for (const auto& e : fs::directory_iterator(dir_)) {  // no temporary left behind
      EXPECT_EQ(e.path().filename().string().find("tmp-mlakv"), std::string::npos) << e.path();
    }
  };
  fails({{"a", ok}, {"a", ok}}, "tensor 1 'a': duplicate name");
  fails({{"", ok}}, "empty name");
  fails({{"__metadata__", ok}}, "reserved");
  TensorView cuda = ok;
  cuda.device = Device::cuda(0);
  fails({{"c", cuda}}, "tensor 0 'c': must be on the cpu, got cuda:0");
  TensorView strided = TensorView::contiguous(v, DType::kF32, {3, 2});
  strided.shape[1] = 1;  // [3, 1] view with row stride 2: every other element
  fails({{"s", strided}}, "tensor 0 's': must be contiguous");
  TensorView null = ok;
  null.data = nullptr;
  fails({{"n", null}}, "null data pointer");
  TensorView negative = ok;
  negative.shape[0] = -1;
  fails({{"neg", negative}}, "negative extent");
  fails({{std::string("bad\xff", 4), ok}}, "cannot encode the header");

  // An empty tensor may have a null pointer.
  TensorView empty = TensorView::contiguous(nullptr, DType::kBF16, {0, 4});
  ASSERT_TRUE(write_safetensors(path, {{"e", empty}}).ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->find("e")->size(1), 4);
  EXPECT_EQ((*f)->file_size(), (*f)->data_offset());
}

TEST_F(SafetensorsTest, WriterReportsIoErrors) {
  const uint8_t b = 1;
  const Status s = write_safetensors((dir_ / "no_such_dir" / "x.safetensors").string(),
                                     {{"b", TensorView::contiguous(&b, DType::kU8, {1})}});
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.to_string();
  EXPECT_NE(s.message().find("no_such_dir"), std::string::npos);
}

// ---- sharded checkpoints ------------------------------------------------------------

// Three hand-built shards: an fp8 kv_b_proj weight in shard 1, its fp32 block scales in
// shard 2, a bf16 norm in shard 3 (which also holds a tensor the index does not list).
class CheckpointTest : public SafetensorsTest {
 protected:
  void write_shards() {
    put("model-00001-of-00003.safetensors",
        st_file(R"({"layers.0.kv_b_proj.weight":{"dtype":"F8_E4M3","shape":[2,4],"data_offsets":[0,8]}})",
                bytes({0x38, 0x40, 0xB8, 0xC0, 0x00, 0x80, 0x7E, 0xFE})));
    put("model-00002-of-00003.safetensors",
        st_file(R"({"layers.0.kv_b_proj.weight_scale_inv":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]}})"
                "    ",
                bytes({0x00, 0x00, 0x00, 0x3E})));  // 0.125f
    put("model-00003-of-00003.safetensors",
        st_file(R"({"layers.0.kv_a_layernorm.weight":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                R"("unlisted":{"dtype":"U8","shape":[1],"data_offsets":[4,5]}})",
                bytes({0x80, 0x3F, 0x00, 0x40, 9})));  // 1.0, 2.0
  }
  std::string index(const std::string& weight_map) {
    return R"({"metadata":{"total_size":16,"format":"pt"},"weight_map":)" + weight_map + "}";
  }
  const std::string kGoodMap =
      R"({"layers.0.kv_b_proj.weight":"model-00001-of-00003.safetensors",)"
      R"("layers.0.kv_b_proj.weight_scale_inv":"model-00002-of-00003.safetensors",)"
      R"("layers.0.kv_a_layernorm.weight":"model-00003-of-00003.safetensors"})";

  void expect_checkpoint_fails(StatusCode code, const std::vector<std::string>& mentions) {
    auto c = Checkpoint::open(dir_.string());
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), code) << c.status().to_string();
    for (const std::string& m : mentions) {
      EXPECT_NE(c.status().message().find(m), std::string::npos) << "missing '" << m << "' in " << c.status().to_string();
    }
  }
};

TEST_F(CheckpointTest, OpensThreeShardsWithWeightAndScaleApart) {
  write_shards();
  put("model.safetensors.index.json", index(kGoodMap));
  auto c = Checkpoint::open(dir_.string());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ((*c)->num_shards(), 3);
  EXPECT_EQ((*c)->describe(), "checkpoint " + dir_.string() + " (3 shards)");
  EXPECT_EQ((*c)->metadata().at("total_size"), "16");
  EXPECT_EQ((*c)->metadata().at("format"), "pt");
  EXPECT_EQ((*c)->names(), (std::vector<std::string>{"layers.0.kv_a_layernorm.weight", "layers.0.kv_b_proj.weight",
                                                      "layers.0.kv_b_proj.weight_scale_inv"}));

  auto w = (*c)->find("layers.0.kv_b_proj.weight");
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->dtype, DType::kF8E4M3);
  EXPECT_EQ(w->size(0), 2);
  EXPECT_EQ(w->size(1), 4);
  EXPECT_EQ(w->stride(0), 4);
  EXPECT_EQ(w->ptr<const uint8_t>()[6], 0x7E);
  auto s = (*c)->find("layers.0.kv_b_proj.weight_scale_inv");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->ptr<const float>()[0], 0.125f);
  auto n = (*c)->find("layers.0.kv_a_layernorm.weight");
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->ptr<const uint16_t>()[1], 0x4000);
  EXPECT_FALSE((*c)->find("unlisted").has_value());  // the index is authoritative
  EXPECT_NE((*c)->shard_of("layers.0.kv_b_proj.weight"), (*c)->shard_of("layers.0.kv_b_proj.weight_scale_inv"));
  EXPECT_EQ((*c)->shard_of("nope"), nullptr);

  // The index file itself may be given.
  auto by_index = Checkpoint::open((dir_ / "model.safetensors.index.json").string());
  ASSERT_TRUE(by_index.ok()) << by_index.status().to_string();
  EXPECT_EQ((*by_index)->names().size(), 3u);
}

TEST_F(CheckpointTest, MissingShardNamesShardAndTensor) {
  write_shards();
  fs::remove(dir_ / "model-00002-of-00003.safetensors");
  put("model.safetensors.index.json", index(kGoodMap));
  expect_checkpoint_fails(StatusCode::kNotFound, {"model.safetensors.index.json", "model-00002-of-00003.safetensors",
                                                  "layers.0.kv_b_proj.weight_scale_inv"});
}

TEST_F(CheckpointTest, TensorAbsentFromItsShard) {
  write_shards();
  put("model.safetensors.index.json",
      index(R"({"layers.0.kv_b_proj.weight":"model-00001-of-00003.safetensors",)"
            R"("layers.0.q_a_proj.weight":"model-00002-of-00003.safetensors"})"));
  expect_checkpoint_fails(StatusCode::kDataLoss, {"tensor 'layers.0.q_a_proj.weight' is mapped to shard "
                                                  "'model-00002-of-00003.safetensors', which does not contain it"});
}

TEST_F(CheckpointTest, RejectsPathTraversal) {
  write_shards();
  put("outside.safetensors", st_file("{}      ", ""));
  for (const char* shard : {"../outside.safetensors", "sub/model.safetensors", "..", "/etc/passwd",
                            "..\\\\x.safetensors", ""}) {
    SCOPED_TRACE(shard);
    put("model.safetensors.index.json", index(std::string(R"({"w":")") + shard + "\"}"));
    expect_checkpoint_fails(StatusCode::kDataLoss, {"tensor 'w' maps to shard", "plain file names"});
  }
}

TEST_F(CheckpointTest, RejectsBadIndexFiles) {
  write_shards();
  put("model.safetensors.index.json", "{\"weight_map\": ");
  expect_checkpoint_fails(StatusCode::kDataLoss, {"model.safetensors.index.json", "not valid JSON"});
  put("model.safetensors.index.json", R"({"metadata":{}})");
  expect_checkpoint_fails(StatusCode::kDataLoss, {"model.safetensors.index.json", "missing 'weight_map'"});
  put("model.safetensors.index.json", R"({"weight_map":["a"]})");
  expect_checkpoint_fails(StatusCode::kDataLoss, {"'weight_map' must be an object"});
  put("model.safetensors.index.json", R"({"weight_map":{"w":3}})");
  expect_checkpoint_fails(StatusCode::kDataLoss, {"weight_map value of 'w' must be a shard file name"});
  put("model.safetensors.index.json", R"({"metadata":"x","weight_map":{}})");
  expect_checkpoint_fails(StatusCode::kDataLoss, {"'metadata' must be an object"});
}

TEST_F(CheckpointTest, CorruptShardIsReportedWithItsName) {
  write_shards();
  put("model-00003-of-00003.safetensors", u64_le(999) + "{}");
  put("model.safetensors.index.json", index(kGoodMap));
  expect_checkpoint_fails(StatusCode::kDataLoss, {"shard 'model-00003-of-00003.safetensors'", "header length 999"});
}

TEST_F(CheckpointTest, SingleFileDirectoryAndDirectPath) {
  const std::string file = put("model.safetensors", st_file(R"({"__metadata__":{"format":"pt"},)"
                                                            R"("t":{"dtype":"I16","shape":[1],"data_offsets":[0,2]}})",
                                                            bytes({0x34, 0x12})));
  for (const std::string& p : {dir_.string(), file}) {
    SCOPED_TRACE(p);
    auto c = Checkpoint::open(p);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ((*c)->num_shards(), 1);
    EXPECT_EQ((*c)->names(), std::vector<std::string>{"t"});
    EXPECT_EQ((*c)->find("t")->ptr<const int16_t>()[0], 0x1234);
    EXPECT_EQ((*c)->metadata().at("format"), "pt");
    EXPECT_EQ((*c)->describe(), "checkpoint " + file);
  }
}

TEST_F(CheckpointTest, EmptyOrMissingDirectory) {
  auto c = Checkpoint::open(dir_.string());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("neither model.safetensors.index.json nor model.safetensors"),
            std::string::npos);
  auto m = Checkpoint::open((dir_ / "absent").string());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
}

TEST_F(CheckpointTest, WriterOutputReadsBackThroughCheckpoint) {
  // Writer -> Checkpoint with two shards, checked against the source values.
  const float w[4] = {0.5f, -1.0f, 2.0f, 8.0f};
  const float s[1] = {3.0f};
  ASSERT_TRUE(write_safetensors((dir_ / "a.safetensors").string(),
                                {{"proj.weight", TensorView::contiguous(w, DType::kF32, {2, 2})}})
                  .ok());
  ASSERT_TRUE(write_safetensors((dir_ / "b.safetensors").string(),
                                {{"proj.weight_scale", TensorView::contiguous(s, DType::kF32, {})}})
                  .ok());
  put("model.safetensors.index.json",
      R"({"weight_map":{"proj.weight":"a.safetensors","proj.weight_scale":"b.safetensors"}})");
  auto c = Checkpoint::open(dir_.string());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE((*c)->metadata().empty());
  const float* got = (*c)->find("proj.weight")->ptr<const float>();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], w[i]);
  EXPECT_EQ((*c)->find("proj.weight_scale")->ptr<const float>()[0], 3.0f);
}

}  // namespace
}  // namespace mlakv
