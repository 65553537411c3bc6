// Weight dequantization (mlakv/kv_b_proj.h). Every case chooses the dense matrix first
// from values each encoding represents exactly, packs it with the straightforward
// packing code below (written from the format descriptions, independent of the
// library), and compares the dequantized output bit for bit. Number decodings used for
// the expectations (e4m3, e2m1, f16) are written here from their definitions with
// std::ldexp, not taken from numerics.h.
#include "mlakv/kv_b_proj.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "mlakv/numerics.h"

namespace mlakv {
namespace {

const std::string kPrefix = "model.layers.3.self_attn.kv_b_proj.";
const float kSentinel = std::numeric_limits<float>::quiet_NaN();

// ---- independent number-format references ------------------------------------------------
double e4m3_ref(uint8_t c) {
  const int e = (c >> 3) & 15, f = c & 7;
  const double v = e == 0 ? std::ldexp(f, -9) : std::ldexp(8 + f, e - 10);  // (1 + f/8) 2^(e-7)
  return (c & 0x80) ? -v : v;
}
bool e4m3_is_nan(uint8_t c) { return (c & 0x7F) == 0x7F; }

// The e4m3 code of an exactly representable value (search over the test's own decoding).
uint8_t e4m3_code(double v) {
  for (int c = 0; c < 256; ++c) {
    if (!e4m3_is_nan(static_cast<uint8_t>(c)) && e4m3_ref(static_cast<uint8_t>(c)) == v &&
        std::signbit(e4m3_ref(static_cast<uint8_t>(c))) == std::signbit(v)) {
      return static_cast<uint8_t>(c);
    }
  }
  ADD_FAILURE() << v << " is not an e4m3 value";
  return 0;
}

constexpr std::array<double, 8> kE2m1Mag = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
double e2m1_ref(uint8_t c) { return (c & 8) ? -kE2m1Mag[c & 7] : kE2m1Mag[c & 7]; }

double f16_ref(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0) {
    v = std::ldexp(m, -24);
  } else if (e == 31) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(1024 + m, e - 25);
  }
  return (h & 0x8000) ? -v : v;
}

// The f16 code of an exactly representable positive value.
uint16_t f16_code(double v) {
  if (v == 0) return 0;
  int exp;
  std::frexp(v, &exp);  // v = m 2^exp, m in [0.5, 1): leading bit at 2^(exp-1)
  const int E = exp - 1;
  uint16_t code;
  if (E >= -14) {
    code = static_cast<uint16_t>(((E + 15) << 10) | static_cast<int>(std::ldexp(v, 10 - E) - 1024));
  } else {
    code = static_cast<uint16_t>(std::ldexp(v, 24));
  }
  EXPECT_EQ(f16_ref(code), v) << v << " is not an f16 value";
  return code;
}

uint16_t bf16_bits_of(float f) {  // only for values exactly representable in bf16
  uint32_t u;
  std::memcpy(&u, &f, 4);
  EXPECT_EQ(u & 0xFFFFu, 0u) << f << " is not a bf16 value";
  return static_cast<uint16_t>(u >> 16);
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- plumbing --------------------------------------------------------------------------------
template <class T>
void put(TensorMap& m, const std::string& name, DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
  const Status st = m.add(name, dt, std::move(shape), v.data(), v.size() * sizeof(T));
  ASSERT_TRUE(st.ok()) << st.to_string();
}

struct Result {
  Status status;
  std::vector<float> w;  // [N, K]
};

Result dequant(const TensorSource& src, int64_t N, int64_t K, const WeightQuantOptions& opt = {},
               const std::string& prefix = kPrefix) {
  Result r;
  r.w.assign(static_cast<std::size_t>(N * K), kSentinel);
  r.status = dequantize_weight(src, prefix, N, K, opt, TensorView::contiguous(r.w.data(), DType::kF32, {N, K}));
  return r;
}

// Compares against a double-precision expectation rounded once to f32.
void expect_matches(const Result& r, const std::vector<double>& want, int64_t K) {
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  ASSERT_EQ(r.w.size(), want.size());
  int64_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float w = static_cast<float>(want[i]);
    if (bits_of(r.w[i]) != bits_of(w) && bad++ < 8) {
      ADD_FAILURE() << "W[" << i / static_cast<std::size_t>(K) << ", " << i % static_cast<std::size_t>(K)
                    << "] = " << r.w[i] << ", want " << w;
    }
  }
  EXPECT_EQ(bad, 0);
}

void expect_error(const Status& st, StatusCode code, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), code) << st.to_string();
  for (const std::string& p : parts) {
    EXPECT_NE(st.message().find(p), std::string::npos) << "'" << p << "' not in: " << st.message();
  }
}

bool all_sentinel(const std::vector<float>& w) {
  for (float v : w) {
    if (!std::isnan(v)) return false;
  }
  return true;
}

// ---- dense -------------------------------------------------------------------------------------
TEST(WeightDequant, DenseF32Bf16F16Exact) {
  const int64_t N = 5, K = 7;
  std::mt19937 rng(1);
  std::vector<double> want(N * K);
  std::vector<float> f32(N * K);
  std::vector<uint16_t> bf16(N * K), f16(N * K);
  for (std::size_t i = 0; i < want.size(); ++i) {
    // m * 2^e with |m| < 128: exact in bf16, f16 and f32
    const int m = static_cast<int>(rng() % 255) - 127;
    want[i] = std::ldexp(m, static_cast<int>(rng() % 8) - 10);
    f32[i] = static_cast<float>(want[i]);
    bf16[i] = bf16_bits_of(f32[i]);
    f16[i] = static_cast<uint16_t>(f16_code(std::fabs(want[i])) | (want[i] < 0 ? 0x8000 : 0));
  }
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    TensorMap m;
    if (dt == DType::kF32) put(m, kPrefix + "weight", dt, {N, K}, f32);
    if (dt == DType::kBF16) put(m, kPrefix + "weight", dt, {N, K}, bf16);
    if (dt == DType::kF16) put(m, kPrefix + "weight", dt, {N, K}, f16);
    SCOPED_TRACE(std::string(dtype_name(dt)));
    expect_matches(dequant(m, N, K), want, K);
  }
}

// Every finite f16 code (sign x 31 exponents x 1024 mantissas) through the dense path.
TEST(WeightDequant, DenseF16AllFiniteCodes) {
  std::vector<uint16_t> codes;
  for (uint32_t h = 0; h < 65536; ++h) {
    if (((h >> 10) & 31) != 31) codes.push_back(static_cast<uint16_t>(h));
  }
  ASSERT_EQ(codes.size(), 248u * 256u);
  TensorMap m;
  put(m, kPrefix + "weight", DType::kF16, {248, 256}, codes);
  std::vector<double> want(codes.size());
  for (std::size_t i = 0; i < codes.size(); ++i) want[i] = f16_ref(codes[i]);
  const Result r = dequant(m, 248, 256);
  expect_matches(r, want, 256);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(bits_of(r.w[std::size_t{31} * 1024]), bits_of(-0.0f));  // code 0x8000 sits after 31*1024 codes
}

TEST(WeightDequant, DenseInfIsDataLoss) {
  std::vector<float> w(3 * 4, 1.0f);
  w[1 * 4 + 2] = std::numeric_limits<float>::infinity();
  TensorMap m;
  put(m, kPrefix + "weight", DType::kF32, {3, 4}, w);
  expect_error(dequant(m, 3, 4).status, StatusCode::kDataLoss, {kPrefix, "dense", "[1, 2]", "inf"});
}

