// Record codecs: golden bytes computed by hand (each expected byte is derived in a
// comment), derived round-trip error bounds on random data with outliers, zero pads,
// guard bytes around every write, and the bad-input errors.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "mlakv/codec.h"

namespace mlakv {
namespace {

constexpr uint8_t kGuard = 0xCD;
constexpr int kGuardBytes = 64;

struct Token {
  std::vector<float> latent = std::vector<float>(kLatentDim, 0.0f);
  std::vector<float> rope = std::vector<float>(kRopeDim, 0.0f);
};

// Encodes `toks` into a buffer framed by guard bytes and checks the guards survive.
std::vector<uint8_t> encode(KvFormat f, const std::vector<Token>& toks, float outer = 1.0f,
                            Fp8ScaleMode mode = Fp8ScaleMode::kPow2) {
  const int n = static_cast<int>(toks.size());
  const int rb = record_bytes(f);
  std::vector<float> lat, rope;
  for (const Token& t : toks) {
    lat.insert(lat.end(), t.latent.begin(), t.latent.end());
    rope.insert(rope.end(), t.rope.begin(), t.rope.end());
  }
  std::vector<uint8_t> buf(static_cast<std::size_t>(n * rb + 2 * kGuardBytes), kGuard);
  CodecParams p{f, outer, mode};
  const Status st = encode_records(p, TensorView::contiguous(lat.data(), DType::kF32, {n, kLatentDim}),
                                   TensorView::contiguous(rope.data(), DType::kF32, {n, kRopeDim}),
                                   TensorView::contiguous(buf.data() + kGuardBytes, DType::kU8, {n, rb}));
  EXPECT_TRUE(st.ok()) << st.to_string();
  for (int i = 0; i < kGuardBytes; ++i) {
    EXPECT_EQ(buf[static_cast<std::size_t>(i)], kGuard) << "guard before, byte " << i;
    EXPECT_EQ(buf[buf.size() - 1 - static_cast<std::size_t>(i)], kGuard) << "guard after, byte " << i;
  }
  return {buf.begin() + kGuardBytes, buf.end() - kGuardBytes};
}

void decode(KvFormat f, const std::vector<uint8_t>& recs, float outer, std::vector<float>& lat,
            std::vector<float>& rope) {
  const int rb = record_bytes(f);
  const int n = static_cast<int>(recs.size()) / rb;
  lat.assign(static_cast<std::size_t>(n) * kLatentDim, -1.0f);
  rope.assign(static_cast<std::size_t>(n) * kRopeDim, -1.0f);
  const Status st =
      decode_records({f, outer}, TensorView::contiguous(recs.data(), DType::kU8, {n, rb}),
                     TensorView::contiguous(lat.data(), DType::kF32, {n, kLatentDim}),
                     TensorView::contiguous(rope.data(), DType::kF32, {n, kRopeDim}));
  ASSERT_TRUE(st.ok()) << st.to_string();
}

// Compares a record with a sparse golden: listed bytes must match, all others are 0.
void expect_golden(const std::vector<uint8_t>& rec, const std::map<int, uint8_t>& golden, const char* what) {
  for (std::size_t i = 0; i < rec.size(); ++i) {
    auto it = golden.find(static_cast<int>(i));
    const uint8_t want = it == golden.end() ? 0 : it->second;
    EXPECT_EQ(rec[i], want) << what << ": byte " << i;
  }
}

void put_f32(std::map<int, uint8_t>& g, int off, uint32_t bits) {
  for (int i = 0; i < 4; ++i) g[off + i] = static_cast<uint8_t>(bits >> (8 * i));
}
void put_u16(std::map<int, uint8_t>& g, int off, uint16_t v) {
  g[off] = static_cast<uint8_t>(v & 0xFF);
  g[off + 1] = static_cast<uint8_t>(v >> 8);
}

// ---- golden records -------------------------------------------------------------------

TEST(CodecGolden, Zeros) {
  const Token z;
  expect_golden(encode(KvFormat::kBf16, {z}), {}, "bf16");
  // fp8 pow2: s = 2^ceil(log2(max(0/448, 1e-4))) = 2^-13 -> fp32 bits 0x39000000 in each tile.
  std::map<int, uint8_t> g;
  for (int t = 0; t < 4; ++t) put_f32(g, 512 + 4 * t, 0x39000000u);
  expect_golden(encode(KvFormat::kFp8DsMla, {z}), g, "fp8 pow2");
  // fp8 exact: s = max(0, FLT_MIN) = 0x00800000.
  g.clear();
  for (int t = 0; t < 4; ++t) put_f32(g, 512 + 4 * t, 0x00800000u);
  expect_golden(encode(KvFormat::kFp8DsMla, {z}, 1.0f, Fp8ScaleMode::kExact), g, "fp8 exact");
  // nvfp4: sf = e4m3(0) = 0 -> every element 0; rope scale 0.
  expect_golden(encode(KvFormat::kNvfp4DsMla, {z}), {}, "nvfp4");
  expect_golden(encode(KvFormat::kNvfp4DsMlaFp8Rope, {z}), {}, "nvfp4 fp8 rope");
  expect_golden(encode(KvFormat::kNvfp4DsMlaInt8Rope, {z}), {}, "nvfp4 int8 rope");
}

TEST(CodecGolden, SingleSpike) {
  Token t;
  t.latent[5] = 3.0f;
  t.rope[0] = 1.0f;
  t.rope[63] = -2.0f;
  {  // bf16: 3.0 = 0x4040, 1.0 = 0x3F80, -2.0 = 0xC000
    std::map<int, uint8_t> g;
    put_u16(g, 10, 0x4040);
    put_u16(g, 1024, 0x3F80);
    put_u16(g, 1024 + 126, 0xC000);
    expect_golden(encode(KvFormat::kBf16, {t}), g, "bf16");
  }
  {  // fp8 pow2: tile 0 amax 3 -> 3/448 = 2^-7.22 -> s = 2^-7 (0x3C000000); 3/s = 384 = 1.5*2^8 -> e4m3 0x7C.
    std::map<int, uint8_t> g;
    g[5] = 0x7C;
    put_f32(g, 512, 0x3C000000u);
    for (int k = 1; k < 4; ++k) put_f32(g, 512 + 4 * k, 0x39000000u);
    put_u16(g, 528, 0x3F80);
    put_u16(g, 528 + 126, 0xC000);
    expect_golden(encode(KvFormat::kFp8DsMla, {t}), g, "fp8 pow2");
    // exact: s = f32(3/448) = 2^-8 * 1.714285.. -> mantissa round(0.714285*2^23) = 0x5B6DB7 -> 0x3BDB6DB7;
    // 3/s = 447.99998 -> 448 = 0x7E. Other tiles FLT_MIN.
    g[5] = 0x7E;
    put_f32(g, 512, 0x3BDB6DB7u);
    for (int k = 1; k < 4; ++k) put_f32(g, 512 + 4 * k, 0x00800000u);
    expect_golden(encode(KvFormat::kFp8DsMla, {t}, 1.0f, Fp8ScaleMode::kExact), g, "fp8 exact");
  }
  {  // nvfp4: group 0 amax 3 -> sf = e4m3(0.5) = 0x30; 3/0.5 = 6 -> e2m1 7; dim 5 = high nibble of byte 2.
    std::map<int, uint8_t> g;
    g[2] = 0x70;
    g[256] = 0x30;
    put_u16(g, 304, 0x3F80);
    put_u16(g, 304 + 126, 0xC000);
    expect_golden(encode(KvFormat::kNvfp4DsMla, {t}), g, "nvfp4");
    // outer scale 0.5: y = 6 -> sf = e4m3(1.0) = 0x38, q = 7; rope is never divided by s_l.
    g[256] = 0x38;
    expect_golden(encode(KvFormat::kNvfp4DsMla, {t}, 0.5f), g, "nvfp4 outer 0.5");
  }
  {  // fp8 rope: rs = 2 * f32(1/448) = 2 * 0x3B124925 = 0x3B924925; 1/rs = 223.99998 -> 224 = 0x76;
     // -2/rs = -447.99997 -> -448 = 0xFE.
    std::map<int, uint8_t> g;
    g[2] = 0x70;
    g[256] = 0x30;
    put_f32(g, 288, 0x3B924925u);
    g[304] = 0x76;
    g[304 + 63] = 0xFE;
    expect_golden(encode(KvFormat::kNvfp4DsMlaFp8Rope, {t}), g, "nvfp4 fp8 rope");
  }
}

TEST(CodecGolden, Int8Rope) {
  // Latent as SingleSpike's nvfp4 (bytes 2 and 256); rope amax 2 -> rs = 2 * f32(1/127):
  // f32(1/127) = 0x3C010204 (the double 1/127 rounded once, = 1.0f/127.0f), times 2 exact
  // -> 0x3C810204 (0.015748031). Quotients v / rs in float32 and rne:
  //   2 / rs = 127 (0x7F); -2 / rs = -127 (0x81);
  //   1 / rs = 63.5 exactly, a tie -> 64 (even, 0x40); 0.5 / rs = 31.75 -> 32 (0x20);
  //   -0.75 / rs = -47.625 -> -48 (0xD0); 2^-7 / rs = 0.496 -> 0; rope[6] = 0 -> 0.
  Token t;
  t.latent[5] = 3.0f;
  const float rope[] = {2.0f, -2.0f, 1.0f, 0.5f, -0.75f, 0.0078125f};
  for (int i = 0; i < 6; ++i) t.rope[static_cast<std::size_t>(i)] = rope[i];
  std::map<int, uint8_t> g;
  g[2] = 0x70;
  g[256] = 0x30;
  put_f32(g, 288, 0x3C810204u);
  g[304] = 0x7F;
  g[305] = 0x81;
  g[306] = 0x40;
  g[307] = 0x20;
  g[308] = 0xD0;
  const auto rec = encode(KvFormat::kNvfp4DsMlaInt8Rope, {t});
  expect_golden(rec, g, "nvfp4 int8 rope");
  // The reader: q * rs, one rounding.
  std::vector<float> lat, rp;
  decode(KvFormat::kNvfp4DsMlaInt8Rope, rec, 1.0f, lat, rp);
  const float rs = std::bit_cast<float>(0x3C810204u);
  const int q[] = {127, -127, 64, 32, -48, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(rp[static_cast<std::size_t>(i)], static_cast<float>(q[i]) * rs) << i;
  EXPECT_EQ(lat[5], 3.0f);
  // Every int8 byte decodes, -128 (never written) included: no NaN check to fail.
  auto any = rec;
  any[310] = 0x80;
  decode(KvFormat::kNvfp4DsMlaInt8Rope, any, 1.0f, lat, rp);
  EXPECT_EQ(rp[6], -128.0f * rs);
}

TEST(CodecGolden, Fp8TiesAndTinyTiles) {
  Token t;
  // Tile 1 (dims 128..255): amax 448 -> s = 2^ceil(log2(1)) = 1 (0x3F800000).
  const std::pair<float, uint8_t> tile1[] = {
      {448.0f, 0x7E},
      {1.0625f, 0x38},                 // tie 1.0 | 1.125 -> even 1.0
      {1.1875f, 0x3A},                 // tie 1.125 | 1.25 -> even 1.25
      {std::ldexp(1.0f, -10), 0x00},   // half the smallest subnormal -> 0
      {std::ldexp(3.0f, -10), 0x02},   // 1.5 quanta -> 2 quanta
      {-1.0625f, 0xB8},
      {2.125f, 0x40},                  // tie 2.0 | 2.25 -> 2.0
      {2.375f, 0x42},                  // tie 2.25 | 2.5 -> 2.5
      {400.0f, 0x7C},                  // tie 384 | 416 -> 384
      {432.0f, 0x7E},                  // tie 416 | 448 -> 448
  };
  std::map<int, uint8_t> g;
  for (int i = 0; i < 10; ++i) {
    t.latent[128 + i] = tile1[i].first;
    g[128 + i] = tile1[i].second;
  }
  // Tile 2: tiny values. amax/448 = 2.2e-9 < 1e-4 -> s = 2^-13; 1e-6/2^-13 = 0.0082 = 4.19 * 2^-9 -> 0x04.
  t.latent[256] = 1e-6f;
  g[256] = 0x04;
  put_f32(g, 512, 0x39000000u);
  put_f32(g, 516, 0x3F800000u);
  put_f32(g, 520, 0x39000000u);
  put_f32(g, 524, 0x39000000u);
  expect_golden(encode(KvFormat::kFp8DsMla, {t}), g, "fp8 ties");
}

TEST(CodecGolden, Nvfp4TiesSubnormalScalesAndSaturation) {
  Token t;
  std::map<int, uint8_t> g;
  // Group 1 (dims 16..31, bytes 8..15): amax 6 -> sf = e4m3(1) = 0x38. Ties 0.25 0.75 1.25 1.75 2.5 3.5 5.
  const float g1[12] = {6, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -0.25f, -0.75f, -5, 2.75f};
  for (int i = 0; i < 12; ++i) t.latent[16 + i] = g1[i];
  // codes: 7 0 | 2 2 | 4 4 | 6 6 | 8 A | E 5  (low nibble = even dim)
  g[8] = 0x07;
  g[9] = 0x22;
  g[10] = 0x44;
  g[11] = 0x66;
  g[12] = 0xA8;
  g[13] = 0x5E;
  g[257] = 0x38;
  // Group 2 (dims 32..47): amax 0.006 -> 0.001 = 0.512 * 2^-9 -> e4m3 subnormal 0x01 (sf = 2^-9);
  // 0.006/sf = 3.07 -> 3 (code 5); 0.001/sf = 0.51 -> 0.5 (1); -0.003/sf = -1.54 -> -1.5 (0xB).
  t.latent[32] = 0.006f;
  t.latent[33] = 0.001f;
  t.latent[34] = -0.003f;
  g[16] = 0x15;
  g[17] = 0x0B;
  g[258] = 0x01;
  // Group 3: amax 0.005 -> 0.000833 = 0.43 * 2^-9 -> sf rounds to 0 -> the whole group encodes as 0.
  t.latent[48] = 0.005f;
  // Group 4: amax 1000 -> 166.7 -> e4m3 160 (0x72); 1000/160 = 6.25 saturates to 6 (7); 100/160 = 0.625 -> 0.5 (1).
  t.latent[64] = 1000.0f;
  t.latent[65] = 100.0f;
  g[32] = 0x17;
  g[260] = 0x72;
  // Group 5: amax 3000 -> 500 saturates to 448 (0x7E); -3000/448 = -6.7 saturates to -6 (0xF).
  t.latent[80] = -3000.0f;
  g[40] = 0x0F;
  g[261] = 0x7E;
  expect_golden(encode(KvFormat::kNvfp4DsMla, {t}), g, "nvfp4");
  expect_golden(encode(KvFormat::kNvfp4DsMlaFp8Rope, {t}), g, "nvfp4 fp8 rope");
  expect_golden(encode(KvFormat::kNvfp4DsMlaInt8Rope, {t}), g, "nvfp4 int8 rope");
}

// ---- round-trip bounds on random data -------------------------------------------------

std::vector<Token> random_tokens(int n, uint32_t seed) {
  // Per-channel scales spanning 2^-6..2^2 and 1% outliers x50, like RMS-normed latents.
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(-6.0f, 2.0f), p(0.0f, 1.0f);
  std::vector<float> ch(kLatentDim);
  for (float& c : ch) c = std::exp2(u(rng));
  std::vector<Token> toks(static_cast<std::size_t>(n));
  for (Token& t : toks) {
    for (int i = 0; i < kLatentDim; ++i) {
      float v = nd(rng) * ch[static_cast<std::size_t>(i)];
      if (p(rng) < 0.01f) v *= 50.0f;
      t.latent[static_cast<std::size_t>(i)] = v;
    }
    for (float& r : t.rope) r = nd(rng) * 2.0f;
  }
  return toks;
}

// Half the gap between neighbouring e2m1 values at magnitude |v| <= 6.
float e2m1_half_gap(float av) { return av < 2.0f ? 0.25f : av < 4.0f ? 0.5f : 1.0f; }

TEST(CodecRoundTrip, DerivedErrorBounds) {
  const auto toks = random_tokens(64, 42);
  std::vector<float> lat, rope;
  for (KvFormat f : {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope,
                     KvFormat::kNvfp4DsMlaInt8Rope}) {
    for (float outer : {1.0f, 0.37f}) {
      if (!format_info(f).has_outer_scale && outer != 1.0f) continue;
      for (Fp8ScaleMode mode : {Fp8ScaleMode::kPow2, Fp8ScaleMode::kExact}) {
        if (f != KvFormat::kFp8DsMla && mode == Fp8ScaleMode::kExact) continue;
        const auto recs = encode(f, toks, outer, mode);
        decode(f, recs, outer, lat, rope);
        const int rb = record_bytes(f);
        for (std::size_t n = 0; n < toks.size(); ++n) {
          const uint8_t* rec = recs.data() + n * static_cast<std::size_t>(rb);
          for (int i = 0; i < kLatentDim; ++i) {
            const float x = toks[n].latent[static_cast<std::size_t>(i)];
            const float xh = lat[n * kLatentDim + static_cast<std::size_t>(i)];
            float bound = 0;
            if (f == KvFormat::kBf16) {
              bound = std::ldexp(std::fabs(x), -8);  // half an ulp of an 8-bit significand: 2^(e-8) <= 2^-8 |x|
            } else if (f == KvFormat::kFp8DsMla) {
              float s;
              std::memcpy(&s, rec + 512 + 4 * (i / 128), 4);
              float amax = 0;
              for (int k = 0; k < 128; ++k) amax = std::max(amax, std::fabs(toks[n].latent[static_cast<std::size_t>(i / 128 * 128 + k)]));
              ASSERT_GE(s * 448.0f, amax * (1 - 1e-6f)) << "scale too small to hold the tile";
              if (mode == Fp8ScaleMode::kPow2) {
                ASSERT_EQ(std::bit_cast<uint32_t>(s) & 0x7FFFFF, 0u) << "pow2 scale";
                ASSERT_LT(s * 448.0f, 2 * std::max(amax, 448e-4f)) << "pow2 scale is the ceiling";
              }
              // e4m3: half ulp <= 2^-4 relative (normal), 2^-10 * s absolute (subnormal).
              bound = std::ldexp(std::fabs(x), -4) + std::ldexp(s, -10);
            } else {
              const float sf = e4m3_to_f32(rec[256 + i / 16]);
              float amax_y = 0;
              for (int k = 0; k < 16; ++k) amax_y = std::max(amax_y, std::fabs(toks[n].latent[static_cast<std::size_t>(i / 16 * 16 + k)] / outer));
              // sf is e4m3_rn(amax/6): within 2^-4 relative or 2^-10 absolute of it.
              ASSERT_LE(std::fabs(sf - amax_y / 6), std::ldexp(amax_y / 6, -4) + std::ldexp(1.0f, -10));
              const float y = std::fabs(x / outer);
              const float err_y = sf == 0 ? y : e2m1_half_gap(std::min(y / sf, 6.0f)) * sf + std::max(0.0f, y - 6 * sf);
              bound = err_y * outer * (1 + 1e-6f) + std::fabs(x) * 1e-6f;
            }
            ASSERT_LE(std::fabs(xh - x), bound) << format_name(f) << " token " << n << " dim " << i << " x " << x;
          }
          float ramax = 0;
          for (float r : toks[n].rope) ramax = std::max(ramax, std::fabs(r));
          for (int i = 0; i < kRopeDim; ++i) {
            const float v = toks[n].rope[static_cast<std::size_t>(i)];
            const float vh = rope[n * kRopeDim + static_cast<std::size_t>(i)];
            // int8: half a step rs/2 (rs = amax/127), plus float32 roundings.
            const float bound = f == KvFormat::kNvfp4DsMlaFp8Rope
                                    ? std::ldexp(std::fabs(v), -4) + std::ldexp(ramax / 448.0f, -10) + std::fabs(v) * 1e-6f
                                : f == KvFormat::kNvfp4DsMlaInt8Rope ? 0.5f * ramax / 127.0f * (1 + 1e-6f) + std::fabs(v) * 1e-6f
                                                                     : std::ldexp(std::fabs(v), -8);
            ASSERT_LE(std::fabs(vh - v), bound) << format_name(f) << " rope " << i;
          }
        }
      }
    }
  }
}

TEST(CodecRoundTrip, PadsAreZeroEvenOverDirtyBuffers) {
  const auto toks = random_tokens(8, 3);
  for (KvFormat f : {KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kNvfp4DsMlaInt8Rope}) {
    const int rb = record_bytes(f);
    std::vector<float> lat, rope;
    for (const Token& t : toks) {
      lat.insert(lat.end(), t.latent.begin(), t.latent.end());
      rope.insert(rope.end(), t.rope.begin(), t.rope.end());
    }
    // Two dirty buffers: every byte of the record must be written (results agree) and pads are 0.
    std::vector<uint8_t> bufs[2] = {std::vector<uint8_t>(8 * static_cast<std::size_t>(rb), 0xAB),
                                    std::vector<uint8_t>(8 * static_cast<std::size_t>(rb), 0x54)};
    for (auto& buf : bufs) {
      ASSERT_TRUE(encode_records({f}, TensorView::contiguous(lat.data(), DType::kF32, {8, kLatentDim}),
                                 TensorView::contiguous(rope.data(), DType::kF32, {8, kRopeDim}),
                                 TensorView::contiguous(buf.data(), DType::kU8, {8, rb}))
                      .ok());
    }
    EXPECT_EQ(bufs[0], bufs[1]) << "a byte of the record was left unwritten";
    const int pad_off = f == KvFormat::kNvfp4DsMla           ? layout::nvfp4_ds_mla::kPadOffset
                        : f == KvFormat::kNvfp4DsMlaFp8Rope ? layout::nvfp4_ds_mla_fp8rope::kPadOffset
                                                            : layout::nvfp4_ds_mla_int8rope::kPadOffset;
    const int pad_len = f == KvFormat::kNvfp4DsMla           ? layout::nvfp4_ds_mla::kPadBytes
                        : f == KvFormat::kNvfp4DsMlaFp8Rope ? layout::nvfp4_ds_mla_fp8rope::kPadBytes
                                                            : layout::nvfp4_ds_mla_int8rope::kPadBytes;
    for (int n = 0; n < 8; ++n) {
      for (int i = 0; i < pad_len; ++i) EXPECT_EQ(bufs[0][static_cast<std::size_t>(n * rb + pad_off + i)], 0) << n << " " << i;
    }
  }
}

TEST(CodecRoundTrip, Bf16InputsEqualFloatInputs) {
  auto toks = random_tokens(4, 9);
  std::vector<uint16_t> lat16, rope16;
  for (Token& t : toks) {
    for (float& v : t.latent) { v = bf16_to_f32(f32_to_bf16(v)); lat16.push_back(f32_to_bf16(v)); }
    for (float& v : t.rope) { v = bf16_to_f32(f32_to_bf16(v)); rope16.push_back(f32_to_bf16(v)); }
  }
  for (KvFormat f : {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope,
                     KvFormat::kNvfp4DsMlaInt8Rope}) {
    const int rb = record_bytes(f);
    std::vector<uint8_t> a = encode(f, toks, format_info(f).has_outer_scale ? 0.5f : 1.0f);
    std::vector<uint8_t> b(a.size());
    ASSERT_TRUE(encode_records({f, format_info(f).has_outer_scale ? 0.5f : 1.0f},
                               TensorView::contiguous(lat16.data(), DType::kBF16, {4, kLatentDim}),
                               TensorView::contiguous(rope16.data(), DType::kBF16, {4, kRopeDim}),
                               TensorView::contiguous(b.data(), DType::kU8, {4, rb}))
                    .ok());
    EXPECT_EQ(a, b) << format_name(f);
  }
}

TEST(CodecRoundTrip, StridedRowsAndOtherGeometryForBf16) {
  // [n, 576] rows: latent is a strided view of the first 256 dims in a MiniCPM3-like 256 + 32 geometry.
  const int n = 3, L = 256, R = 32;
  std::vector<float> rows(static_cast<std::size_t>(n) * 300);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i % 97) * 0.25f - 12.0f;
  TensorView lat = TensorView::contiguous(rows.data(), DType::kF32, {n, L});
  lat.strides[0] = 300;
  TensorView rope = TensorView::contiguous(rows.data() + L, DType::kF32, {n, R});
  rope.strides[0] = 300;
  std::vector<uint8_t> recs(static_cast<std::size_t>(n) * 2 * (L + R));
  CodecParams p{KvFormat::kBf16};
  p.latent_dim = L;
  p.rope_dim = R;
  ASSERT_TRUE(encode_records(p, lat, rope, TensorView::contiguous(recs.data(), DType::kU8, {n, 2 * (L + R)})).ok());
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < L + R; ++i) {
      const float want = rows[static_cast<std::size_t>(t * 300 + i)];  // k*0.25 - 12: exact in bf16
      uint16_t b;
      std::memcpy(&b, recs.data() + t * 2 * (L + R) + 2 * i, 2);
      EXPECT_EQ(bf16_to_f32(b), want);
    }
  }
  p.format = KvFormat::kFp8DsMla;
  const Status st = encode_records(p, lat, rope, TensorView::contiguous(recs.data(), DType::kU8, {n, 2 * (L + R)}));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("use bf16"), std::string::npos) << st.message();
}

