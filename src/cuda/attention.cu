// MLA attention over the paged cache on NVIDIA GPUs (sm_80 and later; built for
// sm_90a and sm_80). Same operation and semantics as mla_attention_cpu.
//
// One CTA = 4 warps = 16 query rows (one m16 MMA tile) x one KV split of one request
// (dense) or one query (sparse). Per tile of 32 tokens:
//   1. the raw records (any format) arrive in shared memory by cp.async, issued one
//      tile ahead so the loads overlap the previous tile's math;
//   2. all 128 threads dequantize them once into a bf16 tile K [32][576] - the fused
//      dequantization: no dequantized copy of the cache exists anywhere else;
//   3. S = Q K^T with mma.sync m16n8k16: warp w owns head dims [144w, 144w+144) for
//      all 32 tokens, so its Q fragments (9 k-steps) stay in registers for the whole
//      kernel; the four partial S tiles are summed through shared memory;
//   4. online softmax in the exp2 domain (warp w finishes tokens [8w, 8w+8));
//   5. O += P V: warp w owns output columns [128w, 128w+128) (V = K's first 512 dims).
// Split-KV partials go to the workspace and a combine kernel merges them with the
// AttnState rule of attn_state.h.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "format/record_codec.h"
#include "cuda/kernels.h"
#include "cuda/mma.cuh"
#include "mlakv/attn_state.h"

