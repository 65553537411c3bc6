// The sm80 MLA attention kernel over the paged cache (sm_80 and later; built for
// every architecture in MLAKV_CUDA_ARCHS). Same operation and semantics as
// mla_attention_cpu. Included only by instantiations/<format>.cu, one format each.
//
// One CTA = 4 warps = 16 query rows (one m16 MMA tile) x one KV split of one request
// (dense) or one query (sparse). Per tile of 32 tokens:
//   1. the raw records (any format) arrive in shared memory by cp.async, issued one
//      tile ahead so the loads overlap the previous tile's math;
//   2. all 128 threads dequantize them once into a bf16 tile K [32][576] - the fused
//      dequantization of reader.cuh: no dequantized copy of the cache exists anywhere else;
//   3. S = Q K^T with mma.sync m16n8k16: warp w owns head dims [144w, 144w+144) for
//      all 32 tokens, so its Q fragments (9 k-steps) stay in registers for the whole
//      kernel; the four partial S tiles are summed through shared memory;
//   4. online softmax in the exp2 domain (warp w finishes tokens [8w, 8w+8));
//   5. O += P V: warp w owns output columns [128w, 128w+128) (V = K's first 512 dims).
// Split-KV partials go to the workspace; smxx's combine kernel (smxx/combine.cu) merges
// them with the AttnState rule of attn_state.h.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "cuda/common/cta_work.cuh"
#include "cuda/sm80/attention/config.h"
#include "cuda/sm80/attention/launch.h"
#include "cuda/sm80/attention/mma.cuh"
#include "cuda/sm80/attention/reader.cuh"
#include "mlakv/numerics.h"

namespace mlakv::cuda::sm80 {

using KParams = kernels::AttentionParams;

// Token lookup in two halves, so the global read can be issued early and its result
// used late: fetch -> raw block id / index (or -1), finish -> slot (or -1).
__device__ inline int32_t token_fetch(const KParams& p, int b, int i, int64_t pos, int64_t end) {
  if (pos >= end) return -1;
  if (p.sparse) return p.indices[b * p.ix_s0 + i * p.ix_s1 + pos * p.ix_s2];
  if (pos / p.block_size >= p.bt_cols) return -1;  // a seqlen past the table: never read past its row
  return p.block_table[b * p.bt_s0 + (pos / p.block_size) * p.bt_s1];
}
__device__ inline int64_t token_finish(const KParams& p, int32_t raw, int64_t pos) {
  if (p.sparse) return (raw >= 0 && raw < p.num_slots) ? raw : -1;
  if (raw < 0 || raw >= p.num_blocks) return -1;  // never read outside the cache
  return static_cast<int64_t>(raw) * p.block_size + pos % p.block_size;
}

template <KvFormat F>
__global__ void __launch_bounds__(kThreads) mla_attention_kernel(KParams p) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const Smem sm = carve<F>(smem_raw, p.record_bytes);
  constexpr int D = issue_distance(F);
  constexpr int kStages = staging_stages(F) > 0 ? staging_stages(F) : 1;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;
  const int split = blockIdx.z;
  const CtaWork cw = cta_work<kRows, 1, kTile>(p);  // cuda/common/cta_work.cuh
  const int b = cw.b, i_fixed = cw.i_fixed, rows_req = cw.rows_req, row0 = cw.row0;
  const int64_t begin = cw.begin, end = cw.end;
  const int n_tiles = cw.n_tiles;
  auto row_query = [&](int r) { return cw.query(p, r); };
  auto row_head = [&](int r) { return cw.head(p, r); };
  auto tile_pos = [&](int tile, int t) { return begin + static_cast<int64_t>(tile) * kTile + t; };

  // ---- Q (bf16) staged in a K buffer the first loads do not target ----
  uint16_t* q_stage = sm.k + (direct_k(F) ? kTile * kKStride : 0);
  for (int e = tid; e < kRows * (kQkDim / 2); e += kThreads) {
    const int r = e / (kQkDim / 2), d = 2 * (e % (kQkDim / 2));
    float v0 = 0.0f, v1 = 0.0f;
    if (row0 + r < rows_req) {
      const int64_t off =
          b * p.q_s0 + static_cast<int64_t>(row_query(r)) * p.q_s1 + static_cast<int64_t>(row_head(r)) * p.q_s2 + d;
      if (p.q_bf16) {
        v0 = bf16_to_f32(static_cast<const uint16_t*>(p.q)[off]);
        v1 = bf16_to_f32(static_cast<const uint16_t*>(p.q)[off + 1]);
      } else {
        v0 = static_cast<const float*>(p.q)[off];
        v1 = static_cast<const float*>(p.q)[off + 1];
      }
    }
    *reinterpret_cast<uint32_t*>(q_stage + r * kKStride + d) = ptx::pack_bf16x2(v0, v1);
  }
  if (tid < kRows) sm.row_vis[tid] = cw.visible(p, tid);
  if constexpr (uses_lut(F)) fill_lut(sm.lut, tid);
  // Slots of the first D + 1 tiles (later ones are prefetched inside the loop).
  if (tid < kTile) {
    for (int u = 0; u <= D; ++u) {
      const int64_t pos = tile_pos(u, tid);
      sm.slots[(u % kSlotRing) * kTile + tid] = token_finish(p, token_fetch(p, b, i_fixed, pos, end), pos);
    }
  }
  __syncthreads();

