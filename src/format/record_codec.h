// Per-record encode/decode primitives shared by the CPU codec, the paged-cache
// writer and the CUDA kernels (host + device). No validation here: callers check
// shapes and finiteness first (codec.cc) or are kernels handed validated params.
//
// Every rounding step is written once, here, so CPU and GPU bytes agree exactly.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "mlakv/codec.h"  // Fp8ScaleMode
#include "mlakv/formats.h"
#include "mlakv/numerics.h"

namespace mlakv::codec {

// Transitional: src/cuda/cache_writer.cu still casts to this name; it goes once the CUDA
// tree uses Fp8ScaleMode (mlakv/codec.h, the one fp8 scale-mode enum) directly.

// ---- small helpers -------------------------------------------------------------
MLAKV_HD float fabs_f(float x) {
#if defined(__CUDA_ARCH__)
  return fabsf(x);  // the same bits (sign cleared), as an operand modifier
#else
  return f32_from_bits(f32_bits(x) & 0x7FFFFFFFu);
#endif
}
MLAKV_HD float fmax_f(float a, float b) { return a > b ? a : b; }

MLAKV_HD void store_f32(uint8_t* p, float v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<float*>(p) = v;  // record offsets of fp32 fields are 4-aligned
#else
  std::memcpy(p, &v, 4);
#endif
}
MLAKV_HD float load_f32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const float*>(p);
#else
  float v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
MLAKV_HD void store_u16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xFFu);
  p[1] = static_cast<uint8_t>(v >> 8);
}
MLAKV_HD uint16_t load_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8));
}

// ---- fp8_ds_mla ------------------------------------------------------------------
// Tile scale from the tile's max |x|.
//  pow2  (FlashMLA): s = 2^ceil(log2(max(amax/448, 1e-4))), with the ceiling taken
//        exactly on the float32 value (so |x/s| <= 448 always holds);
//  exact (vLLM):     s = max(amax/448, FLT_MIN).
MLAKV_HD float fp8_tile_scale(float amax, Fp8ScaleMode mode) {
  const float r = amax / kE4m3Max;
  if (mode == Fp8ScaleMode::kExact) return fmax_f(r, 1.17549435e-38f);
  const float v = fmax_f(r, layout::fp8_ds_mla::kMinScaleRatio);  // >= 1e-4: normal float
  const uint32_t b = f32_bits(v);
  const uint32_t e = (b >> 23) + ((b & 0x7FFFFFu) != 0 ? 1u : 0u);
  return f32_from_bits(e << 23);
}

MLAKV_HD uint8_t fp8_quantize(float x, float scale) { return f32_to_e4m3_satfinite(x / scale); }
MLAKV_HD float fp8_dequantize(uint8_t q, float scale) { return e4m3_to_f32(q) * scale; }

// ---- nvfp4 -------------------------------------------------------------------------
// Group scale code: e4m3_rn(amax(y)/6) (satfinite). Elements: e2m1_rn_satfinite(y / sf),
// all zero when sf decodes to zero.
MLAKV_HD uint8_t nvfp4_group_scale_code(float amax_y) { return f32_to_e4m3_satfinite(amax_y / kE2m1Max); }
MLAKV_HD uint8_t nvfp4_quantize(float y, float sf) { return sf == 0.0f ? uint8_t{0} : f32_to_e2m1_satfinite(y / sf); }
// (e2m1 * e4m3) is exact in float32 (2 x 4 significant bits); one rounding at * s_l.
MLAKV_HD float nvfp4_dequantize(uint8_t q, float sf, float outer_scale) {
  return (e2m1_to_f32(q) * sf) * outer_scale;
}

// ---- e4m3 rope of the 368 B record ------------------------------------------------------
MLAKV_HD float rope_fp8_scale(float amax) { return amax * layout::nvfp4_ds_mla_fp8rope::kRopeScaleFactor; }
MLAKV_HD uint8_t rope_fp8_quantize(float v, float rs) { return rs == 0.0f ? uint8_t{0} : f32_to_e4m3_satfinite(v / rs); }

// ---- int8 rope of nvfp4_ds_mla_int8rope ------------------------------------------------
// rs = amax * f32(1/127); q = rne(v / rs) clamped to [-127, 127] (all zero when rs is 0).
// v / rs is an IEEE division (correctly rounded); |v / rs| <= 127 up to that rounding,
// hence the clamp; then rint (round half to even in the default rounding mode: the
// library never changes it; cvt.rni on the device).
MLAKV_HD float rope_int8_scale(float amax) { return amax * layout::nvfp4_ds_mla_int8rope::kRopeScaleFactor; }
MLAKV_HD float round_half_even_small(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::rint(x);
#endif
}
MLAKV_HD int8_t rope_int8_quantize(float v, float rs) {
  if (rs == 0.0f) return 0;
  constexpr float kMax = static_cast<float>(layout::nvfp4_ds_mla_int8rope::kInt8Max);
  float q = v / rs;
  q = q > kMax ? kMax : (q < -kMax ? -kMax : q);
  return static_cast<int8_t>(round_half_even_small(q));
}
MLAKV_HD float rope_int8_dequantize(uint8_t code, float rs) { return static_cast<float>(static_cast<int8_t>(code)) * rs; }

// ---- the per-token scale mode (formats.h nvfp4_token_scale) ---------------------------------
// s_t = token_amax * f32(1/2688); 0 for an all-zero latent (then every latent byte and group
// scale byte is zero).
MLAKV_HD float nvfp4_token_scale(const float* latent) {
  float amax = 0.0f;
  for (int i = 0; i < kLatentDim; ++i) amax = fmax_f(amax, fabs_f(latent[i]));
  return amax * layout::nvfp4_token_scale::kFactor;
}

// ---- the writers' fast element primitives ---------------------------------------------------
// The CUDA writers (src/cuda/smxx/cache_writer.cu) encode with these instead of the scalar
// functions above. Each returns the bytes the scalar function returns for every input the
// writers hand it (finite latents and ropes: non-finite inputs are not specified on the
// device, include/mlakv/cuda.h); tests/cuda/writer_primitives_kernels.cu checks them on the
// device against the scalar functions, exhaustively over float32 where one operand is free.

// e4m3 satfinite of two floats, lo in bits [0, 8): f32_to_e4m3_satfinite. On sm_89+ one
// hardware conversion (cvt.rn.satfinite.e4m3x2.f32: round to nearest even, +-Inf and
// overflow to +-448, underflow keeps the sign).
MLAKV_HD uint32_t e4m3x2_satfinite(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<uint32_t>(f32_to_e4m3_satfinite(lo)) | (static_cast<uint32_t>(f32_to_e4m3_satfinite(hi)) << 8);
#endif
}

// bf16 of two floats, lo in bits [0, 16): f32_to_bf16. On the device one hardware
// conversion (cvt.rn.bf16x2.f32, sm_80+: round to nearest even, overflow to Inf).
MLAKV_HD uint32_t bf16x2_rn(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<uint32_t>(f32_to_bf16(lo)) | (static_cast<uint32_t>(f32_to_bf16(hi)) << 16);
#endif
}

