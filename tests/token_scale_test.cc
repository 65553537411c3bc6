// The nvfp4 per-token scale mode (formats.h nvfp4_token_scale; the local-inference-lab
// fork's VLLM_NVFP4_MLA_DYNAMIC_SCALE=1, vLLM PR #189 / b12x PR #86):
//   * byte-exact against an independent encoder written here from the fork's
//     description (kv_cache.py's docstring and writer: s_t = token_amax * f32(1/2688)
//     stored fp32 at [292, 296), every group encoded relative to s_t, zero token -> s_t 0
//     and zero codes, the rest of the pad zero, the rope lane unchanged). It shares no
//     code with the codec: its own e4m3 / e2m1 round-to-nearest-even by exhaustive
//     nearest search in double, its own decoders;
//   * the round trip (decode = e2m1 * e4m3(sf) * s_t, within the derived bound);
//   * the rescue: a token of max |latent| 1e-3 at s_l = 1 loses every group to a zero
//     e4m3 scale, and keeps ~2^-3 relative error in the mode;
//   * validation: nvfp4 formats only, outer scale 1, corrupt s_t refused on decode, the
//     record-file flag, the cache layers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mlakv/cache.h"
#include "mlakv/codec.h"

namespace mlakv {
namespace {

constexpr KvFormat kNvfp4[] = {KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kNvfp4DsMlaInt8Rope};

// ---- the independent reference ----------------------------------------------------------------
// e4m3fn magnitude of code c in [0, 0x7E]: subnormal m * 2^-9, normal (1 + m/8) * 2^(e-7).
double e4m3_value(int c) {
  const int e = c >> 3, m = c & 7;
  return e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
}
// Round-to-nearest-even onto the magnitudes v[0..n) (ascending; code = index), saturating
// at the top: the nearest value, a tie going to the even code.
int nearest_even(double a, const double* v, int n) {
  if (a >= v[n - 1]) return n - 1;
  int best = 0;
  for (int c = 1; c < n; ++c) {
    const double d = std::fabs(a - v[c]), db = std::fabs(a - v[best]);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return best;
}
struct RefTables {
  double e4m3[127];
  double e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  RefTables() {
    for (int c = 0; c < 127; ++c) e4m3[c] = e4m3_value(c);
  }
};
const RefTables kRef;

uint8_t ref_e4m3_nonneg(float x) { return static_cast<uint8_t>(nearest_even(static_cast<double>(x), kRef.e4m3, 127)); }
uint8_t ref_e2m1(float x) {
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  return static_cast<uint8_t>(sign | nearest_even(std::fabs(static_cast<double>(x)), kRef.e2m1, 8));
}

// Bytes [0, 288) and the fp32 s_t at [292, 296) of a token, from the fork's description.
struct RefLatent {
  uint8_t bytes[288] = {};
  float st = 0;
};
RefLatent ref_encode(const float* x) {
  RefLatent r;
  float amax = 0;
  for (int i = 0; i < 512; ++i) amax = std::max(amax, std::fabs(x[i]));
  r.st = amax * static_cast<float>(1.0 / (6.0 * 448.0));  // the fork's _TWO_LEVEL_RCP, an f32 constant
  if (r.st == 0.0f) return r;                              // zero token: s_t 0, zero codes and scales
  for (int g = 0; g < 32; ++g) {
    float y[16], gmax = 0;
    for (int i = 0; i < 16; ++i) {
      y[i] = x[16 * g + i] / r.st;  // relative to s_t
      gmax = std::max(gmax, std::fabs(y[i]));
    }
    const uint8_t code = ref_e4m3_nonneg(gmax / 6.0f);  // group amax / 6 -> e4m3 (satfinite)
    const float sf = static_cast<float>(e4m3_value(code));
    r.bytes[256 + g] = code;
    for (int i = 0; i < 16; i += 2) {
      const uint8_t lo = sf == 0.0f ? 0 : ref_e2m1(y[i] / sf), hi = sf == 0.0f ? 0 : ref_e2m1(y[i + 1] / sf);
      r.bytes[8 * g + i / 2] = static_cast<uint8_t>(lo | (hi << 4));  // even dim in the low nibble
    }
  }
  return r;
}
// The reader: x = (e2m1 * e4m3(sf)) * s_t in float32.
float ref_decode(const uint8_t* rec, int i) {
  float st;
  std::memcpy(&st, rec + 292, 4);
  const uint8_t b = rec[i / 2];
  const uint8_t q = (i % 2) ? (b >> 4) : (b & 0xF);
  const float e2 = static_cast<float>((q & 8) ? -kRef.e2m1[q & 7] : kRef.e2m1[q & 7]);
  return (e2 * static_cast<float>(e4m3_value(rec[256 + i / 16]))) * st;
}

// ---- helpers ----------------------------------------------------------------------------------
struct Tokens {
  std::vector<float> lat, rope;
  int64_t n = 0;
};

Tokens tokens(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Tokens t;
  for (double scale : {1e-6, 1e-4, 1e-3, 0.02, 0.3, 1.0, 5.2, 100.0, 3e4}) {
    for (int k = 0; k < 4; ++k) {
      for (int i = 0; i < 512; ++i) t.lat.push_back(static_cast<float>(nd(rng) * scale * (i % 61 == 0 ? 20 : 1)));
      for (int i = 0; i < 64; ++i) t.rope.push_back(nd(rng));
      ++t.n;
    }
  }
  // an all-zero token, a one-spike token, and a token whose groups hit e2m1 ties relative
  // to s_t: amax 2688 gives s_t = 2688 * f32(1/2688) (1 up to one rounding)
  for (int which = 0; which < 3; ++which) {
    for (int i = 0; i < 512; ++i) {
      float v = 0;
      if (which == 1) v = i == 300 ? -7.5f : 0.0f;
      if (which == 2) v = i == 0 ? 2688.0f : (i % 16 == 0 ? 448.0f * 6 : 0.25f * 448.0f * static_cast<float>(i % 13));
      t.lat.push_back(v);
    }
    for (int i = 0; i < 64; ++i) t.rope.push_back(0.5f * static_cast<float>(i % 7 - 3));
    ++t.n;
  }
  return t;
}

std::vector<uint8_t> encode(const CodecParams& p, const Tokens& t) {
  const int rb = *codec_record_bytes(p);
  std::vector<uint8_t> out(static_cast<std::size_t>(t.n) * rb, 0xA5);
  const Status st = encode_records(p, TensorView::contiguous(t.lat.data(), DType::kF32, {t.n, 512}),
                                   TensorView::contiguous(t.rope.data(), DType::kF32, {t.n, 64}),
                                   TensorView::contiguous(out.data(), DType::kU8, {t.n, rb}));
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

Status decode(const CodecParams& p, const std::vector<uint8_t>& recs, std::vector<float>& lat,
              std::vector<float>& rope) {
  const int rb = *codec_record_bytes(p);
  const int64_t n = static_cast<int64_t>(recs.size()) / rb;
  lat.assign(static_cast<std::size_t>(n) * 512, -1.0f);
  rope.assign(static_cast<std::size_t>(n) * 64, -1.0f);
  return decode_records(p, TensorView::contiguous(recs.data(), DType::kU8, {n, rb}),
                        TensorView::contiguous(lat.data(), DType::kF32, {n, 512}),
                        TensorView::contiguous(rope.data(), DType::kF32, {n, 64}));
}

CodecParams ts_params(KvFormat f) {
  CodecParams p;
  p.format = f;
  p.token_scale = true;
  return p;
}

// ---- tests ------------------------------------------------------------------------------------
TEST(TokenScale, ByteExactAgainstAnIndependentEncoderOfTheForksDescription) {
  const Tokens t = tokens(3);
  for (KvFormat f : kNvfp4) {
    SCOPED_TRACE(std::string(format_name(f)));
    const int rb = record_bytes(f);
    const auto got = encode(ts_params(f), t);
    CodecParams stat;
    stat.format = f;
    const auto plain = encode(stat, t);  // the static mode, for the rope lane
    for (int64_t k = 0; k < t.n; ++k) {
      const uint8_t* rec = got.data() + k * rb;
      const RefLatent want = ref_encode(t.lat.data() + k * 512);
      for (int b = 0; b < 288; ++b) {
        ASSERT_EQ(rec[b], want.bytes[b]) << "token " << k << " byte " << b;
      }
      float st;
      std::memcpy(&st, rec + 292, 4);
      ASSERT_EQ(std::memcmp(&st, &want.st, 4), 0) << "token " << k << ": s_t " << st << ", want " << want.st;
      // The rest of the pad is zero: [288, 292) and [296, 304) on 432 B; [296, 304) on 368 B
      // ([288, 292) is the rope scale there).
      for (int b = 296; b < 304; ++b) ASSERT_EQ(rec[b], 0) << "token " << k << " pad byte " << b;
      if (f == KvFormat::kNvfp4DsMla) {
        for (int b = 288; b < 292; ++b) ASSERT_EQ(rec[b], 0) << "token " << k << " pad byte " << b;
      }
      // The rope lane (scale and codes) is the static mode's.
      const uint8_t* p = plain.data() + k * rb;
      const int rope_begin = f == KvFormat::kNvfp4DsMla ? 304 : 288;
      for (int b = rope_begin; b < rb; ++b) {
        if (b >= 292 && b < 304) continue;
        ASSERT_EQ(rec[b], p[b]) << "token " << k << " rope byte " << b;
      }
      // ... and the static mode leaves [292, 296) zero.
      for (int b = 292; b < 296; ++b) ASSERT_EQ(p[b], 0);
    }
    // The zero token stores s_t = 0 and an all-zero latent.
    const uint8_t* z = got.data() + (t.n - 3) * rb;
    for (int b = 0; b < 288; ++b) ASSERT_EQ(z[b], 0);
    for (int b = 292; b < 296; ++b) ASSERT_EQ(z[b], 0);
  }
}

TEST(TokenScale, RoundTripReadsSt) {
  const Tokens t = tokens(5);
  for (KvFormat f : kNvfp4) {
    SCOPED_TRACE(std::string(format_name(f)));
    const int rb = record_bytes(f);
    const CodecParams p = ts_params(f);
    const auto recs = encode(p, t);
    std::vector<float> lat, rope;
    ASSERT_TRUE(decode(p, recs, lat, rope).ok());
    for (int64_t k = 0; k < t.n; ++k) {
      const uint8_t* rec = recs.data() + k * rb;
      float st;
      std::memcpy(&st, rec + 292, 4);
      for (int i = 0; i < 512; ++i) {
        const float x = t.lat[static_cast<std::size_t>(k * 512 + i)];
        const float xh = lat[static_cast<std::size_t>(k * 512 + i)];
        ASSERT_EQ(xh, ref_decode(rec, i)) << "token " << k << " dim " << i;  // the reader's expression
        // Bound: y = x / s_t has |y| <= 2688; the group scale sf ~ amax_g(y)/6 (within e4m3's
        // 2^-4 relative or 2^-10 absolute), then half an e2m1 gap of y / sf, times s_t.
        const float sf = static_cast<float>(e4m3_value(rec[256 + i / 16]));
        const double y = std::fabs(static_cast<double>(x) / st);
        const double r = sf == 0 ? 0 : y / sf;
        const double half_gap = r <= 2 ? 0.25 : r <= 4 ? 0.5 : 1.0;
        const double err_y = sf == 0 ? y : half_gap * sf + std::max(0.0, y - 6.0 * sf);
        const double bound = st == 0 ? 0 : err_y * st * (1 + 1e-6) + 1e-6 * std::fabs(x) + 1e-45;
        ASSERT_LE(std::fabs(static_cast<double>(xh) - x), bound) << "token " << k << " dim " << i << " x " << x;
      }
    }
  }
}

TEST(TokenScale, RescuesASmallLatentToken) {
  // max |latent| ~1e-3 with no outer scale (GLM-5.2's shallow layers are ~0.02): at s_l = 1
  // every group scale amax/6 <= 1.7e-4 is below half e4m3's smallest subnormal (2^-10), so
  // it rounds to 0 and the whole latent decodes to 0. The per-token mode puts the largest
  // group scale at the top of the e4m3 range.
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Tokens t;
  t.n = 16;
  for (int k = 0; k < 16; ++k) {
    std::vector<float> l(512);
    float amax = 0;
    for (float& v : l) {
      v = nd(rng);
      amax = std::max(amax, std::fabs(v));
    }
    for (float& v : l) t.lat.push_back(v / amax * 1e-3f);
    for (int i = 0; i < 64; ++i) t.rope.push_back(nd(rng));
  }
  for (KvFormat f : kNvfp4) {
    SCOPED_TRACE(std::string(format_name(f)));
    CodecParams stat;
    stat.format = f;
    auto rel_err = [&](const CodecParams& p) {
      std::vector<float> lat, rope;
      EXPECT_TRUE(decode(p, encode(p, t), lat, rope).ok());
      double num = 0, den = 0;
      for (std::size_t i = 0; i < lat.size(); ++i) {
        num += (lat[i] - t.lat[i]) * (lat[i] - t.lat[i]);
        den += t.lat[i] * t.lat[i];
      }
      return std::sqrt(num / den);
    };
    const double e_static = rel_err(stat), e_token = rel_err(ts_params(f));
    std::printf("  %s, max|latent| 1e-3: rel L2 error %.3e static (s_l = 1), %.3e token-scale mode\n",
                std::string(format_name(f)).c_str(), e_static, e_token);
    EXPECT_EQ(e_static, 1.0);  // every group scale is 0: nothing survives
    EXPECT_LT(e_token, 0.15);  // nvfp4's usual error on Gaussian groups (~0.1)
  }
}

TEST(TokenScale, Validation) {
  std::vector<float> lat(512, 0.5f), rope(64, 0.25f);
  std::vector<uint8_t> out(1152);
  const auto L = TensorView::contiguous(lat.data(), DType::kF32, {1, 512});
  const auto R = TensorView::contiguous(rope.data(), DType::kF32, {1, 64});
  for (KvFormat f : {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kF32}) {
    CodecParams p = ts_params(f);
    const Status st = codec_record_bytes(p).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << format_name(f);
    EXPECT_NE(st.message().find("token_scale is a mode of the nvfp4 formats"), std::string::npos) << st.message();
  }
  CodecParams p = ts_params(KvFormat::kNvfp4DsMla);
  p.outer_scale = 0.5f;
  Status st = encode_records(p, L, R, TensorView::contiguous(out.data(), DType::kU8, {1, 432}));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("replaces the outer scale"), std::string::npos) << st.message();

  // A corrupt s_t is refused on decode (negative, NaN, Inf); 0 is an all-zero token.
  for (KvFormat f : kNvfp4) {
    const CodecParams q = ts_params(f);
    Tokens t;
    t.n = 1;
    t.lat = lat;
    t.rope = rope;
    auto rec = encode(q, t);
    std::vector<float> dl, dr;
    ASSERT_TRUE(decode(q, rec, dl, dr).ok());
    for (float bad : {-1.0f, NAN, INFINITY}) {
      auto r2 = rec;
      std::memcpy(r2.data() + 292, &bad, 4);
      st = decode(q, r2, dl, dr);
      EXPECT_EQ(st.code(), StatusCode::kDataLoss) << format_name(f) << " " << bad;
      EXPECT_NE(st.message().find("token scale"), std::string::npos) << st.message();
    }
    // A finite s_t that overflows the product is caught by the finiteness check.
    const float huge = 3e38f;
    std::memcpy(rec.data() + 292, &huge, 4);
    EXPECT_EQ(decode(q, rec, dl, dr).code(), StatusCode::kDataLoss);
  }
}

TEST(TokenScale, RecordFileCarriesTheMode) {
  CodecParams p = ts_params(KvFormat::kNvfp4DsMlaInt8Rope);
  auto h = record_file_header(p, 0);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)[layout::record_file::kFlagsOffset], 1);
  auto info = parse_record_file(*h, "mem");
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_TRUE(info->params.token_scale);
  EXPECT_EQ(info->params.format, KvFormat::kNvfp4DsMlaInt8Rope);
  p.token_scale = false;
  auto h0 = record_file_header(p, 0);
  EXPECT_EQ((*h0)[layout::record_file::kFlagsOffset], 0);
  EXPECT_FALSE(parse_record_file(*h0, "mem")->params.token_scale);
  (*h)[layout::record_file::kFlagsOffset] = 4;  // an unknown flag bit (bits 0 and 1 are known)
  auto bad = parse_record_file(*h, "mem");
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("flags"), std::string::npos) << bad.status().to_string();
  // Token-scale mode with the nvfp4 scale search (bit 1): the combination the codec refuses.
  (*h)[layout::record_file::kFlagsOffset] = 3;
  auto both = parse_record_file(*h, "mem");
  EXPECT_EQ(both.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(both.status().message().find("per-token scale mode"), std::string::npos) << both.status().to_string();
  // The flag on a format without the mode fails like the codec params.
  CodecParams f8;
  f8.format = KvFormat::kFp8DsMla;
  auto hf = record_file_header(f8, 0);
  (*hf)[layout::record_file::kFlagsOffset] = 1;
  EXPECT_EQ(parse_record_file(*hf, "mem").status().code(), StatusCode::kDataLoss);
}

TEST(TokenScale, CacheLayersWriteTheModeAndNeedNoWarning) {
  const Tokens t = tokens(8);
  for (KvFormat f : kNvfp4) {
    KvCache::Config c;
    c.num_blocks = 8;
    c.block_size = 8;
    c.layers = {LayerFormat{f, 1.0f, true}};
    int warnings = 0;
    c.on_warning = [&](int, const std::string&) { ++warnings; };
    auto cache = KvCache::create_cpu(c);
    ASSERT_TRUE(cache.ok()) << cache.status().to_string();
    std::vector<int64_t> slots(static_cast<std::size_t>(t.n));
    for (int64_t i = 0; i < t.n; ++i) slots[static_cast<std::size_t>(i)] = t.n - 1 - i;
    ASSERT_TRUE((*cache)
                    ->write(0, TensorView::contiguous(slots.data(), DType::kI64, {t.n}),
                            TensorView::contiguous(t.lat.data(), DType::kF32, {t.n, 512}),
                            TensorView::contiguous(t.rope.data(), DType::kF32, {t.n, 64}))
                    .ok());
    EXPECT_EQ(warnings, 0) << "the token-scale mode has no subnormal-scale problem to warn about";
    const CacheLayerView v = *(*cache)->layer(0);
    EXPECT_TRUE(v.token_scale);
    const auto want = encode(ts_params(f), t);
    for (int64_t i = 0; i < t.n; ++i) {
      ASSERT_EQ(std::memcmp(v.record(t.n - 1 - i), want.data() + i * v.record_bytes, static_cast<std::size_t>(v.record_bytes)), 0)
          << format_name(f) << " token " << i;
    }
    // The same layer without the mode warns: these tokens include 1e-6..1e-3 latents.
    c.layers = {LayerFormat{f, 1.0f, false}};
    c.layers[0].token_scale = true;
    c.layers[0].outer_scale = 0.5f;
    auto bad = KvCache::create_cpu(c);
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    CacheLayerView bv = v;
    bv.format = KvFormat::kBf16;
    bv.record_bytes = 1152;
    EXPECT_FALSE(check_cache_view(bv, "layer").ok());
  }
}

}  // namespace
}  // namespace mlakv
