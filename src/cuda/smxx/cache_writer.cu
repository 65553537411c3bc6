// Cache writers: one warp per token, one launch per layer per step. Every rounding
// goes through the host/device primitives of format/record_codec.h (the writers' fast
// ones: hardware e4m3 / bf16 conversions, divisions through a reciprocal where that is
// the IEEE quotient, the nvfp4 fast path of record_codec.h where a warp's groups all allow
// it), so the bytes equal the CPU codec's (tests/cuda/cuda_harness.cc). Lane l of the warp
// owns the record parts common/record_part.cuh names (record::Lane): latent dims
// [16l, 16l+16), rope dims [2l, 2l+2). The nvfp4 writers are bound by instruction issue
// and the ALU pipe (half the issue rate), so their element code keeps to the FMA pipe
// where it can (docs/perf.md, "Cache writers, helper wrt3"). The nvfp4 scale search
// (Nvfp4ScaleMode::kSearch) runs in its own kernel instantiations, so the round-to-nearest
// kernels are unchanged: per lane (one group each) codec::nvfp4_search_group, the screened
// search, where the warp's groups allow it, else and for the groups it leaves undecided
// codec::nvfp4_group_search_fast (docs/perf.md, "Cache writers, helper srch").
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "cuda/common/dispatch_format.h"
#include "cuda/common/record_part.cuh"
#include "cuda/smxx/launch.h"
#include "format/record_codec.h"