// The e2m1 magnitude code (0..7) of a >= 0 (Inf included) in the low three bits (the
// bits above are not zero): f32_to_e2m1_satfinite(a) & 7. a is first clamped to 6
// (satfinite; Inf -> 6). Below 1 the e2m1 values are multiples of 0.5: a + 2^22 (ulp 0.5)
// rounds to one, ties to even, and its mantissa (0x4A800000 + code) ends in the code. From
// 1 up: round the float32 mantissa to one bit (add 0x1FFFFF plus the kept bit, carry into
// the exponent) and read (exponent, bit) as the code, minus 1.0's (127 << 1) - 2.
MLAKV_HD uint32_t e2m1_magnitude_code_bits(float a) {
  a = a < 6.0f ? a : 6.0f;
  const uint32_t b = f32_bits(a);
  const uint32_t small = f32_bits(a + 4194304.0f);
  const uint32_t big = (b + 0x1FFFFFu + ((b >> 22) & 1u) - 0x3F000000u) >> 22;
  return a < 1.0f ? small : big;
}
// The e2m1 code of the magnitude a with the sign bit of x: f32_to_e2m1_satfinite(+-a).
MLAKV_HD uint32_t e2m1_code(float a, float x) {
  return (e2m1_magnitude_code_bits(a) & 7u) | ((f32_bits(x) >> 28) & 8u);
}

// RN(a / b) from rb = RN(1 / b), for a, b whose quotient and remainders stay in the normal
// range (callers guard it; see below). q0 = RN(a rb) is within 1.5 ulp of a / b; one
// correction q1 = RN(q0 + RN(a - b q0) rb) is within 0.5 ulp plus a 2^-22 ulp fraction, i.e.
// faithful; Markstein's theorem (y = RN(1/b), q faithful: r = a - b q is exact and
// RN(q + r y) = RN(a / b)) makes the second correction the correctly rounded quotient -
// what the IEEE division returns. The fused multiply-adds are single roundings on host
// (std::fma) and device alike.
MLAKV_HD float fma_f(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
MLAKV_HD float div_rn_by_reciprocal(float a, float b, float rb) {
#if defined(__CUDA_ARCH__)
  float q = __fmul_rn(a, rb);
#else
  float q = a * rb;
#endif
  float r = fma_f(-b, q, a);
  q = fma_f(r, rb, q);
  r = fma_f(-b, q, a);
  return fma_f(r, rb, q);
}
// RN(a / b) for b an e4m3 value (an nvfp4 group scale, [2^-9, 448]) from rb = RN(1/b),
// wherever a, the quotient and the remainder are normal (a >= 2^-12 and a / b <= 2^120 is
// enough): q0 = RN(a rb), then one correction RN(q0 + RN(a - b q0) rb). Exact by
// exhaustion: every operation commutes with scaling a or b by powers of two in that range,
// so the 8 float32 mantissas of e4m3 values x every dividend in [1, 4) cover every case
// (tests/writer_primitives_test.cc on the host, cuda_harness on the device).
MLAKV_HD float div_rn_by_e4m3(float a, float b, float rb) {
#if defined(__CUDA_ARCH__)
  const float q = __fmul_rn(a, rb);
#else
  const float q = a * rb;
#endif
  return fma_f(fma_f(-b, q, a), rb, q);
}
// RN(1 / b) (the IEEE reciprocal).
MLAKV_HD float reciprocal_rn(float b) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(b);
#else
  return 1.0f / b;
#endif
}

// max(a, b) for a, b never NaN (the writers' magnitudes): one FMNMX on the device where
// fmax_f's compare-and-select is two instructions; the same value (+0 and -0 do not occur:
// the operands are magnitudes or products of them).
MLAKV_HD float fmax_nonnan(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fmaxf(a, b);
#else
  return fmax_f(a, b);
#endif
}

// nvfp4_group_scale_code(amax_y) = e4m3_rn_satfinite(amax_y / 6) for amax_y >= 0 (Inf
// included): the division through Markstein's sequence with RN(1/6) (the IEEE quotient for
// amax_y in [2^-100, 4096] where the quotient is normal; below, a non-negative value under
// 2^-120 whose code is 0 either way), amax_y clamped to 4096 first (every quotient above
// 448 saturates to the same code 0x7E), then the hardware e4m3 conversion. Exhaustive over
// every non-negative float32 (tests/writer_primitives_test.cc, cuda_harness).
MLAKV_HD uint8_t nvfp4_group_scale_code_fast(float amax_y) {
  constexpr float kSix = kE2m1Max, kRcpSix = 0.166666672f;  // RN(1/6) = 0x3E2AAAAB
  static_assert(kE2m1Max == 6.0f);
  const float a = amax_y < 4096.0f ? amax_y : 4096.0f;
  return static_cast<uint8_t>(e4m3x2_satfinite(div_rn_by_reciprocal(a, kSix, kRcpSix), 0.0f) & 0xFFu);
}

// e4m3_to_f32(c) for a non-NaN code c (0..0x7E, 0x80..0xFE): on sm_89+ the hardware
// e4m3 -> f16 conversion (every e4m3 value is an f16 value) and the exact f16 -> f32 one.
MLAKV_HD float e4m3_to_f32_fast(uint32_t c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<uint16_t>(c & 0xFFu)));
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<uint16_t>(h2 & 0xFFFFu)));
  return f;
#else
  return e4m3_to_f32(static_cast<uint8_t>(c));
#endif
}

// x / s for the encoders below, through the reciprocal rs = RN(1/s) where that is provably
// the IEEE quotient:
//   - s a power of two in [2^-126, 2^126]: rs is exact, x * rs is the same real number as
//     x / s, rounded once (subnormal and overflowing results included);
//   - else s in [2^-60, 2^100] and max|x| * rs <= 2^119: div_rn_by_reciprocal. Its result is
//     RN(x / s) wherever |x| >= 2^-100 and the quotient is normal (the remainders stay
//     exact); elsewhere it is within a few 2^-149 of it, i.e. below 2^-40, where every code
//     of the formats below is zero and only the sign (taken from x) shows;
//   - else the IEEE division.
// Returns |x| / s (the caller takes the sign from x).
enum class DivPath : uint8_t { kPow2, kReciprocal, kIeee };
MLAKV_HD DivPath div_path(float s, float max_abs_x, float rs) {
  const uint32_t b = f32_bits(s);
  if ((b & 0x7FFFFFu) == 0 && s >= 1.17549435e-38f && s <= 8.50705917e+37f) return DivPath::kPow2;
  if (s >= 8.67361738e-19f && s <= 1.26765060e+30f && max_abs_x * rs <= 6.64613997e+35f) return DivPath::kReciprocal;
  return DivPath::kIeee;
}
// y[i] = |x[i]| / s for i < n, along `path` (one branch for the n elements).
template <int n>
MLAKV_HD void abs_div_n(const float* x, float s, float rs, DivPath path, float* y) {
  if (path == DivPath::kPow2) {
#if defined(__CUDA_ARCH__)
    for (int i = 0; i < n; ++i) y[i] = __fmul_rn(fabs_f(x[i]), rs);
#else
    for (int i = 0; i < n; ++i) y[i] = fabs_f(x[i]) * rs;
#endif
  } else if (path == DivPath::kReciprocal) {
    for (int i = 0; i < n; ++i) y[i] = div_rn_by_reciprocal(fabs_f(x[i]), s, rs);
  } else {
    for (int i = 0; i < n; ++i) y[i] = fabs_f(x[i]) / s;
  }
}
MLAKV_HD float with_sign_of(float mag, float x) {
  return f32_from_bits((f32_bits(mag) & 0x7FFFFFFFu) | (f32_bits(x) & 0x80000000u));
}

