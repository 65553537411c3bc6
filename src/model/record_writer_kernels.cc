// SIMD record encoders (src/model/record_writer.h), compiled for every x86 target
// Highway supports and dispatched at run time.
// clang 14's instruction selection crashes (SelectionDAG::salvageDebugInfo, exit 139) on the
// AVX-512 form of SearchScaleCodes at -O2 -g, which CI's fuzz build (clang + libFuzzer) uses:
// there this file leaves the AVX-512 targets out (the other targets give the same bytes).
#if defined(__clang__) && __clang_major__ < 15 && !defined(HWY_DISABLED_TARGETS)
#define HWY_DISABLED_TARGETS (HWY_AVX3 | HWY_AVX3_DL)
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/record_writer_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "format/record_codec.h"
#include "model/record_writer.h"
#include "mlakv/thread_pool.h"

HWY_BEFORE_NAMESPACE();
namespace mlakv {
namespace model {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Applies f(integral_constant i) for i = 0, ..., n - 1 (unrolled at compile time).
template <size_t... i, class F>
HWY_INLINE void ForEachIndex(std::index_sequence<i...>, F&& f) {
  (f(std::integral_constant<size_t, i>{}), ...);
}

// The scale-mode parameter type of codec::fp8_tile_scale (codec::Fp8Scales today; the
// one Fp8ScaleMode of mlakv/codec.h once the modes are unified; kPow2 = 0, kExact = 1 in
// both), so this file compiles on either side of that change.
template <class F>
struct SecondParam;
template <class R, class A, class B>
struct SecondParam<R (*)(A, B)> {
  using type = B;
};
using TileScaleMode = typename SecondParam<decltype(&codec::fp8_tile_scale)>::type;

using DF = hn::CappedTag<float, 16>;  // 16 lanes at most: one nvfp4 group per vector on AVX-512
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;

HWY_INLINE hn::Vec<DU> E4m3Codes(DF df, hn::Vec<DF> y) {
  const DU du;
  const DI di;
  const auto u = hn::BitCast(du, y);
  const auto sign = hn::And(hn::ShiftRight<24>(u), hn::Set(du, 0x80u));
  const auto abs = hn::And(u, hn::Set(du, 0x7FFFFFFFu));
  const auto absf = hn::BitCast(df, abs);
  const auto rs = hn::Sub(hn::Add(absf, hn::Set(df, 16384.0f)), hn::Set(df, 16384.0f));
  const auto code_sub = hn::BitCast(du, hn::ConvertTo(di, hn::Mul(rs, hn::Set(df, 512.0f))));
  const auto rb = hn::Add(hn::Add(abs, hn::Set(du, 0x7FFFFu)), hn::And(hn::ShiftRight<20>(abs), hn::Set(du, 1u)));
  const auto code_n = hn::Sub(hn::ShiftRight<20>(rb), hn::Set(du, 120u << 3));
  const auto is_sub = hn::Lt(hn::BitCast(di, abs), hn::Set(di, 0x3C800000));  // |y| < 2^-6
  auto code = hn::Min(hn::IfThenElse(hn::RebindMask(du, is_sub), code_sub, code_n), hn::Set(du, 0x7Eu));
  code = hn::Or(code, sign);
  const auto nan = hn::Gt(hn::BitCast(di, abs), hn::Set(di, 0x7F800000));
  return hn::IfThenElse(hn::RebindMask(du, nan), hn::Set(du, 0x7Fu), code);
}

HWY_INLINE hn::Vec<DU> E2m1Codes(DF df, hn::Vec<DF> y) {
  const DU du;
  const DI di;
  const auto u = hn::BitCast(du, y);
  const auto sign = hn::And(hn::ShiftRight<28>(u), hn::Set(du, 0x8u));
  const auto abs = hn::And(u, hn::Set(du, 0x7FFFFFFFu));
  const auto absf = hn::BitCast(df, abs);
  const auto rs = hn::Sub(hn::Add(absf, hn::Set(df, 4194304.0f)), hn::Set(df, 4194304.0f));
  const auto code_sub = hn::BitCast(du, hn::ConvertTo(di, hn::Add(rs, rs)));
  const auto rb = hn::Add(hn::Add(abs, hn::Set(du, 0x1FFFFFu)), hn::And(hn::ShiftRight<22>(abs), hn::Set(du, 1u)));
  const auto code_n = hn::Sub(hn::ShiftRight<22>(rb), hn::Set(du, 126u << 1));
  const auto is_sub = hn::Lt(hn::BitCast(di, abs), hn::Set(di, 0x3F800000));  // |y| < 1
  auto code = hn::Min(hn::IfThenElse(hn::RebindMask(du, is_sub), code_sub, code_n), hn::Set(du, 0x7u));
  code = hn::Or(code, sign);
  const auto nan = hn::Gt(hn::BitCast(di, abs), hn::Set(di, 0x7F800000));
  return hn::IfThenElse(hn::RebindMask(du, nan), hn::Set(du, 0x7u), code);
}

HWY_INLINE hn::Vec<DU> Bf16Codes(DF df, hn::Vec<DF> x) {
  const DU du;
  const DI di;
  (void)df;
  const auto u = hn::BitCast(du, x);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto r = hn::ShiftRight<16>(hn::Add(hn::Add(u, hn::Set(du, 0x7FFFu)), lsb));
  const auto nan = hn::Gt(hn::BitCast(di, hn::And(u, hn::Set(du, 0x7FFFFFFFu))), hn::Set(di, 0x7F800000));
  return hn::IfThenElse(hn::RebindMask(du, nan), hn::Set(du, 0x7FFFu), r);
}

// Stores the low byte of each lane.
HWY_INLINE void StoreBytes(hn::Vec<DU> codes, uint8_t* dst) {
  const DI di;
  const hn::Rebind<uint8_t, DI> d8;
  hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di, codes)), d8, dst);
}

