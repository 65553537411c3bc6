// SIMD attention over one unit (rows x token slots), compiled for every x86 target
// Highway supports (SSE4, AVX2, AVX-512, plus a portable fallback) and dispatched at
// run time, so the binary runs on any x86-64 and uses AVX-512 where present.
//
// Per tile of kTileTokens tokens:
//   1. dequantize each record once into a float tile K [n, 576] (shared by every row:
//      the "each record dequantized once, reused by every head" rule);
//   2. S = Q K^T with a 4-row x 3-token register-blocked dot-product micro-kernel;
//   3. online softmax per row (vectorized exp), masked by each row's causal limit;
//   4. O += P V with a 4-row x 2-vector micro-kernel (V = K's first 512 columns).
// nvfp4 latents are dequantized with each chunk of 2*NQ dims stored as [even | odd]
// dims (NQ = dequant lanes): the nibble split then needs no lane shuffles. Q's latent
// is permuted the same way and O is un-permuted at the end, so the sums are unchanged.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/attention_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/aligned_allocator.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <string_view>

#include "format/record_codec.h"
#include "mlakv/attention.h"
#include "cpu/attention_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace mlakv {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;   // matrix work: full vector width
using DQ = hn::CappedTag<float, 8>;  // dequantization: at most 8 lanes (one nvfp4 group per chunk)

constexpr int kK = kQkDim;       // 576
constexpr int kV = kLatentDim;   // 512

bool permuted_latent(KvFormat f) { return is_nvfp4_format(f); }

// Tile position of latent dim i.
int tile_pos(KvFormat f, int i) {
  if (!permuted_latent(f)) return i;
  const int nq = static_cast<int>(hn::Lanes(DQ()));
  const int chunk = i / (2 * nq), within = i % (2 * nq);
  return chunk * 2 * nq + (within % 2) * nq + within / 2;
}

// ---- dequantization --------------------------------------------------------------
template <class D>
HWY_INLINE hn::Vec<D> DecodeE4m3(D d, hn::Vec<hn::RebindToUnsigned<D>> u) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const auto mag = hn::And(u, hn::Set(du, 0x7Fu));
  const auto sign = hn::ShiftLeft<24>(hn::And(u, hn::Set(du, 0x80u)));
  // Normal codes: move the 7-bit magnitude under float's exponent/mantissa and rebias
  // (7 -> 127). Subnormal codes (exponent 0): m * 2^-9, exact.
  const auto normal = hn::BitCast(d, hn::Add(hn::ShiftLeft<20>(mag), hn::Set(du, 120u << 23)));
  const auto sub = hn::Mul(hn::ConvertTo(d, hn::BitCast(di, mag)), hn::Set(d, 1.0f / 512.0f));
  const auto is_sub = hn::RebindMask(d, hn::Lt(hn::BitCast(di, mag), hn::Set(di, 8)));
  return hn::Or(hn::IfThenElse(is_sub, sub, normal), hn::BitCast(d, sign));
}

template <class D>
HWY_INLINE hn::Vec<D> DecodeE2m1(D d, hn::Vec<hn::RebindToUnsigned<D>> nib) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const auto mag = hn::And(nib, hn::Set(du, 7u));
  const auto sign = hn::ShiftLeft<28>(hn::And(nib, hn::Set(du, 8u)));
  // mag >= 2: exponent bits e = mag >> 1 (bias 1 -> 127), mantissa bit mag & 1.
  const auto normal = hn::BitCast(d, hn::Add(hn::ShiftLeft<22>(mag), hn::Set(du, 126u << 23)));
  const auto sub = hn::Mul(hn::ConvertTo(d, hn::BitCast(di, mag)), hn::Set(d, 0.5f));
  const auto is_sub = hn::RebindMask(d, hn::Lt(hn::BitCast(di, mag), hn::Set(di, 2)));
  return hn::Or(hn::IfThenElse(is_sub, sub, normal), hn::BitCast(d, sign));
}