// Sixteen fp8_ds_mla codes (fp8_quantize(x[i], s)) as four little-endian u32, s the tile
// scale (> 0: fp8_tile_scale never returns less than FLT_MIN).
MLAKV_HD void fp8_codes16(const float* x, float s, float max_abs_x, uint32_t* w) {
  const float rs = reciprocal_rn(s);
  float y[16];
  abs_div_n<16>(x, s, rs, div_path(s, max_abs_x, rs), y);
  for (int k = 0; k < 4; ++k) {
    const float* xk = x + 4 * k;
    const float* yk = y + 4 * k;
    w[k] = e4m3x2_satfinite(with_sign_of(yk[0], xk[0]), with_sign_of(yk[1], xk[1])) |
           (e4m3x2_satfinite(with_sign_of(yk[2], xk[2]), with_sign_of(yk[3], xk[3])) << 16);
  }
}

// One 16-dim nvfp4 group as encode_nvfp4_latent writes it: the scale code (returned) and
// the 8 code bytes (two little-endian u32), for the divisor s > 0 (s_l, or s_t).
// max_abs_x: the group's max |x| where the caller has it (token-scale mode), else < 0.
MLAKV_HD uint8_t nvfp4_group_fast(const float* x, float s, uint32_t* w, float max_abs_x = -1.0f) {
  namespace N = layout::nvfp4_ds_mla;
  static_assert(N::kGroupDim == 16);
  const float rs = reciprocal_rn(s);
  DivPath path = div_path(s, 0.0f, rs);
  if (path != DivPath::kPow2) {
    float amax_x = max_abs_x;
    if (amax_x < 0.0f) {
      amax_x = 0.0f;
      for (int i = 0; i < 16; ++i) amax_x = fmax_nonnan(amax_x, fabs_f(x[i]));
    }
    path = div_path(s, amax_x, rs);
  }
  float y[16];  // |x| / s; max is exact, so amax_y is the scalar codec's amax of |y|
  abs_div_n<16>(x, s, rs, path, y);
  float amax_y = 0.0f;
  for (int i = 0; i < 16; ++i) amax_y = fmax_nonnan(amax_y, y[i]);
  const uint8_t sf_code = nvfp4_group_scale_code_fast(amax_y);
  const float sf = e4m3_to_f32_fast(sf_code);
  w[0] = w[1] = 0;
  if (sf == 0.0f) return sf_code;  // nvfp4_quantize: zero codes, no sign
  // sf in [2^-9, 448]: div_rn_by_e4m3 is exact for every |y| >= 2^-12, i.e. every element
  // whose code can be non-zero (q >= 1/8), and the tiny rest stays tiny (code 0); y <= 2^120. After the
  // IEEE path y may be huge or Inf: the IEEE division again.
  float q[16];
  if (path == DivPath::kIeee) {
    for (int i = 0; i < 16; ++i) q[i] = y[i] / sf;
  } else {
    const float rsf = reciprocal_rn(sf);
    for (int i = 0; i < 16; ++i) q[i] = div_rn_by_e4m3(y[i], sf, rsf);
  }
  for (int i = 0; i < 16; ++i) {
    const uint32_t c = e2m1_code(fabs_f(q[i]), x[i]);
    w[i / 8] |= c << (4 * (i % 8));
  }
  return sf_code;
}

// The 368 B records' two rope codes of one writer lane (v0 in the low byte, v1 in the next;
// on the device the two bytes above them are not specified), with rs the
// record's rope scale (rope_fp8_scale / rope_int8_scale of the rope's max |v|, >= 0):
// rope_fp8_quantize / rope_int8_quantize of each. The division: through the reciprocal
// wherever div_path allows it (rs in [2^-60, 2^100], max |v| / rs <= 2^119), powers of two
// included - there div_rn_by_reciprocal is the exact product RN(|v| rrs) too wherever the
// quotient is normal and |v| >= 2^-100, and both are below 2^-40 elsewhere (code 0 with
// the sign of v either way) - else div_path's pow2 / IEEE paths. The int8 rounding:
// RN(q + 1.5 * 2^23) for |q| <= 127 is rint(q) (ulp 1 there, ties to even) in the low
// byte of its bits as two's complement (the mantissa is 2^22 + rint(q)).
MLAKV_HD float fmin_nonnan(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fminf(a, b);
#else
  return a < b ? a : b;
#endif
}
template <KvFormat F>
MLAKV_HD uint32_t rope_codes2(float v0, float v1, float rs, float max_abs_v) {
  static_assert(F == KvFormat::kNvfp4DsMlaFp8Rope || F == KvFormat::kNvfp4DsMlaInt8Rope);
  if (rs == 0.0f) return 0;
  const float rrs = reciprocal_rn(rs);
  const float v[2] = {v0, v1};
  float y[2];
  if (rs >= 8.67361738e-19f && rs <= 1.26765060e+30f && max_abs_v * rrs <= 6.64613997e+35f) {
    for (int i = 0; i < 2; ++i) y[i] = div_rn_by_reciprocal(fabs_f(v[i]), rs, rrs);
  } else {
    abs_div_n<2>(v, rs, rrs, div_path(rs, max_abs_v, rrs), y);
  }
  if constexpr (F == KvFormat::kNvfp4DsMlaFp8Rope) {
    return e4m3x2_satfinite(with_sign_of(y[0], v0), with_sign_of(y[1], v1));
  } else {
    constexpr float kMax = static_cast<float>(layout::nvfp4_ds_mla_int8rope::kInt8Max);
    constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
    uint32_t r[2];
    for (int i = 0; i < 2; ++i) {
      // y >= 0: its bits with the sign bit of v are -y for negative v.
      const float q = f32_from_bits(f32_bits(fmin_nonnan(y[i], kMax)) | (f32_bits(v[i]) & 0x80000000u));
#if defined(__CUDA_ARCH__)
      r[i] = f32_bits(__fadd_rn(q, kRound));
#else
      r[i] = f32_bits(q + kRound);
#endif
    }
#if defined(__CUDA_ARCH__)
    return __byte_perm(r[0], r[1], 0x0040);  // bytes r0.0, r1.0 (the two above: not specified)
#else
    return (r[0] & 0xFFu) | ((r[1] & 0xFFu) << 8);
#endif
  }
}