// bf16 little-endian codes of x[0, n).
void StoreBf16(const float* x, int n, uint8_t* dst) {
  const DF df;
  const DI di;
  const hn::Rebind<uint16_t, DI> d16;
  const int N = static_cast<int>(hn::Lanes(df));
  int i = 0;
  for (; i + N <= n; i += N) {
    const auto c = hn::DemoteTo(d16, hn::BitCast(di, Bf16Codes(df, hn::LoadU(df, x + i))));
    hn::StoreU(c, d16, reinterpret_cast<uint16_t*>(dst + 2 * i));
  }
  for (; i < n; ++i) codec::store_u16(dst + 2 * i, f32_to_bf16(x[i]));
}

float AbsMax(const float* x, int n) {
  const DF df;
  const int N = static_cast<int>(hn::Lanes(df));
  auto m = hn::Zero(df);
  int i = 0;
  for (; i + N <= n; i += N) m = hn::Max(m, hn::Abs(hn::LoadU(df, x + i)));
  float r = hn::GetLane(hn::MaxOfLanes(df, m));
  for (; i < n; ++i) r = codec::fmax_f(r, codec::fabs_f(x[i]));
  return r;
}

// e4m3 codes of x[0, n) / s (n a multiple of the lane count: 128 or 64 here).
void StoreE4m3Div(const float* x, int n, float s, uint8_t* dst) {
  const DF df;
  const int N = static_cast<int>(hn::Lanes(df));
  const auto vs = hn::Set(df, s);
  for (int i = 0; i < n; i += N) StoreBytes(E4m3Codes(df, hn::Div(hn::LoadU(df, x + i), vs)), dst + i);
}

// int8 codes of rne(clamp(x[0, n) / s, -127, 127)) (n a multiple of the lane count; s > 0):
// the scalar codec's rope_int8_quantize per lane (Round is round-half-to-even).
void StoreInt8Div(const float* x, int n, float s, uint8_t* dst) {
  const DF df;
  const DI di;
  const hn::Rebind<int8_t, DI> d8;
  const int N = static_cast<int>(hn::Lanes(df));
  const auto vs = hn::Set(df, s);
  const auto hi = hn::Set(df, static_cast<float>(layout::nvfp4_ds_mla_int8rope::kInt8Max));
  const auto lo = hn::Neg(hi);
  for (int i = 0; i < n; i += N) {
    const auto q = hn::Round(hn::Min(hn::Max(hn::Div(hn::LoadU(df, x + i), vs), lo), hi));
    hn::StoreU(hn::DemoteTo(d8, hn::ConvertTo(di, q)), d8, reinterpret_cast<int8_t*>(dst + i));
  }
}

// e4m3 code -> float for the 128 non-negative codes (the group scales are >= 0).
struct E4m3Table {
  float v[128];
  E4m3Table() {
    for (int c = 0; c < 128; ++c) v[c] = e4m3_to_f32(static_cast<uint8_t>(c));
  }
};

// e2m1_to_f32 of magnitude codes m (0..7): m / 2 below 2, else 2^(m / 2 - 1) (1 + (m & 1) / 2),
// whose float32 bits are (m << 22) + (126 << 23).
HWY_INLINE hn::Vec<DF> E2m1Magnitude(DF df, hn::Vec<DU> m) {
  const DU du;
  const DI di;
  const auto small = hn::Mul(hn::ConvertTo(df, hn::BitCast(di, m)), hn::Set(df, 0.5f));
  const auto big = hn::BitCast(df, hn::Add(hn::ShiftLeft<22>(m), hn::Set(du, 126u << 23)));
  return hn::IfThenElse(hn::RebindMask(df, hn::Lt(m, hn::Set(du, 2u))), small, big);
}

// e4m3_to_f32 of codes c (0..0x7E) per lane: c 2^-9 below 8 (subnormal), else the float32
// bits (c << 20) + (120 << 23) (exponent c >> 3 rebiased from 7 to 127, mantissa c & 7).
HWY_INLINE hn::Vec<DF> E4m3Value(DF df, hn::Vec<DU> c) {
  const DU du;
  const DI di;
  const auto sub = hn::Mul(hn::ConvertTo(df, hn::BitCast(di, c)), hn::Set(df, 0.001953125f));  // 2^-9
  const auto norm = hn::BitCast(df, hn::Add(hn::ShiftLeft<20>(c), hn::Set(du, 120u << 23)));
  return hn::IfThenElse(hn::RebindMask(df, hn::Lt(c, hn::Set(du, 8u))), sub, norm);
}