// ---- DeepSeek fp8 block ---------------------------------------------------------------------------
struct Fp8Case {
  int64_t N, K, bn, bk;
  std::vector<uint8_t> q;  // [N, K]
  std::vector<float> s;    // [ceil(N/bn), ceil(K/bk)]
};

Fp8Case make_fp8(int64_t N, int64_t K, int64_t bn, int64_t bk, uint32_t seed, bool pow2_scales) {
  Fp8Case c{N, K, bn, bk, {}, {}};
  std::mt19937 rng(seed);
  c.q.resize(static_cast<std::size_t>(N * K));
  for (auto& b : c.q) {
    do {
      b = static_cast<uint8_t>(rng());
    } while (e4m3_is_nan(b));
  }
  const int64_t sr = (N + bn - 1) / bn, sc = (K + bk - 1) / bk;
  for (int64_t i = 0; i < sr * sc; ++i) {
    c.s.push_back(pow2_scales ? std::ldexp(1.0f, static_cast<int>(rng() % 15) - 10)
                              : static_cast<float>(0.001 + (rng() % 100000) * 1e-7));
  }
  return c;
}

TensorMap fp8_source(const Fp8Case& c) {
  TensorMap m;
  put(m, kPrefix + "weight", DType::kF8E4M3, {c.N, c.K}, c.q);
  put(m, kPrefix + "weight_scale_inv", DType::kF32, {(c.N + c.bn - 1) / c.bn, (c.K + c.bk - 1) / c.bk}, c.s);
  return m;
}

std::vector<double> fp8_expect(const Fp8Case& c) {
  const int64_t sc = (c.K + c.bk - 1) / c.bk;
  std::vector<double> want(static_cast<std::size_t>(c.N * c.K));
  for (int64_t n = 0; n < c.N; ++n) {
    for (int64_t k = 0; k < c.K; ++k) {
      // e4m3 (4 significant bits) times an f32 scale: the double product is exact, so
      // rounding it to f32 is the correctly rounded f32 product.
      want[static_cast<std::size_t>(n * c.K + k)] = e4m3_ref(c.q[static_cast<std::size_t>(n * c.K + k)]) *
                                                    c.s[static_cast<std::size_t>((n / c.bn) * sc + k / c.bk)];
    }
  }
  return want;
}

TEST(WeightDequant, Fp8BlockRaggedShapes) {
  // N and K not multiples of 128: the last block row / column is partial.
  for (auto [N, K] : {std::pair<int64_t, int64_t>{130, 200}, {127, 129}, {1, 1}, {256, 384}}) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " K=" << K);
    const Fp8Case c = make_fp8(N, K, 128, 128, static_cast<uint32_t>(N * 1000 + K), /*pow2=*/true);
    const TensorMap m = fp8_source(c);
    expect_matches(dequant(m, N, K), fp8_expect(c), K);
  }
}

TEST(WeightDequant, Fp8BlockCustomBlockShapeAndRoundedScales) {
  const Fp8Case c = make_fp8(100, 70, 64, 32, 7, /*pow2=*/false);
  const TensorMap m = fp8_source(c);
  WeightQuantOptions opt;
  opt.fp8_block_rows = 64;
  opt.fp8_block_cols = 32;
  expect_matches(dequant(m, 100, 70, opt), fp8_expect(c), 70);
  // The default 128 x 128 grid expects a [1, 1] scale tensor and names it.
  expect_error(dequant(m, 100, 70).status, StatusCode::kInvalidArgument,
               {kPrefix + "weight_scale_inv", "expected shape [1, 1]", "got [2, 3]"});
}

// DeepSeek-V3 kv_b_proj size: [128 * 256, 512].
TEST(WeightDequant, Fp8BlockDeepSeekV3Size) {
  const Fp8Case c = make_fp8(32768, 512, 128, 128, 11, /*pow2=*/true);
  const TensorMap m = fp8_source(c);
  expect_matches(dequant(m, 32768, 512), fp8_expect(c), 512);
}

TEST(WeightDequant, Fp8NanCodeIsDataLoss) {
  Fp8Case c = make_fp8(4, 8, 128, 128, 3, true);
  c.q[2 * 8 + 5] = 0xFF;
  const TensorMap m = fp8_source(c);
  expect_error(dequant(m, 4, 8).status, StatusCode::kDataLoss, {kPrefix, "fp8_block", "[2, 5]"});
}

// ---- NVFP4 -----------------------------------------------------------------------------------------
struct Nvfp4Case {
  int64_t N, K;
  std::vector<uint8_t> codes;   // [N, K] e2m1 codes, unpacked
  std::vector<uint8_t> packed;  // [N, K/2]
  std::vector<uint8_t> scale;   // [N, K/16] e4m3 codes
};

Nvfp4Case make_nvfp4(int64_t N, int64_t K, uint32_t seed) {
  Nvfp4Case c{N, K, {}, {}, {}};
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < N * K; ++i) c.codes.push_back(static_cast<uint8_t>(rng() % 16));
  for (int64_t i = 0; i < N * K; i += 2) {
    // two values per byte, the even column in the low nibble
    c.packed.push_back(
        static_cast<uint8_t>(c.codes[static_cast<std::size_t>(i)] | (c.codes[static_cast<std::size_t>(i + 1)] << 4)));
  }
  for (int64_t i = 0; i < N * K / 16; ++i) {
    // positive e4m3 block scales: 2^e or 1.5 * 2^e
    const double v = std::ldexp(rng() % 2 ? 1.5 : 1.0, static_cast<int>(rng() % 12) - 6);
    c.scale.push_back(e4m3_code(v));
  }
  return c;
}

std::vector<double> nvfp4_expect(const Nvfp4Case& c, double tensor_scale, bool divide) {
  std::vector<double> want;
  for (int64_t n = 0; n < c.N; ++n) {
    for (int64_t k = 0; k < c.K; ++k) {
      const double v = e2m1_ref(c.codes[static_cast<std::size_t>(n * c.K + k)]) *
                       e4m3_ref(c.scale[static_cast<std::size_t>(n * (c.K / 16) + k / 16)]);
      // v is exact; one double op on two floats then rounding to f32 is the correctly
      // rounded f32 result (53 >= 2 * 24 + 2).
      want.push_back(divide ? v / tensor_scale : v * tensor_scale);
    }
  }
  return want;
}

TEST(WeightDequant, ModelOptNvfp4) {
  const Nvfp4Case c = make_nvfp4(6, 64, 21);
  for (float s2 : {0.125f, 0.37f}) {
    for (bool rank0 : {true, false}) {
      SCOPED_TRACE(testing::Message() << "scale_2=" << s2 << " rank0=" << rank0);
      TensorMap m;
      put(m, kPrefix + "weight", DType::kU8, {6, 32}, c.packed);
      put(m, kPrefix + "weight_scale", DType::kF8E4M3, {6, 4}, c.scale);
      put(m, kPrefix + "weight_scale_2", DType::kF32, rank0 ? std::vector<int64_t>{} : std::vector<int64_t>{1},
          std::vector<float>{s2});
      expect_matches(dequant(m, 6, 64), nvfp4_expect(c, s2, /*divide=*/false), 64);
    }
  }
}

