// Cache writers: one warp per token, one launch per layer per step. Every rounding
// goes through the host/device primitives of format/record_codec.h, so the bytes equal
// the CPU codec's (tests/cuda/cuda_harness.cc checks it). Lane l of the warp owns the
// record parts common/record_part.cuh names (record::Lane): latent dims [16l, 16l+16),
// rope dims [2l, 2l+2).
#include <cuda_runtime.h>

#include "cuda/common/dispatch_format.h"
#include "cuda/common/record_part.cuh"
#include "cuda/smxx/launch.h"
#include "format/record_codec.h"

namespace mlakv::cuda::kernels {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kLaneDims = record::kLaneLatentDims;  // 16
constexpr int kLaneRope = record::kLaneRopeDims;    // 2
static_assert(record::kWriterLanes == 32, "one warp per record");

// A lane's n (16 or 2) consecutive input elements starting at element `off`, as floats:
// 16-byte (or 8-byte) vector loads when the address allows it - one load instruction
// per 16 bytes instead of one per element, which is what the writer's bandwidth hangs
// on - else element by element. The values are the same either way.
template <int N>
__device__ __forceinline__ void load_run(const void* base, int64_t off, bool bf16, float (&x)[N]) {
  static_assert(N == 16 || N == 2);
  if (bf16) {
    const uint16_t* ptr = static_cast<const uint16_t*>(base) + off;
    if constexpr (N == 16) {
      if ((reinterpret_cast<uintptr_t>(ptr) & 15u) == 0) {
        const uint4 a = __ldg(reinterpret_cast<const uint4*>(ptr)), b = __ldg(reinterpret_cast<const uint4*>(ptr) + 1);
        const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          x[2 * k] = bf16_to_f32(static_cast<uint16_t>(w[k] & 0xFFFFu));
          x[2 * k + 1] = bf16_to_f32(static_cast<uint16_t>(w[k] >> 16));
        }
        return;
      }
    } else {
      if ((reinterpret_cast<uintptr_t>(ptr) & 3u) == 0) {
        const uint32_t w = __ldg(reinterpret_cast<const uint32_t*>(ptr));
        x[0] = bf16_to_f32(static_cast<uint16_t>(w & 0xFFFFu));
        x[1] = bf16_to_f32(static_cast<uint16_t>(w >> 16));
        return;
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = bf16_to_f32(ptr[i]);
  } else {
    const float* ptr = static_cast<const float*>(base) + off;
    if constexpr (N == 16) {
      if ((reinterpret_cast<uintptr_t>(ptr) & 15u) == 0) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float4 v = __ldg(reinterpret_cast<const float4*>(ptr) + k);
          x[4 * k] = v.x;
          x[4 * k + 1] = v.y;
          x[4 * k + 2] = v.z;
          x[4 * k + 3] = v.w;
        }
        return;
      }
    } else {
      if ((reinterpret_cast<uintptr_t>(ptr) & 7u) == 0) {
        const float2 v = __ldg(reinterpret_cast<const float2*>(ptr));
        x[0] = v.x;
        x[1] = v.y;
        return;
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = __ldg(ptr + i);
  }
}

// The latent transform (DeviceLatentTransform), bit-identical to LatentTransformKernel::
// latent / rope: (c - mu) * gain, then fwht's butterflies in its order (h = 1, 2, 4, ...;
// the lower element of a pair gets a + b, the upper a - b). Lane l holds dims
// [16l, 16l + 16) of the latent - stages h < 16 inside the lane, h = 16m across lanes
// l and l ^ m - and dims [2l, 2l + 2) of the rope (h = 1 inside, h = 2m across).
__device__ __forceinline__ void butterflies_across_lanes(float* x, int n, int lane, int first_mask) {
  for (int m = first_mask; m < 32; m *= 2) {
#pragma unroll
    for (int i = 0; i < n; ++i) {
      const float o = __shfl_xor_sync(0xFFFFFFFFu, x[i], m);
      x[i] = (lane & m) ? __fsub_rn(o, x[i]) : __fadd_rn(x[i], o);
    }
  }
}

__device__ __forceinline__ void transform_latent(const WriterParams& p, int lane, float (&x)[record::kLaneLatentDims]) {
  constexpr int n = record::kLaneLatentDims;
  float mu[n], g[n];
  load_run(p.t_mu, int64_t{n} * lane, false, mu);
  load_run(p.t_gain, int64_t{n} * lane, false, g);
#pragma unroll
  for (int i = 0; i < n; ++i) x[i] = __fmul_rn(__fsub_rn(x[i], mu[i]), g[i]);
  if (!p.t_rotate) return;
#pragma unroll
  for (int h = 1; h < n; h *= 2) {
#pragma unroll
    for (int i = 0; i < n; ++i) {
      if (i & h) continue;
      const float a = x[i], b = x[i + h];
      x[i] = __fadd_rn(a, b);
      x[i + h] = __fsub_rn(a, b);
    }
  }
  butterflies_across_lanes(x, n, lane, 1);
}

__device__ __forceinline__ void transform_rope(const WriterParams& p, int lane, float (&r)[record::kLaneRopeDims]) {
  if (p.t_rope_gain == nullptr) return;
  float g[2];
  load_run(p.t_rope_gain, int64_t{2} * lane, false, g);
  const float a = __fmul_rn(r[0], g[0]), b = __fmul_rn(r[1], g[1]);
  r[0] = __fadd_rn(a, b);
  r[1] = __fsub_rn(a, b);
  butterflies_across_lanes(r, 2, lane, 1);
}

__device__ __forceinline__ float warp_max(float v, int width) {
  for (int o = width / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o, width));
  return v;
}

template <KvFormat F>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) write_cache_kernel(WriterParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (t >= p.n) return;
  const int64_t slot = p.slots[t];
  if (slot < 0) return;  // padding
  if (slot >= p.num_slots) {
    if (lane == 0 && p.error_count != nullptr) atomicAdd(p.error_count, 1);
    return;
  }
  uint8_t* rec = p.cache + slot * p.record_bytes;
  const int64_t lo = t * p.latent_stride, ro = t * p.rope_stride;

  if constexpr (F == KvFormat::kBf16) {
    // Lane l: latent dims [16l, 16l+16) -> bytes [32l, 32l+32); rope dims [2l, 2l+2).
    float x[kLaneDims];
    load_run(p.latent, lo + kLaneDims * lane, p.bf16_input, x);
    if (p.t_gain != nullptr) transform_latent(p, lane, x);
    uint32_t w[kLaneDims / 2];
#pragma unroll
    for (int k = 0; k < kLaneDims / 2; ++k) {
      w[k] = static_cast<uint32_t>(f32_to_bf16(x[2 * k])) | (static_cast<uint32_t>(f32_to_bf16(x[2 * k + 1])) << 16);
    }
    uint4* dst = reinterpret_cast<uint4*>(rec + record::Parts<F>::kLatentOffset + 2 * kLaneDims * lane);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
    float r[kLaneRope];
    load_run(p.rope, ro + kLaneRope * lane, p.bf16_input, r);
    if (p.t_gain != nullptr) transform_rope(p, lane, r);
    reinterpret_cast<uint32_t*>(rec + record::Parts<F>::kRopeOffset)[lane] =
        static_cast<uint32_t>(f32_to_bf16(r[0])) | (static_cast<uint32_t>(f32_to_bf16(r[1])) << 16);
  } else if constexpr (F == KvFormat::kFp8DsMla) {
    using P = record::Parts<F>;
    using Ln = record::Lane<F>;
    constexpr int kLanesPerTile = record::kLanesPerScale<F>;  // 8 lanes per 128-dim tile
    // Lane l: dims [16l, 16l+16); tile = l / 8.
    float x[kLaneDims];
    load_run(p.latent, lo + kLaneDims * lane, p.bf16_input, x);
    if (p.t_gain != nullptr) transform_latent(p, lane, x);
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) amax = fmaxf(amax, fabsf(x[i]));
    amax = warp_max(amax, kLanesPerTile);
    const float s = codec::fp8_tile_scale(amax, p.fp8_mode);
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[k] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) w[k] |= static_cast<uint32_t>(codec::fp8_quantize(x[4 * k + j], s)) << (8 * j);
    }
    *reinterpret_cast<uint4*>(rec + P::kLatentOffset + Ln::kLatentBytes * lane) = make_uint4(w[0], w[1], w[2], w[3]);
    if ((lane & (kLanesPerTile - 1)) == 0) {
      *reinterpret_cast<float*>(rec + P::kScaleOffset + P::kScaleBytes * (lane / kLanesPerTile)) = s;
    }
    float r[kLaneRope];
    load_run(p.rope, ro + kLaneRope * lane, p.bf16_input, r);
    if (p.t_gain != nullptr) transform_rope(p, lane, r);
    const uint32_t r2 = static_cast<uint32_t>(f32_to_bf16(r[0])) | (static_cast<uint32_t>(f32_to_bf16(r[1])) << 16);
    reinterpret_cast<uint32_t*>(rec + P::kRopeOffset)[lane] = r2;
  } else {
    static_assert(is_nvfp4_format(F));
    using P = record::Parts<F>;
    using Ln = record::Lane<F>;
    static_assert(record::kLanesPerScale<F> == 1);
    // Lane g: group g (dims [16g, 16g+16)) -> bytes [8g, 8g+8) and scale byte 256+g.
    float x[kLaneDims];
    load_run(p.latent, lo + kLaneDims * lane, p.bf16_input, x);
    if (p.t_gain != nullptr) transform_latent(p, lane, x);
    float lane_amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) lane_amax = fmaxf(lane_amax, fabsf(x[i]));
    // The divisor: s_l, or in token-scale mode s_t = token_amax * f32(1/2688) (the max over
    // the warp is exact, so s_t equals the scalar codec's nvfp4_token_scale).
    float s = p.outer_scale;
    if (p.token_scale) s = warp_max(lane_amax, 32) * layout::nvfp4_token_scale::kFactor;
    uint8_t sf_code = 0;
    uint32_t w[2] = {0, 0};
    if (s != 0.0f) {  // s_t = 0: an all-zero latent, zero codes and scales (as the codec)
      float y[kLaneDims];
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < kLaneDims; ++i) {
        y[i] = x[i] / s;
        amax = fmaxf(amax, fabsf(y[i]));
      }
      sf_code = codec::nvfp4_group_scale_code(amax);
      const float sf = e4m3_to_f32(sf_code);
