// The SIMD cache writers (src/model/record_writer.h) against the scalar record codec
// (src/format/record_codec.h, the spec): byte for byte, on every SIMD target this
// machine supports (forced one at a time with hwy::SetSupportedTargetsForTest).
//   * element codes: every e4m3 / e2m1 value, every midpoint between neighbours (the
//     ties), one float32 ulp either side, both signs, zeros, float32 subnormals, Inf,
//     NaN, values past saturation, plus a sweep of every 251st float32 bit pattern;
//   * whole records: random latents over ten decades, outer scales, both fp8 scale
//     modes, and crafted tiles/groups whose divided values land exactly on ties;
//   * the cache writer: same bytes as KvCache::write on shuffled slots with -1 padding;
//     a bad slot or a non-finite input writes nothing.
#include "model/record_writer.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "format/record_codec.h"
#include "mlakv/latent_transform.h"
#include "mlakv/model.h"
#include "mlakv/numerics.h"
#include "mlakv/thread_pool.h"

namespace mlakv::model {
namespace {

// codec::encode_record's fp8 scale-mode parameter type (Fp8ScaleMode: kPow2 = 0, kExact = 1).
using CodecMode = Fp8ScaleMode;

std::vector<int64_t> targets() {
  std::vector<int64_t> out;
  const int64_t supported = hwy::SupportedTargets() & HWY_TARGETS;
  for (int64_t bit = 1; bit != 0 && bit <= supported; bit <<= 1)
    if (supported & bit) out.push_back(bit);
  static bool printed = false;
  if (!printed) {
    printed = true;
    std::printf("[record writer] SIMD targets tested:");
    for (int64_t t : out) std::printf(" %s", hwy::TargetName(t));
    std::printf("\n");
  }
  return out;
}

struct TargetScope {
  explicit TargetScope(int64_t t) { hwy::SetSupportedTargetsForTest(t); }
  ~TargetScope() { hwy::SetSupportedTargetsForTest(0); }
};

std::vector<float> code_inputs(bool e2m1) {
  std::vector<float> vals;
  const int codes = e2m1 ? 8 : 127;  // magnitudes (e4m3: 0..0x7E finite)
  std::vector<float> mags;
  for (int c = 0; c < codes; ++c) mags.push_back(e2m1 ? e2m1_to_f32(static_cast<uint8_t>(c)) : e4m3_to_f32(static_cast<uint8_t>(c)));
  for (std::size_t i = 0; i < mags.size(); ++i) {
    std::vector<float> base = {mags[i]};
    if (i + 1 < mags.size()) base.push_back(0.5f * (mags[i] + mags[i + 1]));  // exact tie (fits in f32)
    for (float b : base) {
      for (float v : {b, std::nextafter(b, 0.0f), std::nextafter(b, 1e30f)}) {
        vals.push_back(v);
        vals.push_back(-v);
      }
    }
  }
  const float top = mags.back();
  for (float v : {top * 1.0625f, top * 1.125f, top * 2.0f, 1e30f, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::denorm_min(), 1e-40f, 0.0f, 1e-30f}) {
    vals.push_back(v);
    vals.push_back(-v);
  }
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 251) vals.push_back(f32_from_bits(static_cast<uint32_t>(b)));
  return vals;
}

TEST(ModelRecordWriter, ElementCodesMatchScalarOnEveryTarget) {
  for (bool e2m1 : {false, true}) {
    const std::vector<float> v = code_inputs(e2m1);
    std::vector<uint8_t> want(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) want[i] = e2m1 ? f32_to_e2m1_satfinite(v[i]) : f32_to_e4m3_satfinite(v[i]);
    for (int64_t t : targets()) {
      TargetScope scope(t);
      std::vector<uint8_t> got(v.size());
      if (e2m1) {
        e2m1_codes_simd(v.data(), static_cast<int64_t>(v.size()), got.data());
      } else {
        e4m3_codes_simd(v.data(), static_cast<int64_t>(v.size()), got.data());
      }
      for (std::size_t i = 0; i < v.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << (e2m1 ? "e2m1" : "e4m3") << " target " << hwy::TargetName(t) << " x = "
                                   << v[i] << " bits 0x" << std::hex << f32_bits(v[i]);
      }
    }
  }
}

std::vector<std::vector<float>> latents(std::mt19937& rng) {
  std::vector<std::vector<float>> out;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (double scale : {1e-7, 1e-5, 1e-3, 0.02, 0.3, 1.0, 5.0, 100.0, 3e3, 1e5}) {
    std::vector<float> l(kLatentDim);
    for (float& x : l) x = static_cast<float>(nd(rng) * scale);
    out.push_back(l);
  }
  out.push_back(std::vector<float>(kLatentDim, 0.0f));
  std::vector<float> spike(kLatentDim, 1e-6f);
  spike[77] = -2e4f;
  spike[300] = -0.0f;
  out.push_back(spike);
  // fp8 ties: every tile holds 56 = 448 * 2^-3 (so the pow2 scale is exactly 2^-3) and
  // e4m3 midpoints times 2^-3, whose quotient by the scale is an exact tie.
  std::vector<float> ties(kLatentDim);
  for (int i = 0; i < kLatentDim; ++i) {
    const int c = i % 126;
    ties[static_cast<std::size_t>(i)] =
        (i % 128 == 0) ? 56.0f : 0.125f * 0.5f * (e4m3_to_f32(static_cast<uint8_t>(c)) + e4m3_to_f32(static_cast<uint8_t>(c + 1))) * ((i & 1) ? -1.0f : 1.0f);
  }
  out.push_back(ties);
  // nvfp4 ties: every group of 16 holds 3.0 (scale code e4m3(0.5) = 0.5 exactly) and the
  // e2m1 midpoints 0.25, 0.75, ..., 5 times 0.5.
  std::vector<float> g(kLatentDim);
  const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (int i = 0; i < kLatentDim; ++i)
    g[static_cast<std::size_t>(i)] = (i % 16 == 0) ? 3.0f : 0.5f * mids[i % 7] * ((i & 2) ? -1.0f : 1.0f);
  out.push_back(g);
  return out;
}

// Rope rows for the record sweep: random at set li's magnitude, all zero (set 10), and for
// the int8 rope, quotients on the .5 ties: amax 2^j (so rs = 2^j * f32(1/127) exactly) and
// values (k + 0.5) * rs, plus values at +-amax (quotients a hair past 127: the clamp).
std::vector<float> rope_row(std::mt19937& rng, std::size_t li) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> rope(kRopeDim);
  for (float& x : rope) x = nd(rng) * static_cast<float>(li + 1);
  if (li == 10) std::fill(rope.begin(), rope.end(), 0.0f);  // rope scale 0
  if (li == 12 || li == 13) {
    const float amax = li == 12 ? 4.0f : 0.0078125f;
    const float rs = codec::rope_int8_scale(amax);
    for (int i = 0; i < kRopeDim; ++i) {
      const int k = (i * 37) % 254 - 127;  // -127 .. 126
      rope[static_cast<std::size_t>(i)] = (static_cast<float>(k) + 0.5f) * rs;
    }
    rope[0] = amax;
    rope[1] = -amax;
  }
  return rope;
}