// One byte, two different values: the low nibble is column 0.
TEST(WeightDequant, Nvfp4LowNibbleIsEvenColumn) {
  std::vector<uint8_t> packed(8, 0);
  packed[0] = 0xF2;  // low nibble 0x2 = +1.0, high nibble 0xF = -6.0
  TensorMap m;
  put(m, kPrefix + "weight", DType::kU8, {1, 8}, packed);
  put(m, kPrefix + "weight_scale", DType::kF8E4M3, {1, 1}, std::vector<uint8_t>{e4m3_code(2.0)});
  put(m, kPrefix + "weight_scale_2", DType::kF32, {}, std::vector<float>{1.0f});
  const Result r = dequant(m, 1, 16);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.w[0], 2.0f);
  EXPECT_EQ(r.w[1], -12.0f);
  for (int k = 2; k < 16; ++k) EXPECT_EQ(r.w[static_cast<std::size_t>(k)], 0.0f);
}

TEST(WeightDequant, CompressedTensorsNvfp4GlobalScaleDivides) {
  const Nvfp4Case c = make_nvfp4(5, 32, 33);
  for (float g : {4.0f, 3.0f, 448.0f * 6.0f / 1.7f}) {
    SCOPED_TRACE(testing::Message() << "global=" << g);
    TensorMap m;
    put(m, kPrefix + "weight_packed", DType::kU8, {5, 16}, c.packed);
    put(m, kPrefix + "weight_scale", DType::kF8E4M3, {5, 2}, c.scale);
    put(m, kPrefix + "weight_global_scale", DType::kF32, {1}, std::vector<float>{g});
    expect_matches(dequant(m, 5, 32), nvfp4_expect(c, g, /*divide=*/true), 32);
  }
  // The same bytes read as ModelOpt (scale_2 = 4) differ from compressed-tensors (global 4) by 16x.
  TensorMap mo, ct;
  put(mo, kPrefix + "weight", DType::kU8, {5, 16}, c.packed);
  put(mo, kPrefix + "weight_scale", DType::kF8E4M3, {5, 2}, c.scale);
  put(mo, kPrefix + "weight_scale_2", DType::kF32, {1}, std::vector<float>{4.0f});
  put(ct, kPrefix + "weight_packed", DType::kU8, {5, 16}, c.packed);
  put(ct, kPrefix + "weight_scale", DType::kF8E4M3, {5, 2}, c.scale);
  put(ct, kPrefix + "weight_global_scale", DType::kF32, {1}, std::vector<float>{4.0f});
  const Result a = dequant(mo, 5, 32), b = dequant(ct, 5, 32);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  for (std::size_t i = 0; i < a.w.size(); ++i) EXPECT_EQ(a.w[i], 16.0f * b.w[i]);
}

TEST(WeightDequant, CompressedTensorsBadGlobalScale) {
  const Nvfp4Case c = make_nvfp4(2, 16, 5);
  for (float g : {0.0f, -1.0f, std::numeric_limits<float>::infinity()}) {
    TensorMap m;
    put(m, kPrefix + "weight_packed", DType::kU8, {2, 8}, c.packed);
    put(m, kPrefix + "weight_scale", DType::kF8E4M3, {2, 1}, c.scale);
    put(m, kPrefix + "weight_global_scale", DType::kF32, {1}, std::vector<float>{g});
    const Result r = dequant(m, 2, 16);
    expect_error(r.status, StatusCode::kDataLoss, {kPrefix + "weight_global_scale", "finite and > 0"});
    EXPECT_TRUE(all_sentinel(r.w));
  }
  // A [2] "scalar" is a shape error naming the tensor.
  TensorMap m;
  put(m, kPrefix + "weight_packed", DType::kU8, {2, 8}, c.packed);
  put(m, kPrefix + "weight_scale", DType::kF8E4M3, {2, 1}, c.scale);
  put(m, kPrefix + "weight_global_scale", DType::kF32, {2}, std::vector<float>{1.0f, 1.0f});
  expect_error(dequant(m, 2, 16).status, StatusCode::kInvalidArgument,
               {kPrefix + "weight_global_scale", "shape [] or [1]", "got shape [2]"});
}

// ---- GPTQ / AWQ ---------------------------------------------------------------------------------------
struct Int4Case {
  int64_t N, K, groups;
  std::vector<int> q;          // [N, K] in [0, 15]
  std::vector<int> zero;       // [groups, N] real zero point
  std::vector<double> scale;   // [groups, N], exact in f16
  std::vector<int32_t> g_idx;  // [K] group of each input row
};

Int4Case make_int4(int64_t N, int64_t K, int64_t G, uint32_t seed, int zero_lo, int zero_hi) {
  Int4Case c{N, K, (K + G - 1) / G, {}, {}, {}, {}};
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < N * K; ++i) c.q.push_back(static_cast<int>(rng() % 16));
  for (int64_t i = 0; i < c.groups * N; ++i) {
    c.zero.push_back(zero_lo + static_cast<int>(rng() % static_cast<uint32_t>(zero_hi - zero_lo + 1)));
    c.scale.push_back(std::ldexp(1 + static_cast<int>(rng() % 2047), -8 - static_cast<int>(rng() % 13)));
  }
  for (int64_t k = 0; k < K; ++k) c.g_idx.push_back(static_cast<int32_t>(k / G));
  return c;
}

std::vector<uint16_t> f16_scales(const Int4Case& c) {
  std::vector<uint16_t> s;
  for (double v : c.scale) s.push_back(f16_code(v));
  return s;
}

std::vector<double> int4_expect(const Int4Case& c) {
  std::vector<double> want;
  for (int64_t n = 0; n < c.N; ++n) {
    for (int64_t k = 0; k < c.K; ++k) {
      const auto cell = static_cast<std::size_t>(c.g_idx[static_cast<std::size_t>(k)] * c.N + n);
      want.push_back((c.q[static_cast<std::size_t>(n * c.K + k)] - c.zero[cell]) * c.scale[cell]);
    }
  }
  return want;
}

int32_t as_i32(uint32_t u) {
  int32_t v;
  std::memcpy(&v, &u, 4);
  return v;
}

// GPTQ qweight [K/8, N]: nibble i of word (r, n) = q[n, 8r + i].
std::vector<int32_t> pack_gptq_qweight(const Int4Case& c) {
  std::vector<int32_t> out;
  for (int64_t r = 0; r < c.K / 8; ++r) {
    for (int64_t n = 0; n < c.N; ++n) {
      uint32_t word = 0;
      for (int i = 0; i < 8; ++i)
        word |= static_cast<uint32_t>(c.q[static_cast<std::size_t>(n * c.K + 8 * r + i)]) << (4 * i);
      out.push_back(as_i32(word));
    }
  }
  return out;
}

// [groups, N/8] words; nibble i of word (g, w) holds column 8w + column_of_nibble[i].
std::vector<int32_t> pack_zeros(const Int4Case& c, int stored_offset, const std::array<int, 8>& column_of_nibble) {
  std::vector<int32_t> out;
  for (int64_t g = 0; g < c.groups; ++g) {
    for (int64_t w = 0; w < c.N / 8; ++w) {
      uint32_t word = 0;
      for (int i = 0; i < 8; ++i) {
        const int z =
            c.zero[static_cast<std::size_t>(g * c.N + 8 * w + column_of_nibble[static_cast<std::size_t>(i)])] -
            stored_offset;
        word |= static_cast<uint32_t>(z & 0xF) << (4 * i);
      }
      out.push_back(as_i32(word));
    }
  }
  return out;
}

constexpr std::array<int, 8> kIdentity = {0, 1, 2, 3, 4, 5, 6, 7};
constexpr std::array<int, 8> kAwqPack = {0, 2, 4, 6, 1, 3, 5, 7};  // AutoAWQ order_map