// ---- the writers' nvfp4 fast path -------------------------------------------------------------
// For a group whose scale is a normal, unsaturated e4m3 value (sf_code >= 8 and the group's
// max |x / s| <= 6.375 * 448), every element's quotient q = RN(|y| / sf) is below 6.4 (sf
// is within 2^-4 of amax_y / 6), so the e2m1 rounding needs no clamp, and the divisions by
// s are one of two kinds (Nvfp4Fast, fixed per launch or per token):
//   kPow2: s a power of two in [2^-64, 2^64] (a static s_l). y = |x| / s = |x| rs is exact
//     wherever q can be non-zero (y >= 2^-12), and div_rn_by_e4m3(y, sf, 1/sf) commutes
//     with scaling y, sf and 1/sf by s (every intermediate stays normal: the remainder is a
//     multiple of 2^-54 when non-zero and s >= 2^-64), so q = div_rn_by_e4m3(|x|, sf s,
//     rsf rs): one multiplication less per element. Below y = 2^-12 both q are below 2^-6
//     (code 0 with the sign of x).
//   kReciprocal: s in [2^-60, 2^100] (s_t, or a static s_l that is no power of two) with
//     max |x| rs <= 2^119: y = div_rn_by_reciprocal(|x|, s, rs) as div_path's reciprocal
//     path, then div_rn_by_e4m3 as nvfp4_group_fast (for a power-of-two s the same y
//     wherever it can matter, as rope_codes2 says).
// nvfp4_fast_applies says where a group may take it; elsewhere nvfp4_group_fast. The
// writers take it for a whole warp at once (every lane's group applies), so a lane that
// applies may also take nvfp4_group_fast: both give the scalar codec's bytes.
enum class Nvfp4Fast : uint8_t { kNone, kPow2, kReciprocal };
MLAKV_HD Nvfp4Fast nvfp4_fast_mode(float s) {
  if ((f32_bits(s) & 0x7FFFFFu) == 0 && s >= 5.42101086e-20f && s <= 1.84467441e+19f) return Nvfp4Fast::kPow2;
  if (s >= 8.67361738e-19f && s <= 1.26765060e+30f) return Nvfp4Fast::kReciprocal;
  return Nvfp4Fast::kNone;
}
// The group's max |x / s| from its max |x| (mode != kNone; equal to the max of the y above
// wherever nvfp4_fast_applies).
MLAKV_HD float nvfp4_fast_amax_y(Nvfp4Fast mode, float amax_x, float s, float rs) {
#if defined(__CUDA_ARCH__)
  return mode == Nvfp4Fast::kPow2 ? __fmul_rn(amax_x, rs) : div_rn_by_reciprocal(amax_x, s, rs);
#else
  return mode == Nvfp4Fast::kPow2 ? amax_x * rs : div_rn_by_reciprocal(amax_x, s, rs);
#endif
}
MLAKV_HD bool nvfp4_fast_applies(Nvfp4Fast mode, uint8_t sf_code, float amax_y, float amax_x, float rs) {
  constexpr uint8_t kMinNormalCode = 8;  // 2^-6
  const bool reciprocal_ok = mode != Nvfp4Fast::kReciprocal || amax_x * rs <= 6.64613997e+35f;
  return mode != Nvfp4Fast::kNone && sf_code >= kMinNormalCode && amax_y <= 2856.0f && reciprocal_ok;
}
// The e2m1 magnitude code of 0 <= q < 7 (f32_to_e2m1_satfinite(q) & 7, no clamp needed)
// in floating point, as the float 2^23 + code: e2m1's values are 0.5 apart below 2, 1 apart
// in [2, 4) and 2 apart from 4, so the code is RNE(2q) below 2, RNE(q) + 2 in [2, 4) and
// RNE(q / 2) + 4 from 4 (ties to even values are ties to even codes), and each of those is
// the least of the three everywhere it applies (2q <= q + 2 iff q <= 2, q + 2 <= q / 2 + 4
// iff q <= 4, q / 2 + 4 <= 2q iff q >= 8/3; RNE is monotonic). Each is one rounding of
// 2^23 + (its argument) to an integer (ulp 1 in [2^23, 2^24)). Three operations on the FMA
// pipe and two maxima instead of the integer rounding's seven on the ALU pipe.
MLAKV_HD float e2m1_code_below7_f(float q) {
#if defined(__CUDA_ARCH__)
  const float b = __fadd_rn(q, 8388610.0f);
#else
  const float b = q + 8388610.0f;
#endif
  const float a = fma_f(q, 2.0f, 8388608.0f), c = fma_f(q, 0.5f, 8388612.0f);
  return fmin_nonnan(fmin_nonnan(a, b), c);
}
// The group's 8 code bytes (two little-endian u32) on the fast path: b = sf s and rb =
// RN(1/sf) rs for kPow2, b = sf and rb = RN(1/sf) for kReciprocal. Each word packs eight
// nibbles: the codes through a multiply-add chain over the bits 0x4B000000 + code of
// e2m1_code_below7_f (the chain's sum of those offsets, 0x4B000000 (1 + 16) mod 2^32 =
// 0xFB000000, subtracted once), the sign bits (e2m1_code's sign, from x) through a funnel
// shift of each element's top nibble.
MLAKV_HD void nvfp4_group_codes_fast(Nvfp4Fast mode, const float* x, float s, float rs, float b, float rb, uint32_t* w) {
  constexpr uint32_t kOffsets = 0xFB000000u;
  for (int k = 0; k < 2; ++k) {
    uint32_t codes = 0, signs = 0;
    for (int j = 7; j >= 0; --j) {
      const float xv = x[8 * k + j];
      const float y = mode == Nvfp4Fast::kPow2 ? fabs_f(xv) : div_rn_by_reciprocal(fabs_f(xv), s, rs);
      codes = codes * 16u + f32_bits(e2m1_code_below7_f(div_rn_by_e4m3(y, b, rb)));
      signs = (signs << 4) | (f32_bits(xv) >> 28);
    }
    w[k] = (codes - kOffsets) | (signs & 0x88888888u);
  }
}

// ---- the nvfp4 scale search (Nvfp4ScaleMode::kSearch, mlakv/codec.h) -------------------------
// Float32 operations rounded once each and never fused into a multiply-add: on the device
// the _rn intrinsics (which nvcc does not contract), on the host one operation per inline
// function (GCC in ISO C++ mode, the project's, does not contract at all; clang's default
// contracts only within one expression).
MLAKV_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MLAKV_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
MLAKV_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// The squared reconstruction error of one 16-dim group at group scale code c (0..0x7E),
// from a[i] = |y_i| (y = latent / s, the quotients the record quantizes), in float32:
//   sf  = e4m3_to_f32(c)
//   q_i = RN(a_i / sf)                 the IEEE quotient (as the record's codes take it)
//   m_i = e2m1_rn_satfinite(q_i)       the magnitude code the record would hold
//   d_i = a_i - e2m1_to_f32(m_i) * sf  (the product is exact: 2 x 4 significant bits)
//   p_i = d_i * d_i
//   p_j = p_j + p_{j+h} for h = 8, 4, 2, 1 (every j < h), the error is p_0
// (code 0: sf = 0, every code zero, d_i = a_i). Each step is one float32 rounding and the
// summation order is this fixed tree, so every writer computes the same float: the SIMD
// writer runs it one group per vector lane (every step a vertical operation), the CUDA
// writer's lane runs this function. The 16 magnitude codes come back packed in
// mag[2] (element i in bits [4 (i % 8), 4 (i % 8) + 3) of word i / 8, the sign bits clear).
MLAKV_HD float nvfp4_group_sq_error(const float* a, uint32_t c, uint32_t* mag) {
  mag[0] = mag[1] = 0;
  const float sf = c == 0 ? 0.0f : e4m3_to_f32_fast(c);
#if defined(__CUDA_ARCH__)
  const float rsf = c == 0 ? 0.0f : reciprocal_rn(sf);
#endif
  // p_i for one element (and its magnitude code into mag).
  auto sq = [&](int i) {
    if (c == 0) return mul_rn(a[i], a[i]);
#if defined(__CUDA_ARCH__)
    // div_rn_by_e4m3 is the IEEE quotient for a >= 2^-12 and a / sf <= 2^120 (a <= 2^111
    // with sf >= 2^-9); below 2^-12 both quotients are below 2^-3, code 0 (and d = a).
    const float q = a[i] <= 0x1p111f ? div_rn_by_e4m3(a[i], sf, rsf) : __fdiv_rn(a[i], sf);
    const uint32_t m = e2m1_magnitude_code_bits(q) & 7u;
#else
    const float q = a[i] / sf;
    const uint32_t m = f32_to_e2m1_satfinite(q) & 7u;
#endif
    const float r = mul_rn(e2m1_to_f32(static_cast<uint8_t>(m)), sf);
    const float d = sub_rn(a[i], r);
    mag[i / 8] |= m << (4 * (i % 8));
    return mul_rn(d, d);
  };
  // The tree's first level as the elements are squared (s_j = p_j + p_{j+8}: 8 partial sums
  // live instead of 16 squares), then h = 4, 2, 1 on them: the same additions.
  float s8[8];
  for (int j = 0; j < 8; ++j) {
    const float lo = sq(j);
    s8[j] = add_rn(lo, sq(j + 8));
  }
  for (int h = 4; h >= 1; h /= 2) {
    for (int j = 0; j < h; ++j) s8[j] = add_rn(s8[j], s8[j + h]);
  }
  return s8[0];
}