  uint32_t aq[kDimsPerWarp / 16][4];
#pragma unroll
  for (int ks = 0; ks < kDimsPerWarp / 16; ++ks) {
    const int col = warp * kDimsPerWarp + ks * 16 + (lane >> 4) * 8;
    ptx::ldmatrix_x4(aq[ks], ptx::smem_addr(q_stage + (lane & 15) * kKStride + col));
  }

  // Loads of one tile: warp w takes records w, w+4, ...; lanes take its 16-byte chunks.
  // Compressed formats land in staging[tile % stages]; bf16 lands in K[tile % 2] directly
  // (invalid tokens are zero-filled there). Always commits one group.
  auto issue_tile = [&](int tile) {
    if (tile < n_tiles) {
      const int chunks = p.record_bytes / 16;
      const int64_t* slots = sm.slots + (tile % kSlotRing) * kTile;
      for (int t = warp; t < kTile; t += kWarps) {
        const int64_t slot = slots[t];
        uint8_t* dst = direct_k(F) ? reinterpret_cast<uint8_t*>(sm.k + ((tile & 1) * kTile + t) * kKStride)
                                   : sm.staging + ((tile % kStages) * kTile + t) * p.record_bytes;
        for (int k = lane; k < chunks; k += 32) {
          if (slot >= 0) {
            ptx::cp_async_16(ptx::smem_addr(dst + 16 * k), p.cache + slot * p.record_bytes + 16 * k);
          } else if (direct_k(F)) {
            *reinterpret_cast<uint4*>(dst + 16 * k) = make_uint4(0, 0, 0, 0);
          }
        }
      }
    }
    ptx::cp_async_commit();
  };
  for (int u = 0; u < D; ++u) issue_tile(u);

  float o[kColsPerWarp / 8][4];
#pragma unroll
  for (int nt = 0; nt < kColsPerWarp / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // rows g, g+8 (log2 domain)

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int64_t* slots = sm.slots + (tile % kSlotRing) * kTile;
    const int64_t tile_begin = tile_pos(tile, 0);
    // The block-table / index entry of tile + D + 1, read now and stored at the end
    // of the iteration, so its latency hides behind this tile's math.
    const int fetch_tile = tile + D + 1;
    int32_t fetched = -1;
    if (tid < kTile && fetch_tile < n_tiles) fetched = token_fetch(p, b, i_fixed, tile_pos(fetch_tile, tid), end);

    if constexpr (D == 2) {
      ptx::cp_async_wait_group<1>();  // this tile landed; the next one may still fly
    } else {
      ptx::cp_async_wait_group<0>();
    }
    __syncthreads();  // loads visible; every warp is done with the previous tile
    const uint16_t* kt = sm.k + (direct_k(F) ? (tile & 1) * kTile * kKStride : 0);
    if constexpr (!direct_k(F)) {
      static_assert(record::kQuarters == 4 && kThreads == kTile * record::kQuarters, "thread = (record, quarter)");
      const int r = tid >> 2, q = tid & 3;
      dequant_part<F>(sm.lut, sm.staging + ((tile % kStages) * kTile + r) * p.record_bytes, slots[r] >= 0, p.outer_scale,
                      q, sm.k + r * kKStride, p.token_scale);
      __syncthreads();  // K tile complete; this staging stage is free again
    }
    issue_tile(tile + D);

    // ---- S partial over this warp's 144 dims, all 32 tokens ----
    float s[kTile / 8][4];
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kDimsPerWarp / 16; ++ks) {
      const int d0 = warp * kDimsPerWarp + ks * 16;
#pragma unroll
      for (int np = 0; np < kTile / 16; ++np) {
        uint32_t kb[4];
        const int tok = 16 * np + (lane & 7) + (lane >> 4) * 8;
        const int dim = d0 + ((lane >> 3) & 1) * 8;
        ptx::ldmatrix_x4(kb, ptx::smem_addr(kt + tok * kKStride + dim));
        ptx::mma_bf16_16816(s[2 * np], aq[ks], kb[0], kb[1]);
        ptx::mma_bf16_16816(s[2 * np + 1], aq[ks], kb[2], kb[3]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt) {
      float* dst = sm.s_part + warp * kRows * kSStride;
      *reinterpret_cast<float2*>(dst + g * kSStride + 8 * nt + 2 * c) = make_float2(s[nt][0], s[nt][1]);
      *reinterpret_cast<float2*>(dst + (g + 8) * kSStride + 8 * nt + 2 * c) = make_float2(s[nt][2], s[nt][3]);
    }
    __syncthreads();

    // ---- softmax: warp w finishes tokens [8w, 8w+8) ----
    float sc[2][2];  // [row g / g+8][token 2c / 2c+1], log2 domain
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int row = g + 8 * rr;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int tok = 8 * warp + 2 * c + j;
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) acc += sm.s_part[(w * kRows + row) * kSStride + tok];
        const bool ok = slots[tok] >= 0 && tile_begin + tok < sm.row_vis[row];
        sc[rr][j] = ok ? acc * p.scale_log2 : -INFINITY;
      }
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float mx = fmaxf(sc[rr][0], sc[rr][1]);
      mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
      if (c == 0) sm.red_max[warp * kRows + g + 8 * rr] = mx;
    }
    __syncthreads();
    float m_new[2], alpha[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int row = g + 8 * rr;
      float tmax = sm.red_max[row];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) tmax = fmaxf(tmax, sm.red_max[w * kRows + row]);
      m_new[rr] = fmaxf(m_run[rr], tmax);
      alpha[rr] = m_run[rr] == -INFINITY ? 0.0f : exp2f(m_run[rr] - m_new[rr]);
      float p0 = 0.0f, p1 = 0.0f;
      if (m_new[rr] != -INFINITY) {
        p0 = sc[rr][0] == -INFINITY ? 0.0f : exp2f(sc[rr][0] - m_new[rr]);
        p1 = sc[rr][1] == -INFINITY ? 0.0f : exp2f(sc[rr][1] - m_new[rr]);
      }
      *reinterpret_cast<uint32_t*>(sm.p + row * kPStride + 8 * warp + 2 * c) = ptx::pack_bf16x2(p0, p1);
      float sum = p0 + p1;
      sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
      sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
      if (c == 0) sm.red_sum[warp * kRows + row] = sum;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int row = g + 8 * rr;
      float tsum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) tsum += sm.red_sum[w * kRows + row];
      l_run[rr] = l_run[rr] * alpha[rr] + tsum;
      m_run[rr] = m_new[rr];
    }