// ---- bad input ----------------------------------------------------------------------------

TEST(CodecErrors, NonFiniteInputNamesTokenAndDimensionAndWritesNothing) {
  auto toks = random_tokens(5, 1);
  std::vector<float> lat, rope;
  for (const Token& t : toks) {
    lat.insert(lat.end(), t.latent.begin(), t.latent.end());
    rope.insert(rope.end(), t.rope.begin(), t.rope.end());
  }
  for (KvFormat f : {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope,
                     KvFormat::kNvfp4DsMlaInt8Rope}) {
    const int rb = record_bytes(f);
    for (int which = 0; which < 3; ++which) {
      auto l = lat, r = rope;
      std::string want;
      if (which == 0) { l[3 * kLatentDim + 17] = NAN; want = "latent: token 3 dimension 17"; }
      if (which == 1) { l[0 * kLatentDim + 511] = INFINITY; want = "latent: token 0 dimension 511"; }
      if (which == 2) { r[4 * kRopeDim + 63] = -INFINITY; want = "rope: token 4 dimension 63"; }
      std::vector<uint8_t> buf(5 * static_cast<std::size_t>(rb), 0x5A);
      const Status st = encode_records({f}, TensorView::contiguous(l.data(), DType::kF32, {5, kLatentDim}),
                                       TensorView::contiguous(r.data(), DType::kF32, {5, kRopeDim}),
                                       TensorView::contiguous(buf.data(), DType::kU8, {5, rb}));
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
      for (uint8_t b : buf) ASSERT_EQ(b, 0x5A) << "records were touched";
    }
  }
}

