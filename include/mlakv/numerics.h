// Number formats used by the KV records and quantized weights: bf16, fp8 e4m3fn,
// e2m1 (fp4) and ue8m0. Header-only and callable from host and CUDA device code, so
// the CPU codecs and the GPU kernels share one definition of every rounding.
//
// Rounding: float32 -> narrow format is round-to-nearest-even everywhere except
// ue8m0, which (as in PTX `cvt.{rz,rp}.ue8m0x2`) rounds toward zero or up.
//
// NaN / Inf policy (chosen to equal NVIDIA's conversions in cuda_bf16.h, cuda_fp8.h
// and cuda_fp4.h bit for bit; tests/numerics_oracle_test.cc checks it):
//   bf16   NaN -> 0x7FFF (canonical, sign dropped); +-Inf stays Inf; overflow rounds
//          to Inf as IEEE does.
//   e4m3   NaN -> 0x7F (sign dropped). |x| > 464 (448 + half an ulp) and +-Inf:
//          satfinite -> +-448 (0x7E/0xFE); nosat -> NaN with x's sign (0x7F/0xFF).
//          Underflow keeps the sign (-tiny -> 0x80).
//   e2m1   always satfinite: |x| > 6 and +-Inf -> +-6; NaN -> +6 (0x7).
//   ue8m0  sign ignored; NaN -> 0xFF; +-Inf and finite overflow: satfinite -> 0xFE,
//          nosat -> 0xFF; 0 and values below 2^-127 -> 0x00 (= 2^-127, the format has
//          no zero) when rounding toward zero.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MLAKV_HD __host__ __device__ __forceinline__
#else
#define MLAKV_HD inline
#endif

namespace mlakv {

// ---- format constants (the single home of these numbers) ---------------------
inline constexpr float kE4m3Max = 448.0f;       // largest finite e4m3fn
inline constexpr float kE4m3MinNormal = 0.015625f;       // 2^-6
inline constexpr float kE4m3MinSubnormal = 0.001953125f; // 2^-9
inline constexpr float kE2m1Max = 6.0f;
inline constexpr uint8_t kE4m3NaN = 0x7F;
inline constexpr uint8_t kE4m3MaxCode = 0x7E;
inline constexpr uint16_t kBf16NaN = 0x7FFF;
inline constexpr uint8_t kUe8m0NaN = 0xFF;

enum class Saturation : uint8_t { kSatFinite, kNoSat };
enum class Ue8m0Rounding : uint8_t { kTowardZero, kUp };

// ---- bit casts -------------------------------------------------------------------
MLAKV_HD uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

MLAKV_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

namespace detail {

// Rounds |x| (given as its float32 bits without sign, finite) to the nearest value of
// a binary format with `mbits` mantissa bits, exponent bias `bias` and subnormals,
// ties to even. Returns the magnitude code (biased exponent << mbits | mantissa),
// which may exceed the format's largest finite code: the caller handles overflow.
MLAKV_HD uint32_t round_to_minifloat(uint32_t abs_bits, int mbits, int bias) {
  const int emin = 1 - bias;  // exponent of the smallest normal
  int e = static_cast<int>(abs_bits >> 23);
  uint32_t m = abs_bits & 0x7FFFFFu;
  if (e == 0) {
    e = -126;  // float32 subnormal: no implicit bit
  } else {
    m |= 0x800000u;
    e -= 127;
  }
  // value = m * 2^(e - 23). A normal target keeps mbits fraction bits; a subnormal
  // target has its quantum at 2^(emin - mbits), i.e. (emin - e) more bits drop.
  int shift = 23 - mbits + (e < emin ? emin - e : 0);
  if (shift > 25) return 0;  // below half the smallest subnormal (m < 2^24)
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rem = m & ((half << 1) - 1u);
  uint32_t q = m >> shift;
  if (rem > half || (rem == half && (q & 1u))) ++q;
  if (e < emin) return q;  // subnormal (q == 2^mbits is the smallest normal's code)
  // q holds the implicit bit: code = (biased_e << mbits) + fraction = ((be - 1) << mbits) + q;
  // a carry out of the fraction lands in the exponent by itself.
  return (static_cast<uint32_t>(e + bias - 1) << mbits) + q;
}

}  // namespace detail

// ---- bf16 ------------------------------------------------------------------------
MLAKV_HD float bf16_to_f32(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

// IEEE binary16 (f16) -> float32, exact (subnormals, Inf and NaN kept).
MLAKV_HD float half_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu) return f32_from_bits(sign | 0x7F800000u | (m << 13));
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24
    return sign != 0u ? -v : v;
  }
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