// AWQ qweight [K, N/8]: nibble i of word (k, w) = q[8w + order[i], k].
std::vector<int32_t> pack_awq_qweight(const Int4Case& c) {
  std::vector<int32_t> out;
  for (int64_t k = 0; k < c.K; ++k) {
    for (int64_t w = 0; w < c.N / 8; ++w) {
      uint32_t word = 0;
      for (int i = 0; i < 8; ++i) {
        word |= static_cast<uint32_t>(
                    c.q[static_cast<std::size_t>((8 * w + kAwqPack[static_cast<std::size_t>(i)]) * c.K + k)])
                << (4 * i);
      }
      out.push_back(as_i32(word));
    }
  }
  return out;
}

TensorMap gptq_source(const Int4Case& c, GptqFormat format, bool with_g_idx) {
  TensorMap m;
  put(m, kPrefix + "qweight", DType::kI32, {c.K / 8, c.N}, pack_gptq_qweight(c));
  put(m, kPrefix + "qzeros", DType::kI32, {c.groups, c.N / 8},
      pack_zeros(c, format == GptqFormat::kV1 ? 1 : 0, kIdentity));
  put(m, kPrefix + "scales", DType::kF16, {c.groups, c.N}, f16_scales(c));
  if (with_g_idx) put(m, kPrefix + "g_idx", DType::kI32, {c.K}, c.g_idx);
  return m;
}

TEST(WeightDequant, GptqV1AndV2) {
  for (GptqFormat f : {GptqFormat::kV1, GptqFormat::kV2}) {
    SCOPED_TRACE(f == GptqFormat::kV1 ? "v1" : "v2");
    // v1 can store real zeros 1..16, v2 0..15.
    const Int4Case c = make_int4(24, 64, 16, 41, f == GptqFormat::kV1 ? 1 : 0, f == GptqFormat::kV1 ? 16 : 15);
    const TensorMap m = gptq_source(c, f, /*with_g_idx=*/false);
    WeightQuantOptions opt;
    opt.gptq_format = f;
    expect_matches(dequant(m, 24, 64, opt), int4_expect(c), 64);
    opt.group_size = 16;
    expect_matches(dequant(m, 24, 64, opt), int4_expect(c), 64);
  }
}

// The same bytes under the two zero conventions: v1 subtracts one more zero step.
TEST(WeightDequant, GptqV1VersusV2SameBytes) {
  const Int4Case c = make_int4(16, 32, 16, 43, 1, 15);
  const TensorMap m = gptq_source(c, GptqFormat::kV1, false);  // stores zero - 1
  WeightQuantOptions v1, v2;
  v2.gptq_format = GptqFormat::kV2;
  const Result a = dequant(m, 16, 32, v1), b = dequant(m, 16, 32, v2);
  expect_matches(a, int4_expect(c), 32);
  ASSERT_TRUE(b.status.ok());
  for (int64_t n = 0; n < 16; ++n) {
    for (int64_t k = 0; k < 32; ++k) {
      const double s = c.scale[static_cast<std::size_t>((k / 16) * 16 + n)];
      EXPECT_EQ(b.w[static_cast<std::size_t>(n * 32 + k)],
                static_cast<float>(a.w[static_cast<std::size_t>(n * 32 + k)] + s));
    }
  }
}

// Hand-packed words pin the bit layout: q[n, k] = k for k < 8 -> 0x76543210; zeros
// for columns 0..7 = 1..8 in v2 -> 0x87654321.
TEST(WeightDequant, GptqNibbleOrder) {
  const int64_t N = 8, K = 8;
  std::vector<int32_t> qweight(N, as_i32(0x76543210u));
  TensorMap m;
  put(m, kPrefix + "qweight", DType::kI32, {1, N}, qweight);
  put(m, kPrefix + "qzeros", DType::kI32, {1, 1}, std::vector<int32_t>{as_i32(0x87654321u)});
  put(m, kPrefix + "scales", DType::kF16, {1, N}, std::vector<uint16_t>(N, f16_code(1.0)));
  WeightQuantOptions opt;
  opt.gptq_format = GptqFormat::kV2;
  const Result r = dequant(m, N, K, opt);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  for (int n = 0; n < N; ++n) {
    for (int k = 0; k < K; ++k) EXPECT_EQ(r.w[static_cast<std::size_t>(n * K + k)], static_cast<float>(k - (n + 1)));
  }
  // v1 reads a stored nibble 15 as zero 16 (no wrap), as AutoGPTQ does.
  put(m, kPrefix + "qzeros", DType::kI32, {1, 1}, std::vector<int32_t>{as_i32(0xFFFFFFFFu)});
  const Result v1 = dequant(m, N, K);
  ASSERT_TRUE(v1.status.ok());
  EXPECT_EQ(v1.w[3], 3.0f - 16.0f);
}

TEST(WeightDequant, GptqGIdxPermutation) {
  Int4Case c = make_int4(16, 64, 16, 47, 1, 16);
  // act-order: rows assigned to groups in a shuffled order, 16 rows per group.
  std::vector<int32_t> perm(64);
  for (int k = 0; k < 64; ++k) perm[static_cast<std::size_t>(k)] = k;
  std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
  for (int i = 0; i < 64; ++i) c.g_idx[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])] = i / 16;
  const TensorMap m = gptq_source(c, GptqFormat::kV1, /*with_g_idx=*/true);
  expect_matches(dequant(m, 16, 64), int4_expect(c), 64);
  // Without g_idx the result would differ (guards against g_idx being ignored).
  const TensorMap no_gidx = gptq_source(c, GptqFormat::kV1, false);
  const Result r = dequant(no_gidx, 16, 64);
  ASSERT_TRUE(r.status.ok());
  EXPECT_NE(r.w, dequant(m, 16, 64).w);
}

TEST(WeightDequant, GptqGIdxOutOfRange) {
  Int4Case c = make_int4(8, 32, 16, 51, 1, 16);
  for (int32_t bad : {2, -1, 1 << 30}) {
    c.g_idx[7] = bad;
    const TensorMap m = gptq_source(c, GptqFormat::kV1, true);
    const Result r = dequant(m, 8, 32);
    expect_error(r.status, StatusCode::kOutOfRange, {kPrefix + "g_idx", "[7]", std::to_string(bad), "[0, 2)"});
    EXPECT_TRUE(all_sentinel(r.w));
  }
}

TEST(WeightDequant, GptqGroupSizeOptions) {
  const Int4Case c = make_int4(8, 64, 64, 53, 1, 16);  // one group
  const TensorMap m = gptq_source(c, GptqFormat::kV1, false);
  WeightQuantOptions opt;
  opt.group_size = -1;
  expect_matches(dequant(m, 8, 64, opt), int4_expect(c), 64);
  opt.group_size = 32;
  expect_error(dequant(m, 8, 64, opt).status, StatusCode::kInvalidArgument,
               {kPrefix + "scales", "group_size 32", "[2, 8]", "got [1, 8]"});
  // Inferred: G = K / rows.
  const Int4Case c3 = make_int4(8, 48, 16, 55, 1, 16);  // 3 groups over K = 48: fine
  expect_matches(dequant(gptq_source(c3, GptqFormat::kV1, false), 8, 48), int4_expect(c3), 48);
  opt.group_size = -7;
  expect_error(dequant(m, 8, 64, opt).status, StatusCode::kInvalidArgument, {"group_size -7"});
}