#pragma unroll
      for (int i = 0; i < kLaneDims; i += 2) {
        const uint32_t b = codec::nvfp4_quantize(y[i], sf) | (codec::nvfp4_quantize(y[i + 1], sf) << 4);
        w[i / 8] |= b << (8 * ((i / 2) % 4));
      }
    }
    *reinterpret_cast<uint2*>(rec + P::kLatentOffset + Ln::kLatentBytes * lane) = make_uint2(w[0], w[1]);
    rec[P::kScaleOffset + lane] = sf_code;
    // The token scale's bits, or zero: the first u32 of the pad at kTokenScaleOffset.
    const uint32_t ts_bits = p.token_scale ? f32_bits(s) : 0u;
    float r[kLaneRope];
    load_run(p.rope, ro + kLaneRope * lane, p.bf16_input, r);
    if (p.t_gain != nullptr) transform_rope(p, lane, r);
    const float v0 = r[0], v1 = r[1];
    if constexpr (F == KvFormat::kNvfp4DsMla) {
      static_assert(record::kTokenScaleOffset == P::kPadOffset + 4, "432 B: s_t is the pad's second u32");
      if (lane == 0) *reinterpret_cast<uint4*>(rec + P::kPadOffset) = make_uint4(0, ts_bits, 0, 0);  // 16 pad bytes
      reinterpret_cast<uint32_t*>(rec + P::kRopeOffset)[lane] =
          static_cast<uint32_t>(f32_to_bf16(v0)) | (static_cast<uint32_t>(f32_to_bf16(v1)) << 16);
    } else {
      static_assert(F == KvFormat::kNvfp4DsMlaFp8Rope || F == KvFormat::kNvfp4DsMlaInt8Rope);
      static_assert(record::kTokenScaleOffset == P::kPadOffset, "368 B: s_t is the pad's first u32");
      const float ramax = warp_max(fmaxf(fabsf(v0), fabsf(v1)), 32);
      uint16_t codes;
      float rs;
      if constexpr (F == KvFormat::kNvfp4DsMlaFp8Rope) {
        rs = codec::rope_fp8_scale(ramax);
        codes = static_cast<uint16_t>(codec::rope_fp8_quantize(v0, rs) | (codec::rope_fp8_quantize(v1, rs) << 8));
      } else {
        rs = codec::rope_int8_scale(ramax);
        codes = static_cast<uint16_t>(static_cast<uint8_t>(codec::rope_int8_quantize(v0, rs)) |
                                      (static_cast<uint8_t>(codec::rope_int8_quantize(v1, rs)) << 8));
      }
      if (lane == 0) {
        *reinterpret_cast<float*>(rec + P::kRopeScaleOffset) = rs;
        *reinterpret_cast<uint32_t*>(rec + P::kPadOffset) = ts_bits;  // 12 pad bytes: 4 (s_t or 0) + 8
        *reinterpret_cast<uint2*>(rec + P::kPadOffset + sizeof(uint32_t)) = make_uint2(0, 0);
      }
      reinterpret_cast<uint16_t*>(rec + P::kRopeOffset)[lane] = codes;
    }
  }
}

}  // namespace

int launch_write_cache(KvFormat format, const WriterParams& p, void* stream) {
  if (p.n == 0) return 0;
  const dim3 grid(static_cast<unsigned>((p.n + kWarpsPerBlock - 1) / kWarpsPerBlock));
  const dim3 block(kWarpsPerBlock * 32);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return dispatch_format<KernelSet::kAll>(format, int{cudaErrorInvalidValue}, [&](auto tag) {
    write_cache_kernel<decltype(tag)::value><<<grid, block, 0, s>>>(p);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace mlakv::cuda::kernels
