// The natural-arrangement many-row sm90 attention kernel for bf16 records (launch_nat.h;
// docs/design.md "Hopper kernels, natural arrangement"): the query rows are the wgmma M
// dimension, the KV tile is read by the tensor cores straight from shared memory, both
// as K^T (S = Q K^T) and as V (O = P V), so no operand of the large product passes
// through registers and no partial score crosses warpgroups.
//
// One CTA = 64 query rows x one KV split of one request (rows i * H + h), 384 threads:
//  - warp 8, the producer (warps 9..11 exit at once; setmaxnreg gives their registers to
//    the consumers): walks the block table one 64-token tile at a time and loads each
//    tile with 2-D TMA boxes (the cache viewed as [num_slots, 576] bf16, 128-byte swizzle,
//    box 64 dims x min(block_size, 64) rows; 9 column blocks of 8 KB per tile) into a
//    ring of two stages, publishing the tile's 64-bit validity mask (token in a valid
//    page and before the split's end); boxes of invalid pages are not loaded;
//  - warpgroups 0 and 1, the consumers. Tile t belongs to warpgroup t % 2 (its owner):
//      owner    S = Q K^T (64 rows x 64 tokens, 36 SS wgmma m64n64k16: Q and K both
//               K-major in the swizzled layout, Q resident in shared memory), masking,
//               the online softmax against the running row maxima the other warpgroup
//               left in shared memory, then publishes the new maxima, the rescale
//               factors alpha and P (bf16, written over the tile's rope block, which S
//               no longer needs) and zeroes the V rows of masked tokens (NaN-poisoned
//               slots may sit there: 0 * NaN would reach O); mbarrier hand-off;
//               O_own += P V (4 RS wgmma m64n256k16, P from the S registers);
//      other    waits for the hand-off, rescales its O by alpha, O += P V (the same 4
//               RS wgmma m64n256k16, P loaded by ldmatrix from the rope block), then
//               issues S of its next tile.
//    Each warpgroup keeps O for its half of the 512 output dims (warpgroup k: dims
//    256 k .. 256 k + 255, 128 fp32 registers), for all 64 rows; V is read MN-major
//    (transpose bit) from the same swizzled tile: dims in 64-wide blocks 8 KB apart
//    (lbo), tokens in 8-row groups 1 KB apart (sbo).
// Softmax rows live in the wgmma accumulator fragment (each row in the four threads of a
// quad), so the row max / sum are two shuffles; the running max passes between the
// warpgroups with the hand-off (the owner of tile t reads the maxima after tile t - 1).
// Stage t % 2 goes back to the producer when both warpgroups' P V of tile t completed
// (each warpgroup's part at its next step, before it waits for a hand-off).
// Shared memory: Q 72 KB + 2 stages x 72 KB + 1.4 KB (one CTA per SM).
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

constexpr int kRows = kNatRowsPerCta;      // 64 query rows per CTA
constexpr int kTile = kNatTokenTile;       // 64 tokens per tile
constexpr int kBlocks = kQkDim / 64;       // 9 column blocks of 64 dims (128 B) per row
constexpr int kBlockBytes = kTile * 128;   // 8 KB: one column block of 64 rows
constexpr int kStageBytes = kBlocks * kBlockBytes;  // 72 KB
constexpr int kQBytes = kBlocks * kRows * 128;      // 72 KB
constexpr int kStages = 2;
constexpr int kConsumerWarps = 8;
constexpr int kThreads = 32 * kConsumerWarps + 128;  // + the producer warpgroup
constexpr int kConsumerRegs = 240, kProducerRegs = 24;
// misc: full[2], empty[2], hand[2], fin (8 B each), vmask[2] (8 B), m[64], alpha[2][64], l[2][64], vis[64]
constexpr int kMiscBytes = 9 * 8 + 4 * kRows * 6;
constexpr int kSmemBytes = 1024 + kQBytes + kStages * kStageBytes + kMiscBytes;  // + 1 KB for the 1024-B alignment
static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM");
constexpr float kLn2 = 0.6931471805599453f;
// Named barriers (0 is __syncthreads): 3 + k = warpgroup k alone (128), 5 = both consumer
// warpgroups (after Q). Data passes between the warpgroups through mbarriers (release
// arrive, acquire wait): hand[k], warpgroup k's tile handed off (its 128 threads arrive, the
// other warpgroup waits on the phase), and fin, both warpgroups' row sums written (256
// arrive, everyone waits). Named barriers order the same accesses in PTX, but
// compute-sanitizer's racecheck reported hazards across them here (an arrive/sync hand-off,
// and the finalize's 256-thread bar.sync; docs/perf.md, fourth and fifth sessions).
constexpr int kBarWg = 3, kBarAll = 5;