TEST(WeightDequant, GptqCeilGroupsWithExplicitGroupSize) {
  // K = 40, G = 16: ceil(40/16) = 3 groups, the last one partial (AutoGPTQ's ceil).
  const Int4Case c = make_int4(8, 40, 16, 57, 1, 16);
  ASSERT_EQ(c.groups, 3);
  const TensorMap m = gptq_source(c, GptqFormat::kV1, false);
  WeightQuantOptions opt;
  opt.group_size = 16;
  expect_matches(dequant(m, 8, 40, opt), int4_expect(c), 40);
  // Inferring from 3 rows fails (40 is not a multiple of 3) and says what to set.
  expect_error(dequant(m, 8, 40).status, StatusCode::kInvalidArgument,
               {kPrefix + "scales", "cannot infer the group size", "set group_size"});
}

// With g_idx the group size is not needed: K = 40 over 3 groups cannot be inferred
// from the rows, but g_idx says where every row goes.
TEST(WeightDequant, GptqGIdxNeedsNoGroupSize) {
  const Int4Case c = make_int4(8, 40, 16, 58, 1, 16);
  const TensorMap m = gptq_source(c, GptqFormat::kV1, /*with_g_idx=*/true);
  expect_matches(dequant(m, 8, 40), int4_expect(c), 40);
  WeightQuantOptions opt;
  opt.group_size = 8;  // a stated group size is still checked against the scale rows
  expect_error(dequant(m, 8, 40, opt).status, StatusCode::kInvalidArgument, {kPrefix + "scales", "group_size 8"});
}

TEST(WeightDequant, BadScalesAreDataLossNamingTheTensor) {
  {
    Fp8Case c = make_fp8(130, 200, 128, 128, 1, true);
    c.s[3] = std::numeric_limits<float>::infinity();  // [1, 1] of the [2, 2] grid
    const Result r = dequant(fp8_source(c), 130, 200);
    expect_error(r.status, StatusCode::kDataLoss, {kPrefix + "weight_scale_inv", "[1, 1]", "inf"});
    EXPECT_TRUE(all_sentinel(r.w));
  }
  {
    Nvfp4Case n = make_nvfp4(2, 32, 1);
    n.scale[3] = 0xFF;  // [1, 1]
    TensorMap m;
    put(m, kPrefix + "weight", DType::kU8, {2, 16}, n.packed);
    put(m, kPrefix + "weight_scale", DType::kF8E4M3, {2, 2}, n.scale);
    put(m, kPrefix + "weight_scale_2", DType::kF32, {}, std::vector<float>{1.0f});
    expect_error(dequant(m, 2, 32).status, StatusCode::kDataLoss, {kPrefix + "weight_scale", "[1, 1]", "NaN"});
  }
  {
    const Int4Case g = make_int4(8, 16, 16, 3, 1, 16);
    TensorMap m = gptq_source(g, GptqFormat::kV1, false);
    std::vector<uint16_t> s = f16_scales(g);
    s[5] = 0x7E00;  // f16 NaN at [0, 5]
    put(m, kPrefix + "scales", DType::kF16, {1, 8}, s);
    expect_error(dequant(m, 8, 16).status, StatusCode::kDataLoss, {kPrefix + "scales", "[0, 5]", "nan"});
  }
}

TEST(WeightDequant, Int4OnlyFourBits) {
  const Int4Case c = make_int4(8, 16, 16, 59, 1, 16);
  WeightQuantOptions opt;
  opt.bits = 8;
  expect_error(dequant(gptq_source(c, GptqFormat::kV1, false), 8, 16, opt).status, StatusCode::kUnimplemented,
               {kPrefix + "qweight", "8-bit"});
}

// AutoAWQ packs columns 0..7 = values 0..7 as nibbles (0, 2, 4, 6, 1, 3, 5, 7) -> 0x75316420.
TEST(WeightDequant, AwqNibbleOrder) {
  const int64_t N = 8, K = 2;
  TensorMap m;
  put(m, kPrefix + "qweight", DType::kI32, {K, 1}, std::vector<int32_t>(K, as_i32(0x75316420u)));
  put(m, kPrefix + "qzeros", DType::kI32, {1, 1}, std::vector<int32_t>{0});
  put(m, kPrefix + "scales", DType::kF16, {1, N}, std::vector<uint16_t>(N, f16_code(1.0)));
  const Result r = dequant(m, N, K);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  for (int n = 0; n < N; ++n) {
    for (int k = 0; k < K; ++k) EXPECT_EQ(r.w[static_cast<std::size_t>(n * K + k)], static_cast<float>(n)) << n;
  }
  // Zeros use the same order: zero of column n = n -> every weight 0.
  put(m, kPrefix + "qzeros", DType::kI32, {1, 1}, std::vector<int32_t>{as_i32(0x75316420u)});
  const Result z = dequant(m, N, K);
  ASSERT_TRUE(z.status.ok());
  for (float v : z.w) EXPECT_EQ(v, 0.0f);
  // Our independent packer agrees with the hand-written word.
  Int4Case c{N, 1, 1, {0, 1, 2, 3, 4, 5, 6, 7}, {}, {}, {}};
  EXPECT_EQ(pack_awq_qweight(c)[0], as_i32(0x75316420u));
}

TEST(WeightDequant, AwqExact) {
  for (auto [N, K, G] : {std::array<int64_t, 3>{16, 32, 16}, {24, 96, 32}, {64, 128, 128}}) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " K=" << K << " G=" << G);
    const Int4Case c = make_int4(N, K, G, static_cast<uint32_t>(N + K + G), 0, 15);
    TensorMap m;
    put(m, kPrefix + "qweight", DType::kI32, {K, N / 8}, pack_awq_qweight(c));
    put(m, kPrefix + "qzeros", DType::kI32, {c.groups, N / 8}, pack_zeros(c, 0, kAwqPack));
    put(m, kPrefix + "scales", DType::kF16, {c.groups, N}, f16_scales(c));
    expect_matches(dequant(m, N, K), int4_expect(c), K);
    EXPECT_EQ(detect_weight_encoding(m, kPrefix).value(), WeightEncoding::kAwq);
  }
}

// ---- output dtype and the kv_b_proj view -------------------------------------------------------------
TEST(WeightDequant, Bf16OutputRoundsTheExactValueOnce) {
  const Int4Case c = make_int4(16, 64, 16, 61, 1, 16);  // (q - z) * s has up to 16 significant bits
  const TensorMap m = gptq_source(c, GptqFormat::kV1, false);
  std::vector<uint16_t> out(16 * 64, 0xFFFF);
  const Status st =
      dequantize_weight(m, kPrefix, 16, 64, {}, TensorView::contiguous(out.data(), DType::kBF16, {16, 64}));
  ASSERT_TRUE(st.ok()) << st.to_string();
  const std::vector<double> want = int4_expect(c);
  int rounded = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    // numerics.h f32_to_bf16 is the project's RNE rounding (checked against NVIDIA's in
    // numerics_oracle_test); the f32 value is exact, so this is a single rounding.
    const float exact = static_cast<float>(want[i]);
    EXPECT_EQ(out[i], f32_to_bf16(exact)) << i;
    rounded += bf16_to_f32(out[i]) != exact;
  }
  EXPECT_GT(rounded, 0);  // the case does exercise rounding
  // fp8 into bf16 too.
  const Fp8Case f = make_fp8(130, 200, 128, 128, 9, false);
  std::vector<uint16_t> out8(130 * 200);
  ASSERT_TRUE(dequantize_weight(fp8_source(f), kPrefix, 130, 200, {},
                                TensorView::contiguous(out8.data(), DType::kBF16, {130, 200}))
                  .ok());
  const std::vector<double> want8 = fp8_expect(f);
  for (std::size_t i = 0; i < out8.size(); ++i) ASSERT_EQ(out8[i], f32_to_bf16(static_cast<float>(want8[i]))) << i;
}