// The search's per-element arithmetic (SearchScaleCodes), the spec's operations in fewer
// instructions with the same float32 results:
//   * the quotient q = RN(a / sf): on targets with a native fused multiply-add,
//     codec::div_rn_by_e4m3 (q0 = RN(a rsf), then RN(q0 + RN(a - sf q0) rsf) with rsf =
//     RN(1 / sf)), the IEEE quotient for every a >= 2^-12 with a / sf <= 2^120 (exhaustively
//     tested in tests/writer_primitives_test.cc); below 2^-12 both are below 2^-3 < 0.25, so
//     both round to e2m1 0, which is all the search reads of q. Blocks with a group maximum
//     above 2^111 (a / sf could pass 2^120) and targets without FMA divide.
//   * the e2m1 value v = e2m1_to_f32(f32_to_e2m1_satfinite(q) & 7) of q >= 0 (finite or
//     +Inf, never NaN) without its code: q + M, M = 2^22 below 2, 2^23 below 4, else 2^24,
//     rounds q to a multiple of ulp(M) = 0.5, 1 or 2 (the e2m1 grid's spacing there; ties to
//     the even multiple, which is the even code), minus M is exact, then min(., 6) saturates
//     (+Inf + M - M = +Inf -> 6).
//   * d = a - v sf as one fused multiply-add: v (<= 2 significant bits) times sf (<= 4) is
//     exact in float32 (2^-10 <= v sf <= 2688), so the fused and the separate forms round
//     the same single difference.
HWY_INLINE hn::Vec<DF> E2m1RoundNonNegative(DF df, hn::Vec<DF> q) {
  const auto m = hn::IfThenElse(hn::Lt(q, hn::Set(df, 2.0f)), hn::Set(df, 4194304.0f),
                                hn::IfThenElse(hn::Lt(q, hn::Set(df, 4.0f)), hn::Set(df, 8388608.0f),
                                               hn::Set(df, 16777216.0f)));
  return hn::Min(hn::Sub(hn::Add(q, m), m), hn::Set(df, kE2m1Max));
}

// The e2m1 magnitude code of a grid value v (0, 0.5, ..., 6): 2 v below 2, else its float32
// exponent and top mantissa bit minus 1.0's ((127 << 1) - 2 = 252).
HWY_INLINE hn::Vec<DU> E2m1CodeOfValue(DF df, hn::Vec<DF> v) {
  const DU du;
  const DI di;
  const auto small = hn::BitCast(du, hn::ConvertTo(di, hn::Add(v, v)));
  const auto big = hn::Sub(hn::ShiftRight<22>(hn::BitCast(du, v)), hn::Set(du, 252u));
  return hn::IfThenElse(hn::RebindMask(du, hn::Lt(v, hn::Set(df, 2.0f))), small, big);
}

// RN(a / sf) where it decides the e2m1 rounding (above): kFast the reciprocal form.
template <bool kFast>
HWY_INLINE hn::Vec<DF> QuotientForE2m1(hn::Vec<DF> a, hn::Vec<DF> sf, hn::Vec<DF> rsf) {
  if constexpr (kFast) {
    const auto q0 = hn::Mul(a, rsf);
    return hn::MulAdd(hn::NegMulAdd(sf, q0, a), rsf, q0);
  } else {
    (void)rsf;
    return hn::Div(a, sf);
  }
}

// codec::nvfp4_group_sq_error for N groups at once, one group per lane: at[i * kNumGroups]
// holds element i of each lane's group (y, i = 0..15; |y| is taken here), sf each lane's
// candidate scale. kZero: some lanes are code 0 (`zero`), whose error the spec defines as
// sum a^2 (d = a): those lanes divide by 1 and take d = a. The same float32 results per lane
// as the spec, and its tree: s_j = p_j + p_{j+8}, then h = 4, 2, 1.
template <bool kFast, bool kZero>
HWY_INLINE hn::Vec<DF> GroupSqErrors(DF df, const float* at, hn::Vec<DF> sf, hn::Mask<DF> zero) {
  namespace NV = layout::nvfp4_ds_mla;
  const auto sfd = kZero ? hn::IfThenElse(zero, hn::Set(df, 1.0f), sf) : sf;
  const auto rsf = kFast ? hn::Div(hn::Set(df, 1.0f), sfd) : sfd;
  auto sq = [&](int i) {
    const auto a = hn::Abs(hn::LoadU(df, at + i * NV::kNumGroups));
    const auto v = E2m1RoundNonNegative(df, QuotientForE2m1<kFast>(a, sfd, rsf));
    auto d = hn::NegMulAdd(v, sfd, a);
    if constexpr (kZero) d = hn::IfThenElse(zero, a, d);
    return hn::Mul(d, d);
  };
  hn::Vec<DF> s8[8];
  for (int j = 0; j < 8; ++j) {
    const auto lo = sq(j);
    s8[j] = hn::Add(lo, sq(j + 8));
  }
  for (int h = 4; h >= 1; h /= 2) {
    for (int j = 0; j < h; ++j) s8[j] = hn::Add(s8[j], s8[j + h]);
  }
  return s8[0];
}