// n bf16 values (n a multiple of the lane count) -> float.
HWY_INLINE void Bf16ToF32(const uint8_t* src, int n, float* dst) {
  const DQ d;
  const hn::RebindToUnsigned<DQ> du;
  const hn::Rebind<uint16_t, DQ> d16;
  const int N = static_cast<int>(hn::Lanes(d));
  const uint16_t* s16 = reinterpret_cast<const uint16_t*>(src);
  for (int i = 0; i < n; i += N) {
    hn::StoreU(hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, s16 + i)))), d, dst + i);
  }
}

// n e4m3 bytes times `scale` -> float.
HWY_INLINE void E4m3ToF32(const uint8_t* src, int n, float scale, float* dst) {
  const DQ d;
  const hn::RebindToUnsigned<DQ> du;
  const hn::Rebind<uint8_t, DQ> d8;
  const int N = static_cast<int>(hn::Lanes(d));
  const auto vs = hn::Set(d, scale);
  for (int i = 0; i < n; i += N) {
    hn::StoreU(hn::Mul(DecodeE4m3(d, hn::PromoteTo(du, hn::LoadU(d8, src + i))), vs), d, dst + i);
  }
}

// n int8 bytes times `scale` -> float (one rounding, as the scalar rope_int8_dequantize).
HWY_INLINE void Int8ToF32(const uint8_t* src, int n, float scale, float* dst) {
  const DQ d;
  const hn::RebindToSigned<DQ> di;
  const hn::Rebind<int8_t, DQ> d8;
  const int N = static_cast<int>(hn::Lanes(d));
  const auto vs = hn::Set(d, scale);
  const int8_t* s8 = reinterpret_cast<const int8_t*>(src);
  for (int i = 0; i < n; i += N) {
    hn::StoreU(hn::Mul(hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, s8 + i))), vs), d, dst + i);
  }
}

// 512 e2m1 latents with 32 group scales and the outer scale -> permuted float tile row.
HWY_INLINE void Nvfp4LatentToF32(const uint8_t* rec, float outer, float* dst) {
  namespace N4 = layout::nvfp4_ds_mla;
  const DQ d;
  const hn::RebindToUnsigned<DQ> du;
  const hn::Rebind<uint8_t, DQ> d8;
  const int N = static_cast<int>(hn::Lanes(d));
  const auto vouter = hn::Set(d, outer);
  for (int c = 0; c < N4::kLatentBytes / N; ++c) {  // chunk c: bytes [cN, cN+N) = dims [2cN, 2cN+2N)
    const float sf = e4m3_to_f32(rec[N4::kScaleOffset + (2 * c * N) / N4::kGroupDim]);
    const auto vsf = hn::Set(d, sf);
    const auto u = hn::PromoteTo(du, hn::LoadU(d8, rec + N4::kLatentOffset + c * N));
    const auto lo = DecodeE2m1(d, hn::And(u, hn::Set(du, 0xFu)));
    const auto hi = DecodeE2m1(d, hn::ShiftRight<4>(u));
    // (e2m1 * sf) is exact; then one rounding at * s_l, as the scalar codec does.
    hn::StoreU(hn::Mul(hn::Mul(lo, vsf), vouter), d, dst + 2 * c * N);
    hn::StoreU(hn::Mul(hn::Mul(hi, vsf), vouter), d, dst + 2 * c * N + N);
  }
}

