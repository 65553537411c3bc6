// The sm80 record reader: four threads turn one staged record (any compressed
// format) into one bf16 row of the K tile, the fused dequantization of the attention.
// Quarter q (record::Quarter, common/record_part.cuh) owns latent dims [128q, 128q+128)
// and rope dims [16q, 16q+16). The products are the scalar codec's
// (format/record_codec.h): e4m3 * s; (e2m1 * sf) * s_l (or * s_t, the record's token
// scale, in token-scale mode); e4m3 * rope_scale; int8 * rope_scale; each then rounded
// once to bf16. bf16 records need no reader: the kernel copies them into the
// K tile as they are.
//
// tests/cuda/record_reader_kernels.cu runs these very functions over every code of
// every format and checks them against the scalar codec.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/common/record_part.cuh"
#include "cuda/sm80/attention/config.h"
#include "cuda/sm80/attention/mma.cuh"
#include "mlakv/numerics.h"

namespace mlakv::cuda::sm80 {

__device__ inline void store8_bf16(uint16_t* dst, const float (&v)[8]) {
  uint4 w;
  w.x = ptx::pack_bf16x2(v[0], v[1]);
  w.y = ptx::pack_bf16x2(v[2], v[3]);
  w.z = ptx::pack_bf16x2(v[4], v[5]);
  w.w = ptx::pack_bf16x2(v[6], v[7]);
  *reinterpret_cast<uint4*>(dst) = w;
}

// Four e4m3 bytes (little-endian in x) -> exact floats. The conversion to f16 is
// exact (every e4m3 value is an f16), hardware on sm_89+, emulated before.
__device__ inline void e4m3x4_to_f32(uint32_t x, float (&f)[4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x >> (16 * h)), __NV_E4M3);
    __half_raw lo, hi;
    lo.x = r.x;
    hi.x = r.y;
    f[2 * h] = __half2float(__half(lo));
    f[2 * h + 1] = __half2float(__half(hi));
  }
}

// The nvfp4 code table (shared memory, kLutEntries floats): thread tid < 16 fills
// entry tid. Callers synchronize before the first dequant_part.
__device__ inline void fill_lut(float* lut, int tid) {
  if (tid < kLutEntries) lut[tid] = e2m1_to_f32(static_cast<uint8_t>(tid));
}

