// The register-staged form of the natural-arrangement kernel for the quantized formats
// (kernel_nat.cuh; docs/design.md "Register-staged converters"; which sets run it: kNatRs in
// kernel_nat.cuh). 384 threads, three warpgroups; the KV tile is still bf16 in shared memory
// for both MMAs, but its record bytes are never staged there:
//  - warpgroup 2, the converters (kRsConverterRegs registers): two threads per token of a
//    64-token tile (warp w: tokens 16 w .. 16 w + 15; lane l: token 16 w + l % 16, role
//    l / 16, RsRaw). Each holds its token's share of the next tile's record in registers,
//    loaded from global memory (16-byte loads through L1) right after the previous tile is
//    converted, i.e. before that tile's stage is free. Once it is (the `empty` barrier, both
//    consumer warpgroups), the registers are converted into the stage - the same 128-byte
//    swizzled bf16 layout and the same values as the in-place converters: fp8 bf16(e4m3 * s),
//    e2m1 e2m1 * sf * 2^-7, the 368-byte ropes bf16(code * rs); invalid tokens as zeros, the
//    tile's validity mask beside it - and `full` completes with the 128 converters' arrivals.
//    So a stage's load is no longer on the chain from its release to the next scores; the
//    converters' one tile of registers is (a tile's loads wait for the previous conversion).
//  - warpgroup 0 (kRsScoreRegs): the scores of every tile (36 wgmma m64n64k16, Q and K from
//    shared memory), the online softmax (kernel_nat.cuh's lazy maximum), P into registers for
//    its O_L += P V_L (m64n256k16, dims 0..255) and into shared memory, with the rows'
//    rescale factors, for warpgroup 1;
//  - warpgroup 1 (kRsPvRegs): O_R += P V_R (dims 256..511, P from shared memory).
// Each consumer warpgroup releases the stage after its P V; warpgroup 0 writes the next P once
// warpgroup 1 has read the last. Shared memory as kernel_nat.cuh's (Q, P, two 72 KB stages,
// barriers); the same grid, results and LSE.
#pragma once