// One record -> one float tile row [latent (maybe permuted) | rope].
HWY_INLINE void DequantRecord(const CacheLayerView& c, const uint8_t* rec, float* row) {
  visit_format(c.format, [&](auto tag) {
    constexpr KvFormat F = decltype(tag)::value;
    if constexpr (F == KvFormat::kBf16) {
      Bf16ToF32(rec, kQkDim, row);
    } else if constexpr (F == KvFormat::kFp8DsMla) {
      namespace L8 = layout::fp8_ds_mla;
      for (int t = 0; t < L8::kNumTiles; ++t) {
        E4m3ToF32(rec + L8::kLatentOffset + t * L8::kTileDim, L8::kTileDim,
                  codec::load_f32(rec + L8::kScaleOffset + 4 * t), row + t * L8::kTileDim);
      }
      Bf16ToF32(rec + L8::kRopeOffset, kRopeDim, row + kLatentDim);
    } else if constexpr (F == KvFormat::kNvfp4DsMla) {
      Nvfp4LatentToF32(rec, codec::nvfp4_latent_scale(rec, c.outer_scale, c.token_scale), row);
      Bf16ToF32(rec + layout::nvfp4_ds_mla::kRopeOffset, kRopeDim, row + kLatentDim);
    } else if constexpr (F == KvFormat::kNvfp4DsMlaFp8Rope) {
      namespace R = layout::nvfp4_ds_mla_fp8rope;
      Nvfp4LatentToF32(rec, codec::nvfp4_latent_scale(rec, c.outer_scale, c.token_scale), row);
      E4m3ToF32(rec + R::kRopeOffset, kRopeDim, codec::load_f32(rec + R::kRopeScaleOffset), row + kLatentDim);
    } else if constexpr (F == KvFormat::kNvfp4DsMlaInt8Rope) {
      namespace R = layout::nvfp4_ds_mla_int8rope;
      Nvfp4LatentToF32(rec, codec::nvfp4_latent_scale(rec, c.outer_scale, c.token_scale), row);
      Int8ToF32(rec + R::kRopeOffset, kRopeDim, codec::load_f32(rec + R::kRopeScaleOffset), row + kLatentDim);
    } else {
      static_assert(F == KvFormat::kF32);
      for (int i = 0; i < kQkDim; ++i) row[i] = codec::load_f32(rec + 4 * i);
    }
  });
}

// Records -> natural-order rows, through DequantRecord (dequantize_records_simd).
void DequantRows(const CacheLayerView& c, const uint8_t* records, int64_t n, float* rows) {
  float tile_row[kK];
  for (int64_t r = 0; r < n; ++r) {
    DequantRecord(c, records + r * c.record_bytes, tile_row);
    float* dst = rows + r * kK;
    for (int i = 0; i < kV; ++i) dst[i] = tile_row[tile_pos(c.format, i)];
    for (int i = kV; i < kK; ++i) dst[i] = tile_row[i];
  }
}

// ---- S = Q K^T -----------------------------------------------------------------------
// R query rows x C tokens; each S entry is a 576-long dot product.
template <int R, int C>
HWY_INLINE void QkBlock(const float* HWY_RESTRICT q, const float* HWY_RESTRICT k, float* HWY_RESTRICT s, int ld_s) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  hn::Vec<DF> acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 3
    for (int c = 0; c < C; ++c) acc[r][c] = hn::Zero(d);
  }
  for (int i = 0; i < kK; i += N) {
    hn::Vec<DF> kv[C];
#pragma GCC unroll 3
    for (int c = 0; c < C; ++c) kv[c] = hn::LoadU(d, k + c * kK + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const auto qv = hn::LoadU(d, q + r * kK + i);
#pragma GCC unroll 3
      for (int c = 0; c < C; ++c) acc[r][c] = hn::MulAdd(qv, kv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 3
    for (int c = 0; c < C; ++c) s[r * ld_s + c] = hn::GetLane(hn::SumOfLanes(d, acc[r][c]));
  }
}

template <int R>
HWY_INLINE void QkRows(const float* q, const float* k, int n, float* s, int ld_s) {
  int t = 0;
  for (; t + 3 <= n; t += 3) QkBlock<R, 3>(q, k + t * kK, s + t, ld_s);
  if (n - t == 2) QkBlock<R, 2>(q, k + t * kK, s + t, ld_s);
  if (n - t == 1) QkBlock<R, 1>(q, k + t * kK, s + t, ld_s);
}

void QkTile(const float* q, int rows, const float* k, int n, float* s, int ld_s) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) QkRows<4>(q + r * kK, k, n, s + r * ld_s, ld_s);
  switch (rows - r) {
    case 3: QkRows<3>(q + r * kK, k, n, s + r * ld_s, ld_s); break;
    case 2: QkRows<2>(q + r * kK, k, n, s + r * ld_s, ld_s); break;
    case 1: QkRows<1>(q + r * kK, k, n, s + r * ld_s, ld_s); break;
    default: break;
  }
}