TEST(WeightDequant, KvBProjPerHeadView) {
  // H = 2, P = 3, V = 5, L = 16: W [16, 16], viewed [2, 8, 16].
  const MlaGeometry geo{.num_heads = 2, .kv_lora_rank = 16, .qk_nope_head_dim = 3, .v_head_dim = 5};
  ASSERT_EQ(geo.kv_b_rows(), 16);
  std::vector<uint16_t> w(16 * 16);
  for (int i = 0; i < 16 * 16; ++i) w[static_cast<std::size_t>(i)] = bf16_bits_of(static_cast<float>(i - 100));
  TensorMap m;
  put(m, kPrefix + "weight", DType::kBF16, {16, 16}, w);
  std::vector<float> out(2 * 8 * 16, kSentinel);
  const Status st = dequantize_kv_b_proj(m, "model.layers.3.self_attn.kv_b_proj", geo, {},
                                         TensorView::contiguous(out.data(), DType::kF32, {2, 8, 16}));
  ASSERT_TRUE(st.ok()) << st.to_string();
  for (int h = 0; h < 2; ++h) {
    for (int r = 0; r < 8; ++r) {
      for (int l = 0; l < 16; ++l) {
        // row r < P of head h is W_UK[h][r], the rest W_UV[h][r - P]: row h*(P+V) + r of W.
        EXPECT_EQ(out[static_cast<std::size_t>((h * 8 + r) * 16 + l)], static_cast<float>((h * 8 + r) * 16 + l - 100));
      }
    }
  }
  expect_error(dequantize_kv_b_proj(m, kPrefix, geo, {}, TensorView::contiguous(out.data(), DType::kF32, {2, 9, 16})),
               StatusCode::kInvalidArgument, {"out", "[2, 8, 16]"});
  expect_error(dequantize_kv_b_proj(
                   m, kPrefix, MlaGeometry{.num_heads = 2, .kv_lora_rank = 16, .qk_nope_head_dim = 0, .v_head_dim = 5},
                   {}, TensorView::contiguous(out.data(), DType::kF32, {2, 8, 16})),
               StatusCode::kInvalidArgument, {"qk_nope_head_dim 0"});
}

// ---- errors naming tensors ---------------------------------------------------------------------------
TEST(WeightDequant, MissingTensorNamed) {
  const Fp8Case c = make_fp8(8, 8, 128, 128, 1, true);
  TensorMap m;
  put(m, kPrefix + "weight", DType::kF8E4M3, {8, 8}, c.q);
  const Result r = dequant(m, 8, 8);
  expect_error(r.status, StatusCode::kNotFound, {kPrefix + "weight_scale_inv", "fp8_block", kPrefix + "weight"});
  EXPECT_TRUE(all_sentinel(r.w));

  const Int4Case g = make_int4(8, 16, 16, 3, 1, 16);
  TensorMap q = gptq_source(g, GptqFormat::kV1, false);
  TensorMap q2;  // qweight + scales, no qzeros
  put(q2, kPrefix + "qweight", DType::kI32, {2, 8}, pack_gptq_qweight(g));
  put(q2, kPrefix + "scales", DType::kF16, {1, 8}, f16_scales(g));
  expect_error(dequant(q2, 8, 16).status, StatusCode::kNotFound, {kPrefix + "qzeros", "gptq"});

  const Nvfp4Case n = make_nvfp4(2, 16, 1);
  TensorMap mo;
  put(mo, kPrefix + "weight", DType::kU8, {2, 8}, n.packed);
  put(mo, kPrefix + "weight_scale", DType::kF8E4M3, {2, 1}, n.scale);
  expect_error(dequant(mo, 2, 16).status, StatusCode::kNotFound, {kPrefix + "weight_scale_2", "modelopt_nvfp4"});
}

TEST(WeightDequant, WrongDtypeNamed) {
  const Int4Case g = make_int4(8, 16, 16, 3, 1, 16);
  TensorMap m = gptq_source(g, GptqFormat::kV1, false);
  put(m, kPrefix + "scales", DType::kF32, {1, 8}, std::vector<float>(8, 1.0f));
  expect_error(dequant(m, 8, 16).status, StatusCode::kInvalidArgument,
               {kPrefix + "scales", "expected dtype f16", "got f32"});

  const Fp8Case c = make_fp8(8, 8, 128, 128, 1, true);
  TensorMap f = fp8_source(c);
  put(f, kPrefix + "weight_scale_inv", DType::kI32, {1, 1}, std::vector<int32_t>{1});
  expect_error(dequant(f, 8, 8).status, StatusCode::kInvalidArgument,
               {kPrefix + "weight_scale_inv", "f32 or bf16", "got i32"});

  const Nvfp4Case n = make_nvfp4(2, 16, 1);
  TensorMap ct;
  put(ct, kPrefix + "weight_packed", DType::kU8, {2, 8}, n.packed);
  put(ct, kPrefix + "weight_scale", DType::kU8, {2, 1}, n.scale);
  put(ct, kPrefix + "weight_global_scale", DType::kF32, {1}, std::vector<float>{1.0f});
  expect_error(dequant(ct, 2, 16).status, StatusCode::kInvalidArgument,
               {kPrefix + "weight_scale", "expected dtype f8_e4m3", "got u8"});
}

TEST(WeightDequant, WrongShapeNamed) {
  // Each GPTQ tensor with a wrong shape; the message names it with expected and actual.
  const Int4Case g = make_int4(16, 32, 16, 3, 1, 16);
  {
    TensorMap m = gptq_source(g, GptqFormat::kV1, false);
    const Result r = dequant(m, 16, 64);  // K wrong: qweight is [4, 16], expected [8, 16]
    expect_error(r.status, StatusCode::kInvalidArgument,
                 {kPrefix + "qweight", "expected shape [8, 16]", "got [4, 16]"});
    EXPECT_TRUE(all_sentinel(r.w));
  }
  {
    TensorMap m = gptq_source(g, GptqFormat::kV1, false);
    put(m, kPrefix + "qzeros", DType::kI32, {2, 1}, std::vector<int32_t>{0, 0});
    expect_error(dequant(m, 16, 32).status, StatusCode::kInvalidArgument,
                 {kPrefix + "qzeros", "expected shape [2, 2]", "got [2, 1]"});
  }
  {
    TensorMap m = gptq_source(g, GptqFormat::kV1, true);
    put(m, kPrefix + "g_idx", DType::kI32, {31}, std::vector<int32_t>(31, 0));
    expect_error(dequant(m, 16, 32).status, StatusCode::kInvalidArgument,
                 {kPrefix + "g_idx", "expected shape [32]", "got [31]"});
  }
  {
    const Nvfp4Case n = make_nvfp4(4, 32, 1);
    TensorMap m;
    put(m, kPrefix + "weight", DType::kU8, {4, 16}, n.packed);
    put(m, kPrefix + "weight_scale", DType::kF8E4M3, {2, 4}, n.scale);  // should be [4, 2]
    put(m, kPrefix + "weight_scale_2", DType::kF32, {}, std::vector<float>{1.0f});
    expect_error(dequant(m, 4, 32).status, StatusCode::kInvalidArgument,
                 {kPrefix + "weight_scale", "expected shape [4, 2]", "got [2, 4]"});
    expect_error(dequant(m, 4, 24).status, StatusCode::kInvalidArgument,
                 {kPrefix + "weight", "not a multiple of the NVFP4 group size 16"});
  }
  {
    const Fp8Case c = make_fp8(130, 200, 128, 128, 1, true);
    const TensorMap m = fp8_source(c);
    expect_error(dequant(m, 129, 200).status, StatusCode::kInvalidArgument,
                 {kPrefix + "weight", "expected shape [129, 200]", "got [130, 200]"});
  }
}