namespace mlakv::cuda::kernels {
namespace {

constexpr int kRows = kAttentionRows;
constexpr int kTile = 32;        // tokens per tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kKStride = kQkDim + 8;  // bf16 per smem K/Q row: 1168 B = 292 words -> conflict-free ldmatrix
constexpr int kPStride = kTile + 8;   // bf16 per P row: 80 B = 20 words -> conflict-free ldmatrix
constexpr int kSStride = kTile + 2;   // f32 per partial-S row (even: float2 stores)
constexpr int kDimsPerWarp = kQkDim / kWarps;   // 144 = 9 k-steps of 16
constexpr int kColsPerWarp = kLatentDim / kWarps;  // 128 = 16 n-tiles of 8
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kDimsPerWarp % 16 == 0 && kColsPerWarp % 16 == 0);

using KParams = AttentionParams;

// Pipeline depth: compressed formats stage raw records and dequantize them into the
// bf16 K tile; bf16 records are the K tile already, so they are copied straight into a
// double-buffered K tile (1 tile in flight). Staging depth is chosen per format so that
// three CTAs fit in an SM's 228 KB (nvfp4: two stages; fp8: one; bf16: two CTAs/SM).
__host__ __device__ constexpr bool direct_k(KvFormat f) { return f == KvFormat::kBf16; }
__host__ __device__ constexpr int staging_stages(KvFormat f) {
  return direct_k(f) ? 0 : (f == KvFormat::kFp8DsMla ? 1 : 2);
}
__host__ __device__ constexpr int issue_distance(KvFormat f) { return direct_k(f) ? 1 : staging_stages(f); }
__host__ __device__ constexpr bool uses_lut(KvFormat f) {
  return f == KvFormat::kNvfp4DsMla || f == KvFormat::kNvfp4DsMlaFp8Rope;
}
constexpr int kSlotRing = 4;  // tiles t .. t+3 (in use, in flight, issued, being fetched)

struct Smem {
  uint16_t* k;        // K tile(s) (bf16, padded rows) [kbuf][kTile][kKStride]; Q is staged here first
  uint8_t* staging;   // compressed formats: [2][kTile][record_bytes]
  float* lut;         // nvfp4: e2m1 code -> value (16 entries)
  float* s_part;      // [kWarps][kRows][kSStride]
  uint16_t* p;        // [kRows][kPStride]
  float* red_max;     // [kWarps][kRows]
  float* red_sum;     // [kWarps][kRows]
  int64_t* slots;     // [kSlotRing][kTile]
  int32_t* row_vis;   // [kRows]
};

__host__ __device__ constexpr std::size_t align16(std::size_t x) { return (x + 15) & ~std::size_t{15}; }

__host__ __device__ inline std::size_t smem_bytes(KvFormat f, int record_bytes) {
  const std::size_t kbuf = direct_k(f) ? 2 : 1, stages = staging_stages(f);
  return align16(sizeof(uint16_t) * kbuf * kTile * kKStride) + align16(stages * kTile * record_bytes) +
         (uses_lut(f) ? align16(sizeof(float) * 16) : 0) + align16(sizeof(float) * kWarps * kRows * kSStride) +
         align16(sizeof(uint16_t) * kRows * kPStride) + 2 * align16(sizeof(float) * kWarps * kRows) +
         align16(sizeof(int64_t) * kSlotRing * kTile) + align16(sizeof(int32_t) * kRows);
}

template <KvFormat F>
__device__ inline Smem carve(uint8_t* base, int record_bytes) {
  Smem s;
  uint8_t* p = base;
  s.k = reinterpret_cast<uint16_t*>(p);
  p += align16(sizeof(uint16_t) * (direct_k(F) ? 2 : 1) * kTile * kKStride);
  s.staging = p;
  p += align16(staging_stages(F) * static_cast<std::size_t>(kTile) * record_bytes);
  s.lut = reinterpret_cast<float*>(p);
  p += uses_lut(F) ? align16(sizeof(float) * 16) : 0;
  s.s_part = reinterpret_cast<float*>(p);
  p += align16(sizeof(float) * kWarps * kRows * kSStride);
  s.p = reinterpret_cast<uint16_t*>(p);
  p += align16(sizeof(uint16_t) * kRows * kPStride);
  s.red_max = reinterpret_cast<float*>(p);
  p += align16(sizeof(float) * kWarps * kRows);
  s.red_sum = reinterpret_cast<float*>(p);
  p += align16(sizeof(float) * kWarps * kRows);
  s.slots = reinterpret_cast<int64_t*>(p);
  p += align16(sizeof(int64_t) * kSlotRing * kTile);
  s.row_vis = reinterpret_cast<int32_t*>(p);
  return s;
}

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

// Thread (record r, part q in 0..3) turns its quarter of a staged record into bf16:
// latent dims [128q, 128q+128) and rope dims [16q, 16q+16). Invalid tokens become 0.
// The products match core/record_codec.h's readers: e4m3 * s; (e2m1 * sf) * s_l.
template <KvFormat F>
__device__ inline void dequant_part(const Smem& sm, const uint8_t* rec, bool valid, float outer, int q, uint16_t* row) {
  uint16_t* lat = row + 128 * q;
  uint16_t* rop = row + kLatentDim + 16 * q;
  if (!valid) {
    const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < 16; ++i) reinterpret_cast<uint4*>(lat)[i] = z;
    reinterpret_cast<uint4*>(rop)[0] = z;
    reinterpret_cast<uint4*>(rop)[1] = z;
    return;
  }
  if constexpr (F == KvFormat::kFp8DsMla) {
    namespace L = layout::fp8_ds_mla;
    const float s = *reinterpret_cast<const float*>(rec + L::kScaleOffset + 4 * q);
    const uint8_t* src = rec + L::kLatentOffset + 128 * q;
#pragma unroll 4
    for (int i = 0; i < 128; i += 8) {
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
    const uint4* rs = reinterpret_cast<const uint4*>(rec + L::kRopeOffset + 2 * 16 * q);
    reinterpret_cast<uint4*>(rop)[0] = rs[0];
    reinterpret_cast<uint4*>(rop)[1] = rs[1];
  } else {
    namespace N = layout::nvfp4_ds_mla;
#pragma unroll 2
    for (int g = 0; g < 8; ++g) {  // groups 8q .. 8q+7
      const int group = 8 * q + g;
      const float sf = e4m3_to_f32(rec[N::kScaleOffset + group]);
      const uint2 b = *reinterpret_cast<const uint2*>(rec + N::kLatentOffset + 8 * group);
      float lo[8], hi[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t x = b.x >> (8 * j), y = b.y >> (8 * j);
        lo[2 * j] = (sm.lut[x & 0xFu] * sf) * outer;
        lo[2 * j + 1] = (sm.lut[(x >> 4) & 0xFu] * sf) * outer;
        hi[2 * j] = (sm.lut[y & 0xFu] * sf) * outer;
        hi[2 * j + 1] = (sm.lut[(y >> 4) & 0xFu] * sf) * outer;
      }
      store8_bf16(lat + 16 * g, lo);
      store8_bf16(lat + 16 * g + 8, hi);
    }
    if constexpr (F == KvFormat::kNvfp4DsMla) {
      const uint4* rs = reinterpret_cast<const uint4*>(rec + N::kRopeOffset + 2 * 16 * q);
      reinterpret_cast<uint4*>(rop)[0] = rs[0];
      reinterpret_cast<uint4*>(rop)[1] = rs[1];
    } else {
      namespace R = layout::nvfp4_ds_mla_fp8rope;
      const float rsc = *reinterpret_cast<const float*>(rec + R::kRopeScaleOffset);
      const uint4 b = *reinterpret_cast<const uint4*>(rec + R::kRopeOffset + 16 * q);
      const uint32_t w[4] = {b.x, b.y, b.z, b.w};
      float lo[8], hi[8], f[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        e4m3x4_to_f32(w[j], f);
#pragma unroll
        for (int k = 0; k < 4; ++k) (j < 2 ? lo : hi)[4 * (j % 2) + k] = f[k] * rsc;
      }
      store8_bf16(rop, lo);
      store8_bf16(rop + 8, hi);
    }
  }
}

template <KvFormat F>
__global__ void __launch_bounds__(kThreads) mla_attention_kernel(KParams p) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const Smem sm = carve<F>(smem_raw, p.record_bytes);
  constexpr int D = issue_distance(F);
  constexpr int kStages = staging_stages(F) > 0 ? staging_stages(F) : 1;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;
  const int row_block = blockIdx.x, split = blockIdx.z;
  int b, i_fixed = 0;
  if (p.sparse) {
    b = blockIdx.y / p.s_q;
    i_fixed = blockIdx.y % p.s_q;
  } else {
    b = blockIdx.y;
  }
  const int rows_req = p.sparse ? p.H : p.s_q * p.H;  // rows of this request (or query)
  const int row0 = row_block * kRows;