TEST(ModelRecordWriter, RecordsMatchScalarCodec) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const auto lats = latents(rng);
  for (int64_t t : targets()) {
    TargetScope scope(t);
    for (KvFormat f : {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope,
                       KvFormat::kF32, KvFormat::kNvfp4DsMlaInt8Rope}) {
      const int rb = record_bytes(f);
      for (float outer : {1.0f, 0.37f, 1e-3f, 100.0f}) {
        for (bool exact : {false, true}) {
          for (std::size_t li = 0; li < lats.size(); ++li) {
            const std::vector<float> rope = rope_row(rng, li);
            std::vector<uint8_t> want(static_cast<std::size_t>(rb), 0xAA), got(static_cast<std::size_t>(rb), 0x55);
            codec::encode_record(f, lats[li].data(), rope.data(), outer,
                                 static_cast<CodecMode>(exact ? 1 : 0), want.data());
            encode_record_simd(f, lats[li].data(), kLatentDim, rope.data(), kRopeDim, outer, exact, got.data());
            ASSERT_EQ(got, want) << format_name(f) << " target " << hwy::TargetName(t) << " latent set " << li
                                 << " outer " << outer << " exact " << exact;
          }
        }
      }
    }
    // The per-token scale mode of the nvfp4 formats (s_l = 1): the zero latent (set 10)
    // stores s_t = 0 and zero codes on both sides.
    for (KvFormat f : {KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kNvfp4DsMlaInt8Rope}) {
      const int rb = record_bytes(f);
      for (std::size_t li = 0; li < lats.size(); ++li) {
        const std::vector<float> rope = rope_row(rng, li);
        std::vector<uint8_t> want(static_cast<std::size_t>(rb), 0xAA), got(static_cast<std::size_t>(rb), 0x55);
        codec::encode_record(f, lats[li].data(), rope.data(), 1.0f, static_cast<CodecMode>(0), want.data(), true);
        encode_record_simd(f, lats[li].data(), kLatentDim, rope.data(), kRopeDim, 1.0f, false, got.data(), true);
        ASSERT_EQ(got, want) << format_name(f) << " token-scale target " << hwy::TargetName(t) << " latent set " << li;
      }
    }
    // bf16 with other geometries (tails past the vector width).
    for (auto [L, R] : {std::pair{100, 6}, std::pair{17, 3}, std::pair{512, 64}}) {
      std::vector<float> lat(static_cast<std::size_t>(L)), rope(static_cast<std::size_t>(R));
      for (float& x : lat) x = nd(rng);
      for (float& x : rope) x = nd(rng);
      std::vector<uint8_t> want(static_cast<std::size_t>(2 * (L + R))), got(want.size());
      codec::encode_bf16_record(lat.data(), L, rope.data(), R, want.data());
      encode_record_simd(KvFormat::kBf16, lat.data(), L, rope.data(), R, 1.0f, false, got.data());
      ASSERT_EQ(got, want) << "bf16 L " << L << " R " << R;
    }
  }
}