// Nvfp4ScaleMode::kSearch's scale code for a group whose round-to-nearest code is c0
// (nvfp4_group_scale_code of its max |y|, 0..0x7E): among c0, c0 - 1 (where >= 1) and
// c0 + 1 (where <= 0x7E, the largest finite e4m3), the one with the least
// nvfp4_group_sq_error; ties go to c0, then to the lower code (c0 is taken first, then
// c0 - 1, then c0 + 1, each replacing the best only when its error is strictly less). An
// all-zero group keeps code 0. mag: the chosen code's magnitude codes (as
// nvfp4_group_sq_error).
MLAKV_HD uint8_t nvfp4_search_scale_code(const float* a, uint32_t c0, uint32_t* mag) {
  uint32_t best = c0;
  float best_err = nvfp4_group_sq_error(a, c0, mag);
  uint32_t m[2];
  if (c0 >= 2) {
    const float e = nvfp4_group_sq_error(a, c0 - 1, m);
    if (e < best_err) best_err = e, best = c0 - 1, mag[0] = m[0], mag[1] = m[1];
  }
  if (c0 + 1 <= 0x7Eu) {
    const float e = nvfp4_group_sq_error(a, c0 + 1, m);
    if (e < best_err) best_err = e, best = c0 + 1, mag[0] = m[0], mag[1] = m[1];
  }
  return static_cast<uint8_t>(best);
}