// The chosen codes' e2m1 nibbles of one block of N groups, as the record stores them: lane
// g's w[0] holds elements 0..7 (element i at bits 4i..4i+3, its sign at bit 4i+3), w[1]
// elements 8..15 - the group's 8 code bytes as two little-endian u32. Code-0 lanes get 0
// (no signs), as the RN path's zero scale does.
template <bool kFast>
HWY_INLINE void GroupCodeWords(DF df, const float* at, hn::Vec<DU> c, hn::Vec<DU>* w) {
  namespace NV = layout::nvfp4_ds_mla;
  const DU du;
  const auto zero = hn::Eq(c, hn::Zero(du));
  const auto sfd = hn::IfThenElse(hn::RebindMask(df, zero), hn::Set(df, 1.0f), E4m3Value(df, c));
  const auto rsf = kFast ? hn::Div(hn::Set(df, 1.0f), sfd) : sfd;
  w[0] = w[1] = hn::Zero(du);
  ForEachIndex(std::make_index_sequence<NV::kGroupDim>{}, [&](auto i) {
    const auto y = hn::LoadU(df, at + i * NV::kNumGroups);
    const auto m = E2m1CodeOfValue(df, E2m1RoundNonNegative(df, QuotientForE2m1<kFast>(hn::Abs(y), sfd, rsf)));
    const auto code = hn::Or(m, hn::And(hn::ShiftRight<28>(hn::BitCast(du, y)), hn::Set(du, 8u)));
    w[i / 8] = hn::Or(w[i / 8], hn::ShiftLeft<4 * (i % 8)>(code));
  });
  w[0] = hn::IfThenZeroElse(zero, w[0]);
  w[1] = hn::IfThenZeroElse(zero, w[1]);
}

// One block of N groups (lane = group) of SearchScaleCodes.
template <bool kFast>
HWY_INLINE void SearchBlock(DF df, const float* at, uint8_t* scales, hn::Vec<DU>* w) {
  const DU du;
  const hn::Rebind<uint8_t, DU> d8;
  const auto c0 = hn::PromoteTo(du, hn::LoadU(d8, scales));
  const auto one = hn::Set(du, 1u);
  const auto zero = hn::RebindMask(df, hn::Eq(c0, hn::Zero(du)));
  auto best_c = c0;
  auto best_e = hn::AllFalse(df, zero) ? GroupSqErrors<kFast, false>(df, at, E4m3Value(df, c0), zero)
                                       : GroupSqErrors<kFast, true>(df, at, E4m3Value(df, c0), zero);
  {  // c0 - 1 where c0 >= 2 (other lanes evaluate code 1 and are not taken)
    const auto ok = hn::Gt(c0, one);
    const auto c = hn::IfThenElse(ok, hn::Sub(c0, one), one);
    const auto e = GroupSqErrors<kFast, false>(df, at, E4m3Value(df, c), zero);
    const auto take = hn::And(hn::RebindMask(df, ok), hn::Lt(e, best_e));
    best_e = hn::IfThenElse(take, e, best_e);
    best_c = hn::IfThenElse(hn::RebindMask(du, take), c, best_c);
  }
  {  // c0 + 1 where <= 0x7E (other lanes, c0 = 0x7E, evaluate c0 and are not taken)
    const auto c = hn::Add(c0, one);
    const auto ok = hn::Lt(c, hn::Set(du, 0x7Fu));
    const auto e = GroupSqErrors<kFast, false>(df, at, E4m3Value(df, hn::IfThenElse(ok, c, c0)), zero);
    const auto take = hn::And(hn::RebindMask(df, ok), hn::Lt(e, best_e));
    best_c = hn::IfThenElse(hn::RebindMask(du, take), c, best_c);
  }
  StoreBytes(best_c, scales);
  GroupCodeWords<kFast>(df, at, best_c, w);
}

// codec::nvfp4_search_scale_code for all 32 groups of y (the record's y = latent / s, amax
// each group's max |y|), N groups per vector (the elements transposed: lane = group): each
// group's RN code c0 from scales[g], then c0 - 1 (where c0 >= 2) and c0 + 1 (where <= 0x7E)
// replace the best only where strictly less. The chosen codes go back to scales[g], and the
// e2m1 codes at the chosen scales to the record's latent bytes `codes` (8 per group).
void SearchScaleCodes(const float* y, const float* amax, uint8_t* scales, uint8_t* codes) {
  namespace NV = layout::nvfp4_ds_mla;
  const DF df;
  const DU du;
  constexpr int N = static_cast<int>(hn::MaxLanes(DF()));
  static_assert(NV::kNumGroups % N == 0);
  alignas(64) float yt[NV::kGroupDim][NV::kNumGroups];  // yt[i][g] = y[16 g + i]
  for (int g = 0; g < NV::kNumGroups; ++g) {
    for (int i = 0; i < NV::kGroupDim; ++i) yt[i][g] = y[g * NV::kGroupDim + i];
  }
  alignas(64) uint32_t w[2][NV::kNumGroups];
  for (int g0 = 0; g0 < NV::kNumGroups; g0 += N) {
    hn::Vec<DU> wv[2];
    // The reciprocal quotient needs a native FMA and every |y| of the block <= 2^111.
    bool fast = HWY_NATIVE_FMA != 0;
    for (int g = g0; g < g0 + N; ++g) fast = fast && amax[g] <= 0x1p111f;
    if (fast) SearchBlock<true>(df, &yt[0][g0], scales + g0, wv);
    else SearchBlock<false>(df, &yt[0][g0], scales + g0, wv);
    hn::Store(wv[0], du, &w[0][g0]);
    hn::Store(wv[1], du, &w[1][g0]);
  }
  for (int g = 0; g < NV::kNumGroups; ++g) {  // little-endian words (x86 only here)
    std::memcpy(codes + g * (NV::kGroupDim / 2), &w[0][g], 4);
    std::memcpy(codes + g * (NV::kGroupDim / 2) + 4, &w[1][g], 4);
  }
}