TEST(ModelRecordWriter, CacheWriterEqualsKvCacheWrite) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  const int64_t n = 150;
  std::vector<float> lat(static_cast<std::size_t>(n * kLatentDim)), rope(static_cast<std::size_t>(n * kRopeDim));
  for (float& x : lat) x = nd(rng);
  for (float& x : rope) x = nd(rng);
  std::vector<int64_t> slots(static_cast<std::size_t>(n));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots[3] = -1;
  slots[99] = -1;
  ThreadPool pool(2);
  struct Case {
    KvFormat f;
    bool token_scale;
  };
  for (Case cs : {Case{KvFormat::kBf16, false}, Case{KvFormat::kFp8DsMla, false}, Case{KvFormat::kNvfp4DsMla, false},
                  Case{KvFormat::kNvfp4DsMlaFp8Rope, false}, Case{KvFormat::kF32, false},
                  Case{KvFormat::kNvfp4DsMlaInt8Rope, false}, Case{KvFormat::kNvfp4DsMla, true},
                  Case{KvFormat::kNvfp4DsMlaFp8Rope, true}, Case{KvFormat::kNvfp4DsMlaInt8Rope, true}}) {
    const KvFormat f = cs.f;
    SCOPED_TRACE(cs.token_scale ? "token-scale mode" : "static scales");
    KvCache::Config c;
    c.num_blocks = 20;
    c.block_size = 8;
    c.layers = {LayerFormat{f, is_nvfp4_format(f) && !cs.token_scale ? 0.05f : 1.0f, cs.token_scale}};
    auto a = KvCache::create_cpu(c);
    auto b = KvCache::create_cpu(c);
    ASSERT_TRUE(a.ok() && b.ok());
    (*a)->fill(0xEE);
    (*b)->fill(0xEE);
    ASSERT_TRUE((*a)->write(0, TensorView::contiguous(slots.data(), DType::kI64, {n}),
                            TensorView::contiguous(lat.data(), DType::kF32, {n, kLatentDim}),
                            TensorView::contiguous(rope.data(), DType::kF32, {n, kRopeDim}))
                    .ok());
    ASSERT_TRUE(write_cache_records(**b, 0, slots, lat.data(), rope.data(), &pool).ok());
    const auto va = *(*a)->layer(0), vb = *(*b)->layer(0);
    ASSERT_EQ(std::memcmp(va.data, vb.data, static_cast<std::size_t>(va.num_slots() * va.record_bytes)), 0)
        << format_name(f);

    // Errors write nothing.
    std::vector<uint8_t> before(vb.data, vb.data + vb.num_slots() * vb.record_bytes);
    std::vector<int64_t> bad = slots;
    bad[7] = 160;  // capacity 160
    Status st = write_cache_records(**b, 0, bad, lat.data(), rope.data(), nullptr);
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.message();
    std::vector<float> nan_lat = lat;
    nan_lat[5 * kLatentDim + 9] = std::numeric_limits<float>::quiet_NaN();
    st = write_cache_records(**b, 0, slots, nan_lat.data(), rope.data(), nullptr);
    EXPECT_NE(st.message().find("latent[5, 9]"), std::string::npos) << st.message();
    EXPECT_EQ(std::memcmp(before.data(), vb.data, before.size()), 0);
    EXPECT_FALSE(write_cache_records(**b, 1, slots, lat.data(), rope.data(), nullptr).ok());
  }
}