TEST(CodecErrors, ShapeDtypeAndParamErrors) {
  std::vector<float> lat(kLatentDim * 2), rope(kRopeDim * 2);
  std::vector<uint8_t> recs(656 * 2);
  auto L = TensorView::contiguous(lat.data(), DType::kF32, {2, kLatentDim});
  auto R = TensorView::contiguous(rope.data(), DType::kF32, {2, kRopeDim});
  auto out = TensorView::contiguous(recs.data(), DType::kU8, {2, 656});
  EXPECT_TRUE(encode_records({KvFormat::kFp8DsMla}, L, R, out).ok());
  auto msg = [](const Status& s) { return s.message(); };
  EXPECT_NE(msg(encode_records({KvFormat::kFp8DsMla}, L, TensorView::contiguous(rope.data(), DType::kF32, {1, kRopeDim}), out)).find("rope"), std::string::npos);
  EXPECT_NE(msg(encode_records({KvFormat::kBf16}, L, R, out)).find("records"), std::string::npos);
  EXPECT_NE(msg(encode_records({KvFormat::kFp8DsMla}, TensorView::contiguous(lat.data(), DType::kI32, {2, kLatentDim}), R, out)).find("latent: expected dtype"), std::string::npos);
  EXPECT_NE(msg(encode_records({KvFormat::kFp8DsMla, 2.0f}, L, R, out)).find("no outer scale"), std::string::npos);
  EXPECT_NE(msg(encode_records({KvFormat::kNvfp4DsMla, -1.0f}, L, R, out)).find("outer_scale"), std::string::npos);
  EXPECT_NE(msg(encode_records({KvFormat::kNvfp4DsMla, NAN}, L, R, out)).find("outer_scale"), std::string::npos);
  TensorView onb = out;
  onb.device = Device::cuda(0);
  EXPECT_NE(msg(encode_records({KvFormat::kFp8DsMla}, L, R, onb)).find("cuda:0"), std::string::npos);
}