#pragma unroll
    for (int nt = 0; nt < kColsPerWarp / 8; ++nt) {
      o[nt][0] *= alpha[0];
      o[nt][1] *= alpha[0];
      o[nt][2] *= alpha[1];
      o[nt][3] *= alpha[1];
    }

    // ---- O += P V over this warp's 128 columns ----
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      uint32_t pa[4];
      ptx::ldmatrix_x4(pa, ptx::smem_addr(sm.p + (lane & 15) * kPStride + 16 * kk + (lane >> 4) * 8));
#pragma unroll
      for (int np = 0; np < kColsPerWarp / 16; ++np) {
        uint32_t vb[4];
        const int tok = 16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int dim = warp * kColsPerWarp + 16 * np + (lane >> 4) * 8;
        ptx::ldmatrix_x4_trans(vb, ptx::smem_addr(kt + tok * kKStride + dim));
        ptx::mma_bf16_16816(o[2 * np], pa, vb[0], vb[1]);
        ptx::mma_bf16_16816(o[2 * np + 1], pa, vb[2], vb[3]);
      }
    }
    if (tid < kTile && fetch_tile < n_tiles) {
      const int64_t pos = tile_pos(fetch_tile, tid);
      sm.slots[(fetch_tile % kSlotRing) * kTile + tid] = token_finish(p, fetched, pos);
    }
  }
  ptx::cp_async_wait_group<0>();

  // ---- finalize: normalize, write out/lse or the split partial ----
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int r = g + 8 * rr;
    if (row0 + r >= rows_req) continue;
    const int i = row_query(r), h = row_head(r);
    const bool empty = l_run[rr] == 0.0f;
    const float inv = empty ? 0.0f : 1.0f / l_run[rr];
    const float lse = empty ? -INFINITY : (m_run[rr] + log2f(l_run[rr])) * kLn2;
    float* dst = result_row(p, b, split, i, h, lse, c == 0 && warp == 0);
#pragma unroll
    for (int nt = 0; nt < kColsPerWarp / 8; ++nt) {
      const int col = warp * kColsPerWarp + 8 * nt + 2 * c;
      *reinterpret_cast<float2*>(dst + col) = make_float2(o[nt][2 * rr] * inv, o[nt][2 * rr + 1] * inv);
    }
  }
}

// ---- the per-format entry points of launch.h ----------------------------------------------
template <KvFormat F>
int configure(int record_bytes) {
  return static_cast<int>(cudaFuncSetAttribute(mla_attention_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(smem_bytes(F, record_bytes))));
}

template <KvFormat F>
int ctas_per_sm(int record_bytes) {
  int n = 0;
  if (configure<F>(record_bytes) != 0) return 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, mla_attention_kernel<F>, kThreads,
                                                    smem_bytes(F, record_bytes)) != cudaSuccess) {
    return 0;
  }
  return n;
}

template <KvFormat F>
int launch(const KParams& kp, int row_blocks, void* stream) {
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(kp.sparse ? kp.B * kp.s_q : kp.B),
                  static_cast<unsigned>(kp.num_splits));
  mla_attention_kernel<F><<<grid, kThreads, smem_bytes(F, kp.record_bytes), static_cast<cudaStream_t>(stream)>>>(kp);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mlakv::cuda::sm80