TEST(WeightDequant, BadOutput) {
  const Fp8Case c = make_fp8(8, 8, 128, 128, 1, true);
  const TensorMap m = fp8_source(c);
  std::vector<float> out(64);
  expect_error(dequantize_weight(m, kPrefix, 8, 8, {}, TensorView::contiguous(out.data(), DType::kF32, {8, 7})),
               StatusCode::kInvalidArgument, {"out", "[8, 8]"});
  expect_error(dequantize_weight(m, kPrefix, 8, 8, {}, TensorView::contiguous(out.data(), DType::kF16, {8, 8})),
               StatusCode::kInvalidArgument, {"out", "f32 or bf16"});
  TensorView strided = TensorView::contiguous(out.data(), DType::kF32, {4, 8});
  strided.strides[0] = 16;
  expect_error(dequantize_weight(m, kPrefix, 4, 8, {}, strided), StatusCode::kInvalidArgument, {"out", "contiguous"});
  expect_error(dequantize_weight(m, kPrefix, 0, 8, {}, TensorView::contiguous(out.data(), DType::kF32, {0, 8})),
               StatusCode::kInvalidArgument, {"N = 0"});
}

// A forced encoding that does not match the tensors fails on the first missing tensor.
TEST(WeightDequant, ForcedEncoding) {
  const Fp8Case c = make_fp8(8, 8, 128, 128, 1, true);
  const TensorMap m = fp8_source(c);
  WeightQuantOptions opt;
  opt.encoding = WeightEncoding::kAwq;
  expect_error(dequant(m, 8, 8, opt).status, StatusCode::kNotFound, {kPrefix + "qweight", "awq"});
  opt.encoding = WeightEncoding::kFp8Block;
  expect_matches(dequant(m, 8, 8, opt), fp8_expect(c), 8);
}

// ---- detection ------------------------------------------------------------------------------------------
TEST(DetectWeightEncoding, EachEncoding) {
  auto detect = [](const TensorMap& m) { return detect_weight_encoding(m, kPrefix); };
  {
    TensorMap m;
    put(m, kPrefix + "weight", DType::kBF16, {2, 2}, std::vector<uint16_t>(4, 0));
    EXPECT_EQ(detect(m).value(), WeightEncoding::kDense);
    // The prefix may omit the trailing dot.
    EXPECT_EQ(detect_weight_encoding(m, "model.layers.3.self_attn.kv_b_proj").value(), WeightEncoding::kDense);
  }
  EXPECT_EQ(detect(fp8_source(make_fp8(4, 4, 128, 128, 1, true))).value(), WeightEncoding::kFp8Block);
  const Nvfp4Case n = make_nvfp4(2, 16, 1);
  {
    TensorMap m;
    put(m, kPrefix + "weight", DType::kU8, {2, 8}, n.packed);
    EXPECT_EQ(detect(m).value(), WeightEncoding::kModelOptNvfp4);
  }
  {
    TensorMap m;
    put(m, kPrefix + "weight_packed", DType::kU8, {2, 8}, n.packed);
    EXPECT_EQ(detect(m).value(), WeightEncoding::kCompressedTensorsNvfp4);
  }
  const Int4Case g = make_int4(16, 16, 16, 1, 1, 16);
  EXPECT_EQ(detect(gptq_source(g, GptqFormat::kV1, false)).value(), WeightEncoding::kGptq);
  EXPECT_EQ(weight_encoding_name(WeightEncoding::kCompressedTensorsNvfp4), "compressed_tensors_nvfp4");
}

TEST(DetectWeightEncoding, NoStorageListsNames) {
  TensorMap m;
  put(m, kPrefix + "bias", DType::kF32, {2}, std::vector<float>{0, 0});
  put(m, kPrefix + "weight_scale", DType::kF32, {1}, std::vector<float>{1});
  put(m, "model.layers.4.self_attn.kv_b_proj.weight", DType::kF32, {1}, std::vector<float>{1});
  const StatusOr<WeightEncoding> e = detect_weight_encoding(m, kPrefix);
  expect_error(e.status(), StatusCode::kNotFound,
               {kPrefix + "bias", kPrefix + "weight_scale", "weight_packed", "qweight"});
  EXPECT_EQ(e.status().message().find("layers.4"), std::string::npos) << e.status().message();
  // dequantize_weight reports the same.
  expect_error(dequant(m, 2, 2).status, StatusCode::kNotFound, {kPrefix + "bias"});
  expect_error(detect_weight_encoding(m, "model.layers.9.").status(), StatusCode::kNotFound, {"none"});
}

TEST(DetectWeightEncoding, UnsupportedStorage) {
  {
    TensorMap m;  // compressed-tensors int4 pack-quantized (W4A16)
    put(m, kPrefix + "weight_packed", DType::kI32, {2, 2}, std::vector<int32_t>(4, 0));
    expect_error(detect_weight_encoding(m, kPrefix).status(), StatusCode::kUnimplemented,
                 {kPrefix + "weight_packed", "i32"});
  }
  {
    TensorMap m;  // per-tensor fp8
    put(m, kPrefix + "weight", DType::kF8E4M3, {2, 2}, std::vector<uint8_t>(4, 0));
    put(m, kPrefix + "weight_scale", DType::kF32, {1}, std::vector<float>{1});
    expect_error(detect_weight_encoding(m, kPrefix).status(), StatusCode::kUnimplemented,
                 {kPrefix + "weight", "weight_scale_inv"});
  }
  {
    TensorMap m;
    put(m, kPrefix + "weight", DType::kI8, {2, 2}, std::vector<int8_t>(4, 0));
    expect_error(detect_weight_encoding(m, kPrefix).status(), StatusCode::kInvalidArgument, {kPrefix + "weight", "i8"});
  }
  {
    TensorMap m;  // qweight whose shape fits neither layout
    put(m, kPrefix + "qweight", DType::kI32, {4, 5}, std::vector<int32_t>(20, 0));
    put(m, kPrefix + "scales", DType::kF16, {1, 16}, std::vector<uint16_t>(16, 0));
    expect_error(detect_weight_encoding(m, kPrefix).status(), StatusCode::kInvalidArgument,
                 {kPrefix + "qweight [4, 5]", kPrefix + "scales [1, 16]"});
    TensorMap n;
    put(n, kPrefix + "qweight", DType::kI32, {4, 5}, std::vector<int32_t>(20, 0));
    expect_error(detect_weight_encoding(n, kPrefix).status(), StatusCode::kNotFound, {kPrefix + "scales"});
  }
}