MLAKV_HD uint16_t f32_to_bf16(float x) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return kBf16NaN;
  // Round to nearest even on the dropped 16 bits; Inf stays Inf, overflow carries into Inf.
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7FFFu + lsb) >> 16);
}

// ---- fp8 e4m3fn (bias 7, no Inf, NaN = S.1111.111) ----------------------------------
MLAKV_HD float e4m3_to_f32(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t mag = c & 0x7Fu;
  if (mag == 0x7Fu) return f32_from_bits(sign | 0x7FC00000u);
  const uint32_t e = mag >> 3, f = mag & 7u;
  if (e == 0) {
    // subnormal: f * 2^-9, exact in float32
    const float v = static_cast<float>(f) * kE4m3MinSubnormal;
    return (c & 0x80u) ? -v : v;
  }
  return f32_from_bits(sign | ((e - 7u + 127u) << 23) | (f << 20));
}

MLAKV_HD uint8_t f32_to_e4m3(float x, Saturation sat) {
  const uint32_t u = f32_bits(x);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return kE4m3NaN;
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  uint32_t code = abs == 0x7F800000u ? 0xFFu : detail::round_to_minifloat(abs, 3, 7);
  if (code > kE4m3MaxCode) code = sat == Saturation::kSatFinite ? kE4m3MaxCode : kE4m3NaN;
  return static_cast<uint8_t>(sign | code);
}

MLAKV_HD uint8_t f32_to_e4m3_satfinite(float x) { return f32_to_e4m3(x, Saturation::kSatFinite); }

// ---- fp4 e2m1 (bias 1; magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6) -------------------------
// Codes are 4 bits (sign in bit 3); the upper bits of the byte are ignored.
MLAKV_HD float e2m1_to_f32(uint8_t c) {
  const uint32_t mag = c & 7u;
  // value = mag/2 for mag < 4 (0, .5, 1, 1.5), then 2, 3, 4, 6
  const float v = mag < 4u ? 0.5f * static_cast<float>(mag)
                           : static_cast<float>((2u + (mag & 1u)) << ((mag >> 1) - 2u));
  return (c & 8u) ? -v : v;
}

MLAKV_HD uint8_t f32_to_e2m1_satfinite(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return 0x7u;  // NaN -> +6
  const uint8_t sign = static_cast<uint8_t>((u >> 28) & 0x8u);
  uint32_t code = abs == 0x7F800000u ? 0x7u : detail::round_to_minifloat(abs, 1, 1);
  if (code > 0x7u) code = 0x7u;
  return static_cast<uint8_t>(sign | code);
}

// ---- ue8m0 (2^(c-127), no zero, 0xFF = NaN) ----------------------------------------
MLAKV_HD float ue8m0_to_f32(uint8_t c) {
  if (c == kUe8m0NaN) return f32_from_bits(0x7FC00000u);
  if (c == 0) return f32_from_bits(0x00400000u);  // 2^-127 is a float32 subnormal
  return f32_from_bits(static_cast<uint32_t>(c) << 23);
}

MLAKV_HD uint8_t f32_to_ue8m0(float x, Ue8m0Rounding rounding, Saturation sat) {
  const uint32_t abs = f32_bits(x) & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return kUe8m0NaN;
  uint32_t code = abs >> 23;  // toward zero: the exponent field (0 for subnormals)
  if (rounding == Ue8m0Rounding::kUp && abs < 0x7F800000u) {
    // up: next power of two unless |x| already is one, or |x| <= 2^-127 (code 0 covers it)
    const bool is_pow2 = (abs & 0x7FFFFFu) == 0;
    if (code != 0 ? !is_pow2 : abs > 0x00400000u) ++code;
  }
  if (code == 0xFFu && sat == Saturation::kSatFinite) code = 0xFEu;
  return static_cast<uint8_t>(code);
}

}  // namespace mlakv