namespace mlakv::cuda::sm90 {
namespace {
namespace nat {

constexpr int kRsThreads = 384;
// Registers after setmaxnreg: the smallest of each that ptxas compiles without spills (at 200
// / 152 the score / P V warpgroups spill 80 / 488 bytes); the converters get the rest.
constexpr int kRsScoreRegs = 216, kRsPvRegs = 160, kRsConverterRegs = 128;
static_assert((kRsScoreRegs + kRsPvRegs + kRsConverterRegs) * 128 <= 65536, "the three warpgroups' registers fit the SM's");
// misc: full[2], empty[2], p_ready, p_free, l_ready (8 B each), vmask[2] (8 B each), the rows'
// rescale factors (64 fp32) and row sums (64 fp32).
constexpr int kRsMiscBytes = 8 * 7 + 8 * kStages + 2 * 64 * 4;
constexpr int kRsSmemBytes = 1024 + kQBytes + kQBlockBytes + kStages * kStageBytes + kRsMiscBytes;
static_assert(kRsSmemBytes <= 227 * 1024, "one CTA per SM");

#if MLAKV_SM90_DEVICE
// Loads of read-only cache bytes by the converters, the L2 fetching a missed line whole. The
// policy (MLAKV_NAT_RS_POLICY; docs/perf.md, twelfth session): 1, L1 evict_last (a line's four
// loads follow each other in one warp), measured 1.2-1.5x faster than 0, L1 no_allocate;
// 2 (the default .nc) and 3 (plain ld.global) were within 1% of 1 in the coalesced layout.
#ifndef MLAKV_NAT_RS_POLICY
#define MLAKV_NAT_RS_POLICY 1
#endif
#if MLAKV_NAT_RS_POLICY == 0
#define MLAKV_NAT_RS_OP "ld.global.nc.L1::no_allocate.L2::128B."
#elif MLAKV_NAT_RS_POLICY == 1
#define MLAKV_NAT_RS_OP "ld.global.nc.L1::evict_last.L2::128B."
#elif MLAKV_NAT_RS_POLICY == 2
#define MLAKV_NAT_RS_OP "ld.global.nc.L2::128B."
#else
#define MLAKV_NAT_RS_OP "ld.global.L2::128B."
#endif
#ifdef MLAKV_NAT_RS_ABLATE_LOAD
#define MLAKV_NAT_RS_LD(T, R, V, SRC) V = 0
#else
#define MLAKV_NAT_RS_LD(T, R, V, SRC) asm volatile(MLAKV_NAT_RS_OP T " %0, [%1];\n" : "=" R(V) : "l"(SRC))
#endif
__device__ __forceinline__ uint4 ld_rec16(const uint8_t* src) {
  uint4 v;
#ifdef MLAKV_NAT_RS_ABLATE_LOAD
  v = make_uint4(0, 0, 0, 0);
#else
  asm volatile(MLAKV_NAT_RS_OP "v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(src));
#endif
  return v;
}
__device__ __forceinline__ uint32_t ld_rec4(const uint8_t* src) {
  uint32_t v;
  MLAKV_NAT_RS_LD("u32", "r", v, src);
  return v;
}
#undef MLAKV_NAT_RS_LD
#undef MLAKV_NAT_RS_OP

// One converter's share of its token's record (role r = lane / 16): the latent code bytes
// 32 k + 16 r (k < kCodeLoads), the scale field, the rope bytes 32 k + 16 r of a bf16 rope
// (k < 4) or of the 368-byte records' 8-bit codes (k < 2) and then the rope scale. The two
// lanes of a token read a whole 32-byte sector per load, the four loads of a 128-byte line
// follow each other (and hit L1); the quarter-warp's 16-byte stores go to eight rows.
template <KvFormat F>
struct RsRaw {
  static constexpr bool kFp8 = F == KvFormat::kFp8DsMla;
  static constexpr bool kRope8 = rope_converted<F>();
  static constexpr int kCodeLoads = kFp8 ? 16 : 8;
  static constexpr int kScaleLoads = kFp8 ? 1 : 2;
  static constexpr int kRopeLoads = kRope8 ? 2 : 4;
  uint4 code[kCodeLoads];
  uint4 scale[kScaleLoads];
  uint4 rope[kRopeLoads];
  float rope_scale;
};

// Group G of kG: code loads [G n / kG, (G + 1) n / kG); the last group also takes the scale
// field and the rope. Sparse sets convert a tile in kRsSparseGroups groups and load each
// group of the next tile as soon as the same group of this one is converted (its registers
// free); dense sets in one, the next tile loaded after the full arrive (each measured the
// faster: docs/perf.md, twelfth session).
constexpr int kRsSparseGroups = 4;
template <KvFormat F, int G, int kG>
__device__ __forceinline__ void rs_load(RsRaw<F>& raw, const uint8_t* cache, int32_t slot, int r) {
  using R = RsRaw<F>;
  using Q = Quant<F>;
  constexpr int k0 = G * R::kCodeLoads / kG, k1 = (G + 1) * R::kCodeLoads / kG;
  constexpr bool kTail = G == kG - 1;
  if (slot < 0) {  // an invalid token converts to zeros
#pragma unroll
    for (int k = k0; k < k1; ++k) raw.code[k] = make_uint4(0, 0, 0, 0);
    if constexpr (kTail) {
#pragma unroll
      for (int k = 0; k < R::kScaleLoads; ++k) raw.scale[k] = make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int k = 0; k < R::kRopeLoads; ++k) raw.rope[k] = make_uint4(0, 0, 0, 0);
      raw.rope_scale = 0.0f;
    }
    return;
  }
  const uint8_t* rec = cache + static_cast<int64_t>(slot) * Q::kRecordBytes;
#pragma unroll
  for (int k = k0; k < k1; ++k) raw.code[k] = ld_rec16(rec + Q::raw_col(0, 0) + 32 * k + 16 * r);
  if constexpr (kTail) {
#pragma unroll
    for (int k = 0; k < R::kScaleLoads; ++k) raw.scale[k] = ld_rec16(rec + Q::kScaleCol + 16 * k);
    if constexpr (R::kRope8) {
      // kernel_nat.cuh's 128-byte rope box from record byte kRopeCol: the rope scale at box
      // byte kRopeScaleInBox, the 64 codes at box bytes 64 .. 127.
#pragma unroll
      for (int k = 0; k < R::kRopeLoads; ++k) raw.rope[k] = ld_rec16(rec + Q::kRopeCol + 64 + 32 * k + 16 * r);
      raw.rope_scale = __uint_as_float(ld_rec4(rec + Q::kRopeCol + Q::kRopeScaleInBox));
    } else {
#pragma unroll
      for (int k = 0; k < R::kRopeLoads; ++k) raw.rope[k] = ld_rec16(rec + Q::kRopeCol + 32 * k + 16 * r);
      raw.rope_scale = 0.0f;
    }
  }
}

// Writes token t's converted share (role r) into the stage at `st`: the same values and places
// as the in-place converters (kernel_nat.cuh) - latent dim d at column block d / 64, chunk (d %
// 64) / 8 of row t (128-byte swizzle: chunk c at ((c ^ t) & 7) * 16), the rope in block 8.
template <KvFormat F, int G, int kG>
__device__ __forceinline__ void rs_convert(const RsRaw<F>& raw, uint8_t* st, int t, int r) {
  using R = RsRaw<F>;
  constexpr int k0 = G * R::kCodeLoads / kG, k1 = (G + 1) * R::kCodeLoads / kG;
  constexpr bool kTail = G == kG - 1;
  namespace gp = mlakv::cuda::ptx;
  uint8_t* row = st + t * 128;
  auto chunk = [&](int blk, int c) __attribute__((always_inline)) { return row + blk * kBlockBytes + (((c ^ t) & 7) << 4); };
  if constexpr (R::kFp8) {
    const float sc[4] = {__uint_as_float(raw.scale[0].x), __uint_as_float(raw.scale[0].y), __uint_as_float(raw.scale[0].z),
                         __uint_as_float(raw.scale[0].w)};
#pragma unroll
    for (int k = k0; k < k1; ++k) {
      const float s = sc[k >> 2];  // dims 32 k + 16 r .. + 15: scale tile k / 4
      const uint4 v = raw.code[k];
      uint32_t o[8];
      e4m3x4_to_bf16(v.x, s, o[0], o[1]);
      e4m3x4_to_bf16(v.y, s, o[2], o[3]);
      e4m3x4_to_bf16(v.z, s, o[4], o[5]);
      e4m3x4_to_bf16(v.w, s, o[6], o[7]);
      const int blk = k >> 1, c0 = 4 * (k & 1) + 2 * r;
      *reinterpret_cast<uint4*>(chunk(blk, c0)) = make_uint4(o[0], o[1], o[2], o[3]);
      *reinterpret_cast<uint4*>(chunk(blk, c0 + 1)) = make_uint4(o[4], o[5], o[6], o[7]);
    }
  } else {
    const uint32_t gw[8] = {raw.scale[0].x, raw.scale[0].y, raw.scale[0].z, raw.scale[0].w,
                            raw.scale[1].x, raw.scale[1].y, raw.scale[1].z, raw.scale[1].w};
#pragma unroll
    for (int k = k0; k < k1; ++k) {
      // dims 64 k + 32 r .. + 31: groups 4 k + 2 r (words x, y) and 4 k + 2 r + 1 (z, w), scale
      // bytes 2 r, 2 r + 1 of scale word k; (sf0, sf1) exactly in f16, then sf * 2^119 as bf16x2
      // pairs (convert_half's arithmetic)
      const float2 sf = f16x2_to_f32x2(ptx::e4m3x2_to_f16x2(gw[k] >> (16 * r)));
      const uint32_t sa = gp::pack_bf16x2(sf.x * 0x1p119f, sf.x * 0x1p119f);
      const uint32_t sb = gp::pack_bf16x2(sf.y * 0x1p119f, sf.y * 0x1p119f);
      const uint4 v = raw.code[k];
      const int c0 = 4 * r;
      *reinterpret_cast<uint4*>(chunk(k, c0 + 0)) = e2m1x8_to_bf16(v.x, sa);
      *reinterpret_cast<uint4*>(chunk(k, c0 + 1)) = e2m1x8_to_bf16(v.y, sa);
      *reinterpret_cast<uint4*>(chunk(k, c0 + 2)) = e2m1x8_to_bf16(v.z, sb);
      *reinterpret_cast<uint4*>(chunk(k, c0 + 3)) = e2m1x8_to_bf16(v.w, sb);
    }
  }
  if constexpr (!kTail) {
    return;
  } else if constexpr (R::kRope8) {
    // rope codes 32 k + 16 r .. + 15 -> output chunks 4 k + 2 r, + 1: bf16(code * rs) (convert_rope)
#pragma unroll
    for (int k = 0; k < R::kRopeLoads; ++k) {
      uint4 lo, hi;
      rope8x16_to_bf16<F>(raw.rope[k], raw.rope_scale, lo, hi);
      const int c = 4 * k + 2 * r;
      *reinterpret_cast<uint4*>(chunk(8, c)) = lo;
      *reinterpret_cast<uint4*>(chunk(8, c + 1)) = hi;
    }
  } else {
    // bf16 rope bytes 32 k + 16 r .. + 15: chunk 2 k + r of the rope row, as they are
#pragma unroll
    for (int k = 0; k < R::kRopeLoads; ++k) *reinterpret_cast<uint4*>(chunk(8, 2 * k + r)) = raw.rope[k];
  }
}
#endif  // MLAKV_SM90_DEVICE

}  // namespace nat

template <KvFormat F, bool kSparse>
__global__ void __launch_bounds__(nat::kRsThreads, 1)
    attention_nat_rs_kernel(const __grid_constant__ kernels::AttentionParams p) {
#if MLAKV_SM90_DEVICE
  using namespace nat;
  namespace gp = mlakv::cuda::ptx;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (gp::smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* qs = smem;
  uint8_t* ps = qs + kQBytes;  // P of the current tile, written by warpgroup 0 for warpgroup 1
  uint8_t* ring = ps + kQBlockBytes;
  uint8_t* misc = ring + kStages * kStageBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(misc);  // full[stage]: converted (128 arrivals)
  uint64_t* empty = full + kStages;                     // empty[stage]: both P V done (256)
  uint64_t* p_ready = empty + kStages;                  // [0] -> [1]: P and the rescale factors
  uint64_t* p_free = p_ready + 1;                       // [1] -> [0]: P read
  uint64_t* l_ready = p_free + 1;                       // [0] -> [1]: the final row sums
  uint64_t* vmask = l_ready + 1;                        // vmask[stage]: the tile's valid tokens
  float* ss = reinterpret_cast<float*>(vmask + kStages);  // rows' rescale factors of the current tile
  float* sl = ss + 64;                                    // rows' final sums

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int split = blockIdx.z;
  const CtaWork cw = cta_work<kRows, kTile, kTile>(p);
  const int b = cw.b;
  const int64_t begin = cw.begin, end = cw.end;
  const int n_tiles = cw.n_tiles;

  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      ptx::mbar_init(gp::smem_addr(&full[i]), 128);
      ptx::mbar_init(gp::smem_addr(&empty[i]), 256);
    }
    ptx::mbar_init(gp::smem_addr(p_ready), 128);
    ptx::mbar_init(gp::smem_addr(p_free), 128);
    ptx::mbar_init(gp::smem_addr(l_ready), 128);
    ptx::mbar_init_fence();
  }
  __syncthreads();