  // Row r of the CTA -> (query i, head h); rows past the request are inert.
  auto row_query = [&](int r) { return p.sparse ? i_fixed : (row0 + r) / p.H; };
  auto row_head = [&](int r) { return p.sparse ? row0 + r : (row0 + r) % p.H; };

  // ---- token range of this split ----
  int64_t n_max;
  // Device seqlens are not validated by the host: clamp them to what the table covers.
  const int32_t seqlen =
      p.sparse ? 0 : static_cast<int32_t>(std::clamp<int64_t>(p.seqlens[b * p.sl_s0], 0, p.bt_cols * p.block_size));
  if (p.sparse) {
    n_max = p.topk;
    if (p.topk_length != nullptr) n_max = std::clamp<int64_t>(p.topk_length[b * p.tl_s0], 0, n_max);
  } else {
    const int last_row = std::min(row0 + kRows, rows_req) - 1;
    const int i_last = last_row / p.H;
    n_max = p.causal ? std::min<int64_t>(seqlen, std::max<int64_t>(0, seqlen - p.s_q + i_last + 1)) : seqlen;
  }
  const int64_t chunk = (n_max + p.num_splits - 1) / p.num_splits;
  const int64_t begin = std::min<int64_t>(n_max, split * chunk), end = std::min<int64_t>(n_max, begin + chunk);
  const int n_tiles = static_cast<int>((end - begin + kTile - 1) / kTile);
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
  if (tid < kRows) {
    int32_t vis = 0;
    if (row0 + tid < rows_req) {
      if (p.sparse) {
        vis = 0x7FFFFFFF;
      } else {
        const int i = row_query(tid);
        vis = p.causal ? std::max(0, std::min(seqlen, seqlen - p.s_q + i + 1)) : seqlen;
      }
    }
    sm.row_vis[tid] = vis;
  }
  if constexpr (uses_lut(F)) {
    if (tid < 16) sm.lut[tid] = e2m1_to_f32(static_cast<uint8_t>(tid));
  }
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
      const int r = tid >> 2, q = tid & 3;
      dequant_part<F>(sm, sm.staging + ((tile % kStages) * kTile + r) * p.record_bytes, slots[r] >= 0, p.outer_scale,
                      q, sm.k + r * kKStride);
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
    float* dst;
    if (p.num_splits == 1) {
      dst = p.out + b * p.o_s0 + static_cast<int64_t>(i) * p.o_s1 + static_cast<int64_t>(h) * p.o_s2;
      if (c == 0 && warp == 0) p.lse[b * p.l_s0 + static_cast<int64_t>(i) * p.l_s1 + static_cast<int64_t>(h) * p.l_s2] = lse;
    } else {
      const int64_t grow = (static_cast<int64_t>(b) * p.s_q + i) * p.H + h;
      dst = p.part_o + (static_cast<int64_t>(split) * p.rows_total + grow) * kLatentDim;
      if (c == 0 && warp == 0) p.part_lse[static_cast<int64_t>(split) * p.rows_total + grow] = lse;
    }
#pragma unroll
    for (int nt = 0; nt < kColsPerWarp / 8; ++nt) {
      const int col = warp * kColsPerWarp + 8 * nt + 2 * c;
      *reinterpret_cast<float2*>(dst + col) = make_float2(o[nt][2 * rr] * inv, o[nt][2 * rr + 1] * inv);
    }
  }
}