namespace mlakv::cuda::kernels {
namespace {

constexpr int kWarpsPerBlock = 4;
// 8 blocks of 4 warps per SM: at most 64 registers a thread, 32 warps resident (the
// writers hide their load latency with warps; 72 registers would leave 28).
constexpr int kMinBlocksPerSm = 8;
constexpr int kLaneDims = record::kLaneLatentDims;  // 16
constexpr int kLaneRope = record::kLaneRopeDims;    // 2
static_assert(record::kWriterLanes == 32, "one warp per record");

// A lane's n (16 or 2) consecutive input elements starting at element `off`, as floats:
// 16-byte (or 8-byte) vector loads when the address allows it - one load instruction
// per 16 bytes instead of one per element, which is what the writer's bandwidth hangs
// on - else element by element. The values are the same either way.
// kVec: the launch checked that every lane's run is aligned for its vector loads
// (input_is_vector_aligned), so the element-by-element path is not compiled in.
template <int N, bool kVec>
__device__ __forceinline__ void load_run(const void* base, int64_t off, bool bf16, float (&x)[N]) {
  static_assert(N == 16 || N == 2);
  if (bf16) {
    const uint16_t* ptr = static_cast<const uint16_t*>(base) + off;
    if constexpr (N == 16) {
      if (kVec || (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0) {
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
      if (kVec || (reinterpret_cast<uintptr_t>(ptr) & 3u) == 0) {
        const uint32_t w = __ldg(reinterpret_cast<const uint32_t*>(ptr));
        x[0] = bf16_to_f32(static_cast<uint16_t>(w & 0xFFFFu));
        x[1] = bf16_to_f32(static_cast<uint16_t>(w >> 16));
        return;
      }
    }
    if constexpr (!kVec) {
#pragma unroll
      for (int i = 0; i < N; ++i) x[i] = bf16_to_f32(ptr[i]);
    }
  } else {
    const float* ptr = static_cast<const float*>(base) + off;
    if constexpr (N == 16) {
      if (kVec || (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0) {
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
      if (kVec || (reinterpret_cast<uintptr_t>(ptr) & 7u) == 0) {
        const float2 v = __ldg(reinterpret_cast<const float2*>(ptr));
        x[0] = v.x;
        x[1] = v.y;
        return;
      }
    }
    if constexpr (!kVec) {
#pragma unroll
      for (int i = 0; i < N; ++i) x[i] = __ldg(ptr + i);
    }
  }
}

// The latent transform (DeviceLatentTransform), bit-identical to LatentTransformKernel::
// latent / rope: (c - mu) * gain, then fwht's butterflies in its order (h = 1, 2, 4, ...;
// the lower element of a pair gets a + b, the upper a - b). Lane l holds dims
// [16l, 16l + 16) of the latent - stages h < 16 inside the lane, h = 16m across lanes
// l and l ^ m - and dims [2l, 2l + 2) of the rope (h = 1 inside, h = 2m across). Across
// lanes one fused multiply-add per value: fma(+1, x, o) = RN(x + o) on the lower lane,
// fma(-1, x, o) = RN(o - x) on the upper (the products are exact).
// The factors live in shared memory, loaded once per block (every block loops over many
// tokens): lane l's 16 mu / gain values as float4 k = 0..3 at [k][l], so a warp's loads of
// one k are 512 consecutive bytes (no bank conflicts), and its two RoPE gains at [l].
struct TransformSmem {
  float4 mu[kLaneDims / 4][32];
  float4 g[kLaneDims / 4][32];
  float2 rg[32];
};
template <bool kOn>
struct LaneTransform {
  __device__ void load(const WriterParams&, TransformSmem*) {}
};
template <>
struct LaneTransform<true> {
  const TransformSmem* sm;
  bool rotate, rope;
  // Every thread of the block calls it (it synchronizes the block).
  __device__ void load(const WriterParams& p, TransformSmem* smem) {
    const int tid = threadIdx.x;
    static_assert(kWarpsPerBlock * 32 == 32 * (kLaneDims / 4), "one float4 of mu and of gain per thread");
    const int k = tid / 32, l = tid % 32;
    const float* m = p.t_mu + kLaneDims * l + 4 * k;
    const float* g = p.t_gain + kLaneDims * l + 4 * k;
    smem->mu[k][l] = make_float4(m[0], m[1], m[2], m[3]);
    smem->g[k][l] = make_float4(g[0], g[1], g[2], g[3]);
    if (tid < 32) {
      smem->rg[tid] = p.t_rope_gain != nullptr ? make_float2(p.t_rope_gain[2 * tid], p.t_rope_gain[2 * tid + 1])
                                               : make_float2(1.0f, 1.0f);
    }
    __syncthreads();
    sm = smem;
    rotate = p.t_rotate;
    rope = p.t_rope_gain != nullptr;
  }
};

template <int N>
__device__ __forceinline__ void butterflies_across_lanes(float (&x)[N], int lane) {
#pragma unroll
  for (int m = 1; m < 32; m *= 2) {
    const float sgn = (lane & m) ? -1.0f : 1.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = __fmaf_rn(sgn, x[i], __shfl_xor_sync(0xFFFFFFFFu, x[i], m));
  }
}

__device__ __forceinline__ void transform_latent(const LaneTransform<true>& tf, int lane, float (&x)[kLaneDims]) {
#pragma unroll
  for (int k = 0; k < kLaneDims / 4; ++k) {
    const float4 m = tf.sm->mu[k][lane], g = tf.sm->g[k][lane];
    x[4 * k] = __fmul_rn(__fsub_rn(x[4 * k], m.x), g.x);
    x[4 * k + 1] = __fmul_rn(__fsub_rn(x[4 * k + 1], m.y), g.y);
    x[4 * k + 2] = __fmul_rn(__fsub_rn(x[4 * k + 2], m.z), g.z);
    x[4 * k + 3] = __fmul_rn(__fsub_rn(x[4 * k + 3], m.w), g.w);
  }
  if (!tf.rotate) return;
#pragma unroll
  for (int h = 1; h < kLaneDims; h *= 2) {
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) {
      if (i & h) continue;
      const float a = x[i], b = x[i + h];
      x[i] = __fadd_rn(a, b);
      x[i + h] = __fsub_rn(a, b);
    }
  }
  butterflies_across_lanes(x, lane);
}

__device__ __forceinline__ void transform_rope(const LaneTransform<true>& tf, int lane, float (&r)[kLaneRope]) {
  if (!tf.rope) return;
  const float2 rg = tf.sm->rg[lane];
  const float a = __fmul_rn(r[0], rg.x), b = __fmul_rn(r[1], rg.y);
  r[0] = __fadd_rn(a, b);
  r[1] = __fsub_rn(a, b);
  butterflies_across_lanes(r, lane);
}

__device__ __forceinline__ float warp_max(float v, int width) {
  for (int o = width / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o, width));
  return v;
}
// The max over the whole warp of a magnitude v >= 0 (never NaN): the float32 bits of
// non-negative floats order as the floats, so one redux.sync on the bits (sm_80+) gives
// the same value as warp_max(v, 32)'s five shuffles and maxima.
__device__ __forceinline__ float warp_max_magnitude(float v) {
  return __uint_as_float(__reduce_max_sync(0xFFFFFFFFu, __float_as_uint(v)));
}

// A lane's part of the nvfp4 subnormal-scale tally (WriterParams::tally), over the tokens
// its warp encodes: its group's max |latent| against 6 * 2^-6 s_l, in double as
// nvfp4_scale_check computes it on the CPU.
struct LaneTally {
  unsigned tokens = 0, groups = 0, subnormal = 0;
  float max_abs = 0.0f;
  // a: the group's max |latent|.
  __device__ void add(float a, float outer_scale) {
    ++tokens;
    if (a != 0.0f) {
      ++groups;
      if (static_cast<double>(a) / static_cast<double>(outer_scale) / 6.0 < 0.015625) ++subnormal;
    }
    max_abs = fmaxf(max_abs, a);
  }
  // The warp's sums into the device tally (every lane calls it).
  __device__ void flush(unsigned long long* tally, int lane) const {
    const unsigned g = __reduce_add_sync(0xFFFFFFFFu, groups), sub = __reduce_add_sync(0xFFFFFFFFu, subnormal);
    const unsigned m = __reduce_max_sync(0xFFFFFFFFu, __float_as_uint(max_abs));
    if (lane == 0 && tokens != 0) {
      atomicAdd(tally, static_cast<unsigned long long>(tokens));
      atomicAdd(tally + 1, static_cast<unsigned long long>(g));
      atomicAdd(tally + 2, static_cast<unsigned long long>(sub));
      atomicMax(reinterpret_cast<unsigned*>(tally + 3), m);
    }
  }
};

// The nvfp4 writers' per-launch state: s_l, RN(1/s_l) and its fast-path mode (outside
// token-scale mode, the same for every token), and every e4m3 group scale's value and
// reciprocal (sf, RN(1/sf)) by code in shared memory (codes 0..127; 0x7F, NaN, never
// occurs: nvfp4_group_scale_code_fast saturates to 0x7E; the search reads it as RN + 1 of
// 0x7E, not a candidate: 0, 0). The search kernels (kFold) with a power-of-two s_l in
// [2^-16, 2^16] (codec::nvfp4_search_folds) hold (sf s_l, RN(1/sf) / s_l) instead: the
// screen's folded constants.
struct Nvfp4Launch {
  float s, rs;
  codec::Nvfp4Fast mode;
  bool search_fold;  // the table holds the search's folded constants
  const float2* sf_table;
};
constexpr int kSfTableSize = 128;
// Every thread of the block calls it (it synchronizes the block).
template <bool kSearch>
__device__ Nvfp4Launch nvfp4_launch(const WriterParams& p, float2* table) {
  Nvfp4Launch l;
  if constexpr (kSearch) {
    l.s = p.outer_scale;
    l.rs = l.s != 0.0f ? codec::reciprocal_rn(l.s) : 0.0f;
    l.search_fold = codec::nvfp4_search_folds(l.s);
  }
  for (int c = threadIdx.x; c < kSfTableSize; c += blockDim.x) {
    const float sf = codec::e4m3_to_f32_fast(c == 0x7F ? 0u : static_cast<uint32_t>(c));
    const float rsf = sf != 0.0f ? codec::reciprocal_rn(sf) : 0.0f;
    if constexpr (kSearch) {
      table[c] = l.search_fold ? make_float2(__fmul_rn(sf, l.s), __fmul_rn(rsf, l.rs)) : make_float2(sf, rsf);
    } else {
      table[c] = make_float2(sf, rsf);
    }
  }
  __syncthreads();
  if constexpr (!kSearch) {
    l.s = p.outer_scale;
    l.rs = l.s != 0.0f ? codec::reciprocal_rn(l.s) : 0.0f;
    l.search_fold = false;
  }
  l.mode = codec::nvfp4_fast_mode(l.s);
  l.sf_table = table;
  return l;
}

// Lane `lane`'s input of token t (load_run).
template <bool kVec>
__device__ __forceinline__ void load_token(const WriterParams& p, int lane, int64_t t, float (&x)[kLaneDims],
                                           float (&r)[kLaneRope]) {
  load_run<kLaneDims, kVec>(p.latent, t * p.latent_stride + kLaneDims * lane, p.bf16_input, x);
  load_run<kLaneRope, kVec>(p.rope, t * p.rope_stride + kLaneRope * lane, p.bf16_input, r);
}

// One token: lane `lane`'s parts of record `rec` from its input x, r (load_token). kSearch:
// Nvfp4ScaleMode::kSearch (nvfp4 formats, never in token-scale mode).
// xs: the warp's staging area for the search's fallback (kSearch only; else unused).
template <KvFormat F, bool kTf, bool kVec, bool kSearch>
__device__ __forceinline__ void encode_token(const WriterParams& p, const LaneTransform<kTf>& tf, const Nvfp4Launch& nl,
                                             int lane, float (&x)[kLaneDims], float (&r)[kLaneRope], uint8_t* rec,
                                             LaneTally& tally, float4* xs) {
  if constexpr (kTf) {
    transform_latent(tf, lane, x);
    transform_rope(tf, lane, r);
  }
  if constexpr (F == KvFormat::kBf16) {
    // Lane l: latent dims [16l, 16l+16) -> bytes [32l, 32l+32); rope dims [2l, 2l+2).
    uint32_t w[kLaneDims / 2];
#pragma unroll
    for (int k = 0; k < kLaneDims / 2; ++k) w[k] = codec::bf16x2_rn(x[2 * k], x[2 * k + 1]);
    uint4* dst = reinterpret_cast<uint4*>(rec + record::Parts<F>::kLatentOffset + 2 * kLaneDims * lane);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
    reinterpret_cast<uint32_t*>(rec + record::Parts<F>::kRopeOffset)[lane] = codec::bf16x2_rn(r[0], r[1]);
  } else if constexpr (F == KvFormat::kFp8DsMla) {
    using P = record::Parts<F>;
    using Ln = record::Lane<F>;
    constexpr int kLanesPerTile = record::kLanesPerScale<F>;  // 8 lanes per 128-dim tile
    // Lane l: dims [16l, 16l+16); tile = l / 8.
    float lane_amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) lane_amax = fmaxf(lane_amax, fabsf(x[i]));
    const float amax = warp_max(lane_amax, kLanesPerTile);
    const float s = codec::fp8_tile_scale(amax, p.fp8_mode);
    uint32_t w[4];
    codec::fp8_codes16(x, s, lane_amax, w);
    *reinterpret_cast<uint4*>(rec + P::kLatentOffset + Ln::kLatentBytes * lane) = make_uint4(w[0], w[1], w[2], w[3]);
    if ((lane & (kLanesPerTile - 1)) == 0) {
      *reinterpret_cast<float*>(rec + P::kScaleOffset + P::kScaleBytes * (lane / kLanesPerTile)) = s;
    }
    reinterpret_cast<uint32_t*>(rec + P::kRopeOffset)[lane] = codec::bf16x2_rn(r[0], r[1]);
  } else {
    static_assert(is_nvfp4_format(F));
    using P = record::Parts<F>;
    using Ln = record::Lane<F>;
    static_assert(record::kLanesPerScale<F> == 1);
    // Lane g: group g (dims [16g, 16g+16)) -> bytes [8g, 8g+8) and scale byte 256+g.
    // The divisor: s_l, or in token-scale mode s_t = token_amax * f32(1/2688) (the max over
    // the warp is exact, so s_t equals the scalar codec's nvfp4_token_scale).
    float lane_amax = 0.0f;  // this group's max |x|
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) lane_amax = fmaxf(lane_amax, fabsf(x[i]));
    float s, rs;
    codec::Nvfp4Fast mode;
    if (!kSearch && p.token_scale) {  // (the search kernels run outside token-scale mode only)
      s = warp_max_magnitude(lane_amax) * layout::nvfp4_token_scale::kFactor;
      rs = s != 0.0f ? codec::reciprocal_rn(s) : 0.0f;
      mode = codec::nvfp4_fast_mode(s);
    } else {
      s = nl.s;
      rs = nl.rs;
      mode = nl.mode;
    }
    if (p.tally != nullptr) tally.add(lane_amax, s);  // set outside token-scale mode only (s = s_l)
    uint8_t sf_code = 0;
    uint32_t w[2] = {0, 0};
    if constexpr (kSearch) {
      // Each group's scale code by its squared error (the spec's nvfp4_search_scale_code on
      // the IEEE quotients |x| / s_l; s_l > 0 always, check_cache_view). Where every lane's
      // group allows it (s_l on a fast-path mode, codec::nvfp4_search_fast_applies), the
      // screened search (codec::nvfp4_search_group: the three candidates' errors in four
      // operations per element, then the chosen scale's codes); lanes it leaves undecided
      // (near ties) and every lane of other warps take codec::nvfp4_group_search_fast (the
      // spec's three quantizations, every division path) on x, staged in shared memory (lane
      // l's float4 k at xs[32 k + l]) so that the screen's registers need not hold it.
#pragma unroll
      for (int k = 0; k < kLaneDims / 4; ++k) xs[32 * k + lane] = make_float4(x[4 * k], x[4 * k + 1], x[4 * k + 2], x[4 * k + 3]);
      int c = -1;
      if (mode != codec::Nvfp4Fast::kNone) {
        const float amax_y = codec::nvfp4_fast_amax_y(mode, lane_amax, s, rs);
        const uint32_t c0 = codec::nvfp4_group_scale_code_fast(amax_y);
        const bool reciprocal_ok = mode != codec::Nvfp4Fast::kReciprocal || lane_amax * rs <= 6.64613997e+35f;
        if (__all_sync(0xFFFFFFFFu, codec::nvfp4_search_fast_applies(c0, amax_y) && reciprocal_ok)) {
          uint32_t signs[2];
          codec::nvfp4_group_signs(x, signs);
          float sf[3], rsf[3];
#pragma unroll
          for (int k = 0; k < 3; ++k) {
            const float2 e = nl.sf_table[c0 - 1 + k];
            sf[k] = e.x;
            rsf[k] = e.y;
          }
          if (nl.search_fold) {  // a power-of-two s_l in [2^-16, 2^16]: |x|, s_l in the table's constants
            float a[kLaneDims];
#pragma unroll
            for (int i = 0; i < kLaneDims; ++i) a[i] = fabsf(x[i]);
            c = codec::nvfp4_search_group(a, c0, sf, rsf, signs, w);
          } else {
            // a = |x| / s: exact for a power of two (the product by RN(1/s) in the fast mode's
            // range), else div_rn_by_reciprocal (the IEEE quotient wherever |x| >= 2^-100;
            // below, within a few 2^-149 of it: code 0 either way, and far inside the screen's
            // slack).
            float a[kLaneDims];
            if (mode == codec::Nvfp4Fast::kPow2) {
#pragma unroll
              for (int i = 0; i < kLaneDims; ++i) a[i] = __fmul_rn(fabsf(x[i]), rs);
            } else {
#pragma unroll
              for (int i = 0; i < kLaneDims; ++i) a[i] = codec::div_rn_by_reciprocal(fabsf(x[i]), s, rs);
            }
            c = codec::nvfp4_search_group(a, c0, sf, rsf, signs, w);
          }
        }
      }
      if (c >= 0) {
        sf_code = static_cast<uint8_t>(c);
      } else {
        float xf[kLaneDims];
#pragma unroll
        for (int k = 0; k < kLaneDims / 4; ++k) {
          const float4 v = xs[32 * k + lane];
          xf[4 * k] = v.x;
          xf[4 * k + 1] = v.y;
          xf[4 * k + 2] = v.z;
          xf[4 * k + 3] = v.w;
        }
        sf_code = codec::nvfp4_group_search_fast(xf, s, lane_amax, w);
      }
    } else if (s != 0.0f) {  // s_t = 0: an all-zero latent, zero codes and scales
      // The fast path where every lane's group allows it (s and mode are the warp's).
      bool fast = false;
      if (mode != codec::Nvfp4Fast::kNone) {
        const float amax_y = codec::nvfp4_fast_amax_y(mode, lane_amax, s, rs);
        sf_code = codec::nvfp4_group_scale_code_fast(amax_y);
        fast = __all_sync(0xFFFFFFFFu, codec::nvfp4_fast_applies(mode, sf_code, amax_y, lane_amax, rs));
        if (fast) {
          const float2 sf = nl.sf_table[sf_code];
          if (mode == codec::Nvfp4Fast::kPow2) {
            codec::nvfp4_group_codes_fast(mode, x, s, rs, __fmul_rn(sf.x, s), __fmul_rn(sf.y, rs), w);
          } else {
            codec::nvfp4_group_codes_fast(mode, x, s, rs, sf.x, sf.y, w);
          }
        }
      }
      if (!fast) sf_code = codec::nvfp4_group_fast(x, s, w, lane_amax);
    }
    *reinterpret_cast<uint2*>(rec + P::kLatentOffset + Ln::kLatentBytes * lane) = make_uint2(w[0], w[1]);
    rec[P::kScaleOffset + lane] = sf_code;
    // The token scale's bits, or zero: the first u32 of the pad at kTokenScaleOffset.
    const uint32_t ts_bits = !kSearch && p.token_scale ? f32_bits(s) : 0u;
    const float v0 = r[0], v1 = r[1];
    if constexpr (F == KvFormat::kNvfp4DsMla) {
      static_assert(record::kTokenScaleOffset == P::kPadOffset + 4, "432 B: s_t is the pad's second u32");
      if (lane == 0) *reinterpret_cast<uint4*>(rec + P::kPadOffset) = make_uint4(0, ts_bits, 0, 0);  // 16 pad bytes
      reinterpret_cast<uint32_t*>(rec + P::kRopeOffset)[lane] = codec::bf16x2_rn(v0, v1);
    } else {
      static_assert(F == KvFormat::kNvfp4DsMlaFp8Rope || F == KvFormat::kNvfp4DsMlaInt8Rope);
      static_assert(record::kTokenScaleOffset == P::kPadOffset, "368 B: s_t is the pad's first u32");
      const float lane_ramax = fmaxf(fabsf(v0), fabsf(v1));
      const float ramax = warp_max_magnitude(lane_ramax);
      const float rs = F == KvFormat::kNvfp4DsMlaFp8Rope ? codec::rope_fp8_scale(ramax) : codec::rope_int8_scale(ramax);
      const uint16_t codes = static_cast<uint16_t>(codec::rope_codes2<F>(v0, v1, rs, lane_ramax));
      if (lane == 0) {
        *reinterpret_cast<float*>(rec + P::kRopeScaleOffset) = rs;
        *reinterpret_cast<uint32_t*>(rec + P::kPadOffset) = ts_bits;  // 12 pad bytes: 4 (s_t or 0) + 8
        *reinterpret_cast<uint2*>(rec + P::kPadOffset + sizeof(uint32_t)) = make_uint2(0, 0);
      }
      reinterpret_cast<uint16_t*>(rec + P::kRopeOffset)[lane] = codes;
    }
  }
}

// Each warp encodes tokens warp, warp + W, warp + 2W, ... (W warps in the grid, sized to
// what the GPU holds at once), so the transform's factors are loaded once per block.
template <KvFormat F, bool kTf, bool kVec, bool kSearch>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kMinBlocksPerSm) write_cache_kernel(WriterParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  __shared__ std::conditional_t<kTf, TransformSmem, int> smem;
  __shared__ std::conditional_t<is_nvfp4_format(F), float2[kSfTableSize], int> sf_table;
  __shared__ std::conditional_t<kSearch, float4[kWarpsPerBlock][kLaneDims / 4 * 32], int> xs;
  LaneTransform<kTf> tf;
  if constexpr (kTf) tf.load(p, &smem);
  Nvfp4Launch nl{};
  if constexpr (is_nvfp4_format(F)) nl = nvfp4_launch<kSearch>(p, sf_table);
  LaneTally tally;
  float4* xw = nullptr;
  if constexpr (kSearch) xw = xs[threadIdx.x >> 5];
  // (Loading the next token's input before this token's work, in registers or as L2
  // prefetches, measured slower: docs/perf.md, tenth session.)
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); t < p.n; t += stride) {
    const int64_t slot = p.slots[t];
    if (slot < 0) continue;  // padding
    if (slot >= p.num_slots) {
      if (lane == 0 && p.error_count != nullptr) atomicAdd(p.error_count, 1);
      continue;
    }
    float x[kLaneDims], r[kLaneRope];
    load_token<kVec>(p, lane, t, x, r);
    encode_token<F, kTf, kVec, kSearch>(p, tf, nl, lane, x, r, p.cache + slot * p.record_bytes, tally, xw);
  }
  if constexpr (is_nvfp4_format(F)) {
    if (p.tally != nullptr) tally.flush(p.tally, lane);
  }
}