  if (warp >= kConsumerWarps) {
    ptx::setmaxnreg_dec<kRsConverterRegs>();
    // ---- the converters: token 16 w + lane % 16 of every tile, role lane / 16; the next
    // tile's loads follow each conversion ----
    const int w = warp - kConsumerWarps, tk = 16 * w + (lane & 15), r = lane >> 4;
    auto slot_of = [&](int t) __attribute__((always_inline)) -> int32_t {
      const int64_t pos = begin + static_cast<int64_t>(t) * kTile + tk;
      if (pos >= end) return -1;
      if constexpr (kSparse) return sparse_slot(p, b, cw.i_fixed, pos, end);
      else return static_cast<int32_t>(box_row(p, b, pos));
    };
    RsRaw<F> raw;
    int32_t slot = slot_of(0), next_slot = slot_of(1);
    // (Group indices as template arguments: the register arrays stay statically indexed.)
    constexpr int kG = kSparse ? kRsSparseGroups : 1;
    auto each_group = [&](auto fn) __attribute__((always_inline)) {
      fn(std::integral_constant<int, 0>{});
      if constexpr (kG > 1) fn(std::integral_constant<int, 1>{});
      if constexpr (kG > 2) fn(std::integral_constant<int, 2>{});
      if constexpr (kG > 3) fn(std::integral_constant<int, 3>{});
    };
    static_assert(kG == 1 || kG == 2 || kG == 4);
    if (n_tiles > 0) each_group([&](auto g) __attribute__((always_inline)) { rs_load<F, decltype(g)::value, kG>(raw, p.cache, slot, r); });
    for (int t = 0; t < n_tiles; ++t) {
      const bool more = t + 1 < n_tiles;
      const int k = t & 1;
      if (t >= kStages) ptx::mbar_wait(gp::smem_addr(&empty[k]), ((t >> 1) - 1) & 1);
      const uint32_t vb = __ballot_sync(0xFFFFFFFFu, slot >= 0) & 0xFFFFu;  // lanes 0..15: tokens 16 w ..
      if (lane == 0) reinterpret_cast<uint16_t*>(&vmask[k])[w] = static_cast<uint16_t>(vb);
#ifndef MLAKV_NAT_ABLATE_CONVERT
      each_group([&](auto g) __attribute__((always_inline)) {
        rs_convert<F, decltype(g)::value, kG>(raw, ring + k * kStageBytes, tk, r);
        if (kG > 1 && more) rs_load<F, decltype(g)::value, kG>(raw, p.cache, next_slot, r);  // this group of the next tile
      });
#else
      {  // (an ablation: the loads kept alive, nothing converted; wrong values)
        uint32_t x = __float_as_uint(raw.rope_scale);
        for (const uint4& v : raw.code) x ^= v.x ^ v.y ^ v.z ^ v.w;
        for (const uint4& v : raw.scale) x ^= v.x ^ v.y ^ v.z ^ v.w;
        for (const uint4& v : raw.rope) x ^= v.x ^ v.y ^ v.z ^ v.w;
        if (x == 0x12345u) ring[k * kStageBytes + tk] = 1;
        if (kG > 1 && more) each_group([&](auto g) __attribute__((always_inline)) { rs_load<F, decltype(g)::value, kG>(raw, p.cache, next_slot, r); });
      }
#endif
      ptx::fence_proxy_async();
      ptx::mbar_arrive(gp::smem_addr(&full[k]));
      if (kG == 1 && more) rs_load<F, 0, 1>(raw, p.cache, next_slot, r);
      if (more) {
        // The lookup a tile further after the next tile's loads (its result is used only
        // then: the two latencies overlap).
        slot = next_slot;
        next_slot = slot_of(t + 2);
      }
    }
    return;
  }

