// The natural-arrangement many-row sm90 attention kernel for bf16 records (launch_nat.h;
// docs/design.md "Hopper kernels, natural arrangement"): the query rows are the wgmma M
// dimension, the KV tile is read by the tensor cores straight from shared memory, both
// as K^T (S = Q K^T) and as V (O = P V), so no operand of the large product passes
// through registers.
//
// One CTA = 64 query rows x one KV split of one request (rows i * H + h), 384 threads:
//  - warp 8, the producer (warps 9..11 exit at once; setmaxnreg gives their registers to
//    the consumers): walks the block table (one lookup per lane for the boxes of the next
//    32 / boxes-per-tile tiles) and loads each 32-token tile with 2-D TMA boxes (the cache
//    viewed as [num_slots, 576] bf16, 128-byte swizzle, box 64 dims x min(block_size, 32)
//    rows; 9 column blocks of 4 KB per tile) into a ring of three stages, publishing the
//    tile's 32-bit validity mask (token in a valid page and before the split's end);
//    boxes of invalid pages are not loaded;
//  - warpgroups 0 and 1, the consumers, run the same program on every tile (no roles):
//    warpgroup k computes the partial scores of the tile over its half of the 576 dims
//    (k-steps 18 k .. 18 k + 17: 18 SS wgmma m64n32k16, Q and K both K-major in the
//    swizzled layout, Q resident in shared memory); the two halves are exchanged through
//    shared memory (an mbarrier per tile parity) and summed in the same order by both,
//    so both hold the same full scores and run the same online softmax on them: no
//    maximum, rescale factor or P crosses the warpgroups. Warpgroup k then zeroes the V
//    rows of masked tokens in its own column blocks (NaN-poisoned slots may sit there:
//    0 * NaN would reach O) and computes O_k += P V over its 256 output dims (2 RS wgmma
//    m64n256k16, P from the score registers; V read MN-major from the same tile).
//    The scores of tile t + 1 are issued before the exchange and softmax of tile t, so the
//    tensor cores run them meanwhile (two score register sets; the loop runs in pairs).
//    Each warpgroup keeps O for its 256 dims (128 fp32 registers), for all 64 rows.
// Softmax rows live in the wgmma accumulator fragment (each row in the four threads of a
// quad), so the row max / sum are two shuffles. Stage t % 3 goes back to the producer once
// both warpgroups' P V of tile t completed (at their next tile's wait).
// Shared memory: Q 72 KB + 3 stages x 36 KB + the score exchange 32 KB + barriers (one CTA
// per SM).
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: the map is made through the runtime's driver entry point)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/cta_work.cuh"
#include "cuda/sm80/attention/mma.cuh"  // mlakv::cuda::ptx::smem_addr, pack_bf16x2
#include "cuda/sm90/attention/launch_nat.h"
#include "cuda/sm90/attention/ptx.cuh"
#include "cuda/sm90/attention/ptx_nat.cuh"
#include "cuda/sm90/attention/ptx_rows.cuh"
#include "mlakv/formats.h"
#include "mlakv/numerics.h"