// Resident blocks per SM of one kernel on the current device (looked up once per kernel:
// the writers run on one architecture per process in practice; a wrong count only costs
// speed).
template <KvFormat F, bool kTf, bool kVec, bool kSearch>
int grid_blocks(int64_t n) {
  static std::atomic<int> per_sm{0}, sms{0};
  if (per_sm.load(std::memory_order_relaxed) == 0) {
    int b = 0, dev = 0, c = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, write_cache_kernel<F, kTf, kVec, kSearch>, kWarpsPerBlock * 32, 0) != cudaSuccess || b < 1) b = 1;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || c < 1) c = 1;
    sms.store(c, std::memory_order_relaxed);
    per_sm.store(b, std::memory_order_relaxed);
  }
  const int64_t full = (n + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int64_t resident = static_cast<int64_t>(per_sm.load(std::memory_order_relaxed)) * sms.load(std::memory_order_relaxed);
  return static_cast<int>(std::max<int64_t>(1, std::min(full, resident)));
}

// Whether every lane's latent run (16 elements at t * latent_stride + 16 lane) starts on a
// 16-byte boundary and every rope run (2 at t * rope_stride + 2 lane) on a 2-element one,
// for every token: load_run's vector loads then need no check.
bool input_is_vector_aligned(const WriterParams& p) {
  const int64_t es = p.bf16_input ? 2 : 4;  // element bytes
  const auto lat = reinterpret_cast<uintptr_t>(p.latent), rope = reinterpret_cast<uintptr_t>(p.rope);
  return lat % 16 == 0 && (p.latent_stride * es) % 16 == 0 && (kLaneDims * es) % 16 == 0 &&
         rope % static_cast<uintptr_t>(kLaneRope * es) == 0 && (p.rope_stride * es) % (kLaneRope * es) == 0;
}

}  // namespace