// One CTA per output row; thread t merges columns [4t, 4t+4) over the splits.
__global__ void __launch_bounds__(128) combine_kernel(const float* part_o, const float* part_lse, int splits,
                                                      int64_t rows, int s_q, int H, float* out, int64_t o_s0,
                                                      int64_t o_s1, int64_t o_s2, float* lse, int64_t l_s0,
                                                      int64_t l_s1, int64_t l_s2) {
  const int64_t row = blockIdx.x;
  const int h = static_cast<int>(row % H), i = static_cast<int>((row / H) % s_q);
  const int64_t b = row / (static_cast<int64_t>(H) * s_q);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  AttnState st;
  for (int k = 0; k < splits; ++k) {
    const float4 v = reinterpret_cast<const float4*>(part_o + (k * rows + row) * kLatentDim)[threadIdx.x];
    const float part[4] = {v.x, v.y, v.z, v.w};
    st.merge(acc, part, part_lse[k * rows + row], 4);
  }
  float* dst = out + b * o_s0 + i * o_s1 + h * o_s2;
  reinterpret_cast<float4*>(dst)[threadIdx.x] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  if (threadIdx.x == 0) lse[b * l_s0 + i * l_s1 + h * l_s2] = st.lse;
}

// Generic [P, N, D] merge for merge_attn_states.
__global__ void merge_kernel(const float* o_parts, int64_t op_s0, int64_t op_s1, const float* lse_parts,
                             int64_t lp_s0, int64_t lp_s1, int P, int D, float* out, int64_t out_s0, float* lse,
                             int64_t lse_s0) {
  const int64_t n = blockIdx.x;
  for (int d0 = threadIdx.x; d0 < D; d0 += blockDim.x) {
    float acc = 0.0f;
    AttnState st;
    for (int k = 0; k < P; ++k) st.merge(&acc, o_parts + k * op_s0 + n * op_s1 + d0, lse_parts[k * lp_s0 + n * lp_s1], 1);
    out[n * out_s0 + d0] = acc;
    if (d0 == 0) lse[n * lse_s0] = st.lse;
  }
}

template <KvFormat F>
cudaError_t launch_format(const KParams& kp, dim3 grid, std::size_t smem, cudaStream_t stream) {
  mla_attention_kernel<F><<<grid, kThreads, smem, stream>>>(kp);
  return cudaGetLastError();
}