// search: Nvfp4ScaleMode::kSearch (the group codes from SearchScaleCodes).
void Nvfp4Latent(const float* latent, float outer_scale, uint8_t* rec, bool search) {
  namespace NV = layout::nvfp4_ds_mla;
  static const E4m3Table table;
  const DF df;
  const DU du;
  const int N = static_cast<int>(hn::Lanes(df));
  const auto vo = hn::Set(df, outer_scale);
  float y[kLatentDim];
  float amax[NV::kNumGroups];
  // y = latent / s_l and each group's max |y|.
  for (int g = 0; g < NV::kNumGroups; ++g) {
    auto m = hn::Zero(df);
    for (int i = 0; i < NV::kGroupDim; i += N) {
      const auto v = hn::Div(hn::LoadU(df, latent + g * NV::kGroupDim + i), vo);
      hn::StoreU(v, df, y + g * NV::kGroupDim + i);
      m = hn::Max(m, hn::Abs(v));
    }
    amax[g] = hn::GetLane(hn::MaxOfLanes(df, m));
  }
  // Scale codes e4m3_satfinite(amax / 6) for all groups at once (amax >= 0 and finite:
  // the codes are < 0x7F), written to the record's scale bytes.
  uint8_t* scales = rec + NV::kScaleOffset;
  for (int g = 0; g < NV::kNumGroups; g += N) {
    StoreBytes(E4m3Codes(df, hn::Div(hn::LoadU(df, amax + g), hn::Set(df, kE2m1Max))), scales + g);
  }
  if (search) {
    SearchScaleCodes(y, amax, scales, rec + NV::kLatentOffset);
    return;
  }
  uint8_t codes[NV::kGroupDim + 16];
  for (int g = 0; g < NV::kNumGroups; ++g) {
    const float sf = table.v[scales[g] & 0x7F];
    uint8_t* dst = rec + NV::kLatentOffset + g * (NV::kGroupDim / 2);
    if (sf == 0.0f) {
      std::memset(dst, 0, NV::kGroupDim / 2);
      continue;
    }
    const auto vsf = hn::Set(df, sf);
    for (int i = 0; i < NV::kGroupDim; i += N) {
      StoreBytes(E2m1Codes(df, hn::Div(hn::LoadU(df, y + g * NV::kGroupDim + i), vsf)), codes + i);
    }
    for (int i = 0; i < NV::kGroupDim; i += 2) dst[i / 2] = static_cast<uint8_t>(codes[i] | (codes[i + 1] << 4));
  }
  (void)du;
}

// Bytes [0, 288) of an nvfp4 record; in token-scale mode also s_t at [292, 296) (call
// after the pad is zeroed): s_t = AbsMax * f32(1/2688) is the scalar spec's, and an
// s_t of 0 writes zero codes and scales as the scalar encode_nvfp4_latent does. search
// (Nvfp4ScaleMode::kSearch) applies outside token-scale mode only, as the spec's.
void Nvfp4LatentMode(const float* latent, float outer_scale, bool token_scale, uint8_t* rec, bool search) {
  namespace NV = layout::nvfp4_ds_mla;
  float s = outer_scale;
  if (token_scale) {
    s = AbsMax(latent, kLatentDim) * layout::nvfp4_token_scale::kFactor;
    codec::store_f32(rec + layout::nvfp4_token_scale::kOffset, s);
  }
  if (s == 0.0f) {
    std::memset(rec + NV::kLatentOffset, 0, NV::kLatentBytes);
    std::memset(rec + NV::kScaleOffset, 0, NV::kNumGroups);
    return;
  }
  Nvfp4Latent(latent, s, rec, search && !token_scale);
}

// The in-vector butterfly's signs of stage h: +1 on the lower lane of each pair (j & h = 0),
// -1 on the upper. fma(v, +1, p) = RN(v + p) and fma(v, -1, p) = RN(p - v) exactly (the
// products are exact), signed zeros included, so one fused multiply-add gives fwht's a + b
// and a - b where a blend of both took three operations.
template <class D>
HWY_INLINE hn::Vec<D> ButterflySigns(D df, size_t h) {
  const hn::RebindToUnsigned<D> du;
  const auto upper = hn::RebindMask(df, hn::Ne(hn::And(hn::Iota(du, 0), hn::Set(du, static_cast<uint32_t>(h))),
                                               hn::Zero(du)));
  return hn::IfThenElse(upper, hn::Set(df, -1.0f), hn::Set(df, 1.0f));
}

// The in-vector butterfly of stage h < lanes: lane j pairs with lane j ^ h; the lower one
// gets a + b, the upper one a - b (fwht's order, so the result is bit-identical).
template <class D>
HWY_INLINE hn::Vec<D> InVectorButterfly(D df, hn::Vec<D> v, size_t h) {
  hn::Vec<D> p = v;
#if HWY_TARGET != HWY_SCALAR  // one lane: no in-vector stage (never called)
  if constexpr (hn::MaxLanes(D()) >= 2) {
    if (h == 1) p = hn::Shuffle2301(v);
  }
  if constexpr (hn::MaxLanes(D()) >= 4) {
    if (h == 2) p = hn::Shuffle1032(v);
  }
  if constexpr (hn::MaxLanes(D()) >= 8) {
    if (h == 4) p = hn::SwapAdjacentBlocks(v);
  }
  if constexpr (hn::MaxLanes(D()) >= 16) {
    if (h == 8) p = hn::ConcatLowerUpper(df, v, v);
  }
#endif
  return hn::MulAdd(v, ButterflySigns(df, h), p);
}