// The public entry point stores what PagedKvCache::write stores and validates first.
TEST(ModelRecordWriter, PublicWriteRecordsSimd) {
  std::mt19937 rng(8);
  std::normal_distribution<float> nd(0.0f, 0.7f);
  const int64_t n = 9;
  std::vector<float> lat(static_cast<std::size_t>(n * kLatentDim)), rope(static_cast<std::size_t>(n * kRopeDim));
  for (float& x : lat) x = nd(rng);
  for (float& x : rope) x = nd(rng);
  KvCache::Config c;
  c.num_blocks = 4;
  c.block_size = 4;
  c.layers = {LayerFormat{KvFormat::kNvfp4DsMlaFp8Rope, 0.1f}};
  auto a = PagedKvCache::create_cpu(c);
  auto b = PagedKvCache::create_cpu(c);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::vector<int64_t> slots = {15, 0, 3, -1, 8, 9, 1, 2, 14};
  const TensorView lv = TensorView::contiguous(lat.data(), DType::kF32, {n, kLatentDim});
  const TensorView rv = TensorView::contiguous(rope.data(), DType::kF32, {n, kRopeDim});
  ASSERT_TRUE((*a)->write(0, slots, lv, rv).ok());
  ASSERT_TRUE(write_records_simd(**b, 0, slots, lv, rv).ok());
  const auto va = *(*a)->storage().layer(0), vb = *(*b)->storage().layer(0);
  EXPECT_EQ(std::memcmp(va.data, vb.data, static_cast<std::size_t>(va.num_slots() * va.record_bytes)), 0);
  const Status st = write_records_simd(**b, 0, slots, TensorView::contiguous(lat.data(), DType::kF32, {n, 500}), rv);
  EXPECT_NE(st.message().find("latent"), std::string::npos) << st.message();
}