namespace mlakv::cuda::sm90 {
namespace {

namespace nat {

using kernels::AttentionParams;

constexpr int kRows = kNatRowsPerCta;          // 64 query rows per CTA
constexpr int kTile = kNatTokenTile;           // 32 tokens per tile
constexpr int kBlocks = kQkDim / 64;           // 9 column blocks of 64 dims (128 B) per row
constexpr int kBlockBytes = kTile * 128;       // 4 KB: one column block of a tile
constexpr int kStageBytes = kBlocks * kBlockBytes;  // 36 KB
constexpr int kQBlockBytes = kRows * 128;      // 8 KB: one column block of Q
constexpr int kQBytes = kBlocks * kQBlockBytes;     // 72 KB
constexpr int kStages = 3;
constexpr int kKSteps = kQkDim / 16 / 2;       // 18 k-steps of the scores per warpgroup
constexpr int kConsumerWarps = 8;
constexpr int kThreads = 32 * kConsumerWarps + 128;  // + the producer warpgroup
constexpr int kConsumerRegs = 240, kProducerRegs = 24;
// The score exchange: [tile parity][warpgroup][warp][float4 i][lane] (16 fp32 per thread).
constexpr int kXWarpBytes = 4 * 32 * 16;                // 2 KB
constexpr int kXBytes = 2 * 2 * 4 * kXWarpBytes;        // 32 KB
// misc: full[3], empty[3], xbar[2] (8 B each), vmask[3] (4 B each)
constexpr int kMiscBytes = 8 * 8 + 4 * kStages;
constexpr int kSmemBytes = 1024 + kQBytes + kStages * kStageBytes + kXBytes + kMiscBytes;  // + 1 KB for the 1024-B alignment
static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM");
static_assert(kTile == 32, "the validity mask and the exchange layout assume 32-token tiles");
constexpr float kLn2 = 0.6931471805599453f;
// Named barriers (0 is __syncthreads): 3 + k = warpgroup k alone (128), 5 = both consumer
// warpgroups (after Q). The score exchange goes through mbarriers (release arrive by all
// 256 consumer threads, acquire wait): compute-sanitizer's racecheck reported hazards across
// named-barrier hand-offs in the earlier form of this kernel (docs/perf.md, fourth and
// fifth sessions), none across mbarriers.
constexpr int kBarWg = 3, kBarAll = 5;

// Byte offset of (row r, element k) inside a block of 64-element (128-byte) rows of the
// 128-byte swizzled layout (what TMA writes with CU_TENSOR_MAP_SWIZZLE_128B into a 1024-B
// aligned block): 16-byte chunk k / 8 of row r moves to chunk (k / 8) ^ (r % 8).
__device__ __forceinline__ uint32_t sw128(int r, int k) {
  return static_cast<uint32_t>(r * 128 + ((((k >> 3) ^ r) & 7) << 4) + ((k & 7) << 1));
}

// The page-table lookup of the box starting at token position `pos` of request b: the
// box's first cache row, or -1 (page past the table or an invalid block id).
__device__ __forceinline__ int64_t box_row(const AttentionParams& p, int b, int64_t pos) {
  const int64_t page = pos / p.block_size;
  if (page >= p.bt_cols) return -1;
  const int32_t raw = p.block_table[b * p.bt_s0 + page * p.bt_s1];
  if (raw < 0 || raw >= p.num_blocks) return -1;
  return static_cast<int64_t>(raw) * p.block_size + pos % p.block_size;
}

}  // namespace nat

__global__ void __launch_bounds__(nat::kThreads, 1)
    attention_nat_kernel(const __grid_constant__ kernels::AttentionParams p, const __grid_constant__ CUtensorMap tmap) {
#if MLAKV_SM90_DEVICE
  using namespace nat;
  namespace gp = mlakv::cuda::ptx;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // The swizzled blocks need 1024-byte alignment.
  uint8_t* smem = smem_raw + ((1024 - (gp::smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* qs = smem;
  uint8_t* ring = qs + kQBytes;
  uint8_t* xs = ring + kStages * kStageBytes;
  uint8_t* misc = xs + kXBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(misc);
  uint64_t* empty = full + kStages;
  uint64_t* xbar = empty + kStages;  // xbar[t % 2]: both warpgroups' partial scores of tile t are in xs
  uint32_t* vmask = reinterpret_cast<uint32_t*>(xbar + 2);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int split = blockIdx.z;
  const CtaWork cw = cta_work<kRows, kTile, kTile>(p);
  const int b = cw.b;
  const int64_t begin = cw.begin, end = cw.end;
  const int n_tiles = cw.n_tiles;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(gp::smem_addr(&full[s]), 1);
      ptx::mbar_init(gp::smem_addr(&empty[s]), kConsumerWarps);
    }
    for (int k = 0; k < 2; ++k) ptx::mbar_init(gp::smem_addr(&xbar[k]), 32 * kConsumerWarps);
    ptx::mbar_init_fence();
  }
  __syncthreads();

  if (warp >= kConsumerWarps) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (warp != kConsumerWarps) return;
    // ---- producer: one lane per box of the tile ----
    const int br = p.block_size < kTile ? p.block_size : kTile;  // box rows (launch_nat.h: 8, 16 or 32)
    const int n_box = kTile / br;                                // boxes per tile: 1, 2 or 4
    const int tiles_per_lookup = 32 / n_box;                     // tiles whose boxes one lookup round covers
    if (lane == 0) ptx::prefetch_tensormap(&tmap);
    int64_t looked_up = -1;  // this lane's box of the current lookup round
    for (int t = 0; t < n_tiles; ++t) {
      const int st = t % kStages;
      const int64_t pos0 = begin + static_cast<int64_t>(t) * kTile;
      const int tr = t % tiles_per_lookup;
      if (tr == 0) {
        const int64_t pos = pos0 + static_cast<int64_t>(lane) * br;
        looked_up = pos < end ? box_row(p, b, pos) : -1;
      }
      const int64_t got = __shfl_sync(0xFFFFFFFFu, looked_up, tr * n_box + (lane < n_box ? lane : 0));
      const int64_t row = lane < n_box ? got : -1;
      const uint32_t valid = __ballot_sync(0xFFFFFFFFu, row >= 0);
      if (t >= kStages) ptx::mbar_wait(gp::smem_addr(&empty[st]), ((t / kStages) - 1) & 1);
      const uint32_t bar = gp::smem_addr(&full[st]);
      if (lane == 0) {
        const uint32_t box_bits = br == 32 ? ~0u : ((1u << br) - 1);
        uint32_t mask = 0;
        for (int k = 0; k < n_box; ++k) {
          if ((valid >> k) & 1u) mask |= box_bits << (k * br);
        }
        const int64_t left = end - pos0;
        if (left < kTile) mask &= (1u << left) - 1;
        vmask[st] = mask;
        ptx::mbar_arrive_expect_tx(bar, static_cast<uint32_t>(__popc(valid)) * kBlocks * br * 128);
      }
      __syncwarp();
      if (row >= 0) {
        const uint32_t dst = gp::smem_addr(ring + st * kStageBytes + lane * br * 128);
#pragma unroll
        for (int k = 0; k < kBlocks; ++k) ptx::tma_load_2d(dst + k * kBlockBytes, &tmap, 64 * k, static_cast<int>(row), bar);
      }
    }
    return;
  }
  ptx::setmaxnreg_inc<kConsumerRegs>();

  // wg through a shuffle from lane 0: ptxas then knows it is warp-uniform and keeps the
  // descriptors built from it in uniform registers (no per-wgmma R2UR).
  const int wg = __shfl_sync(0xFFFFFFFFu, warp >> 2, 0), w = warp & 3, ctid = tid & 255, g = lane >> 2, c = lane & 3;
  // ---- Q of the 64 rows, bf16, swizzled K-major: thread (row ctid / 4) writes chunks ctid % 4 + 4 k ----
  {
    const int r = ctid >> 2, sub = ctid & 3;
    const bool ok = cw.row0 + r < cw.rows_req;
    const int rc = ok ? r : 0;
    const int64_t off = b * p.q_s0 + static_cast<int64_t>(cw.query(p, rc)) * p.q_s1 + static_cast<int64_t>(cw.head(p, rc)) * p.q_s2;
    // 16-byte loads where the row is 16-byte aligned (the usual contiguous q), else scalar
    // ones (any q stride).
    const uintptr_t qbase = reinterpret_cast<uintptr_t>(p.q);
    const bool vec = p.q_bf16 ? ((qbase + 2 * off) & 15) == 0 : ((qbase + 4 * off) & 15) == 0;
#pragma unroll 2
    for (int k = 0; k < kQkDim / 8 / 4; ++k) {
      const int ch = sub + 4 * k;  // 16-byte chunk: dims 8 ch .. 8 ch + 7
      const int64_t d0 = off + 8 * ch;
      uint32_t v[4];
      if (vec && p.q_bf16) {
        const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.q) + d0);
        v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
      } else if (vec) {
        const float4 lo = *reinterpret_cast<const float4*>(static_cast<const float*>(p.q) + d0);
        const float4 hi = *reinterpret_cast<const float4*>(static_cast<const float*>(p.q) + d0 + 4);
        v[0] = gp::pack_bf16x2(lo.x, lo.y), v[1] = gp::pack_bf16x2(lo.z, lo.w);
        v[2] = gp::pack_bf16x2(hi.x, hi.y), v[3] = gp::pack_bf16x2(hi.z, hi.w);
      } else {
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int64_t d = d0 + 2 * x;
          if (p.q_bf16) {
            const uint16_t* q16 = static_cast<const uint16_t*>(p.q);
            v[x] = static_cast<uint32_t>(q16[d]) | (static_cast<uint32_t>(q16[d + 1]) << 16);
          } else {
            const float* q32 = static_cast<const float*>(p.q);
            v[x] = gp::pack_bf16x2(q32[d], q32[d + 1]);
          }
        }
      }
#pragma unroll
      for (int x = 0; x < 4; ++x) v[x] = ok ? v[x] : 0u;
      *reinterpret_cast<uint4*>(qs + (ch >> 3) * kQBlockBytes + sw128(r, 8 * (ch & 7))) = make_uint4(v[0], v[1], v[2], v[3]);
    }
    ptx::fence_proxy_async();
  }
  ptx::named_barrier(kBarAll, 256);

  const uint32_t q_addr = gp::smem_addr(qs), ring_addr = gp::smem_addr(ring);
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  ptx::wg_hold128(o);  // opaque zeros: constant-folded ones make ptxas serialize the P V wgmma (C7515)
  float s[16];
  uint32_t pa_even[2][4], pa_odd[2][4];  // P of even / odd tiles (A fragments of the two k-steps)
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  float alpha[2] = {1.0f, 1.0f};  // the rescale factors of the tile whose P V goes out next
  const int r0 = 16 * w + g;      // this thread's rows: r0, r0 + 8
  const int32_t vis0 = cw.visible(p, r0), vis1 = cw.visible(p, r0 + 8);

  // This warpgroup's partial scores of tile t: in every 64-dim block the k-steps 2 wg and
  // 2 wg + 1 (32 B each inside the 128-byte rows), so that a step's offset from the
  // warpgroup's base descriptor is a constant (step i: block i / 2, 32 B x (i % 2)).
  const uint64_t dq0 = ptx::desc_sw128(q_addr + 64 * wg, 16, 1024);
  auto issue_scores = [&](int t) __attribute__((always_inline)) {
    const int st = t % kStages;
    ptx::mbar_wait(gp::smem_addr(&full[st]), (t / kStages) & 1);
    const uint64_t dk0 = ptx::desc_sw128(ring_addr + st * kStageBytes + 64 * wg, 16, 1024);
    ptx::wg_fence();
#pragma unroll
    for (int i = 0; i < kKSteps; ++i) {
      // Descriptor + (byte offset >> 4): the start-address field (addr >> 4, 14 bits) never carries.
      const uint32_t qo = ((i >> 1) * kQBlockBytes + (i & 1) * 32) >> 4, ko = ((i >> 1) * kBlockBytes + (i & 1) * 32) >> 4;
      ptx::wgmma_n32_bf16_ss(s, dq0 + qo, dk0 + ko, i > 0);
    }
    ptx::wg_commit();
  };
  // The scores of tile t (completed) -> both halves summed, the online softmax (the same in
  // both warpgroups), P into `pa`, alpha for the rescale before its P V, the V rows of
  // masked tokens zeroed in this warpgroup's blocks.
  auto softmax = [&](int t, uint32_t(&pa)[2][4]) __attribute__((always_inline)) {
    const int st = t % kStages;
    uint8_t* stage = ring + st * kStageBytes;
    // The exchange: my half of the scores out, the other half in, summed into x (the
    // score registers are written by the wgmma only, C7515).
    float x[16];
    {
      uint8_t* xt = xs + (t & 1) * (2 * 4 * kXWarpBytes);
      float4* mine = reinterpret_cast<float4*>(xt + (wg * 4 + w) * kXWarpBytes) + lane;
      const float4* other = reinterpret_cast<const float4*>(xt + ((1 - wg) * 4 + w) * kXWarpBytes) + lane;
#pragma unroll
      for (int i = 0; i < 4; ++i) mine[32 * i] = make_float4(s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]);
      ptx::mbar_arrive(gp::smem_addr(&xbar[t & 1]));
      ptx::mbar_wait(gp::smem_addr(&xbar[t & 1]), (t >> 1) & 1);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // One rounded fp32 add of the same two halves (commutative): both warpgroups get the same sums.
        const float4 v = other[32 * i];
        x[4 * i] = s[4 * i] + v.x, x[4 * i + 1] = s[4 * i + 1] + v.y;
        x[4 * i + 2] = s[4 * i + 2] + v.z, x[4 * i + 3] = s[4 * i + 3] + v.w;
      }
    }
    const uint32_t mask = vmask[st];
    const int64_t pos0 = begin + static_cast<int64_t>(t) * kTile;
    // Masked scores -> -inf (token outside the split or in an invalid page, or past the
    // row's causal limit); a tile every row sees whole (all but the last ones) skips the test.
    const bool whole = mask == ~0u && vis0 - pos0 >= kTile && vis1 - pos0 >= kTile;
    if (!__all_sync(0xFFFFFFFFu, whole)) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int k = 8 * (i >> 2) + 2 * c + (i & 1);
        const bool ok = ((mask >> k) & 1u) && k < (((i >> 1) & 1) ? vis1 : vis0) - pos0;
        x[i] = ok ? x[i] : -INFINITY;
      }
    }
    // The row maxima in the log2 domain (scale_log2 > 0 keeps the order), then
    // p = exp2(x scale_log2 - m) in one FFMA per score.
    float neg_m[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) v = fmaxf(v, fmaxf(x[4 * j + 2 * h], x[4 * j + 2 * h + 1]));
      v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
      v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
      const float m_new = fmaxf(m_run[h], v * p.scale_log2);
      alpha[h] = m_run[h] == -INFINITY ? 0.0f : exp2f(m_run[h] - m_new);
      m_run[h] = m_new;
      neg_m[h] = m_new == -INFINITY ? 0.0f : -m_new;  // a row that saw nothing yet: every x is -inf, p = 0
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int h = (i >> 1) & 1;
      const float e = exp2f(fmaf(x[i], p.scale_log2, neg_m[h]));
      sum[h] += e;
      x[i] = e;
    }
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
      for (int q = 0; q < 4; ++q) pa[kk][q] = gp::pack_bf16x2(x[8 * kk + 2 * q], x[8 * kk + 2 * q + 1]);
    }
    l_run[0] = l_run[0] * alpha[0] + sum[0];
    l_run[1] = l_run[1] * alpha[1] + sum[1];
    if (mask != ~0u) {
      // Zero the V rows of masked tokens in this warpgroup's blocks (4 wg .. 4 wg + 3; 128
      // threads, 16 B each): both warpgroups' S(t) completed (the exchange).
      for (int i = ctid & 127; i < kTile * 4 * 8; i += 128) {
        const int k = i >> 5, blk = 4 * wg + ((i >> 3) & 3), ch = i & 7;
        if (!((mask >> k) & 1u)) *reinterpret_cast<uint4*>(stage + blk * kBlockBytes + k * 128 + ch * 16) = make_uint4(0, 0, 0, 0);
      }
      ptx::fence_proxy_async();
      ptx::named_barrier(kBarWg + wg, 128);
    }
  };
  auto scale_o = [&](float a0, float a1) {
    if (__any_sync(0xFFFFFFFFu, a0 != 1.0f || a1 != 1.0f)) {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j] *= a0, o[4 * j + 1] *= a0;
        o[4 * j + 2] *= a1, o[4 * j + 3] *= a1;
      }
    }
  };
  // V of this warpgroup's 256 dims: column blocks 4 wg .. 4 wg + 3 (lbo 4 KB), k-step kk = tokens 16 kk.. (2 KB).
  auto v_desc = [&](int st, int kk) {
    return ptx::desc_sw128(ring_addr + st * kStageBytes + 4 * wg * kBlockBytes, kBlockBytes, 1024) + ((kk * 2048) >> 4);
  };

  // One step per tile t (P(t) ready): S(t + 1) out, O rescaled, P V(t) out; S(t + 1)'s
  // exchange and softmax while P V(t) runs; the stage of t back once P V(t) completed.
  // Nothing is in flight across steps, so ptxas sees every accumulator read after a
  // wait that covers it (C7514 otherwise). P of even and odd tiles in two register sets
  // (P V(t) reads one while the softmax writes the other; the loop runs in pairs). At the
  // last tile the scores of tile t again (discarded): the same wgmma in every step.
  if (n_tiles > 0) {
    issue_scores(0);
    ptx::wg_wait<0>();
    ptx::wg_hold16(s);
    softmax(0, pa_even);
  }
  auto step = [&](const int t, uint32_t(&pc)[2][4], uint32_t(&pn)[2][4]) __attribute__((always_inline)) {
    if (t >= n_tiles) return;
    const bool more = t + 1 < n_tiles;
    issue_scores(more ? t + 1 : t);
    scale_o(alpha[0], alpha[1]);
    ptx::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) ptx::wgmma_n256_bf16_rs(o, pc[kk], v_desc(t % kStages, kk), 1);
    ptx::wg_commit();
    ptx::wg_wait<1>();
    ptx::wg_hold16(s);
    if (more) softmax(t + 1, pn);
    ptx::wg_wait<0>();
    ptx::wg_hold128(o);
    ptx::wg_hold16(s);
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(gp::smem_addr(&empty[t % kStages]));
  };
  for (int t = 0; t < n_tiles; t += 2) {
    step(t, pa_even, pa_odd);
    step(t + 1, pa_odd, pa_even);
  }
  // ---- finalize: every row's 256 dims of this warpgroup (both hold the same m and l) ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xFFFFFFFFu, l, 1);
    l += __shfl_xor_sync(0xFFFFFFFFu, l, 2);
    const int r = r0 + 8 * h;
    if (cw.row0 + r >= cw.rows_req) continue;
    const bool is_empty = l == 0.0f;
    const float inv_l = is_empty ? 0.0f : 1.0f / l;
    const float lse = is_empty ? -INFINITY : (m_run[h] + log2f(l)) * kLn2;
    const int i = cw.query(p, r), hh = cw.head(p, r);
    const bool lse_here = wg == 0 && c == 0;
    float* dst = result_row(p, b, split, i, hh, lse, lse_here);
    dst += 256 * wg + 2 * c;
    if ((reinterpret_cast<uintptr_t>(dst) & 7) == 0) {
      // 8-byte stores: a quad writes whole 32-byte sectors.
#pragma unroll
      for (int j = 0; j < 32; ++j) *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * h] * inv_l, o[4 * j + 2 * h + 1] * inv_l);
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        dst[8 * j] = o[4 * j + 2 * h] * inv_l;
        dst[8 * j + 1] = o[4 * j + 2 * h + 1] * inv_l;
      }
    }
  }
#endif  // MLAKV_SM90_DEVICE
}

}  // namespace
}  // namespace mlakv::cuda::sm90