// The in-vector butterfly stages h = 1, 2, ..., N / 2 of one vector (fwht's order).
HWY_INLINE hn::Vec<DF> InVectorStages(DF df, hn::Vec<DF> v) {
  constexpr size_t N = hn::MaxLanes(DF());
  for (size_t h = 1; h < N; h <<= 1) v = InVectorButterfly(df, v, h);
  return v;
}

// The whole-vector butterfly stages over an array of n vectors held as one group (stage
// hv pairs v[j] with v[j + hv], hv = 1, 2, ..., n / 2: fwht's order within the group).
// Every index is a template constant, so the array stays in registers.
template <size_t hv, size_t n, size_t... q>
HWY_INLINE void VectorStage(hn::Vec<DF> (&v)[n], std::index_sequence<q...>) {
  auto pair = [&v](auto j) {
    const auto a = v[j], b = v[j + hv];
    v[j] = hn::Add(a, b);
    v[j + hv] = hn::Sub(a, b);
  };
  (pair(std::integral_constant<size_t, (q / hv) * 2 * hv + q % hv>{}), ...);
}
template <size_t n, size_t hv = 1>
HWY_INLINE void VectorStages(hn::Vec<DF> (&v)[n]) {
  if constexpr (hv < n) {
    VectorStage<hv>(v, std::make_index_sequence<n / 2>{});
    VectorStages<n, 2 * hv>(v);
  }
}

// LatentTransformKernel::latent / rope, vectorized (bit-identical: the same operations in
// the same order). The latent's 512 floats go through the 9 butterfly stages in two passes
// that each keep a block of vectors in registers: kBlock consecutive vectors (the gain, the
// in-vector stages and the whole-vector stages below kBlock vectors), then the kGroup
// vectors of stride kBlock (the stages from kBlock vectors on) - every pair of a stage is
// combined after both of its inputs' earlier stages, as in fwht's stage-by-stage loop.
void TransformToken(const float* mu, const float* gain, bool rotate, const float* rope_gain, const float* c,
                    const float* k, float* HWY_RESTRICT out, float* HWY_RESTRICT rope_out) {
  const DF df;
  constexpr size_t N = hn::MaxLanes(DF());
  constexpr size_t NV = static_cast<size_t>(kLatentDim) / N;
  // 16 vectors of 32 registers (AVX-512), 8 of 16 (AVX2, SSE4): the block and its temporaries fit.
  constexpr size_t kBlock = std::min<size_t>(NV, N >= 16 ? 16 : 8);
  constexpr size_t kGroup = NV / kBlock;
  static_assert(NV % kBlock == 0);
  for (size_t b = 0; b < NV; b += kBlock) {
    hn::Vec<DF> v[kBlock];
    ForEachIndex(std::make_index_sequence<kBlock>{}, [&](auto i) {
      const size_t o = (b + i) * N;
      v[i] = hn::Mul(hn::Sub(hn::LoadU(df, c + o), hn::LoadU(df, mu + o)), hn::LoadU(df, gain + o));
    });
    if (rotate) {
      ForEachIndex(std::make_index_sequence<kBlock>{}, [&](auto i) { v[i] = InVectorStages(df, v[i]); });
      VectorStages(v);
    }
    ForEachIndex(std::make_index_sequence<kBlock>{}, [&](auto i) { hn::StoreU(v[i], df, out + (b + i) * N); });
  }
  if (rotate && kGroup > 1) {
    for (size_t j = 0; j < kBlock; ++j) {
      hn::Vec<DF> v[kGroup];
      ForEachIndex(std::make_index_sequence<kGroup>{}, [&](auto g) { v[g] = hn::LoadU(df, out + (j + g * kBlock) * N); });
      VectorStages(v);
      ForEachIndex(std::make_index_sequence<kGroup>{}, [&](auto g) { hn::StoreU(v[g], df, out + (j + g * kBlock) * N); });
    }
  }
  if (rope_gain == nullptr) {
    std::memcpy(rope_out, k, kRopeDim * sizeof(float));
    return;
  }
  // The rope's 64-point rotation: the gain, then its butterflies in registers.
  constexpr size_t NR = static_cast<size_t>(kRopeDim) / N;
  static_assert(kRopeDim % N == 0);
  hn::Vec<DF> r[NR];
  ForEachIndex(std::make_index_sequence<NR>{}, [&](auto i) {
    r[i] = InVectorStages(df, hn::Mul(hn::LoadU(df, k + i * N), hn::LoadU(df, rope_gain + i * N)));
  });
  VectorStages(r);
  ForEachIndex(std::make_index_sequence<NR>{}, [&](auto i) { hn::StoreU(r[i], df, rope_out + i * N); });
}