  const int wg = __shfl_sync(0xFFFFFFFFu, warp >> 2, 0), w = warp & 3, ctid = tid & 255, g = lane >> 2, c = lane & 3;
  const int r0 = 16 * w + g, ra = r0, rb = r0 + 8;  // this thread's rows
  const uint32_t q_addr = gp::smem_addr(qs), ring_addr = gp::smem_addr(ring);
  // Q, by both consumer warpgroups, before they part (one barrier instruction for both).
  load_q<F>(p, cw, b, qs, ctid);
  ptx::named_barrier(kBarAll, 256);
  // (Each warpgroup's code after its setmaxnreg stays in its own branch: ptxas allocates a
  // region at the smallest budget that reaches it.)
  auto start = [&](float (&o)[128]) __attribute__((always_inline)) {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    ptx::wg_hold128(o);
  };
  auto scale_o = [&](float (&o)[128], float a0, float a1) __attribute__((always_inline)) {
    if (__any_sync(0xFFFFFFFFu, a0 != 1.0f || a1 != 1.0f)) {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j] *= a0, o[4 * j + 1] *= a0;
        o[4 * j + 2] *= a1, o[4 * j + 3] *= a1;
      }
    }
  };
  // V of this warpgroup's 256 dims in stage k: column blocks 4 wg .. 4 wg + 3 (lbo 8 KB),
  // k-step kk = tokens 16 kk .. (2 KB).
  auto dv_of = [&](int k) __attribute__((always_inline)) {
    return ptx::desc_sw128(ring_addr + k * kStageBytes + 4 * wg * kBlockBytes, kBlockBytes, 1024);
  };
  // ---- finalize: O / l, the LSE from warpgroup 0 ----
  auto finish = [&](const float (&o)[128], const float (&l_fin)[2], const float (&m_fin)[2]) __attribute__((always_inline)) {
    store_rows<F>(
        p, cw, b, split, o, [&](int h, int) __attribute__((always_inline)) { return l_fin[h]; }, m_fin, ra, rb, wg, c,
        wg == 0 && c == 0);
  };

  if (wg == 0) {
    ptx::setmaxnreg_inc<kRsScoreRegs>();
    float o[128];
    start(o);
    float s[32];
    uint32_t pa[4][4];
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    const int32_t vis0 = cw.visible(p, ra), vis1 = cw.visible(p, rb);
    const uint64_t dq = ptx::desc_sw128(q_addr, 16, 1024);
    for (int t = 0; t < n_tiles; ++t) {
      const int k = t & 1;
      const uint32_t ph = (t >> 1) & 1;
      ptx::mbar_wait(gp::smem_addr(&full[k]), ph);
      const uint64_t tmask = vmask[k];
      const uint64_t dk = ptx::desc_sw128(ring_addr + k * kStageBytes, 16, 1024);
      ptx::wg_fence();
#pragma unroll
      for (int i = 0; i < 36; ++i) {
        // Descriptor + (byte offset >> 4): block i / 4, k-step i % 4 (32 B).
        const uint32_t qo = ((i >> 2) * kQBlockBytes + (i & 3) * 32) >> 4, ko = ((i >> 2) * kBlockBytes + (i & 3) * 32) >> 4;
        ptx::wgmma_n64_bf16_ss(s, dq + qo, dk + ko, i > 0);
      }
      ptx::wg_commit();
      ptx::wg_wait<0>();
      ptx::wg_hold32(s);
      // Masking: -inf for invalid tokens and those past a row's visible prefix.
      const int64_t pos0 = begin + static_cast<int64_t>(t) * kTile;
      const bool whole = tmask == ~0ull && vis0 - pos0 >= kTile && vis1 - pos0 >= kTile;
      if (!__all_sync(0xFFFFFFFFu, whole)) {
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const int kt = 8 * (i >> 2) + 2 * c + (i & 1);
          const bool ok = ((tmask >> kt) & 1ull) && kt < (((i >> 1) & 1) ? vis1 : vis0) - pos0;
          s[i] = ok ? s[i] : -INFINITY;
        }
      }
      float a[2], sum[2];
      float neg_m[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]);
        float mx = fmaxf(fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3])), fmaxf(fmaxf(v[4], v[5]), fmaxf(v[6], v[7])));
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
        mx *= p.scale_log2;
        // The lazy maximum (kLazy): the reference moves only when passed by more than 2^kLazy.
        const float m = mx > m_run[h] + kLazy ? mx : m_run[h];
        a[h] = m == m_run[h] ? 1.0f : exp2f(m_run[h] - m);
        m_run[h] = m;
        neg_m[h] = m == -INFINITY ? 0.0f : -m;
      }
      float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float e0 = ptx::ex2_ftz(fmaf(s[4 * j + 2 * h], p.scale_log2, neg_m[h]));
          const float e1 = ptx::ex2_ftz(fmaf(s[4 * j + 2 * h + 1], p.scale_log2, neg_m[h]));
          acc[h][j & 1] += e0 + e1;
          pa[j >> 1][2 * (j & 1) + h] = gp::pack_bf16x2(e0, e1);
        }
      }
      sum[0] = acc[0][0] + acc[0][1], sum[1] = acc[1][0] + acc[1][1];
      l_run[0] = l_run[0] * a[0] + sum[0];
      l_run[1] = l_run[1] * a[1] + sum[1];
      // P and the rescale factors for warpgroup 1, once it has read the previous ones.
      if (t >= 1) ptx::mbar_wait(gp::smem_addr(p_free), (t - 1) & 1);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          *reinterpret_cast<uint32_t*>(ps + sw128(r0 + 8 * (q & 1), 16 * kk + 8 * (q >> 1) + 2 * c)) = pa[kk][q];
        }
      }
      if (c == 0) ss[ra] = a[0], ss[rb] = a[1];
      ptx::fence_proxy_async();
      ptx::mbar_arrive(gp::smem_addr(p_ready));
      scale_o(o, a[0], a[1]);
      const uint64_t dv = dv_of(k);
      ptx::wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) ptx::wgmma_n256_bf16_rs(o, pa[kk], dv + ((kk * 2048) >> 4), 1);
      ptx::wg_commit();
      ptx::wg_wait<0>();
      ptx::wg_hold128(o);
      ptx::mbar_arrive(gp::smem_addr(&empty[k]));
    }
    float l_fin[2];
    quad_row_sums(l_run, l_fin);
    if (c == 0) sl[ra] = l_fin[0], sl[rb] = l_fin[1];
    ptx::mbar_arrive(gp::smem_addr(l_ready));
    finish(o, l_fin, m_run);
  } else {
    ptx::setmaxnreg_dec<kRsPvRegs>();
    float o[128];
    start(o);
    // ---- warpgroup 1: O_R += P V_R, P from shared memory ----
    const uint64_t dp = ptx::desc_sw128(gp::smem_addr(ps), 16, 1024);
    for (int t = 0; t < n_tiles; ++t) {
      const int k = t & 1;
      ptx::mbar_wait(gp::smem_addr(p_ready), t & 1);
      scale_o(o, ss[ra], ss[rb]);
      const uint64_t dv = dv_of(k);
      ptx::wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) ptx::wgmma_n256_bf16_ss(o, dp + ((kk * 32) >> 4), dv + ((kk * 2048) >> 4), 1);
      ptx::wg_commit();
      ptx::wg_wait<0>();
      ptx::wg_hold128(o);
      ptx::mbar_arrive(gp::smem_addr(p_free));
      ptx::mbar_arrive(gp::smem_addr(&empty[k]));
    }
    ptx::mbar_wait(gp::smem_addr(l_ready), 0);
    const float l_fin[2] = {sl[ra], sl[rb]}, m_fin[2] = {-INFINITY, -INFINITY};  // (the LSE is warpgroup 0's)
    finish(o, l_fin, m_fin);
  }
#endif  // MLAKV_SM90_DEVICE
}

}  // namespace
}  // namespace mlakv::cuda::sm90