int launch_write_cache(KvFormat format, const WriterParams& p, void* stream) {
  if (p.n == 0) return 0;
  const dim3 block(kWarpsPerBlock * 32);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool tf = p.t_gain != nullptr;
  const bool vec = input_is_vector_aligned(p);
  return dispatch_format<KernelSet::kAll>(format, int{cudaErrorInvalidValue}, [&](auto tag) {
    constexpr KvFormat F = decltype(tag)::value;
    auto go = [&](auto kernel, int blocks) { kernel<<<blocks, block, 0, s>>>(p); };
    // The scale search: its own instantiations (nvfp4 formats only), so the round-to-nearest
    // kernels are the same code as without it.
    auto launch = [&](auto search) {
      constexpr bool kS = decltype(search)::value;
      if (tf) {
        if (vec) {
          go(write_cache_kernel<F, true, true, kS>, grid_blocks<F, true, true, kS>(p.n));
        } else {
          go(write_cache_kernel<F, true, false, kS>, grid_blocks<F, true, false, kS>(p.n));
        }
      } else if (vec) {
        go(write_cache_kernel<F, false, true, kS>, grid_blocks<F, false, true, kS>(p.n));
      } else {
        go(write_cache_kernel<F, false, false, kS>, grid_blocks<F, false, false, kS>(p.n));
      }
    };
    if constexpr (is_nvfp4_format(F)) {
      if (p.nvfp4_search && !p.token_scale) {
        launch(std::true_type{});
        return static_cast<int>(cudaGetLastError());
      }
    }
    launch(std::false_type{});
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace mlakv::cuda::kernels