TEST(CodecErrors, CorruptRecordsAreRejectedOnDecode) {
  Token t;
  t.latent[0] = 1.0f;
  auto rec = encode(KvFormat::kFp8DsMla, {t, t});
  std::vector<float> lat(2 * kLatentDim), rope(2 * kRopeDim);
  auto run = [&](KvFormat f, const std::vector<uint8_t>& r) {
    const int rb = record_bytes(f);
    const int n = static_cast<int>(r.size()) / rb;
    return decode_records({f}, TensorView::contiguous(r.data(), DType::kU8, {n, rb}),
                          TensorView::contiguous(lat.data(), DType::kF32, {n, kLatentDim}),
                          TensorView::contiguous(rope.data(), DType::kF32, {n, kRopeDim}));
  };
  ASSERT_TRUE(run(KvFormat::kFp8DsMla, rec).ok());
  auto bad = rec;
  const float neg = -1.0f;
  std::memcpy(bad.data() + 656 + 512 + 8, &neg, 4);  // record 1, tile 2
  Status st = run(KvFormat::kFp8DsMla, bad);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("record 1: tile 2"), std::string::npos) << st.message();
  bad = rec;
  bad[7] = 0xFF;  // e4m3 NaN in record 0's latent
  st = run(KvFormat::kFp8DsMla, bad);
  EXPECT_NE(st.message().find("record 0"), std::string::npos) << st.message();
  auto r4 = encode(KvFormat::kNvfp4DsMlaFp8Rope, {t});
  const float nanf = NAN;
  std::memcpy(r4.data() + 288, &nanf, 4);
  st = run(KvFormat::kNvfp4DsMlaFp8Rope, r4);
  EXPECT_NE(st.message().find("rope scale"), std::string::npos) << st.message();
  auto r5 = encode(KvFormat::kNvfp4DsMlaInt8Rope, {t});
  const float negf = -0.5f;
  std::memcpy(r5.data() + 288, &negf, 4);
  st = run(KvFormat::kNvfp4DsMlaInt8Rope, r5);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("rope scale"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace mlakv