// One 16-dim group in Nvfp4ScaleMode::kSearch as encode_nvfp4_latent writes it, for the
// writers: the chosen scale code (returned) and the 8 code bytes (two little-endian u32),
// for a static divisor s > 0 (the search does not apply in token-scale mode); max_abs_x the
// group's max |x|. y = |x| / s is the IEEE quotient on every path: the exact product by
// RN(1/s) for a power-of-two s, div_rn_by_reciprocal where div_path allows it and |x| >=
// 2^-100 (below a subnormal quotient only: its square is 0 and its code 0 either way), the
// IEEE division elsewhere; then the spec's nvfp4_search_scale_code on y, and the codes of
// the chosen scale with the signs of x (none for code 0).
MLAKV_HD float div_ieee(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
MLAKV_HD uint8_t nvfp4_group_search_fast(const float* x, float s, float max_abs_x, uint32_t* w) {
  // The sign bits first (e2m1_code's, bit 3 of each nibble), so x is dead during the search.
  uint32_t signs[2];
  for (int k = 0; k < 2; ++k) {
    uint32_t sg = 0;
    for (int j = 7; j >= 0; --j) sg = (sg << 4) | (f32_bits(x[8 * k + j]) >> 28);
    signs[k] = sg & 0x88888888u;
  }
  const float rs = reciprocal_rn(s);
  const DivPath path = div_path(s, max_abs_x, rs);
  float y[16];
  float amax_y = 0.0f;
  for (int i = 0; i < 16; ++i) {
    const float ax = fabs_f(x[i]);
    if (path == DivPath::kPow2) {
      y[i] = mul_rn(ax, rs);
    } else if (path == DivPath::kReciprocal && ax >= 7.88860905e-31f) {  // 2^-100
      y[i] = div_rn_by_reciprocal(ax, s, rs);
    } else {
      y[i] = div_ieee(ax, s);
    }
    amax_y = fmax_nonnan(amax_y, y[i]);
  }
  uint32_t mag[2];
  const uint8_t c = nvfp4_search_scale_code(y, nvfp4_group_scale_code_fast(amax_y), mag);
  w[0] = w[1] = 0;
  if (c == 0) return c;  // nvfp4_quantize: zero codes, no sign
  w[0] = mag[0] | signs[0];
  w[1] = mag[1] | signs[1];
  return c;
}

// ---- the nvfp4 scale search's screened path (the CUDA writers) --------------------------------
// nvfp4_search_scale_code's choice and codes without its three exact quantizations, for a
// group whose RN code c0 is in [9, 0x7E] and whose max |y| is at most 2856
// (nvfp4_search_fast_applies): the candidates c0 - 1 (>= 8), c0 and c0 + 1 (<= 0x7E) are then
// normal e4m3 values, two consecutive ones within a factor 9/8, and every candidate's
// quotient q = |y| / sf below 6.4 * 9/8 = 7.2 (sf_c0 is within 2^-4 of amax / 6).
//
// One magic number per element, shared by the candidates (nvfp4_search_magic): M = 2^22 P with
// P = 1, 2 or 4 where the RN candidate's quotient times 1 + 2^-7 is below 2, below 4, or not.
// RN(q + M) rounds q to a multiple of ulp(M) = P / 2 (ties to the even multiple), and in the
// range each P leaves every candidate's quotient that is the e2m1 rounding, ties included:
//   P = 1: q_c0 < 1.9845, every q < 1.9845 * 9/8 = 2.2326: e2m1's 0.5 grid below 2.25;
//   P = 2: every q in [1.9845 * 8/9, 3.969 * 9/8] = [1.764, 4.466]: e2m1 rounds to 2, 3 or 4
//          there, the unit grid's points (midpoints 2.5 and 3.5, ties to the even one);
//   P = 4: every q >= 3.969 * 8/9 = 3.528: e2m1 rounds to 4 or 6 there, the even grid's
//          (midpoint 5, to 4), with the value capped at 6 (e2m1 saturates; only RN - 1 passes 7).
// The grid value v = RN(q + M) - M is exact, and so is the code: RN(q + M)'s bits are M's plus
// k = v / (P / 2), and the e2m1 code is k + 2 log2(P) (nvfp4_search_codes_at).
//
// The screen (nvfp4_search_group) computes each candidate's error in four float32 operations
// per element: t = RN(a rsf + M), v = t - M, r = RN(a - v sf), acc = RN(r^2 + acc), with a =
// |y| and rsf = RN(1/sf). It rounds the exact product a rsf instead of RN(a / sf); both are
// within u (a / sf) of a / sf (u = 2^-24), so the two grid values differ only across an e2m1
// midpoint mu with |a - mu sf| <= u a, where the two distances to the grid differ by at most
// 2 u a and are at least (w / 2) sf - u a (w the cell, mu / w <= 3.5): each square within
// 28.1 u of the spec's. With the spec's 7 roundings per square and the screen's 18 (its running
// sum) the screened error E' is within 53.4 u E' (+ 2^-140 for float32 subnormals) of the
// spec's E. A comparison is decided where |E'_a - E'_b| > 2^-16 max(E'_a, E'_b) + 2^-100
// (2^-16 = 256 u, 2.4 times the two errors' bounds): there E_a - E_b has the sign of
// E'_a - E'_b and is not 0, so the spec's strict comparisons (RN - 1 replaces RN where less,
// RN + 1 the best where less) take the same branches. Elsewhere (near ties: ~3e-5 of Gaussian
// groups) the screen returns -1 and the caller runs the spec.
//
// The writer may fold a power-of-two divisor s in [2^-16, 2^16] into the constants: a = |x|,
// sf -> sf s, rsf -> RN(1/sf) / s. Every grid rounding is then the same (the products are the
// same reals), the errors are s^2 times the unfolded ones wherever no float32 subnormal is
// involved, and the spec's subnormal slack (2^-140) times s^2 <= 2^32 stays below 2^-100; the
// codes' quotients are nvfp4_group_codes_fast's kPow2 fold.
constexpr uint32_t kNvfp4SearchMinCode = 9;
constexpr float kNvfp4SearchTau = 0x1p-16f, kNvfp4SearchAlpha = 0x1p-100f;
// 2^22 (1 + 2^-7): RN(1/sf_c0) times this is the magic's scale.
constexpr float kNvfp4SearchMagicScale = 4227072.0f;
MLAKV_HD bool nvfp4_search_fast_applies(uint32_t c0, float amax_y) {
  return c0 >= kNvfp4SearchMinCode && amax_y <= 2856.0f;
}
// The divisors the writer folds (above).
MLAKV_HD bool nvfp4_search_folds(float s) {
  return (f32_bits(s) & 0x7FFFFFu) == 0 && s >= 1.52587891e-05f && s <= 65536.0f;
}
// M for one element: k0 = RN(RN(1/sf_c0) kNvfp4SearchMagicScale) (folded: RN(1/sf_c0) / s
// instead of RN(1/sf_c0)). RN(a k0) is within 3u of 2^22 (1 + 2^-7) q_c0, far from the
// ranges' edges above (0.7% and more); its binade, floored at 2^22's, is 2^22 P.
MLAKV_HD float nvfp4_search_magic(float a, float k0) {
  const float z = fmax_nonnan(mul_rn(a, k0), 4194304.0f);
  return f32_from_bits(f32_bits(z) & 0x7F800000u);
}
// One element's term of a candidate's screened error: acc + (a - v sf)^2, kClamp for RN - 1.
template <bool kClamp>
MLAKV_HD float nvfp4_search_term(float a, float m, float sf, float rsf, float acc) {
  float v = sub_rn(fma_f(a, rsf, m), m);
  if constexpr (kClamp) v = fmin_nonnan(v, 6.0f);
  const float r = fma_f(-v, sf, a);
  return fma_f(r, r, acc);
}
// Whether the screen tells E_a from E_b (above).
MLAKV_HD bool nvfp4_search_decided(float ea, float eb) {
  return fabs_f(sub_rn(ea, eb)) > fma_f(fmax_nonnan(ea, eb), kNvfp4SearchTau, kNvfp4SearchAlpha);
}
// The sign bits of 16 elements as the record's nibbles hold them (bit 3 of each; word k for
// elements 8k .. 8k + 7).
MLAKV_HD void nvfp4_group_signs(const float* x, uint32_t* signs) {
  for (int k = 0; k < 2; ++k) {
    uint32_t sg = 0;
    for (int j = 7; j >= 0; --j) sg = (sg << 4) | (f32_bits(x[8 * k + j]) >> 28);
    signs[k] = sg & 0x88888888u;
  }
}
// The 8 code bytes (two little-endian u32) at candidate scale sf (rsf = RN(1/sf), either
// folded) from a[16] and the elements' magic numbers m[16]: q = div_rn_by_e4m3(a, sf, rsf) (the
// IEEE quotient for a >= 2^-12 - below, both quotients below 2^-6: code 0 either way), t =
// min(RN(q + M), 2^24 + 6) (e2m1's saturation: only P = 4 reaches 2^24 + 8), and the code
// k + 2p (p = log2 P) of each nibble as two sums per four elements, in the low 16 bits of
//   sum_j bits(t_j) 16^j  (bits(t) = bits(M) + k: M's bits start at bit 23, past four
//                          nibbles, whatever the multiplier)
//   + sum_j bits(M_j) >> (22 - 4j)  (= 2 e_j 16^j, e = 149 + p M's exponent field)
//   + 0x2236                        (-298 (1 + 16 + 256 + 4096) mod 2^16: the 2 * 149s),
// then the signs.
MLAKV_HD void nvfp4_search_codes_at(const float* a, const float* m, float sf, float rsf, const uint32_t* signs,
                                    uint32_t* w) {
  uint32_t half[4];
  for (int h = 0; h < 4; ++h) {
    uint32_t acc = 0x2236u;
    for (int j = 0; j < 4; ++j) {
      const int i = 4 * h + j;
      const float t = fmin_nonnan(add_rn(div_rn_by_e4m3(a[i], sf, rsf), m[i]), 16777222.0f);
      acc += f32_bits(t) * (1u << (4 * j)) + (f32_bits(m[i]) >> (22 - 4 * j));
    }
    half[h] = acc;
  }
  w[0] = ((half[0] & 0xFFFFu) | (half[1] << 16)) | signs[0];
  w[1] = ((half[2] & 0xFFFFu) | (half[3] << 16)) | signs[1];
}
// The screened search of one group: a[16] = |y| (or |x|, folded), c0 its RN code
// (nvfp4_search_fast_applies), sf[k] / rsf[k] the value and RN(1/value) of code c0 - 1 + k
// (either folded; for c0 = 0x7E, k = 2 may be anything finite: RN + 1 is not a candidate),
// signs its sign words. Returns the spec's code and writes its 8 code bytes to w, or returns
// -1 (undecided: w unset).
MLAKV_HD int nvfp4_search_group(const float* a, uint32_t c0, const float* sf, const float* rsf, const uint32_t* signs,
                                uint32_t* w) {
  const float k0 = mul_rn(rsf[1], kNvfp4SearchMagicScale);
  float m[16];
  float em = 0.0f, e0 = 0.0f, ep = 0.0f;
  for (int i = 0; i < 16; ++i) {
    m[i] = nvfp4_search_magic(a[i], k0);
    em = nvfp4_search_term<true>(a[i], m[i], sf[0], rsf[0], em);
    e0 = nvfp4_search_term<false>(a[i], m[i], sf[1], rsf[1], e0);
    ep = nvfp4_search_term<false>(a[i], m[i], sf[2], rsf[2], ep);
  }
  const bool has_p = c0 < 0x7Eu;
  const bool down = em < e0;
  const float best = down ? em : e0;
  const bool up = has_p && ep < best;
  if (!nvfp4_search_decided(em, e0) || (has_p && !nvfp4_search_decided(ep, best))) return -1;
  // (selected, not indexed: a dynamic index would put sf and rsf in local memory on the device)
  const float sfc = up ? sf[2] : (down ? sf[0] : sf[1]), rsfc = up ? rsf[2] : (down ? rsf[0] : rsf[1]);
  nvfp4_search_codes_at(a, m, sfc, rsfc, signs, w);
  return static_cast<int>(up ? c0 + 1 : (down ? c0 - 1 : c0));
}

// ---- whole records -------------------------------------------------------------------
// latent[kLatentDim], rope[kRopeDim] float32 in; rec[record_bytes] out (every byte
// written, pads zero). For bf16 the geometry is (latent_dim, rope_dim).
MLAKV_HD void encode_bf16_record(const float* latent, int latent_dim, const float* rope, int rope_dim,
                                 uint8_t* rec) {
  for (int i = 0; i < latent_dim; ++i) store_u16(rec + 2 * i, f32_to_bf16(latent[i]));
  for (int i = 0; i < rope_dim; ++i) store_u16(rec + 2 * (latent_dim + i), f32_to_bf16(rope[i]));
}

MLAKV_HD void encode_fp8_record(const float* latent, const float* rope, Fp8ScaleMode mode, uint8_t* rec) {
  namespace F = layout::fp8_ds_mla;
  for (int t = 0; t < F::kNumTiles; ++t) {
    const float* x = latent + t * F::kTileDim;
    float amax = 0.0f;
    for (int i = 0; i < F::kTileDim; ++i) amax = fmax_f(amax, fabs_f(x[i]));
    const float s = fp8_tile_scale(amax, mode);
    for (int i = 0; i < F::kTileDim; ++i) rec[F::kLatentOffset + t * F::kTileDim + i] = fp8_quantize(x[i], s);
    store_f32(rec + F::kScaleOffset + 4 * t, s);
  }
  for (int i = 0; i < kRopeDim; ++i) store_u16(rec + F::kRopeOffset + 2 * i, f32_to_bf16(rope[i]));
}

// Shared by the nvfp4 records: bytes [0, 288). `outer_scale` is s_l, or the token scale
// s_t in token-scale mode, where 0 (an all-zero latent) writes zero codes and scales.
// `mode`: how each group's scale code is chosen (kSearch: nvfp4_search_scale_code of the
// group's |y|, the elements then quantized at the chosen scale as at any other).
MLAKV_HD void encode_nvfp4_latent(const float* latent, float outer_scale, uint8_t* rec,
                                  Nvfp4ScaleMode mode = Nvfp4ScaleMode::kRn) {
  namespace N = layout::nvfp4_ds_mla;
  if (outer_scale == 0.0f) {
    for (int i = 0; i < N::kLatentBytes; ++i) rec[N::kLatentOffset + i] = 0;
    for (int g = 0; g < N::kNumGroups; ++g) rec[N::kScaleOffset + g] = 0;
    return;
  }
  for (int g = 0; g < N::kNumGroups; ++g) {
    float y[N::kGroupDim];
    float amax = 0.0f;
    for (int i = 0; i < N::kGroupDim; ++i) {
      y[i] = latent[g * N::kGroupDim + i] / outer_scale;
      amax = fmax_f(amax, fabs_f(y[i]));
    }
    uint8_t sf_code = nvfp4_group_scale_code(amax);
    if (mode == Nvfp4ScaleMode::kSearch) {
      float a[N::kGroupDim];
      for (int i = 0; i < N::kGroupDim; ++i) a[i] = fabs_f(y[i]);
      uint32_t mag[2];
      sf_code = nvfp4_search_scale_code(a, sf_code, mag);
    }
    const float sf = e4m3_to_f32(sf_code);
    for (int i = 0; i < N::kGroupDim; i += 2) {
      const uint8_t lo = nvfp4_quantize(y[i], sf), hi = nvfp4_quantize(y[i + 1], sf);
      rec[N::kLatentOffset + (g * N::kGroupDim + i) / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
    rec[N::kScaleOffset + g] = sf_code;
  }
}

// The latent bytes [0, 288) and, in token-scale mode, s_t at [292, 296) (the caller has
// zeroed the pad first). The token-scale mode is the fork's encoder: its group scales are
// always round-to-nearest (check_nvfp4_scales rejects kSearch with it before any encoder
// runs; here it is ignored).
MLAKV_HD void encode_nvfp4_latent_mode(const float* latent, float outer_scale, bool token_scale, uint8_t* rec,
                                       Nvfp4ScaleMode mode = Nvfp4ScaleMode::kRn) {
  if (token_scale) {
    const float st = nvfp4_token_scale(latent);
    encode_nvfp4_latent(latent, st, rec);
    store_f32(rec + layout::nvfp4_token_scale::kOffset, st);
  } else {
    encode_nvfp4_latent(latent, outer_scale, rec, mode);
  }
}

MLAKV_HD void encode_nvfp4_record(const float* latent, const float* rope, float outer_scale, uint8_t* rec,
                                  bool token_scale = false, Nvfp4ScaleMode mode = Nvfp4ScaleMode::kRn) {
  namespace N = layout::nvfp4_ds_mla;
  for (int i = 0; i < N::kPadBytes; ++i) rec[N::kPadOffset + i] = 0;
  encode_nvfp4_latent_mode(latent, outer_scale, token_scale, rec, mode);
  for (int i = 0; i < kRopeDim; ++i) store_u16(rec + N::kRopeOffset + 2 * i, f32_to_bf16(rope[i]));
}

// The two 368 B records (same layout): e4m3 rope with rs = amax / 448, or int8 rope with
// rs = amax / 127.
template <KvFormat F>
MLAKV_HD void encode_nvfp4_scaled_rope_record(const float* latent, const float* rope, float outer_scale, uint8_t* rec,
                                              bool token_scale, Nvfp4ScaleMode mode = Nvfp4ScaleMode::kRn) {
  static_assert(F == KvFormat::kNvfp4DsMlaFp8Rope || F == KvFormat::kNvfp4DsMlaInt8Rope);
  namespace N = layout::nvfp4_ds_mla_fp8rope;  // the int8 record's layout too
  for (int i = 0; i < N::kPadBytes; ++i) rec[N::kPadOffset + i] = 0;
  encode_nvfp4_latent_mode(latent, outer_scale, token_scale, rec, mode);
  float amax = 0.0f;
  for (int i = 0; i < kRopeDim; ++i) amax = fmax_f(amax, fabs_f(rope[i]));
  if constexpr (F == KvFormat::kNvfp4DsMlaFp8Rope) {
    const float rs = rope_fp8_scale(amax);
    store_f32(rec + N::kRopeScaleOffset, rs);
    for (int i = 0; i < kRopeDim; ++i) rec[N::kRopeOffset + i] = rope_fp8_quantize(rope[i], rs);
  } else {
    const float rs = rope_int8_scale(amax);
    store_f32(rec + N::kRopeScaleOffset, rs);
    for (int i = 0; i < kRopeDim; ++i) rec[N::kRopeOffset + i] = static_cast<uint8_t>(rope_int8_quantize(rope[i], rs));
  }
}

MLAKV_HD void encode_nvfp4_fp8rope_record(const float* latent, const float* rope, float outer_scale,
                                          uint8_t* rec, bool token_scale = false,
                                          Nvfp4ScaleMode mode = Nvfp4ScaleMode::kRn) {
  encode_nvfp4_scaled_rope_record<KvFormat::kNvfp4DsMlaFp8Rope>(latent, rope, outer_scale, rec, token_scale, mode);
}

MLAKV_HD void encode_nvfp4_int8rope_record(const float* latent, const float* rope, float outer_scale,
                                           uint8_t* rec, bool token_scale = false,
                                           Nvfp4ScaleMode mode = Nvfp4ScaleMode::kRn) {
  encode_nvfp4_scaled_rope_record<KvFormat::kNvfp4DsMlaInt8Rope>(latent, rope, outer_scale, rec, token_scale, mode);
}

MLAKV_HD void encode_f32_record(const float* latent, int latent_dim, const float* rope, int rope_dim, uint8_t* rec) {
  for (int i = 0; i < latent_dim; ++i) store_f32(rec + 4 * i, latent[i]);
  for (int i = 0; i < rope_dim; ++i) store_f32(rec + 4 * (latent_dim + i), rope[i]);
}

// token_scale: the per-token scale mode (nvfp4 formats only; callers validate).
// nvfp4_mode: the nvfp4 group-scale choice (nvfp4 formats outside token-scale mode; callers
// validate with check_nvfp4_scales; ignored elsewhere).
MLAKV_HD void encode_record(KvFormat f, const float* latent, const float* rope, float outer_scale,
                            Fp8ScaleMode fp8_mode, uint8_t* rec, bool token_scale = false,
                            Nvfp4ScaleMode nvfp4_mode = Nvfp4ScaleMode::kRn) {
  visit_format(f, [&](auto tag) {
    constexpr KvFormat F = decltype(tag)::value;
    if constexpr (F == KvFormat::kBf16) {
      encode_bf16_record(latent, kLatentDim, rope, kRopeDim, rec);
    } else if constexpr (F == KvFormat::kFp8DsMla) {
      encode_fp8_record(latent, rope, fp8_mode, rec);
    } else if constexpr (F == KvFormat::kNvfp4DsMla) {
      encode_nvfp4_record(latent, rope, outer_scale, rec, token_scale, nvfp4_mode);
    } else if constexpr (F == KvFormat::kNvfp4DsMlaFp8Rope) {
      encode_nvfp4_fp8rope_record(latent, rope, outer_scale, rec, token_scale, nvfp4_mode);
    } else if constexpr (F == KvFormat::kNvfp4DsMlaInt8Rope) {
      encode_nvfp4_int8rope_record(latent, rope, outer_scale, rec, token_scale, nvfp4_mode);
    } else {
      static_assert(F == KvFormat::kF32);
      encode_f32_record(latent, kLatentDim, rope, kRopeDim, rec);
    }
  });
}

// Decode one record (L=512, R=64 except bf16, which takes its geometry).
MLAKV_HD void decode_bf16_record(const uint8_t* rec, int latent_dim, int rope_dim, float* latent, float* rope) {
  for (int i = 0; i < latent_dim; ++i) latent[i] = bf16_to_f32(load_u16(rec + 2 * i));
  for (int i = 0; i < rope_dim; ++i) rope[i] = bf16_to_f32(load_u16(rec + 2 * (latent_dim + i)));
}

MLAKV_HD void decode_f32_record(const uint8_t* rec, int latent_dim, int rope_dim, float* latent, float* rope) {
  for (int i = 0; i < latent_dim; ++i) latent[i] = load_f32(rec + 4 * i);
  for (int i = 0; i < rope_dim; ++i) rope[i] = load_f32(rec + 4 * (latent_dim + i));
}

MLAKV_HD void decode_nvfp4_latent(const uint8_t* rec, float outer_scale, float* latent) {
  namespace N = layout::nvfp4_ds_mla;
  for (int g = 0; g < N::kNumGroups; ++g) {
    const float sf = e4m3_to_f32(rec[N::kScaleOffset + g]);
    for (int i = 0; i < N::kGroupDim; i += 2) {
      const uint8_t b = rec[N::kLatentOffset + (g * N::kGroupDim + i) / 2];
      latent[g * N::kGroupDim + i] = nvfp4_dequantize(b & 0xFu, sf, outer_scale);
      latent[g * N::kGroupDim + i + 1] = nvfp4_dequantize(b >> 4, sf, outer_scale);
    }
  }
}

// The scale the latent is multiplied by: s_l, or in token-scale mode the record's s_t.
MLAKV_HD float nvfp4_latent_scale(const uint8_t* rec, float outer_scale, bool token_scale) {
  return token_scale ? load_f32(rec + layout::nvfp4_token_scale::kOffset) : outer_scale;
}

MLAKV_HD void decode_record(KvFormat f, const uint8_t* rec, float outer_scale, float* latent, float* rope,
                            bool token_scale = false) {
  visit_format(f, [&](auto tag) {
    constexpr KvFormat F = decltype(tag)::value;
    if constexpr (F == KvFormat::kBf16) {
      decode_bf16_record(rec, kLatentDim, kRopeDim, latent, rope);
    } else if constexpr (F == KvFormat::kFp8DsMla) {
      namespace L8 = layout::fp8_ds_mla;
      for (int t = 0; t < L8::kNumTiles; ++t) {
        const float s = load_f32(rec + L8::kScaleOffset + 4 * t);
        for (int i = 0; i < L8::kTileDim; ++i) {
          latent[t * L8::kTileDim + i] = fp8_dequantize(rec[L8::kLatentOffset + t * L8::kTileDim + i], s);
        }
      }
      for (int i = 0; i < kRopeDim; ++i) rope[i] = bf16_to_f32(load_u16(rec + L8::kRopeOffset + 2 * i));
    } else if constexpr (F == KvFormat::kNvfp4DsMla) {
      decode_nvfp4_latent(rec, nvfp4_latent_scale(rec, outer_scale, token_scale), latent);
      for (int i = 0; i < kRopeDim; ++i) {
        rope[i] = bf16_to_f32(load_u16(rec + layout::nvfp4_ds_mla::kRopeOffset + 2 * i));
      }
    } else if constexpr (F == KvFormat::kNvfp4DsMlaFp8Rope) {
      namespace N = layout::nvfp4_ds_mla_fp8rope;
      decode_nvfp4_latent(rec, nvfp4_latent_scale(rec, outer_scale, token_scale), latent);
      const float rs = load_f32(rec + N::kRopeScaleOffset);
      for (int i = 0; i < kRopeDim; ++i) rope[i] = e4m3_to_f32(rec[N::kRopeOffset + i]) * rs;
    } else if constexpr (F == KvFormat::kNvfp4DsMlaInt8Rope) {
      namespace N = layout::nvfp4_ds_mla_int8rope;
      decode_nvfp4_latent(rec, nvfp4_latent_scale(rec, outer_scale, token_scale), latent);
      const float rs = load_f32(rec + N::kRopeScaleOffset);
      for (int i = 0; i < kRopeDim; ++i) rope[i] = rope_int8_dequantize(rec[N::kRopeOffset + i], rs);
    } else {
      static_assert(F == KvFormat::kF32);
      decode_f32_record(rec, kLatentDim, kRopeDim, latent, rope);
    }
  });
}

}  // namespace mlakv::codec