// The fused latent transform (TransformToken: centre, gain, the 512-point butterflies in
// register blocks, the 64-point RoPE ones) on every SIMD target: the records equal
// LatentTransformKernel::latent / rope (the spec) followed by the scalar codec, for the
// three transform shapes (both rotations, latent only, centre + scale only), inputs with
// signed zeros, ties of the butterfly sums and values over ten decades.
TEST(ModelRecordWriter, TransformedRecordsMatchTheSpecOnEveryTarget) {
  const int64_t n = 37;
  std::mt19937 rng(12);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> lat(static_cast<std::size_t>(n * kLatentDim)), rope(static_cast<std::size_t>(n * kRopeDim));
  for (std::size_t i = 0; i < lat.size(); ++i) {
    lat[i] = nd(rng) * std::pow(10.0f, static_cast<float>(static_cast<int>(i % 11) - 5));
    if (i % 29 == 0) lat[i] = -0.0f;
    if (i % 31 == 0) lat[i] = 1.0f;  // with mu = 1 on some dims: exact zeros, then sums of zeros
  }
  for (float& x : rope) x = nd(rng);
  for (int variant = 0; variant < 3; ++variant) {
    LatentTransformLayer tl = LatentTransformLayer::identity();
    for (int d = 0; d < kLatentDim; ++d) {
      tl.mu[static_cast<std::size_t>(d)] = d % 31 == 0 ? 1.0f : 0.05f * nd(rng);
      tl.d[static_cast<std::size_t>(d)] = std::exp(0.5f * nd(rng));
    }
    tl.rotate = variant < 2;
    tl.sign_seed = 77;
    tl.rope_rotate = variant == 0;
    tl.rope_sign_seed = 78;
    auto k = LatentTransformKernel::create(tl);
    ASSERT_TRUE(k.ok()) << k.status().to_string();
    std::vector<float> lt(lat.size()), rt(rope.size());
    for (int64_t t = 0; t < n; ++t) {
      k->latent(lat.data() + t * kLatentDim, lt.data() + t * kLatentDim);
      k->rope(rope.data() + t * kRopeDim, rt.data() + t * kRopeDim);
    }
    for (KvFormat f : {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaInt8Rope,
                       KvFormat::kF32}) {
      KvCache::Config c;
      c.num_blocks = 5;
      c.block_size = 8;
      c.layers = {LayerFormat{f, format_info(f).has_outer_scale ? tl.outer_scale : 1.0f}};
      std::vector<int64_t> slots(static_cast<std::size_t>(n));
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng);
      slots[4] = -1;
      auto want = PagedKvCache::create_cpu(c);
      ASSERT_TRUE(want.ok());
      ASSERT_TRUE((*want)
                      ->write(0, slots, TensorView::contiguous(lt.data(), DType::kF32, {n, kLatentDim}),
                              TensorView::contiguous(rt.data(), DType::kF32, {n, kRopeDim}))
                      .ok());
      const auto vw = *(*want)->storage().layer(0);
      for (int64_t target : targets()) {
        TargetScope scope(target);
        SCOPED_TRACE(std::string(hwy::TargetName(target)) + " " + std::string(format_name(f)) + " variant " +
                     std::to_string(variant));
        auto got = PagedKvCache::create_cpu(c);
        ASSERT_TRUE(got.ok());
        ASSERT_TRUE(write_records_simd(**got, 0, slots, TensorView::contiguous(lat.data(), DType::kF32, {n, kLatentDim}),
                                       TensorView::contiguous(rope.data(), DType::kF32, {n, kRopeDim}), nullptr, &*k)
                        .ok());
        const auto vg = *(*got)->storage().layer(0);
        for (int64_t b = 0; b < vg.num_slots() * vg.record_bytes; ++b) {
          ASSERT_EQ(vg.data[b], vw.data[b]) << "byte " << b << " (slot " << b / vg.record_bytes << ")";
        }
      }
    }
  }
}

}  // namespace
}  // namespace mlakv::model