template <KvFormat F>
cudaError_t configure_format(std::size_t smem) {
  return cudaFuncSetAttribute(mla_attention_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
}

}  // namespace



template <KvFormat F>
int ctas_per_sm(std::size_t smem) {
  int n = 0;
  if (configure_format<F>(smem) != cudaSuccess) return 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, mla_attention_kernel<F>, kThreads, smem) != cudaSuccess) return 0;
  return n;
}

int attention_ctas_per_sm(KvFormat format, int record_bytes) {
  const std::size_t smem = smem_bytes(format, record_bytes);
  switch (format) {
    case KvFormat::kBf16: return ctas_per_sm<KvFormat::kBf16>(smem);
    case KvFormat::kFp8DsMla: return ctas_per_sm<KvFormat::kFp8DsMla>(smem);
    case KvFormat::kNvfp4DsMla: return ctas_per_sm<KvFormat::kNvfp4DsMla>(smem);
    case KvFormat::kNvfp4DsMlaFp8Rope: return ctas_per_sm<KvFormat::kNvfp4DsMlaFp8Rope>(smem);
  }
  return 0;
}

int configure_attention(KvFormat format, int record_bytes) {
  const std::size_t smem = smem_bytes(format, record_bytes);
  switch (format) {
    case KvFormat::kBf16: return static_cast<int>(configure_format<KvFormat::kBf16>(smem));
    case KvFormat::kFp8DsMla: return static_cast<int>(configure_format<KvFormat::kFp8DsMla>(smem));
    case KvFormat::kNvfp4DsMla: return static_cast<int>(configure_format<KvFormat::kNvfp4DsMla>(smem));
    case KvFormat::kNvfp4DsMlaFp8Rope: return static_cast<int>(configure_format<KvFormat::kNvfp4DsMlaFp8Rope>(smem));
  }
  return 0;
}

int launch_attention(KvFormat format, const AttentionParams& kp, int row_blocks, void* stream_ptr) {
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(kp.sparse ? kp.B * kp.s_q : kp.B),
                  static_cast<unsigned>(kp.num_splits));
  const std::size_t smem = smem_bytes(format, kp.record_bytes);
  cudaStream_t s = static_cast<cudaStream_t>(stream_ptr);
  cudaError_t e = cudaSuccess;
  switch (format) {
    case KvFormat::kBf16: e = launch_format<KvFormat::kBf16>(kp, grid, smem, s); break;
    case KvFormat::kFp8DsMla: e = launch_format<KvFormat::kFp8DsMla>(kp, grid, smem, s); break;
    case KvFormat::kNvfp4DsMla: e = launch_format<KvFormat::kNvfp4DsMla>(kp, grid, smem, s); break;
    case KvFormat::kNvfp4DsMlaFp8Rope: e = launch_format<KvFormat::kNvfp4DsMlaFp8Rope>(kp, grid, smem, s); break;
  }
  if (e != cudaSuccess || kp.num_splits == 1) return static_cast<int>(e);
  combine_kernel<<<static_cast<unsigned>(kp.B * kp.s_q * kp.H), 128, 0, s>>>(
      kp.part_o, kp.part_lse, kp.num_splits, kp.rows_total, kp.s_q, kp.H, kp.out, kp.o_s0, kp.o_s1, kp.o_s2, kp.lse,
      kp.l_s0, kp.l_s1, kp.l_s2);
  return static_cast<int>(cudaGetLastError());
}

int launch_merge(const float* o_parts, int64_t op_s0, int64_t op_s1, const float* lse_parts, int64_t lp_s0,
                 int64_t lp_s1, int P, int64_t N, int D, float* out, int64_t out_s0, float* lse, int64_t lse_s0,
                 void* stream) {
  if (N == 0) return 0;
  merge_kernel<<<static_cast<unsigned>(N), 128, 0, static_cast<cudaStream_t>(stream)>>>(
      o_parts, op_s0, op_s1, lse_parts, lp_s0, lp_s1, P, D, out, out_s0, lse, lse_s0);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mlakv::cuda::kernels