void EncodeRecord(KvFormat f, const float* latent, int latent_dim, const float* rope, int rope_dim, float outer_scale,
                  bool fp8_exact, bool token_scale, bool nvfp4_search, uint8_t* rec) {
  switch (f) {
    case KvFormat::kBf16:
      StoreBf16(latent, latent_dim, rec);
      StoreBf16(rope, rope_dim, rec + 2 * latent_dim);
      break;
    case KvFormat::kF32:
      std::memcpy(rec, latent, sizeof(float) * static_cast<std::size_t>(latent_dim));
      std::memcpy(rec + 4 * latent_dim, rope, sizeof(float) * static_cast<std::size_t>(rope_dim));
      break;
    case KvFormat::kFp8DsMla: {
      namespace F = layout::fp8_ds_mla;
      const auto mode = static_cast<TileScaleMode>(fp8_exact ? 1 : 0);
      for (int t = 0; t < F::kNumTiles; ++t) {
        const float* x = latent + t * F::kTileDim;
        const float s = codec::fp8_tile_scale(AbsMax(x, F::kTileDim), mode);
        StoreE4m3Div(x, F::kTileDim, s, rec + F::kLatentOffset + t * F::kTileDim);
        codec::store_f32(rec + F::kScaleOffset + 4 * t, s);
      }
      StoreBf16(rope, kRopeDim, rec + F::kRopeOffset);
      break;
    }
    case KvFormat::kNvfp4DsMla: {
      namespace NV = layout::nvfp4_ds_mla;
      std::memset(rec + NV::kPadOffset, 0, NV::kPadBytes);
      Nvfp4LatentMode(latent, outer_scale, token_scale, rec, nvfp4_search);
      StoreBf16(rope, kRopeDim, rec + NV::kRopeOffset);
      break;
    }
    case KvFormat::kNvfp4DsMlaFp8Rope: {
      namespace NR = layout::nvfp4_ds_mla_fp8rope;
      std::memset(rec + NR::kPadOffset, 0, NR::kPadBytes);
      Nvfp4LatentMode(latent, outer_scale, token_scale, rec, nvfp4_search);
      const float rs = codec::rope_fp8_scale(AbsMax(rope, kRopeDim));
      codec::store_f32(rec + NR::kRopeScaleOffset, rs);
      if (rs == 0.0f) {
        std::memset(rec + NR::kRopeOffset, 0, kRopeDim);
      } else {
        StoreE4m3Div(rope, kRopeDim, rs, rec + NR::kRopeOffset);
      }
      break;
    }
    case KvFormat::kNvfp4DsMlaInt8Rope: {
      namespace NI = layout::nvfp4_ds_mla_int8rope;
      std::memset(rec + NI::kPadOffset, 0, NI::kPadBytes);
      Nvfp4LatentMode(latent, outer_scale, token_scale, rec, nvfp4_search);
      const float rs = codec::rope_int8_scale(AbsMax(rope, kRopeDim));
      codec::store_f32(rec + NI::kRopeScaleOffset, rs);
      if (rs == 0.0f) {
        std::memset(rec + NI::kRopeOffset, 0, kRopeDim);
      } else {
        StoreInt8Div(rope, kRopeDim, rs, rec + NI::kRopeOffset);
      }
      break;
    }
  }
}

void E4m3CodesN(const float* y, int64_t n, uint8_t* out) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) StoreBytes(E4m3Codes(df, hn::LoadU(df, y + i)), out + i);
  for (; i < n; ++i) out[i] = f32_to_e4m3_satfinite(y[i]);
}

void E2m1CodesN(const float* y, int64_t n, uint8_t* out) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) StoreBytes(E2m1Codes(df, hn::LoadU(df, y + i)), out + i);
  for (; i < n; ++i) out[i] = f32_to_e2m1_satfinite(y[i]);
}