// Thread (record r, quarter q in 0..3) turns its quarter of record `rec` into bf16 in
// `row` (the record's K row, kQkDim bf16, 16-byte aligned): latent dims
// [128q, 128q+128) and rope dims [16q, 16q+16). An invalid token becomes zeros (its
// bytes are not read). `lut`: fill_lut's table (nvfp4 formats; unused otherwise).
// token_scale (nvfp4 formats): multiply by the record's s_t instead of `outer`.
template <KvFormat F>
__device__ inline void dequant_part(const float* lut, const uint8_t* rec, bool valid, float outer, int q,
                                    uint16_t* row, bool token_scale = false) {
  static_assert(F != KvFormat::kBf16, "bf16 records are copied into the K tile, not dequantized");
  using P = record::Parts<F>;
  using Q = record::Quarter<F>;
  using QS = record::QuarterScales<F>;
  constexpr int kLat = record::kQuarterLatentDims;  // 128
  constexpr int kRope = record::kQuarterRopeDims;   // 16
  uint16_t* lat = row + kLat * q;
  uint16_t* rop = row + kLatentDim + kRope * q;
  if (!valid) {
    const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < kLat * 2 / 16; ++i) reinterpret_cast<uint4*>(lat)[i] = z;
#pragma unroll
    for (int i = 0; i < kRope * 2 / 16; ++i) reinterpret_cast<uint4*>(rop)[i] = z;
    return;
  }
  if constexpr (F == KvFormat::kFp8DsMla) {
    static_assert(P::kLatentBits == 8 && P::kRopeBits == 16);
    const float s = *reinterpret_cast<const float*>(rec + P::kScaleOffset + QS::kBytes * q);
    const uint8_t* src = rec + P::kLatentOffset + Q::kLatentBytes * q;
#pragma unroll 4
    for (int i = 0; i < kLat; i += 8) {  // 8 codes: one uint2 in, one uint4 of bf16 out
      const uint2 b = *reinterpret_cast<const uint2*>(src + i);
      float v[8], f[4];
      e4m3x4_to_f32(b.x, f);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = f[j] * s;
      e4m3x4_to_f32(b.y, f);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[4 + j] = f[j] * s;
      store8_bf16(lat + i, v);
    }
    const uint4* rs = reinterpret_cast<const uint4*>(rec + P::kRopeOffset + Q::kRopeBytes * q);
    reinterpret_cast<uint4*>(rop)[0] = rs[0];
    reinterpret_cast<uint4*>(rop)[1] = rs[1];
  } else {
    static_assert(is_nvfp4_format(F));
    static_assert(P::kLatentBits == 4 && P::kScaleBytes == 1 && P::kDimsPerScale == 16);
    if (token_scale) outer = *reinterpret_cast<const float*>(rec + record::kTokenScaleOffset);
#pragma unroll 2
    for (int g = 0; g < QS::kScales; ++g) {  // groups 8q .. 8q+7
      const int group = QS::kScales * q + g;
      const float sf = e4m3_to_f32(rec[P::kScaleOffset + group]);
      const uint2 b = *reinterpret_cast<const uint2*>(rec + P::kLatentOffset + QS::kGroupBytes * group);
      float lo[8], hi[8];  // the group's dims [0, 8) from b.x, [8, 16) from b.y
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t x = b.x >> (8 * j), y = b.y >> (8 * j);
        lo[2 * j] = (lut[x & 0xFu] * sf) * outer;
        lo[2 * j + 1] = (lut[(x >> 4) & 0xFu] * sf) * outer;
        hi[2 * j] = (lut[y & 0xFu] * sf) * outer;
        hi[2 * j + 1] = (lut[(y >> 4) & 0xFu] * sf) * outer;
      }
      store8_bf16(lat + P::kDimsPerScale * g, lo);
      store8_bf16(lat + P::kDimsPerScale * g + P::kDimsPerScale / 2, hi);
    }
    if constexpr (F == KvFormat::kNvfp4DsMla) {
      static_assert(P::kRopeBits == 16);
      const uint4* rs = reinterpret_cast<const uint4*>(rec + P::kRopeOffset + Q::kRopeBytes * q);
      reinterpret_cast<uint4*>(rop)[0] = rs[0];
      reinterpret_cast<uint4*>(rop)[1] = rs[1];
    } else {
      static_assert(F == KvFormat::kNvfp4DsMlaFp8Rope || F == KvFormat::kNvfp4DsMlaInt8Rope);
      static_assert(P::kRopeBits == 8);
      const float rsc = *reinterpret_cast<const float*>(rec + P::kRopeScaleOffset);
      const uint4 b = *reinterpret_cast<const uint4*>(rec + P::kRopeOffset + Q::kRopeBytes * q);
      const uint32_t w[4] = {b.x, b.y, b.z, b.w};
      float lo[8], hi[8], f[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (F == KvFormat::kNvfp4DsMlaFp8Rope) {
          e4m3x4_to_f32(w[j], f);
        } else {  // four int8 codes, exact as floats
#pragma unroll
          for (int k = 0; k < 4; ++k) f[k] = static_cast<float>(static_cast<int8_t>(w[j] >> (8 * k)));
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) (j < 2 ? lo : hi)[4 * (j % 2) + k] = f[k] * rsc;
      }
      store8_bf16(rop, lo);
      store8_bf16(rop + kRope / 2, hi);
    }
  }
}

}  // namespace mlakv::cuda::sm80
