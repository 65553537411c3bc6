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
MLAKV_HD float fabs_f(float x) { return f32_from_bits(f32_bits(x) & 0x7FFFFFFFu); }
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
MLAKV_HD void encode_nvfp4_latent(const float* latent, float outer_scale, uint8_t* rec) {
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
    const uint8_t sf_code = nvfp4_group_scale_code(amax);
    const float sf = e4m3_to_f32(sf_code);
    for (int i = 0; i < N::kGroupDim; i += 2) {
      const uint8_t lo = nvfp4_quantize(y[i], sf), hi = nvfp4_quantize(y[i + 1], sf);
      rec[N::kLatentOffset + (g * N::kGroupDim + i) / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
    rec[N::kScaleOffset + g] = sf_code;
  }
}

// The latent bytes [0, 288) and, in token-scale mode, s_t at [292, 296) (the caller has
// zeroed the pad first).
MLAKV_HD void encode_nvfp4_latent_mode(const float* latent, float outer_scale, bool token_scale, uint8_t* rec) {
  if (token_scale) {
    const float st = nvfp4_token_scale(latent);
    encode_nvfp4_latent(latent, st, rec);
    store_f32(rec + layout::nvfp4_token_scale::kOffset, st);
  } else {
    encode_nvfp4_latent(latent, outer_scale, rec);
  }
}

MLAKV_HD void encode_nvfp4_record(const float* latent, const float* rope, float outer_scale, uint8_t* rec,
                                  bool token_scale = false) {
  namespace N = layout::nvfp4_ds_mla;
  for (int i = 0; i < N::kPadBytes; ++i) rec[N::kPadOffset + i] = 0;
  encode_nvfp4_latent_mode(latent, outer_scale, token_scale, rec);
  for (int i = 0; i < kRopeDim; ++i) store_u16(rec + N::kRopeOffset + 2 * i, f32_to_bf16(rope[i]));
}

// The two 368 B records (same layout): e4m3 rope with rs = amax / 448, or int8 rope with
// rs = amax / 127.
template <KvFormat F>
MLAKV_HD void encode_nvfp4_scaled_rope_record(const float* latent, const float* rope, float outer_scale, uint8_t* rec,
                                              bool token_scale) {
  static_assert(F == KvFormat::kNvfp4DsMlaFp8Rope || F == KvFormat::kNvfp4DsMlaInt8Rope);
  namespace N = layout::nvfp4_ds_mla_fp8rope;  // the int8 record's layout too
  for (int i = 0; i < N::kPadBytes; ++i) rec[N::kPadOffset + i] = 0;
  encode_nvfp4_latent_mode(latent, outer_scale, token_scale, rec);
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
                                          uint8_t* rec, bool token_scale = false) {
  encode_nvfp4_scaled_rope_record<KvFormat::kNvfp4DsMlaFp8Rope>(latent, rope, outer_scale, rec, token_scale);
}

MLAKV_HD void encode_nvfp4_int8rope_record(const float* latent, const float* rope, float outer_scale,
                                           uint8_t* rec, bool token_scale = false) {
  encode_nvfp4_scaled_rope_record<KvFormat::kNvfp4DsMlaInt8Rope>(latent, rope, outer_scale, rec, token_scale);
}

MLAKV_HD void encode_f32_record(const float* latent, int latent_dim, const float* rope, int rope_dim, uint8_t* rec) {
  for (int i = 0; i < latent_dim; ++i) store_f32(rec + 4 * i, latent[i]);
  for (int i = 0; i < rope_dim; ++i) store_f32(rec + 4 * (latent_dim + i), rope[i]);
}

// token_scale: the per-token scale mode (nvfp4 formats only; callers validate).
MLAKV_HD void encode_record(KvFormat f, const float* latent, const float* rope, float outer_scale,
                            Fp8ScaleMode fp8_mode, uint8_t* rec, bool token_scale = false) {
  visit_format(f, [&](auto tag) {
    constexpr KvFormat F = decltype(tag)::value;
    if constexpr (F == KvFormat::kBf16) {
      encode_bf16_record(latent, kLatentDim, rope, kRopeDim, rec);
    } else if constexpr (F == KvFormat::kFp8DsMla) {
      encode_fp8_record(latent, rope, fp8_mode, rec);
    } else if constexpr (F == KvFormat::kNvfp4DsMla) {
      encode_nvfp4_record(latent, rope, outer_scale, rec, token_scale);
    } else if constexpr (F == KvFormat::kNvfp4DsMlaFp8Rope) {
      encode_nvfp4_fp8rope_record(latent, rope, outer_scale, rec, token_scale);
    } else if constexpr (F == KvFormat::kNvfp4DsMlaInt8Rope) {
      encode_nvfp4_int8rope_record(latent, rope, outer_scale, rec, token_scale);
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