// max over x[0, n) of the float32 bits with the sign cleared: >= 0x7F800000 when some
// value is not finite, else the bits of max |x| (non-negative floats order as integers).
uint32_t MaxAbsBits(const float* HWY_RESTRICT x, int64_t n) {
  const DF df;
  const DU du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto m = hn::Zero(du);
  const auto mask = hn::Set(du, 0x7FFFFFFFu);
  int64_t i = 0;
  for (; i + N <= n; i += N) m = hn::Max(m, hn::And(hn::BitCast(du, hn::LoadU(df, x + i)), mask));
  uint32_t r = hn::GetLane(hn::MaxOfLanes(du, m));
  for (; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    r = std::max(r, b & 0x7FFFFFFFu);
  }
  return r;
}

}  // namespace HWY_NAMESPACE
}  // namespace model
}  // namespace mlakv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mlakv {
namespace model {

HWY_EXPORT(EncodeRecord);
HWY_EXPORT(TransformToken);
HWY_EXPORT(MaxAbsBits);
HWY_EXPORT(E4m3CodesN);
HWY_EXPORT(E2m1CodesN);

void encode_record_simd(KvFormat f, const float* latent, int latent_dim, const float* rope, int rope_dim,
                        float outer_scale, bool fp8_exact_scales, uint8_t* rec, bool token_scale,
                        Nvfp4ScaleMode nvfp4_scales) {
  HWY_DYNAMIC_DISPATCH(EncodeRecord)(f, latent, latent_dim, rope, rope_dim, outer_scale, fp8_exact_scales,
                                     token_scale, nvfp4_scales == Nvfp4ScaleMode::kSearch, rec);
}

void e4m3_codes_simd(const float* y, int64_t n, uint8_t* out) { HWY_DYNAMIC_DISPATCH(E4m3CodesN)(y, n, out); }
void e2m1_codes_simd(const float* y, int64_t n, uint8_t* out) { HWY_DYNAMIC_DISPATCH(E2m1CodesN)(y, n, out); }

Status write_cache_records(KvCache& cache, int layer, std::span<const int64_t> slots, const float* latent,
                           const float* rope, ThreadPool* pool, const LatentTransformKernel* transform) {
  MLAKV_ASSIGN_OR_RETURN(CacheLayerView v, cache.layer(layer));
  const int64_t n = static_cast<int64_t>(slots.size());
  const int L = v.latent_dim, R = v.rope_dim;
  if (v.format != KvFormat::kBf16 && (L != kLatentDim || R != kRopeDim)) {
    return invalid_argument(fmt::format("layer {}: {} records need latent {} + rope {}, the cache has {} + {}", layer,
                                        format_name(v.format), kLatentDim, kRopeDim, L, R));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (slots[static_cast<std::size_t>(i)] >= v.num_slots()) {
      return out_of_range(fmt::format("layer {}: slot {} (token {}) is past the cache's {} slots", layer,
                                      slots[static_cast<std::size_t>(i)], i, v.num_slots()));
    }
  }
  // One vectorized pass finds max |x| (and whether anything is not finite); only then is the
  // first bad value looked for, to name it.
  const uint32_t lat_bits = HWY_DYNAMIC_DISPATCH(MaxAbsBits)(latent, n * L);
  const uint32_t rope_bits = HWY_DYNAMIC_DISPATCH(MaxAbsBits)(rope, n * R);
  for (int64_t i = 0; lat_bits >= 0x7F800000u && i < n * L; ++i) {
    if (!std::isfinite(latent[i]))
      return invalid_argument(fmt::format("layer {}: latent[{}, {}] is not finite", layer, i / L, i % L));
  }
  for (int64_t i = 0; rope_bits >= 0x7F800000u && i < n * R; ++i) {
    if (!std::isfinite(rope[i]))
      return invalid_argument(fmt::format("layer {}: rope[{}, {}] is not finite", layer, i / R, i % R));
  }
  if (transform != nullptr) {
    if (L != kLatentDim || R != kRopeDim) {
      return invalid_argument(fmt::format("layer {}: a latent transform needs latent {} + rope {}, the cache has {} + {}",
                                          layer, kLatentDim, kRopeDim, L, R));
    }
    // |k'_j| <= 8 max |k| for the 64-point rotation; the latent's bound is the kernel's.
    // One bound from the largest |latent| clears every token at once (the usual case);
    // only past it is each token checked exactly.
    float max_lat = 0.0f, max_rope = 0.0f;
    std::memcpy(&max_lat, &lat_bits, 4);
    std::memcpy(&max_rope, &rope_bits, 4);
    const bool all_clear =
        transform->scaled_input_bound(max_lat) <= LatentTransformKernel::kMaxScaledInput && max_rope <= 1e37f;
    for (int64_t i = 0; i < n && !all_clear; ++i) {
      if (slots[static_cast<std::size_t>(i)] < 0) continue;
      const float m = transform->max_scaled_input(latent + i * L);
      if (!(m <= LatentTransformKernel::kMaxScaledInput))
        return invalid_argument(fmt::format("layer {}: token {}: max |(latent - mu) d| = {} overflows the latent "
                                            "transform (at most {})",
                                            layer, i, m, LatentTransformKernel::kMaxScaledInput));
      for (int j = 0; j < R; ++j) {
        if (std::abs(rope[i * R + j]) > 1e37f)
          return invalid_argument(fmt::format("layer {}: rope[{}, {}] = {} overflows the RoPE rotation", layer, i, j,
                                              rope[i * R + j]));
      }
    }
  }
  const bool exact = cache.config().fp8_scales == Fp8ScaleMode::kExact;
  // (cache.layer validated the view: kSearch only on nvfp4 layers outside token-scale mode.)
  const bool search = v.nvfp4_scales == Nvfp4ScaleMode::kSearch;
  auto one = [&](int64_t i) {
    const int64_t s = slots[static_cast<std::size_t>(i)];
    if (s < 0) return;
    if (transform == nullptr) {
      HWY_DYNAMIC_DISPATCH(EncodeRecord)(v.format, latent + i * L, L, rope + i * R, R, v.outer_scale, exact,
                                         v.token_scale, search, v.data + s * v.record_bytes);
      return;
    }
    alignas(64) float lat[kLatentDim];
    alignas(64) float rp[kRopeDim];
    HWY_DYNAMIC_DISPATCH(TransformToken)(transform->mu_data(), transform->gain_data(), transform->rotates_latent(),
                                         transform->rotates_rope() ? transform->rope_gain_data() : nullptr,
                                         latent + i * L, rope + i * R, lat, rp);
    HWY_DYNAMIC_DISPATCH(EncodeRecord)(v.format, lat, L, rp, R, v.outer_scale, exact, v.token_scale, search,
                                       v.data + s * v.record_bytes);
  };
  if (pool == nullptr || n < 64) {
    for (int64_t i = 0; i < n; ++i) one(i);
  } else {
    const int64_t chunk = 32;
    pool->parallel_for((n + chunk - 1) / chunk, [&](int64_t c, int) {
      for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) one(i);
    });
  }
  return Status::Ok();
}

}  // namespace model
}  // namespace mlakv
#endif