// ---- quantization_config ----------------------------------------------------------------------------------
TEST(WeightQuantOptions, ParseQuantizationConfig) {
  auto parse = [](const char* s) { return parse_weight_quant_options(s); };
  {
    const auto o = parse(R"({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 64]})");
    ASSERT_TRUE(o.ok()) << o.status().to_string();
    EXPECT_EQ(o->fp8_block_rows, 128);
    EXPECT_EQ(o->fp8_block_cols, 64);
    EXPECT_FALSE(o->encoding.has_value());
  }
  {
    const auto o = parse(R"({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 64,
                              "desc_act": true, "checkpoint_format": "gptq_v2"}, "model_type": "deepseek_v3"})");
    ASSERT_TRUE(o.ok()) << o.status().to_string();
    EXPECT_EQ(o->gptq_format, GptqFormat::kV2);
    EXPECT_EQ(o->group_size, 64);
    EXPECT_EQ(o->bits, 4);
  }
  {
    const auto o = parse(R"({"quant_method": "gptq", "bits": 8, "group_size": -1})");
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(o->gptq_format, GptqFormat::kV1);
    EXPECT_EQ(o->group_size, -1);
    EXPECT_EQ(o->bits, 8);
  }
  {
    const auto o =
        parse(R"({"quant_method": "awq", "w_bit": 4, "q_group_size": 128, "version": "GEMM", "zero_point": true})");
    ASSERT_TRUE(o.ok()) << o.status().to_string();
    EXPECT_EQ(o->group_size, 128);
  }
  EXPECT_TRUE(parse(R"({"quant_method": "modelopt", "quant_algo": "NVFP4"})").ok());
  EXPECT_TRUE(parse(R"({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"})").ok());
  expect_error(parse(R"({"quant_method": "awq", "version": "gemv"})").status(), StatusCode::kUnimplemented, {"gemv"});
  expect_error(parse(R"({"quant_method": "gptq", "checkpoint_format": "marlin"})").status(), StatusCode::kUnimplemented,
               {"marlin"});
  expect_error(parse(R"({"quant_method": "bitsandbytes"})").status(), StatusCode::kUnimplemented, {"bitsandbytes"});
  expect_error(parse(R"({"quant_method": "gptq", "bits": "4"})").status(), StatusCode::kInvalidArgument,
               {"quantization_config.bits"});
  expect_error(parse(R"({"quant_method": "fp8", "weight_block_size": [128]})").status(), StatusCode::kInvalidArgument,
               {"weight_block_size"});
  expect_error(parse("{not json").status(), StatusCode::kInvalidArgument, {"not valid JSON"});
  expect_error(parse(R"({"bits": 4})").status(), StatusCode::kInvalidArgument, {"quant_method"});
}

// The one reader of a checkpoint's quantization settings: a whole config.json.
void expect_defaults(const StatusOr<WeightQuantOptions>& o, const char* what) {
  ASSERT_TRUE(o.ok()) << what << ": " << o.status().to_string();
  EXPECT_FALSE(o->encoding.has_value()) << what;
  EXPECT_EQ(o->bits, 4) << what;
  EXPECT_EQ(o->group_size, 0) << what;
  EXPECT_EQ(o->gptq_format, GptqFormat::kV1) << what;
  EXPECT_EQ(o->fp8_block_rows, 128) << what;
  EXPECT_EQ(o->fp8_block_cols, 128) << what;
}

TEST(WeightQuantOptions, CheckpointConfigAbsentAndNullAreTheSame) {
  const char* absent = R"({"model_type": "deepseek_v3", "kv_lora_rank": 512})";
  const char* null = R"({"model_type": "deepseek_v3", "quantization_config": null, "kv_lora_rank": 512})";
  expect_defaults(parse_checkpoint_quant_options(absent, "a/config.json"), "absent");
  expect_defaults(parse_checkpoint_quant_options(null, "a/config.json"), "null");
  // parse_weight_quant_options agrees on null, given the config or the bare object.
  expect_defaults(parse_weight_quant_options(null), "null via parse_weight_quant_options");
  expect_defaults(parse_weight_quant_options("null"), "bare null");
}

TEST(WeightQuantOptions, CheckpointConfigEachMethod) {
  auto with = [](const std::string& q) {
    return parse_checkpoint_quant_options(R"({"model_type": "deepseek_v3", "quantization_config": )" + q + "}",
                                          "ckpt/config.json");
  };
  {
    const auto o = with(R"({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [64, 32]})");
    ASSERT_TRUE(o.ok()) << o.status().to_string();
    EXPECT_EQ(o->fp8_block_rows, 64);
    EXPECT_EQ(o->fp8_block_cols, 32);
    EXPECT_FALSE(o->encoding.has_value());
  }
  {
    const auto o = with(R"({"quant_method": "gptq", "bits": 4, "group_size": 32, "checkpoint_format": "gptq_v2"})");
    ASSERT_TRUE(o.ok()) << o.status().to_string();
    EXPECT_EQ(o->gptq_format, GptqFormat::kV2);
    EXPECT_EQ(o->group_size, 32);
  }
  {
    const auto o = with(R"({"quant_method": "gptq", "bits": 4, "group_size": -1})");
    ASSERT_TRUE(o.ok()) << o.status().to_string();
    EXPECT_EQ(o->gptq_format, GptqFormat::kV1);
    EXPECT_EQ(o->group_size, -1);
  }
  {
    const auto o = with(R"({"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm"})");
    ASSERT_TRUE(o.ok()) << o.status().to_string();
    EXPECT_EQ(o->group_size, 64);
  }
  expect_defaults(with(R"({"quant_method": "modelopt", "quant_algo": "NVFP4"})"), "modelopt");
  expect_defaults(with(R"({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"})"),
                  "compressed-tensors");
  // Errors are parse_weight_quant_options's, with the source in front.
  expect_error(with(R"({"quant_method": "bitsandbytes"})").status(), StatusCode::kUnimplemented,
               {"ckpt/config.json", "bitsandbytes"});
  expect_error(with(R"({"bits": 4})").status(), StatusCode::kInvalidArgument, {"ckpt/config.json", "quant_method"});
  expect_error(with(R"("fp8")").status(), StatusCode::kInvalidArgument, {"ckpt/config.json", "JSON object"});
  expect_error(parse_checkpoint_quant_options("[1, 2]", "x.json").status(), StatusCode::kInvalidArgument,
               {"x.json", "JSON object"});
  expect_error(parse_checkpoint_quant_options("{oops", "x.json").status(), StatusCode::kInvalidArgument,
               {"x.json", "not valid JSON"});
}

TEST(WeightQuantOptions, LoadFromDirectoryOrFile) {
  const std::string dir = ::testing::TempDir() + "quant_ckpt_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/config.json", std::ios::binary);
    f << R"({"model_type": "glm4_moe_lite", "quantization_config": {"quant_method": "fp8", "weight_block_size": [4, 2]}})";
  }
  for (const std::string& path : {dir, dir + "/config.json"}) {
    const auto o = load_checkpoint_quant_options(path);
    ASSERT_TRUE(o.ok()) << path << ": " << o.status().to_string();
    EXPECT_EQ(o->fp8_block_rows, 4) << path;
    EXPECT_EQ(o->fp8_block_cols, 2) << path;
  }
  {
    std::ofstream f(dir + "/config.json", std::ios::binary | std::ios::trunc);
    f << R"({"model_type": "glm4_moe_lite", "quantization_config": null})";
  }
  expect_defaults(load_checkpoint_quant_options(dir), "null on disk");
  std::filesystem::remove(dir + "/config.json");
  expect_error(load_checkpoint_quant_options(dir).status(), StatusCode::kNotFound, {"config.json"});
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mlakv