// Byte offset of (row r, element k) inside a 64-row x 64-element block of the 128-byte
// swizzled layout (what TMA writes with CU_TENSOR_MAP_SWIZZLE_128B into a 1024-B aligned
// block): 16-byte chunk k / 8 of row r moves to chunk (k / 8) ^ (r % 8).
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
  uint8_t* misc = ring + kStages * kStageBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(misc);
  uint64_t* empty = full + kStages;
  uint64_t* hand = empty + kStages;  // hand[k]: warpgroup k's tile is handed off
  uint64_t* fin = hand + 2;         // both warpgroups' row sums are in l_sh
  uint64_t* vmask = fin + 1;
  float* m_sh = reinterpret_cast<float*>(vmask + kStages);  // running row maxima (log2 domain)
  float* alpha_sh = m_sh + kRows;                           // [tile parity][row]
  float* l_sh = alpha_sh + 2 * kRows;                       // [warpgroup][row]
  int32_t* row_vis = reinterpret_cast<int32_t*>(l_sh + 2 * kRows);

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
    for (int k = 0; k < 2; ++k) ptx::mbar_init(gp::smem_addr(&hand[k]), 128);
    ptx::mbar_init(gp::smem_addr(fin), 256);
    ptx::mbar_init_fence();
  }
  if (tid < kRows) {
    row_vis[tid] = cw.visible(p, tid);
    m_sh[tid] = -INFINITY;
  }
  __syncthreads();

  if (warp >= kConsumerWarps) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (warp != kConsumerWarps) return;
    // ---- producer: one lane per box of the tile ----
    const int br = p.block_size < kTile ? p.block_size : kTile;  // box rows (launch_nat.h: 8, 16, 32 or k * 64)
    const int n_box = kTile / br;
    if (lane == 0) ptx::prefetch_tensormap(&tmap);
    for (int t = 0; t < n_tiles; ++t) {
      const int st = t % kStages;
      const int64_t pos0 = begin + static_cast<int64_t>(t) * kTile;
      const int64_t pos = pos0 + lane * br;
      const int64_t row = lane < n_box && pos < end ? box_row(p, b, pos) : -1;
      const uint32_t valid = __ballot_sync(0xFFFFFFFFu, row >= 0);
      if (t >= kStages) ptx::mbar_wait(gp::smem_addr(&empty[st]), ((t / kStages) - 1) & 1);
      const uint32_t bar = gp::smem_addr(&full[st]);
      if (lane == 0) {
        const uint64_t box_bits = br == 64 ? ~0ull : ((1ull << br) - 1);
        uint64_t mask = 0;
        for (int k = 0; k < n_box; ++k) {
          if ((valid >> k) & 1u) mask |= box_bits << (k * br);
        }
        const int64_t left = end - pos0;
        if (left < kTile) mask &= (1ull << left) - 1;
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

  const int wg = warp >> 2, w = warp & 3, ctid = tid & 255, g = lane >> 2, c = lane & 3;
  // ---- Q of the 64 rows, bf16, swizzled K-major: thread (row ctid / 4) writes chunks ctid % 4 + 4 k ----
  {
    const int r = ctid >> 2, sub = ctid & 3;
    const bool ok = cw.row0 + r < cw.rows_req;
    const int rc = ok ? r : 0;
    const int64_t off = b * p.q_s0 + static_cast<int64_t>(cw.query(p, rc)) * p.q_s1 + static_cast<int64_t>(cw.head(p, rc)) * p.q_s2;
#pragma unroll 2
    for (int k = 0; k < kQkDim / 8 / 4; ++k) {
      const int ch = sub + 4 * k;  // 16-byte chunk: dims 8 ch .. 8 ch + 7 (scalar loads: any q stride)
      uint32_t v[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int64_t d = off + 8 * ch + 2 * x;
        if (p.q_bf16) {
          const uint16_t* q16 = static_cast<const uint16_t*>(p.q);
          v[x] = static_cast<uint32_t>(q16[d]) | (static_cast<uint32_t>(q16[d + 1]) << 16);
        } else {
          const float* q32 = static_cast<const float*>(p.q);
          v[x] = gp::pack_bf16x2(q32[d], q32[d + 1]);
        }
        if (!ok) v[x] = 0;
      }
      *reinterpret_cast<uint4*>(qs + (ch >> 3) * kBlockBytes + sw128(r, 8 * (ch & 7))) = make_uint4(v[0], v[1], v[2], v[3]);
    }
    ptx::fence_proxy_async();
  }
  ptx::named_barrier(kBarAll, 256);

  const uint32_t q_addr = gp::smem_addr(qs), ring_addr = gp::smem_addr(ring);
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  ptx::wg_hold128(o);  // opaque zeros: constant-folded ones make ptxas serialize the P V wgmma (C7515)
  float s[32];
  float l_run[2] = {0.0f, 0.0f};
  const int r0 = 16 * w + g;  // this thread's rows: r0, r0 + 8

  // S of tile t (its owner): 36 k-steps, block ks / 4, 32 B per step inside the block.
  auto issue_scores = [&](int t) {
    const int st = t % kStages;
    ptx::mbar_wait(gp::smem_addr(&full[st]), (t / kStages) & 1);
    const uint32_t k_addr = ring_addr + st * kStageBytes;
    ptx::wg_fence();
#pragma unroll
    for (int ks = 0; ks < 4 * kBlocks; ++ks) {
      const uint32_t off = (ks >> 2) * kBlockBytes + (ks & 3) * 32;
      ptx::wgmma_n64_bf16_ss(s, ptx::desc_sw128(q_addr + off, 16, 1024), ptx::desc_sw128(k_addr + off, 16, 1024), ks > 0);
    }
    ptx::wg_commit();
  };
  // The stage of tile t goes back once this warpgroup's P V of it completed.
  auto release = [&](int t) {
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(gp::smem_addr(&empty[t % kStages]));
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
  // V of this warpgroup's 256 dims: column blocks 4 wg .. 4 wg + 3 (lbo 8 KB), k-step kk = tokens 16 kk.. (2 KB).
  auto v_desc = [&](int st, int kk) {
    return ptx::desc_sw128(ring_addr + st * kStageBytes + 4 * wg * kBlockBytes + kk * 2048, kBlockBytes, 1024);
  };

  // One site per wgmma kind and one wgmma.wait site per step (both warpgroups run the
  // same instructions on the same registers; only selects and branches without wgmma
  // depend on the role): ptxas serializes the wgmma otherwise (C7515). One step per
  // tile, P of even and odd tiles in two register sets (the loop runs in pairs).
  uint32_t pa_even[4][4], pa_odd[4][4];
  auto step = [&](const int t, uint32_t(&pa_t)[4][4]) __attribute__((always_inline)) {
    if (t >= n_tiles) return;
    if (t >= 0) {
      const int st = t % kStages;
      uint8_t* stage = ring + st * kStageBytes;
      uint8_t* pblk = stage + (kBlocks - 1) * kBlockBytes;  // P over the rope block (S is done with it)
      const bool own = (t & 1) == wg;
      uint32_t(&pa)[4][4] = pa_t;
      float sum[2] = {0.0f, 0.0f};
      float a[2];
      // In flight: this warpgroup's P V of tile t - 1, and S(t) when it owns t. The stage
      // of tile t - 1 goes back before the hand-off wait (the producer refills it meanwhile).
      ptx::wg_wait<0>();
      ptx::wg_hold128(o);
      if (t >= 1) release(t - 1);
      ptx::wg_hold32(s);
      if (own) {
        // ---- owner: softmax of S(t), P, the new maxima and alpha, hand-off ----
        const uint64_t mask = vmask[st];
        const int64_t pos0 = begin + static_cast<int64_t>(t) * kTile;
        float m_new[2], alpha[2];
        float(&x_all)[32] = s;  // the scores, scaled and masked, then P
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = r0 + 8 * h;
          const int64_t vis = row_vis[r] - pos0;  // tokens of the tile this row sees
          float v = -INFINITY;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int k = 8 * j + 2 * c + e;
              const bool ok = ((mask >> k) & 1ull) && k < vis;
              float& x = x_all[4 * j + 2 * h + e];
              x = ok ? s[4 * j + 2 * h + e] * p.scale_log2 : -INFINITY;
              v = fmaxf(v, x);
            }
          }
          v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
          v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
          const float m_prev = m_sh[r];
          m_new[h] = fmaxf(m_prev, v);
          alpha[h] = m_prev == -INFINITY ? 0.0f : exp2f(m_prev - m_new[h]);
        }
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const int h = (i >> 1) & 1;
          const float e = m_new[h] == -INFINITY ? 0.0f : exp2f(x_all[i] - m_new[h]);
          sum[h] += e;
          x_all[i] = e;
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
          for (int x = 0; x < 4; ++x) pa[kk][x] = gp::pack_bf16x2(x_all[8 * kk + 2 * x], x_all[8 * kk + 2 * x + 1]);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            *reinterpret_cast<uint32_t*>(pblk + sw128(r0 + 8 * h, 8 * j + 2 * c)) = pa[j >> 1][2 * (j & 1) + h];
          }
        }
        __syncwarp();  // every thread of the quad has read m_sh
        if (c == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            m_sh[r0 + 8 * h] = m_new[h];
            alpha_sh[(t & 1) * kRows + r0 + 8 * h] = alpha[h];
          }
        }
        if (mask != ~0ull) {
          // Zero the V rows of masked tokens (blocks 0..7; 128 threads, 16 B each).
          for (int i = ctid & 127; i < kTile * 8 * 8; i += 128) {
            const int k = i >> 6, blk = (i >> 3) & 7, ch = i & 7;
            if (!((mask >> k) & 1ull)) *reinterpret_cast<uint4*>(stage + blk * kBlockBytes + k * 128 + ch * 16) = make_uint4(0, 0, 0, 0);
          }
          ptx::fence_proxy_async();
          ptx::named_barrier(kBarWg + wg, 128);
        }
        ptx::mbar_arrive(gp::smem_addr(&hand[wg]));  // hand-off number t / 2 of this warpgroup
        a[0] = alpha[0], a[1] = alpha[1];
      } else {
        // ---- other: the owner's hand-off, P from shared memory ----
        ptx::mbar_wait(gp::smem_addr(&hand[1 - wg]), (t >> 1) & 1);
        ptx::mbar_wait(gp::smem_addr(&full[st]), (t / kStages) & 1);  // the tile's bytes (complete: its owner waited)
        a[0] = alpha_sh[(t & 1) * kRows + r0], a[1] = alpha_sh[(t & 1) * kRows + r0 + 8];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const int mi = lane >> 3;
          gp::ldmatrix_x4(pa[kk], gp::smem_addr(pblk + sw128(16 * w + (lane & 7) + 8 * (mi & 1), 16 * kk + 8 * (mi >> 1))));
        }
      }
      // ---- both: O = alpha O + P V over this warpgroup's 256 dims ----
      l_run[0] = l_run[0] * a[0] + sum[0];
      l_run[1] = l_run[1] * a[1] + sum[1];
      scale_o(a[0], a[1]);
    }
    if (t >= 0) {
      ptx::wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) ptx::wgmma_n256_bf16_rs(o, pa_t[kk], v_desc(t % kStages, kk), 1);
      ptx::wg_commit();
    }
    // ---- S of this warpgroup's next tile, after its P V of this one ----
    if (t + 1 < n_tiles && ((t + 1) & 1) == wg) issue_scores(t + 1);
  };
  step(-1, pa_odd);
  for (int t = 0; t < n_tiles; t += 2) {
    step(t, pa_even);
    step(t + 1, pa_odd);
  }
  ptx::wg_wait<0>();
  ptx::wg_hold128(o);
  ptx::wg_hold32(s);

  // ---- finalize: l of both warpgroups, then every row's 256 dims of this warpgroup ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float v = l_run[h];
    v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
    v += __shfl_xor_sync(0xFFFFFFFFu, v, 2);
    if (c == 0) l_sh[wg * kRows + r0 + 8 * h] = v;
  }
  ptx::mbar_arrive(gp::smem_addr(fin));
  ptx::mbar_wait(gp::smem_addr(fin), 0);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + 8 * h;
    if (cw.row0 + r >= cw.rows_req) continue;
    const float l = l_sh[r] + l_sh[kRows + r];
    const bool is_empty = l == 0.0f;
    const float inv_l = is_empty ? 0.0f : 1.0f / l;
    const float lse = is_empty ? -INFINITY : (m_sh[r] + log2f(l)) * kLn2;
    const int i = cw.query(p, r), hh = cw.head(p, r);
    const bool lse_here = wg == 0 && c == 0;
    float* dst = result_row(p, b, split, i, hh, lse, lse_here);
    dst += 256 * wg + 2 * c;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      dst[8 * j] = o[4 * j + 2 * h] * inv_l;
      dst[8 * j + 1] = o[4 * j + 2 * h + 1] * inv_l;
    }
  }
#endif  // MLAKV_SM90_DEVICE
}

}  // namespace
}  // namespace mlakv::cuda::sm90