// ---- O += P V --------------------------------------------------------------------------
// R rows x 2 vectors of output columns starting at col, over n tokens.
template <int R>
HWY_INLINE void PvBlock(const float* HWY_RESTRICT p, int ld_p, const float* HWY_RESTRICT v, int n,
                        float* HWY_RESTRICT o, int col) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  hn::Vec<DF> acc0[R], acc1[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    acc0[r] = hn::LoadU(d, o + r * kV + col);
    acc1[r] = hn::LoadU(d, o + r * kV + col + N);
  }
  for (int t = 0; t < n; ++t) {
    const auto v0 = hn::LoadU(d, v + t * kK + col);
    const auto v1 = hn::LoadU(d, v + t * kK + col + N);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const auto pr = hn::Set(d, p[r * ld_p + t]);
      acc0[r] = hn::MulAdd(pr, v0, acc0[r]);
      acc1[r] = hn::MulAdd(pr, v1, acc1[r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    hn::StoreU(acc0[r], d, o + r * kV + col);
    hn::StoreU(acc1[r], d, o + r * kV + col + N);
  }
}

void PvTile(const float* p, int rows, int ld_p, const float* v, int n, float* o) {
  const int N = static_cast<int>(hn::Lanes(DF()));
  for (int col = 0; col < kV; col += 2 * N) {
    int r = 0;
    for (; r + 4 <= rows; r += 4) PvBlock<4>(p + r * ld_p, ld_p, v, n, o + r * kV, col);
    switch (rows - r) {
      case 3: PvBlock<3>(p + r * ld_p, ld_p, v, n, o + r * kV, col); break;
      case 2: PvBlock<2>(p + r * ld_p, ld_p, v, n, o + r * kV, col); break;
      case 1: PvBlock<1>(p + r * ld_p, ld_p, v, n, o + r * kV, col); break;
      default: break;
    }
  }
}

// ---- the unit ---------------------------------------------------------------------------
void RunUnit(const UnitArgs& a) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const int rows = a.rows;
  const KvFormat fmt = a.cache->format;
  constexpr int kLdS = kTileTokens;  // a multiple of every lane count
  static_assert(kTileTokens % 16 == 0 && kTileTokens % 3 == 0);

  auto ktile = hwy::AllocateAligned<float>(static_cast<std::size_t>(kTileTokens) * kK);
  auto s = hwy::AllocateAligned<float>(static_cast<std::size_t>(rows) * kLdS);
  auto q = hwy::AllocateAligned<float>(static_cast<std::size_t>(rows) * kK);
  auto o = hwy::AllocateAligned<float>(static_cast<std::size_t>(rows) * kV);
  auto m = hwy::AllocateAligned<float>(static_cast<std::size_t>(rows));
  auto l = hwy::AllocateAligned<float>(static_cast<std::size_t>(rows));

  int perm[kLatentDim];
  for (int i = 0; i < kLatentDim; ++i) perm[i] = tile_pos(fmt, i);
  int64_t n_eff = 0;
  for (int r = 0; r < rows; ++r) {
    const float* src = a.q + static_cast<std::size_t>(r) * kK;
    float* dst = q.get() + static_cast<std::size_t>(r) * kK;
    for (int i = 0; i < kLatentDim; ++i) dst[perm[i]] = src[i];
    std::memcpy(dst + kLatentDim, src + kLatentDim, sizeof(float) * kRopeDim);
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
    n_eff = std::max(n_eff, a.row_limit ? std::min(a.row_limit[r], a.n_tokens) : a.n_tokens);
  }
  std::memset(o.get(), 0, sizeof(float) * static_cast<std::size_t>(rows) * kV);

  for (int64_t t0 = 0; t0 < n_eff; t0 += kTileTokens) {
    const int n = static_cast<int>(std::min<int64_t>(kTileTokens, n_eff - t0));
    for (int t = 0; t < n; ++t) {
      DequantRecord(*a.cache, a.cache->record(a.slots[t0 + t]), ktile.get() + static_cast<std::size_t>(t) * kK);
    }
    QkTile(q.get(), rows, ktile.get(), n, s.get(), kLdS);
    // Online softmax: rescale what was accumulated when the running max moves.
    for (int r = 0; r < rows; ++r) {
      const int64_t lim_abs = a.row_limit ? a.row_limit[r] : a.n_tokens;
      const int lim = static_cast<int>(std::clamp<int64_t>(lim_abs - t0, 0, n));
      float* sr = s.get() + static_cast<std::size_t>(r) * kLdS;
      if (lim == 0) {
        std::memset(sr, 0, sizeof(float) * static_cast<std::size_t>(n));
        continue;
      }
      float mx = sr[0];
      for (int t = 1; t < lim; ++t) mx = std::max(mx, sr[t]);
      const float m_new = std::max(m[r], mx);
      const float alpha = m[r] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(m[r] - m_new);
      const auto vm = hn::Set(d, m_new);
      auto vsum = hn::Zero(d);
      for (int t = 0; t < n; t += N) {
        const auto mask = hn::FirstN(d, static_cast<std::size_t>(std::max(0, lim - t)));
        const auto pv = hn::IfThenElseZero(mask, hn::Exp(d, hn::Sub(hn::LoadU(d, sr + t), vm)));
        hn::StoreU(pv, d, sr + t);
        vsum = hn::Add(vsum, pv);
      }
      l[r] = l[r] * alpha + hn::GetLane(hn::SumOfLanes(d, vsum));
      if (alpha != 1.0f) {
        float* orow = o.get() + static_cast<std::size_t>(r) * kV;
        const auto va = hn::Set(d, alpha);
        for (int c = 0; c < kV; c += N) hn::StoreU(hn::Mul(hn::LoadU(d, orow + c), va), d, orow + c);
      }
      m[r] = m_new;
    }
    PvTile(s.get(), rows, kLdS, ktile.get(), n, o.get());
  }

  for (int r = 0; r < rows; ++r) {
    float* dst = a.o + static_cast<std::size_t>(r) * kV;
    const float* src = o.get() + static_cast<std::size_t>(r) * kV;
    if (l[r] == 0.0f) {
      std::memset(dst, 0, sizeof(float) * kV);
      a.lse[r] = -std::numeric_limits<float>::infinity();
      continue;
    }
    const float inv = 1.0f / l[r];
    for (int i = 0; i < kLatentDim; ++i) dst[i] = src[perm[i]] * inv;
    a.lse[r] = m[r] + std::log(l[r]);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace mlakv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mlakv {
namespace cpu {

HWY_EXPORT(RunUnit);

void run_attention_unit(const UnitArgs& a) { HWY_DYNAMIC_DISPATCH(RunUnit)(a); }

HWY_EXPORT(DequantRows);

void dequantize_records_simd(const CacheLayerView& cache, const uint8_t* records, int64_t n, float* rows) {
  HWY_DYNAMIC_DISPATCH(DequantRows)(cache, records, n, rows);
}

const char* attention_simd_target() {
  // The dispatcher's choice: the best (lowest-bit) target compiled in and supported here.
  const int64_t t = hwy::SupportedTargets() & HWY_TARGETS;
  return hwy::TargetName(t & -t);
}

}  // namespace cpu

const char* cpu_attention_isa() {
  // Highway's target names ("AVX3", "AVX3_ZEN4", "AVX3_SPR") are its own; users know
  // these instruction sets as AVX-512.
  const std::string_view t = cpu::attention_simd_target();
  if (t.substr(0, 4) == "AVX3") return t == "AVX3" ? "AVX-512" : (t == "AVX3_ZEN4" ? "AVX-512 (Zen 4)" : "AVX-512 (SPR)");
  return cpu::attention_simd_target();
}

}  // namespace mlakv
#endif
