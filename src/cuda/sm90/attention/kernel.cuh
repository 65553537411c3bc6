// MLA attention on Hopper (sm_90a), warp-specialized: the kernel templates of the sm90
// path (launch.h), instantiated once per record format in instantiations/<format>.cu.
// Same semantics as the sm80 path (src/cuda/sm80/attention/kernel.cuh); design notes in
// docs/design.md ("Hopper kernels"). Two kernels share the producer warp and the ring:
//   - attention_sm90_kernel (v7, described here first): the bf16 format;
//   - attention_wg_kernel (v8/v9, described further down): the quantized formats, the KV
//     tile as the M dimension of wgmma m64n16k16 (S^T = K Q^T, O^T = V^T P^T); v9 (the
//     e2m1 formats) converts each element once into an f16 V tile both MMAs read.
//
// v7: one CTA = 16 query rows x one KV split of one request (dense) or one query (sparse),
// 5 warps:
//  - warp 4, the producer, walks the block table (or the top-k list) one tile of 32
//    tokens at a time, lane t owning token t: it issues cp.async.bulk copies straight
//    from the cache into a ring of shared-memory stages (one per run of consecutive
//    slots, i.e. per block, for the unpadded formats; one per record for bf16, whose
//    rows are padded), completion counted in bytes on the stage's `full` mbarrier,
//    zero-fills invalid tokens and publishes the tile's validity mask. Consumers hand
//    stages back on `empty` mbarriers and never touch the block table.
//  - warps 0..3, the consumers. Warp w owns latent dims [128w, 128w+128) for both MMAs
//    (scores and output columns) and feeds mma.sync m16n8k16 through ldmatrix:
//      bf16      straight from the record rows (padded to 1168 B, conflict-free);
//      quantized each warp dequantizes its 128-column slice of the tile once into a
//                warp-private f16 slice (exact values, no CTA barrier), read by
//                ldmatrix for Q K^T and ldmatrix.trans for P V;
//      fp8       cvt.rn.f16x2.e4m3x2; the 128-dim tile scale multiplies the partial
//                scores of that tile and, for P V, the weights P (slice w = tile w);
//      e2m1      two nibbles -> one f16x2 by shift/mask (scaled by 2^-14), one
//                mul.f16x2 by the group scale * 2^7; the outer scale s_l and the 2^7
//                are folded into q and into the output.
//    Rope dims [16w, 16w+16) come from the records; the four partial score tiles meet in
//    shared memory once per tile (one named barrier), every warp then runs the same
//    online softmax on the summed scores, so no other exchange is needed.
// q is rounded once per CTA: bf16 for the bf16 format; f16 for the quantized latent
// (and the e4m3 rope) after a per-row power-of-two prescale that keeps it in f16's
// range (folded back into the softmax scale); bf16 rope stays bf16.
// Split-KV partials go to the workspace (params/attention.h layout); smxx's combine,
// launched by the API layer, merges them.
// Records are addressed through common/record_part.cuh: consumer warp w owns the
// reader's quarter w (latent dims [128w, 128w+128), rope dims [16w, 16w+16)).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "cuda/common/cta_work.cuh"
#include "cuda/common/record_part.cuh"
#include "cuda/sm80/attention/mma.cuh"  // the sm_80+ ldmatrix wrappers (mlakv::cuda::ptx)
#include "cuda/sm90/attention/launch.h"
#include "cuda/sm90/attention/ptx.cuh"
#include "mlakv/numerics.h"


namespace mlakv::cuda::sm90 {
namespace {

using kernels::AttentionParams;

constexpr int kRows = kAttentionRows;
constexpr int kT = 32;                    // tokens per tile (= producer lanes)
constexpr int kNT = kT / 8;               // score n-tiles per tile
[[maybe_unused]] constexpr int kKS = kT / 16;              // P V k-steps per tile
constexpr int kConsumerWarps = 4;
constexpr int kConsumerThreads = 32 * kConsumerWarps;
constexpr int kThreads = kConsumerThreads + 32;
constexpr int kMaxStages = 8;
constexpr int kSmemBudget = 227 * 1024 / 2 - 1024;  // two CTAs per SM (1 KB reserved each)
constexpr int kPartBytes = 2 * kConsumerWarps * kNT * 32 * 16;  // double-buffered partial scores
constexpr int kMiscBytes = 2 * 8 * kMaxStages + 4 * kMaxStages + 4 * kRows + 4 * kRows;
// Quantized formats: each consumer warp dequantizes its 128-column slice of a tile
// once into f16 rows here, read by both MMAs through ldmatrix (stride 136 halves = 17
// chunks of 16 B, odd: conflict-free).
constexpr int kSliceStride = 128 + 8;
constexpr int kSliceBytes = kConsumerWarps * kT * kSliceStride * 2;
template <KvFormat F>
constexpr int fixed_bytes() {
  return kPartBytes + (F == KvFormat::kBf16 ? 0 : kSliceBytes) + ((kMiscBytes + 127) & ~127);
}
[[maybe_unused]] constexpr float kLn2 = 0.6931471805599453f;
[[maybe_unused]] constexpr int kConsumerBarrier = 1;       // named barrier id of the four consumer warps

template <KvFormat F>
struct Fmt;
template <>
struct Fmt<KvFormat::kBf16> {
  static constexpr int kRecord = record::Parts<KvFormat::kBf16>::kRecordBytes;
  static constexpr int kStride = kRecord + 16;  // 1168 B: 73 chunks of 16 B, odd -> conflict-free ldmatrix
};
template <>
struct Fmt<KvFormat::kFp8DsMla> {
  static constexpr int kRecord = record::Parts<KvFormat::kFp8DsMla>::kRecordBytes;  // 656 = 41 chunks
  static constexpr int kStride = kRecord;
};
template <>
struct Fmt<KvFormat::kNvfp4DsMla> {
  static constexpr int kRecord = record::Parts<KvFormat::kNvfp4DsMla>::kRecordBytes;  // 432 = 27 chunks
  static constexpr int kStride = kRecord;
};
template <>
struct Fmt<KvFormat::kNvfp4DsMlaFp8Rope> {
  static constexpr int kRecord = record::Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kRecordBytes;  // 368 = 23 chunks
  static constexpr int kStride = kRecord;
};
template <>
struct Fmt<KvFormat::kNvfp4DsMlaInt8Rope> {  // the fp8-rope record's layout, int8 rope codes (warpgroup kernel only)
  static constexpr int kRecord = record::Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kRecordBytes;  // 368
  static constexpr int kStride = kRecord;
};

template <KvFormat F>
constexpr int stages() {
  const int n = (kSmemBudget - fixed_bytes<F>()) / (kT * Fmt<F>::kStride);
  return n < kMaxStages ? n : kMaxStages;
}
template <KvFormat F>
constexpr std::size_t smem_bytes() {
  return static_cast<std::size_t>(stages<F>()) * kT * Fmt<F>::kStride + fixed_bytes<F>();
}
static_assert(stages<KvFormat::kBf16>() >= 2 && stages<KvFormat::kFp8DsMla>() >= 2);
static_assert(split_granule(KvFormat::kBf16) == kT);  // v7 rounds split chunks to kT (launch.h)

[[maybe_unused]] constexpr bool is_nvfp4(KvFormat f) {
  return f == KvFormat::kNvfp4DsMla || f == KvFormat::kNvfp4DsMlaFp8Rope || f == KvFormat::kNvfp4DsMlaInt8Rope;
}
[[maybe_unused]] constexpr bool f16_latent(KvFormat f) { return f != KvFormat::kBf16; }
// 8-bit rope codes (e4m3 or int8) with an fp32 rope scale per record: f16 rope, scale per token.
[[maybe_unused]] constexpr bool f16_rope(KvFormat f) {
  return f == KvFormat::kNvfp4DsMlaFp8Rope || f == KvFormat::kNvfp4DsMlaInt8Rope;
}

// Head dim (0..575) that k index `kidx` of score k-step `ks` (0..7 latent, 8 rope) of
// warp w means. The B fragments are loaded in whatever dim order is cheapest for the
// record layout; q's A fragments follow the same order (the dot product does not care).
template <KvFormat F>
__device__ __forceinline__ int qdim(int w, int ks, int kidx) {
  if (ks < 8) return 128 * w + 16 * ks + kidx;  // latent: ldmatrix rows, natural order
  if constexpr (F == KvFormat::kBf16) {
    return kLatentDim + 16 * w + kidx;
  } else {
    // rope of the quantized formats: lane c loads dims 4c .. 4c+3 of its token
    const int e = (kidx & 1) | ((kidx >> 3) << 1), c = (kidx >> 1) & 3;
    return kLatentDim + 16 * w + 4 * c + e;
  }
}

// Output column of accumulator n-tile j, column n (0..7) of warp w.
[[maybe_unused]] __device__ __forceinline__ int ocol(int w, int j, int n) { return 128 * w + 8 * j + n; }

#if MLAKV_SM90_DEVICE
using ptx::e2m1_pair;  // e2m1 nibbles J and J+4 of a word -> f16x2 (value * 2^-14)

__device__ __forceinline__ uint4 lds128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint2 lds64(const uint8_t* p) { return *reinterpret_cast<const uint2*>(p); }
__device__ __forceinline__ uint32_t lds32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ float ldsf(const uint8_t* p) { return *reinterpret_cast<const float*>(p); }

constexpr uint32_t kF16x2_128 = 0x58005800u;  // (128.0, 128.0) in f16

// Quantized formats: lane t dequantizes token t's 128 latent dims of warp w's slice
// into f16 row t of `slice` (exact: e4m3 values; e2m1 * sf * 2^-7).
template <KvFormat F>
__device__ __forceinline__ void dequant_slice(const uint8_t* stage, int w, int lane, uint16_t* slice) {
  constexpr int kS = Fmt<F>::kStride;
  const uint8_t* rec = stage + lane * kS;
  uint4* row = reinterpret_cast<uint4*>(slice + lane * kSliceStride);
  using P = record::Parts<F>;
  constexpr int kQL = record::Quarter<F>::kLatentBytes;  // quarter w's codes at kLatentOffset + kQL w
  if constexpr (F == KvFormat::kFp8DsMla) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint4 v = lds128(rec + P::kLatentOffset + kQL * w + 16 * i);
      const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
      uint32_t h[8];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        h[2 * k] = ptx::e4m3x2_to_f16x2(wv[k]);
        h[2 * k + 1] = ptx::e4m3x2_hi_to_f16x2(wv[k]);
      }
      row[2 * i] = make_uint4(h[0], h[1], h[2], h[3]);
      row[2 * i + 1] = make_uint4(h[4], h[5], h[6], h[7]);
    }
  } else {
    static_assert(record::QuarterScales<F>::kBytes == 8 && record::QuarterScales<F>::kGroupBytes == 8);
    const uint2 sfb = lds64(rec + P::kScaleOffset + record::QuarterScales<F>::kBytes * w);  // groups 8w .. 8w+7
    const uint32_t sfw[2] = {sfb.x, sfb.y};
#pragma unroll
    for (int u = 0; u < 4; ++u) {  // 16 B = groups 8w+2u, 8w+2u+1
      const uint4 v = lds128(rec + P::kLatentOffset + kQL * w + 16 * u);
      const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
      const uint32_t sf2 = ptx::hmul2(
          (u & 1) ? ptx::e4m3x2_hi_to_f16x2(sfw[u >> 1]) : ptx::e4m3x2_to_f16x2(sfw[u >> 1]), kF16x2_128);
      const uint32_t sa = ptx::prmt(sf2, sf2, 0x1010), sb = ptx::prmt(sf2, sf2, 0x3232);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t sc = k < 2 ? sa : sb;
        const uint32_t p0 = ptx::hmul2(e2m1_pair<0>(wv[k]), sc), p1 = ptx::hmul2(e2m1_pair<1>(wv[k]), sc);
        const uint32_t p2 = ptx::hmul2(e2m1_pair<2>(wv[k]), sc), p3 = ptx::hmul2(e2m1_pair<3>(wv[k]), sc);
        // pairs hold dims (j, j+4): back to natural order
        row[4 * u + k] = make_uint4(ptx::prmt(p0, p1, 0x5410), ptx::prmt(p2, p3, 0x5410), ptx::prmt(p0, p1, 0x7632),
                                    ptx::prmt(p2, p3, 0x7632));
      }
    }
  }
}

// Quantized formats: scores over warp w's slice (f16 ldmatrix) plus its 16 rope dims
// (from the record), with the fp8 tile scale / e4m3 rope scale per token.
template <KvFormat F>
__device__ __forceinline__ void score_slice(const uint8_t* stage, const uint16_t* slice, int w, int lane,
                                            const uint32_t (&aq)[8][4], const uint32_t (&aqr)[4], float (&s)[kNT][4]) {
  constexpr int kS = Fmt<F>::kStride;
  using P = record::Parts<F>;
  const int g = lane >> 2, c = lane & 3;
  // Lane c reads rope dims 16w + 4c .. 16w + 4c + 3 of quarter w: byte
  // P::kRopeOffset + kRopeDimBytes * (16w + 4c).
  constexpr int kRopeDimBytes = P::kRopeBits / 8;
  constexpr int kQR = record::kQuarterRopeDims;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
    for (int np = 0; np < kNT / 2; ++np) {
      uint32_t kb[4];
      const int tok = 16 * np + (lane & 7) + (lane >> 4) * 8;
      const int dim = 16 * ks + ((lane >> 3) & 1) * 8;
      mlakv::cuda::ptx::ldmatrix_x4(kb, mlakv::cuda::ptx::smem_addr(slice + tok * kSliceStride + dim));
      ptx::mma_f16_16816(s[2 * np], aq[ks], kb[0], kb[1]);
      ptx::mma_f16_16816(s[2 * np + 1], aq[ks], kb[2], kb[3]);
    }
  }
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const uint8_t* rec = stage + (8 * nt + g) * kS;
    const uint8_t* t0 = stage + (8 * nt + 2 * c) * kS;  // C-fragment tokens 2c, 2c+1
    float accr[4] = {0.f, 0.f, 0.f, 0.f};
    if constexpr (F == KvFormat::kFp8DsMla) {
      const uint2 r = lds64(rec + P::kRopeOffset + kRopeDimBytes * (kQR * w + 4 * c));
      ptx::mma_bf16_16816(accr, aqr, r.x, r.y);
      constexpr int kQS = record::QuarterScales<F>::kBytes;  // quarter w's tile scale at kScaleOffset + kQS w
      const float sc0 = ldsf(t0 + P::kScaleOffset + kQS * w), sc1 = ldsf(t0 + kS + P::kScaleOffset + kQS * w);
      s[nt][0] = fmaf(s[nt][0], sc0, accr[0]);
      s[nt][1] = fmaf(s[nt][1], sc1, accr[1]);
      s[nt][2] = fmaf(s[nt][2], sc0, accr[2]);
      s[nt][3] = fmaf(s[nt][3], sc1, accr[3]);
    } else if constexpr (F == KvFormat::kNvfp4DsMla) {
      const uint2 r = lds64(rec + P::kRopeOffset + kRopeDimBytes * (kQR * w + 4 * c));
      ptx::mma_bf16_16816(s[nt], aqr, r.x, r.y);
    } else {
      const uint32_t r = lds32(rec + P::kRopeOffset + kRopeDimBytes * kQR * w + kRopeDimBytes * 4 * c);
      ptx::mma_f16_16816(accr, aqr, ptx::e4m3x2_to_f16x2(r), ptx::e4m3x2_hi_to_f16x2(r));
      const float rs0 = ldsf(t0 + P::kRopeScaleOffset), rs1 = ldsf(t0 + kS + P::kRopeScaleOffset);
      s[nt][0] = fmaf(accr[0], rs0, s[nt][0]);
      s[nt][1] = fmaf(accr[1], rs1, s[nt][1]);
      s[nt][2] = fmaf(accr[2], rs0, s[nt][2]);
      s[nt][3] = fmaf(accr[3], rs1, s[nt][3]);
    }
  }
}

// bf16: two n-tiles (16 tokens) per ldmatrix.x4, straight from the padded record rows.
__device__ __forceinline__ void score_bf16(const uint8_t* stage, int w, int lane, const uint32_t (&aq)[8][4],
                                           const uint32_t (&aqr)[4], float (&s)[kNT][4]) {
  constexpr int kSE = Fmt<KvFormat::kBf16>::kStride / 2;  // row stride in bf16 elements
  const uint16_t* kt = reinterpret_cast<const uint16_t*>(stage);
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < 9; ++ks) {
    const int d0 = ks < 8 ? 128 * w + 16 * ks : kLatentDim + 16 * w;
#pragma unroll
    for (int np = 0; np < kNT / 2; ++np) {
      uint32_t kb[4];
      const int tok = 16 * np + (lane & 7) + (lane >> 4) * 8;
      const int dim = d0 + ((lane >> 3) & 1) * 8;
      mlakv::cuda::ptx::ldmatrix_x4(kb, mlakv::cuda::ptx::smem_addr(kt + tok * kSE + dim));
      const uint32_t(&a)[4] = ks < 8 ? aq[ks < 8 ? ks : 0] : aqr;
      ptx::mma_bf16_16816(s[2 * np], a, kb[0], kb[1]);
      ptx::mma_bf16_16816(s[2 * np + 1], a, kb[2], kb[3]);
    }
  }
}

// O += P V for P V k-step kk (tokens 16kk .. 16kk+15) over warp w's 128 columns: from
// the padded bf16 records, or from the warp's f16 slice for the quantized formats.
template <KvFormat F>
__device__ __forceinline__ void pv_kstep(const uint8_t* stage, const uint16_t* slice, int kk, int w, int lane,
                                         const uint32_t (&pa)[4], float (&o)[16][4]) {
#pragma unroll
  for (int np = 0; np < 8; ++np) {
    uint32_t vb[4];
    const int tok = 16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8;
    if constexpr (F == KvFormat::kBf16) {
      constexpr int kSE = Fmt<F>::kStride / 2;
      const uint16_t* kt = reinterpret_cast<const uint16_t*>(stage);
      const int dim = 128 * w + 16 * np + (lane >> 4) * 8;
      mlakv::cuda::ptx::ldmatrix_x4_trans(vb, mlakv::cuda::ptx::smem_addr(kt + tok * kSE + dim));
      ptx::mma_bf16_16816(o[2 * np], pa, vb[0], vb[1]);
      ptx::mma_bf16_16816(o[2 * np + 1], pa, vb[2], vb[3]);
    } else {
      const int dim = 16 * np + (lane >> 4) * 8;
      mlakv::cuda::ptx::ldmatrix_x4_trans(vb, mlakv::cuda::ptx::smem_addr(slice + tok * kSliceStride + dim));
      ptx::mma_f16_16816(o[2 * np], pa, vb[0], vb[1]);
      ptx::mma_f16_16816(o[2 * np + 1], pa, vb[2], vb[3]);
    }
  }
}
#endif  // MLAKV_SM90_DEVICE

// Token lookup (as in the portable kernel): raw block id / index, then the slot or -1.
[[maybe_unused]] __device__ __forceinline__ int64_t token_slot(const AttentionParams& p, int b, int i, int64_t pos, int64_t end) {
  if (pos >= end) return -1;
  if (p.sparse) {
    const int32_t raw = p.indices[b * p.ix_s0 + i * p.ix_s1 + pos * p.ix_s2];
    return (raw >= 0 && raw < p.num_slots) ? raw : -1;
  }
  // 0 <= pos < end <= 2^31 (seqlens are i32): a 32-bit division; the 64-bit one is a
  // long software routine on the producer's per-stage critical path.
  const uint32_t up = static_cast<uint32_t>(pos), bs = static_cast<uint32_t>(p.block_size);
  const uint32_t blk = up / bs;
  if (blk >= p.bt_cols) return -1;
  const int32_t raw = p.block_table[b * p.bt_s0 + static_cast<int64_t>(blk) * p.bt_s1];
  if (raw < 0 || raw >= p.num_blocks) return -1;
  return static_cast<int64_t>(raw) * p.block_size + (up - blk * bs);
}

// The producer warp: walks the token set one tile of kT tokens at a time (lane t owns
// token t), issues the bulk copies of each tile into its ring stage (stage = tile % S),
// zero-fills invalid tokens and publishes the tile's validity mask; waits on `empty`
// before reusing a stage. Shared by both sm90 kernels.
template <KvFormat F, int S, int kS>
__device__ __forceinline__ void produce(const AttentionParams& p, int b, int i_fixed, int64_t begin, int64_t end,
                                        int n_tiles, uint8_t* ring, uint64_t* full, uint64_t* empty, uint32_t* vmask,
                                        int lane) {
#if MLAKV_SM90_DEVICE
  constexpr int kRec = Fmt<F>::kRecord;
  int64_t slot = token_slot(p, b, i_fixed, begin + lane, end);
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int st = tile % S;
    // Next tile's lookup first: its latency hides behind this tile's wait and copy.
    const int64_t next = tile + 1 < n_tiles ? token_slot(p, b, i_fixed, begin + (tile + 1) * kT + lane, end) : -1;
    if (tile >= S) ptx::mbar_wait(mlakv::cuda::ptx::smem_addr(&empty[st]), ((tile / S) - 1) & 1);
    const bool valid = slot >= 0;
    const uint32_t mask = __ballot_sync(0xFFFFFFFFu, valid);
    uint8_t* dst = ring + (st * kT + lane) * kS;
    const uint32_t bar = mlakv::cuda::ptx::smem_addr(&full[st]);
    if (!valid) {
      const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll 4
      for (int k = 0; k < kRec / 16; ++k) reinterpret_cast<uint4*>(dst)[k] = z;
      ptx::fence_proxy_async();  // the copy engine writes these bytes later
    }
    if (lane == 0) {
      vmask[st] = mask;
      ptx::mbar_expect_tx(bar, static_cast<uint32_t>(__popc(mask)) * kRec);
    }
    __syncwarp();
    if constexpr (kS == kRec) {
      // Unpadded stages: a run of tokens in consecutive slots (a block's records) is
      // one bulk copy, issued by the run's first lane. Small copies are what bounds
      // the copy engine (one copy per record caps it near 3e9 records/s on the H200).
      const int64_t prev = __shfl_up_sync(0xFFFFFFFFu, slot, 1);
      const bool cont = valid && lane > 0 && prev >= 0 && slot == prev + 1;
      const uint32_t cont_mask = __ballot_sync(0xFFFFFFFFu, cont);
      if (valid && !cont) {
        const uint64_t after = static_cast<uint64_t>(cont_mask) >> (lane + 1);  // run continues while set
        const int len = 1 + (__ffsll(static_cast<long long>(~after)) - 1);
        ptx::bulk_g2s(mlakv::cuda::ptx::smem_addr(dst), p.cache + slot * kRec, static_cast<uint32_t>(len * kRec), bar);
      }
    } else {
      if (valid) ptx::bulk_g2s(mlakv::cuda::ptx::smem_addr(dst), p.cache + slot * kRec, kRec, bar);
    }
    ptx::mbar_arrive(bar);
    slot = next;
  }
#endif
}

// A CTA's start, before any role runs: the ring's mbarriers (full: the producer warp's 32
// lanes arrive; empty: every consumer warp releases) and the rows' visible lengths.
template <int S, int kR>
__device__ __forceinline__ void init_ring(const AttentionParams& p, const CtaWork& cw, uint64_t* full, uint64_t* empty,
                                          int consumer_warps, int32_t* row_vis, int tid) {
#if MLAKV_SM90_DEVICE
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      ptx::mbar_init(mlakv::cuda::ptx::smem_addr(&full[s]), 32);
      ptx::mbar_init(mlakv::cuda::ptx::smem_addr(&empty[s]), consumer_warps);
    }
    ptx::mbar_init_fence();
  }
  if (tid < kR) row_vis[tid] = cw.visible(p, tid);
  __syncthreads();
#endif
}

template <KvFormat F>
__global__ void __launch_bounds__(kThreads, 2) attention_sm90_kernel(const __grid_constant__ AttentionParams p) {
#if MLAKV_SM90_DEVICE
  constexpr int S = stages<F>();
  constexpr int kS = Fmt<F>::kStride;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* ring = smem;
  float4* s_part = reinterpret_cast<float4*>(smem + static_cast<std::size_t>(S) * kT * kS);
  uint16_t* slices = reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(s_part) + kPartBytes);
  uint8_t* misc = reinterpret_cast<uint8_t*>(s_part) + kPartBytes + (F == KvFormat::kBf16 ? 0 : kSliceBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(misc);
  uint64_t* empty = full + kMaxStages;
  uint32_t* vmask = reinterpret_cast<uint32_t*>(empty + kMaxStages);
  int32_t* row_vis = reinterpret_cast<int32_t*>(vmask + kMaxStages);
  int32_t* row_e = row_vis + kRows;
  ptx::launch_dependents();  // smxx's combine may launch now (it waits for this grid's results)

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int split = blockIdx.z;
  const CtaWork cw = cta_work<kRows, kT, kT>(p);  // cuda/common/cta_work.cuh
  const int b = cw.b, i_fixed = cw.i_fixed, rows_req = cw.rows_req, row0 = cw.row0;
  const int64_t begin = cw.begin, end = cw.end;
  const int n_tiles = cw.n_tiles;
  auto row_query = [&](int r) { return cw.query(p, r); };
  auto row_head = [&](int r) { return cw.head(p, r); };

  init_ring<S, kRows>(p, cw, full, empty, kConsumerWarps, row_vis, tid);

  if (warp == kConsumerWarps) {
    produce<F, S, kS>(p, b, i_fixed, begin, end, n_tiles, ring, full, empty, vmask, lane);
    return;
  }

  // ================= consumers =================
  const int w = warp, g = lane >> 2, c = lane & 3;
  uint16_t* slice = slices + w * kT * kSliceStride;  // quantized formats only
  // Element offset of q row r; a row past the request reads row 0 and is zeroed by a
  // select (no branch, so the unrolled loads below all issue before the first use).
  auto q_row = [&](int r) -> int64_t {
    const int rc = row0 + r < rows_req ? r : 0;
    return b * p.q_s0 + static_cast<int64_t>(row_query(rc)) * p.q_s1 + static_cast<int64_t>(row_head(rc)) * p.q_s2;
  };
  // Latent q multiplier before rounding: s_l * 2^7 for e2m1 (the K fragments carry
  // e2m1 * sf * 2^-7), 1 otherwise.
  const float lat_base = is_nvfp4(F) ? p.outer_scale * 128.0f : 1.0f;
  uint32_t aq[8][4], aqr[4];
  float row_scale[2];
  // q prologue, instantiated for f32 and bf16 q so that no load sits behind a branch.
  auto q_prologue = [&](auto bf16_tag) {
    constexpr bool kQ16 = decltype(bf16_tag)::value;
    auto q_at = [&](int64_t off, bool ok, int d) -> float {
      float v;
      if constexpr (kQ16) v = bf16_to_f32(static_cast<const uint16_t*>(p.q)[off + d]);
      else v = static_cast<const float*>(p.q)[off + d];
      return ok ? v : 0.0f;
    };
    // ---- per-row power-of-two prescale so that f16 q cannot overflow ----
    if constexpr (f16_latent(F)) {
      const int r = tid >> 3, sub = tid & 7;
      const int64_t off = q_row(r);
      const bool ok = row0 + r < rows_req;
      float amax = 0.0f;
#pragma unroll
      for (int k = 0; k < kQkDim / 8; ++k) {  // constant trip count: fully unrolled, loads in flight together
        const int d = sub + 8 * k;
        amax = fmaxf(amax, fabsf(q_at(off, ok, d) * (d < kLatentDim ? lat_base : 1.0f)));
      }
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 4));
      if (sub == 0) {
        int e = 0;
        if (amax > 0.0f && amax <= 3.4e38f) {
          int ex;
          (void)frexpf(amax, &ex);  // amax < 2^ex
          e = std::clamp(15 - ex, -100, 100);
        }
        row_e[r] = e;
      }
    } else {
      if (tid < kRows) row_e[tid] = 0;
    }
    ptx::named_barrier(kConsumerBarrier, kConsumerThreads);
    const int e_row[2] = {row_e[g], row_e[g + 8]};
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) row_scale[rr] = ldexpf(p.scale_log2, -e_row[rr]);

    // ---- q A fragments: 8 latent k-steps + 1 rope k-step ----
    float mlat[2], mrope[2];
    const int64_t qoff[2] = {q_row(g), q_row(g + 8)};
    const bool qok[2] = {row0 + g < rows_req, row0 + g + 8 < rows_req};
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      mlat[rr] = ldexpf(lat_base, e_row[rr]);
      mrope[rr] = ldexpf(1.0f, e_row[rr]);
    }
#pragma unroll
    for (int ks = 0; ks < 9; ++ks) {
      uint32_t fr[4];
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {
        const int rr = reg & 1;                 // a0 a2: row g; a1 a3: row g + 8
        const int k0 = 2 * c + (reg >> 1) * 8;  // a0 a1: k 2c, 2c+1; a2 a3: k 2c+8, 2c+9
        const int d0 = qdim<F>(w, ks, k0), d1 = qdim<F>(w, ks, k0 + 1);
        const bool lat = ks < 8;
        const float m = lat ? mlat[rr] : mrope[rr];
        const float v0 = q_at(qoff[rr], qok[rr], d0) * m, v1 = q_at(qoff[rr], qok[rr], d1) * m;
        const bool f16 = lat ? f16_latent(F) : f16_rope(F);
        fr[reg] = f16 ? ptx::pack_f16x2(v0, v1) : mlakv::cuda::ptx::pack_bf16x2(v0, v1);
      }
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {
        if (ks < 8) aq[ks < 8 ? ks : 0][reg] = fr[reg];
        else aqr[reg] = fr[reg];
      }
    }
  };
  if (p.q_bf16) {
    q_prologue(std::true_type{});
  } else {
    q_prologue(std::false_type{});
  }

  float o[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // l: this thread's columns only
  float sig = 0.0f;  // fp8: O is kept in units of sig, the largest tile scale seen so far
  const int vis[2] = {row_vis[g], row_vis[g + 8]};

  float s[kNT][4];      // scores, then P, of the current tile
  uint32_t pa[kKS][4];  // P as A fragments

  // Scores of `tile` over this warp's dims, published to the other consumer warps.
  auto scores = [&](int tile) {
    const int st = tile % S;
    const uint8_t* stage = ring + st * kT * kS;
    ptx::mbar_wait(mlakv::cuda::ptx::smem_addr(&full[st]), (tile / S) & 1);
    if constexpr (F == KvFormat::kBf16) {
      score_bf16(stage, w, lane, aq, aqr, s);
    } else {
      __syncwarp();  // the previous tile's ldmatrix reads of the slice are done
      dequant_slice<F>(stage, w, lane, slice);
      __syncwarp();
      score_slice<F>(stage, slice, w, lane, aq, aqr, s);
    }
    float4* mine = s_part + ((tile & 1) * kConsumerWarps + w) * kNT * 32;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) mine[nt * 32 + lane] = make_float4(s[nt][0], s[nt][1], s[nt][2], s[nt][3]);
  };

  // Sums the partial scores of `tile`, runs the online softmax (log2 domain; identical
  // in every consumer warp), rescales O and leaves P in pa.
  auto softmax = [&](int tile) {
    const int st = tile % S;
    const uint8_t* stage = ring + st * kT * kS;
    const uint32_t mask = vmask[st];
    const int64_t tb = begin + static_cast<int64_t>(tile) * kT;
    ptx::named_barrier(kConsumerBarrier, kConsumerThreads);
    const float4* all = s_part + (tile & 1) * kConsumerWarps * kNT * 32;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      float4 acc = all[nt * 32 + lane];
#pragma unroll
      for (int ww = 1; ww < kConsumerWarps; ++ww) {
        const float4 v = all[(ww * kNT + nt) * 32 + lane];
        acc.x += v.x;
        acc.y += v.y;
        acc.z += v.z;
        acc.w += v.w;
      }
      s[nt][0] = acc.x;
      s[nt][1] = acc.y;
      s[nt][2] = acc.z;
      s[nt][3] = acc.w;
    }
    float alpha[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int t = 8 * nt + 2 * c + j;
          const bool ok = ((mask >> t) & 1u) && tb + t < vis[rr];
          const float x = ok ? s[nt][2 * rr + j] * row_scale[rr] : -INFINITY;
          s[nt][2 * rr + j] = x;
          mx = fmaxf(mx, x);
        }
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
      const float m_new = fmaxf(m_run[rr], mx);
      alpha[rr] = m_run[rr] == -INFINITY ? 0.0f : exp2f(m_run[rr] - m_new);
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float pv = m_new == -INFINITY ? 0.0f : exp2f(s[nt][2 * rr + j] - m_new);
          s[nt][2 * rr + j] = pv;
          sum += pv;
        }
      }
      l_run[rr] = l_run[rr] * alpha[rr] + sum;
      m_run[rr] = m_new;
    }
    float f_o[2] = {alpha[0], alpha[1]};
    if constexpr (F == KvFormat::kFp8DsMla) {
      // This warp's tile scale goes into P relative to sig, the largest scale seen so
      // far (so P * s / sig <= 1 in f16); O is rescaled only when sig grows.
      float ts[kNT][2];
      float smax = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          ts[nt][j] = ldsf(stage + (8 * nt + 2 * c + j) * kS + record::Parts<F>::kScaleOffset +
                           record::QuarterScales<F>::kBytes * w);
          smax = fmaxf(smax, ts[nt][j]);
        }
      }
      smax = fmaxf(smax, __shfl_xor_sync(0xFFFFFFFFu, smax, 1));
      smax = fmaxf(smax, __shfl_xor_sync(0xFFFFFFFFu, smax, 2));
      if (smax > sig) {
        const float ratio = sig / smax;  // sig starts at 0: the first tile has alpha = 0 anyway
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) f_o[rr] = alpha[rr] * ratio;
        sig = smax;
      }
      const float inv = sig > 0.0f ? 1.0f / sig : 0.0f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s[nt][i] *= ts[nt][i & 1] * inv;
      }
    }
    // Most tiles leave the running max (and sig) alone: skip the 64 multiplies then.
    if (__any_sync(0xFFFFFFFFu, f_o[0] != 1.0f || f_o[1] != 1.0f)) {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        o[j][0] *= f_o[0];
        o[j][1] *= f_o[0];
        o[j][2] *= f_o[1];
        o[j][3] *= f_o[1];
      }
    }
#pragma unroll
    for (int kk = 0; kk < kKS; ++kk) {
      if constexpr (F == KvFormat::kBf16) {
        pa[kk][0] = mlakv::cuda::ptx::pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
        pa[kk][1] = mlakv::cuda::ptx::pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
        pa[kk][2] = mlakv::cuda::ptx::pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[kk][3] = mlakv::cuda::ptx::pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      } else {
        pa[kk][0] = ptx::pack_f16x2(s[2 * kk][0], s[2 * kk][1]);
        pa[kk][1] = ptx::pack_f16x2(s[2 * kk][2], s[2 * kk][3]);
        pa[kk][2] = ptx::pack_f16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[kk][3] = ptx::pack_f16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      }
    }
  };

  // The stage of `tile` goes back to the producer.
  auto release = [&](int tile) {
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(mlakv::cuda::ptx::smem_addr(&empty[tile % S]));
  };
  // O += P V of `tile` (bf16: from its stage, which is released after; quantized: from
  // the warp's slice, the stage having been released after the softmax).
  auto pv = [&](int tile) {
    const uint8_t* stage = ring + (tile % S) * kT * kS;
#pragma unroll
    for (int kk = 0; kk < kKS; ++kk) pv_kstep<F>(stage, slice, kk, w, lane, pa[kk], o);
    if constexpr (F == KvFormat::kBf16) release(tile);
  };

  // Per tile: scores, softmax, P V. Quantized formats read P V's operands from the
  // warp's slice, so their stage goes back before P V; bf16 reads the stage itself.
  // (Issuing the scores of tile n+1 before P V of tile n measured +1-4% with registers
  // dequantization and needs a second slice or a third bf16 stage: not done.)
  for (int tile = 0; tile < n_tiles; ++tile) {
    scores(tile);
    softmax(tile);
    if constexpr (F != KvFormat::kBf16) release(tile);
    pv(tile);
  }

  // ---- finalize ----
  float post = 1.0f;
  if constexpr (F == KvFormat::kFp8DsMla) post = sig;
  if constexpr (is_nvfp4(F)) post = p.outer_scale * 128.0f;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float l = l_run[rr];
    l += __shfl_xor_sync(0xFFFFFFFFu, l, 1);
    l += __shfl_xor_sync(0xFFFFFFFFu, l, 2);
    const int r = g + 8 * rr;
    if (row0 + r >= rows_req) continue;
    const int i = row_query(r), h = row_head(r);
    const bool is_empty = l == 0.0f;
    const float scale = is_empty ? 0.0f : post / l;
    const float lse = is_empty ? -INFINITY : (m_run[rr] + log2f(l)) * kLn2;
    float* dst = result_row(p, b, split, i, h, lse, c == 0 && w == 0);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      *reinterpret_cast<float2*>(dst + ocol(w, j, 2 * c)) = make_float2(o[j][2 * rr] * scale, o[j][2 * rr + 1] * scale);
    }
  }
#endif  // MLAKV_SM90_DEVICE
}

// ============================================================================================
// The warpgroup kernel (v8) for the quantized formats: the KV tile is the wgmma M
// dimension. One CTA = 16 query rows x one split, 4 consumer warps (one warpgroup) +
// the producer warp above. Per consumer tile of 64 tokens (two producer stages):
//   scores  S^T (64 tokens x 16 rows) = K (64 x 576) Q^T: 36 wgmma m64n16k16, A = K
//           dequantized straight into registers (warp w: tokens 16w..16w+15, converted
//           once), B = Q^T in shared memory (written once per CTA, f16 latent after the
//           per-row power-of-two prescale; bf16 or f16 rope); fp8: one accumulator per
//           128-dim tile scale, the scales applied per token in fp32;
//   softmax per row over the 64 tokens: warp shuffles + one exchange of 16 row maxima
//           per warp (one named barrier); P^T written as f16 by stmatrix.trans (fp8: one
//           copy per tile scale, P * scale / sig_q with sig_q the largest scale seen);
//   P V     O^T (512 x 16) = V^T (512 x 64) P^T: 32 wgmma m64n16k16, A = V^T
//           dequantized into registers (a thread's dims are contiguous bytes of 4
//           tokens, byte-interleaved by prmt), B = P^T.
// v9, the e2m1 formats (kVt, wg_vtile): each latent element is converted once. The
// warps convert their 16 tokens into the V tile (f16, 64 tokens x 512 dims in shared
// memory), and after one warpgroup barrier both MMAs read it as their A operand through
// descriptors: the scores as K-major A (32 latent wgmma back to back; the 4 rope k-steps
// still from registers), P V as M-major A (imm-trans-a; 32 wgmma, nothing to convert).
// The ring stages go back to the producer before the score wgmmas; the V tile leaves
// room for 2 stages only (one consumer tile) beside Q^T at two CTAs per SM. fp8 keeps
// the register path (its V tile would not fit beside 2 fp8 stages).
// Every dequantized element is exact in f16 (e4m3; e2m1 * sf * 2^-7; int8), as in v7, so
// the harness's emulation (exact K/V, q and P roundings) is unchanged.
constexpr int kWgTile = 64;                     // tokens per consumer tile (= 2 stages)
[[maybe_unused]] constexpr float kLazyLog2 = 8.0f;  // lazy rescale margin (log2 units)
[[maybe_unused]] constexpr int kLazyBarrier = 2;    // named barrier id of the lazy rescale's OR
constexpr int kWgKSteps = kQkDim / 16;          // 36 score k-steps (32 latent + 4 rope)
constexpr int kQtBytes = kWgKSteps * 512;       // Q^T: per k-step 16 rows x 16 k, f16/bf16
constexpr int kPtBytes = (kWgTile / 16) * 512;  // one P^T copy: 4 k-steps of 16 tokens
template <KvFormat F>
constexpr int wg_pt_copies() {
  return F == KvFormat::kFp8DsMla ? 4 : 1;
}
constexpr int kWgRedBytes = 4 * (kConsumerWarps * kRows + kConsumerWarps * 4);
constexpr int kWgMiscBytes = 2 * 8 * kMaxStages + 4 * kMaxStages + 4 * kRows * 3;
// The V tile (e2m1 formats): the tile's 64 tokens x 512 latent dims as the f16 values the
// scores converted, M-major for P V's A operand (wgmma imm-trans-a): 8-dim group G (SBO =
// kVtGroupStride apart; 16 B of padding make the scores' 16-B stores conflict-free), then
// 8-token groups 128 B apart (LBO), 16 B per token. Within a group the 8 halves hold dims
// 8G + vt_dim(p), the order of the score fragments' e2m1 pairs (undone at the output).
constexpr int kVtGroupStride = 1024 + 16;
constexpr int kVtBytes = (kLatentDim / 8) * kVtGroupStride;  // 66,560
// Two CTAs per SM: 228 KB per SM, 1 KB reserved per CTA.
constexpr int kWgSmemBudget = 228 * 1024 / 2 - 1024;
template <KvFormat F>
constexpr bool wg_vtile() {
  return is_nvfp4(F);
}
template <KvFormat F, bool Vt = wg_vtile<F>()>
constexpr int wg_fixed_bytes() {
  return kQtBytes + wg_pt_copies<F>() * kPtBytes + (Vt ? kVtBytes : 0) + kWgRedBytes +
         ((kWgMiscBytes + 127) & ~127);
}
template <KvFormat F, bool Vt = wg_vtile<F>()>
constexpr int wg_stages() {
  const int n = ((Vt ? kWgSmemBudget : kSmemBudget) - wg_fixed_bytes<F, Vt>()) / (kT * Fmt<F>::kRecord);
  return n < kMaxStages ? n : kMaxStages;
}
template <KvFormat F, bool Vt = wg_vtile<F>()>
constexpr std::size_t wg_smem_bytes() {
  return static_cast<std::size_t>(wg_stages<F, Vt>()) * kT * Fmt<F>::kRecord + wg_fixed_bytes<F, Vt>();
}
static_assert(wg_stages<KvFormat::kFp8DsMla>() >= 2 && wg_stages<KvFormat::kNvfp4DsMla>() >= 2 &&
              wg_stages<KvFormat::kNvfp4DsMlaFp8Rope>() >= 2 && wg_stages<KvFormat::kNvfp4DsMlaInt8Rope>() >= 2);
static_assert(split_granule(KvFormat::kFp8DsMla) == kWgTile);  // v8 rounds split chunks to kWgTile (launch.h)
// Dim (0..7) of the 8-dim group that half p of a V tile row holds: the e2m1 pairs (j, j + 4).
__host__ __device__ constexpr int vt_dim(int p) { return (p >> 1) + 4 * (p & 1); }

// Byte offset of element (row n, k index kk) of a 16 x 16 B block (K-major, no swizzle:
// core matrices (n / 8, kk / 8) at 256 (n / 8) + 128 (kk / 8), rows 16 B apart).
__host__ __device__ constexpr int wg_b_offset(int n, int kk) {
  return 256 * (n >> 3) + 128 * (kk >> 3) + 16 * (n & 7) + 2 * (kk & 7);
}
// Head dim that k index kk (0..15) of score k-step ks (0..35) means: the order in which
// a thread's A fragment holds its token's dims (lane c of a quad loads 16 dims).
// Vt: the order of v9's V tile (the e2m1 formats on attention_wg_kernel); false: the
// order of wg_k_chunk's registers (v8, and the many-row kernel for every format).
template <KvFormat F, bool Vt = wg_vtile<F>()>
__host__ __device__ constexpr int wg_qdim(int ks, int kk) {
  const int c = (kk & 7) >> 1, e = kk & 1, hi = kk >> 3;
  if (Vt && ks < 32) return 16 * ks + 8 * hi + vt_dim(kk & 7);  // the V tile's order
  if (ks < 32) {
    const int kc = ks >> 2, j = ks & 3, base = 64 * kc + 16 * c;
    if constexpr (is_nvfp4(F)) return base + 8 * hi + j + 4 * e;  // e2m1 pairs (nibble j, j + 4)
    return base + 4 * j + 2 * hi + e;                               // e4m3 pairs, in byte order
  }
  return kLatentDim + 16 * c + 4 * (ks - 32) + 2 * hi + e;  // rope (bf16 or e4m3), in order
}

#if MLAKV_SM90_DEVICE
__device__ __forceinline__ uint32_t lds8(const uint8_t* p) { return *p; }

// A fragments of score k-steps 4kc .. 4kc+3 (latent chunk kc of 64 dims) for tokens
// rg (row g) and rg8 (row g + 8) of the warp's 16.
template <KvFormat F>
__device__ __forceinline__ void wg_k_chunk(const uint8_t* rg, const uint8_t* rg8, int kc, int c, uint32_t (&a)[4][4]) {
  using P = record::Parts<F>;
  if constexpr (F == KvFormat::kFp8DsMla) {
    const uint4 x = lds128(rg + P::kLatentOffset + 64 * kc + 16 * c), y = lds128(rg8 + P::kLatentOffset + 64 * kc + 16 * c);
    const uint32_t xw[4] = {x.x, x.y, x.z, x.w}, yw[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      a[j][0] = ptx::e4m3x2_to_f16x2(xw[j]);
      a[j][1] = ptx::e4m3x2_to_f16x2(yw[j]);
      a[j][2] = ptx::e4m3x2_hi_to_f16x2(xw[j]);
      a[j][3] = ptx::e4m3x2_hi_to_f16x2(yw[j]);
    }
  } else {
    const uint2 x = lds64(rg + P::kLatentOffset + 32 * kc + 8 * c), y = lds64(rg8 + P::kLatentOffset + 32 * kc + 8 * c);
    const uint32_t sx = lds8(rg + P::kScaleOffset + 4 * kc + c), sy = lds8(rg8 + P::kScaleOffset + 4 * kc + c);
    const uint32_t fx = ptx::hmul2(ptx::e4m3x2_to_f16x2(sx * 0x0101u), kF16x2_128);
    const uint32_t fy = ptx::hmul2(ptx::e4m3x2_to_f16x2(sy * 0x0101u), kF16x2_128);
    auto pair = [](uint32_t v, int j) {
      return j == 0 ? e2m1_pair<0>(v) : j == 1 ? e2m1_pair<1>(v) : j == 2 ? e2m1_pair<2>(v) : e2m1_pair<3>(v);
    };
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      a[j][0] = ptx::hmul2(pair(x.x, j), fx);
      a[j][1] = ptx::hmul2(pair(y.x, j), fy);
      a[j][2] = ptx::hmul2(pair(x.y, j), fx);
      a[j][3] = ptx::hmul2(pair(y.y, j), fy);
    }
  }
}

// A fragments of the 4 rope k-steps (bf16 rope: raw pairs; e4m3 rope: cvt to f16; int8
// rope: the exact integers in f16 by byte permute; 8-bit ropes keep the same dim order).
template <KvFormat F>
__device__ __forceinline__ void wg_rope(const uint8_t* rg, const uint8_t* rg8, int c, uint32_t (&a)[4][4]) {
  using P = record::Parts<F>;
  if constexpr (F == KvFormat::kNvfp4DsMlaInt8Rope) {
    const uint4 x = lds128(rg + P::kRopeOffset + 16 * c), y = lds128(rg8 + P::kRopeOffset + 16 * c);
    const uint32_t xw[4] = {x.x, x.y, x.z, x.w}, yw[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t ux = xw[j] ^ 0x80808080u, uy = yw[j] ^ 0x80808080u;
      a[j][0] = ptx::biased_u8x2_to_f16x2<0x4140u>(ux);
      a[j][1] = ptx::biased_u8x2_to_f16x2<0x4140u>(uy);
      a[j][2] = ptx::biased_u8x2_to_f16x2<0x4342u>(ux);
      a[j][3] = ptx::biased_u8x2_to_f16x2<0x4342u>(uy);
    }
  } else if constexpr (F == KvFormat::kNvfp4DsMlaFp8Rope) {
    const uint4 x = lds128(rg + P::kRopeOffset + 16 * c), y = lds128(rg8 + P::kRopeOffset + 16 * c);
    const uint32_t xw[4] = {x.x, x.y, x.z, x.w}, yw[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      a[j][0] = ptx::e4m3x2_to_f16x2(xw[j]);
      a[j][1] = ptx::e4m3x2_to_f16x2(yw[j]);
      a[j][2] = ptx::e4m3x2_hi_to_f16x2(xw[j]);
      a[j][3] = ptx::e4m3x2_hi_to_f16x2(yw[j]);
    }
  } else {
    const uint4 x0 = lds128(rg + P::kRopeOffset + 32 * c), x1 = lds128(rg + P::kRopeOffset + 32 * c + 16);
    const uint4 y0 = lds128(rg8 + P::kRopeOffset + 32 * c), y1 = lds128(rg8 + P::kRopeOffset + 32 * c + 16);
    const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    const uint32_t yw[8] = {y0.x, y0.y, y0.z, y0.w, y1.x, y1.y, y1.z, y1.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      a[j][0] = xw[2 * j];
      a[j][1] = yw[2 * j];
      a[j][2] = xw[2 * j + 1];
      a[j][3] = yw[2 * j + 1];
    }
  }
}

// V^T A fragments of P V k-step kk, m-blocks 4 half .. 4 half + 3, for the thread's dims,
// from its 4 tokens' records t0 = 2c, t1 = 2c+1, t8 = 2c+8, t9 = 2c+9 of the k-step
// (attention_wg_kernel: fp8 only, v9 reads the e2m1 formats' V^T from the V tile; the
// many-row kernel: every quantized format). m-block mb's rows:
//   fp8:  row 16w + g + 8h -> dim 128 (mb / 2) + 4 (8w + g) + 2 (mb % 2) + h
//   e2m1: row 16w + g + 8h -> dim 16 (8w + g) + 2 mb + h
template <KvFormat F>
__device__ __forceinline__ void wg_v_frags(const uint8_t* t0, const uint8_t* t1, const uint8_t* t8, const uint8_t* t9,
                                           int wg_g, int half, uint32_t (&a)[4][4]) {
  using P = record::Parts<F>;
  if constexpr (F == KvFormat::kFp8DsMla) {
#pragma unroll
    for (int qq = 0; qq < 2; ++qq) {
      const int off = P::kLatentOffset + 128 * (2 * half + qq) + 4 * wg_g;
      const uint32_t w0 = lds32(t0 + off), w1 = lds32(t1 + off), w8 = lds32(t8 + off), w9 = lds32(t9 + off);
      const uint32_t x0 = ptx::prmt(w0, w1, 0x5140), x1 = ptx::prmt(w0, w1, 0x7362);
      const uint32_t y0 = ptx::prmt(w8, w9, 0x5140), y1 = ptx::prmt(w8, w9, 0x7362);
      a[2 * qq][0] = ptx::e4m3x2_to_f16x2(x0);
      a[2 * qq][1] = ptx::e4m3x2_hi_to_f16x2(x0);
      a[2 * qq][2] = ptx::e4m3x2_to_f16x2(y0);
      a[2 * qq][3] = ptx::e4m3x2_hi_to_f16x2(y0);
      a[2 * qq + 1][0] = ptx::e4m3x2_to_f16x2(x1);
      a[2 * qq + 1][1] = ptx::e4m3x2_hi_to_f16x2(x1);
      a[2 * qq + 1][2] = ptx::e4m3x2_to_f16x2(y1);
      a[2 * qq + 1][3] = ptx::e4m3x2_hi_to_f16x2(y1);
    }
  } else {
    // word `half` of the thread's 8 latent bytes: dims 16 (8w + g) + 8 half .. + 7
    const int off = P::kLatentOffset + 8 * wg_g + 4 * half, soff = P::kScaleOffset + wg_g;
    const uint32_t v0 = lds32(t0 + off), v1 = lds32(t1 + off), v8 = lds32(t8 + off), v9 = lds32(t9 + off);
    const uint32_t f01 = ptx::hmul2(ptx::e4m3x2_to_f16x2(lds8(t0 + soff) | (lds8(t1 + soff) << 8)), kF16x2_128);
    const uint32_t f89 = ptx::hmul2(ptx::e4m3x2_to_f16x2(lds8(t8 + soff) | (lds8(t9 + soff) << 8)), kF16x2_128);
#pragma unroll
    for (int hb = 0; hb < 2; ++hb) {  // bytes (0,1) or (2,3) of the word: m-blocks 2hb, 2hb+1 of the half
      const uint32_t sel = hb ? 0x7632u : 0x5410u;
      const uint32_t z = ptx::prmt(v0, v1, sel), zz = ptx::prmt(v8, v9, sel);
      const int m0 = 2 * hb;
      a[m0][0] = ptx::hmul2(e2m1_pair<0>(z), f01);
      a[m0][1] = ptx::hmul2(e2m1_pair<1>(z), f01);
      a[m0][2] = ptx::hmul2(e2m1_pair<0>(zz), f89);
      a[m0][3] = ptx::hmul2(e2m1_pair<1>(zz), f89);
      a[m0 + 1][0] = ptx::hmul2(e2m1_pair<2>(z), f01);
      a[m0 + 1][1] = ptx::hmul2(e2m1_pair<3>(z), f01);
      a[m0 + 1][2] = ptx::hmul2(e2m1_pair<2>(zz), f89);
      a[m0 + 1][3] = ptx::hmul2(e2m1_pair<3>(zz), f89);
    }
  }
}
// Q^T of a 16-row CTA into shared memory (v8, v9 and v10; 128 threads of the first consumer
// warpgroup): row n = tid / 8, its 8 threads split the k-steps' pairs; row_sc[n] gets the
// row's power-of-two prescale folded into the softmax scale.
template <KvFormat F, bool Vt>
__device__ __forceinline__ void wg_store_qt(const AttentionParams& p, const CtaWork& cw, int tid, uint8_t* qt,
                                            float* row_sc) {
  const int b = cw.b, row0 = cw.row0, rows_req = cw.rows_req;
  auto row_query = [&](int r) { return cw.query(p, r); };
  auto row_head = [&](int r) { return cw.head(p, r); };
  const int n = tid >> 3, sub = tid & 7;
  const bool ok = row0 + n < rows_req;
  const int rc = ok ? n : 0;
  const int64_t off = b * p.q_s0 + static_cast<int64_t>(row_query(rc)) * p.q_s1 +
                      static_cast<int64_t>(row_head(rc)) * p.q_s2;
  auto q_at = [&](int d) -> float {
    float v = p.q_bf16 ? bf16_to_f32(static_cast<const uint16_t*>(p.q)[off + d]) : static_cast<const float*>(p.q)[off + d];
    return ok ? v : 0.0f;
  };
  const float lat_base = is_nvfp4(F) ? p.outer_scale * 128.0f : 1.0f;
  // The row's 72 values of this thread, every load issued before the first use (one
  // memory round trip; the loop unrolled by 8 here made ~9 dependent ones: 2.5-3.5 us
  // of a one-tile split's ~18 us at B = 1, docs/perf.md "tp"). The pass below re-reads
  // q from L1.
  float qv[kQkDim / 8];
  if (p.q_bf16) {
#pragma unroll
    for (int k = 0; k < kQkDim / 8; ++k) qv[k] = bf16_to_f32(static_cast<const uint16_t*>(p.q)[off + sub + 8 * k]);
  } else {
#pragma unroll
    for (int k = 0; k < kQkDim / 8; ++k) qv[k] = static_cast<const float*>(p.q)[off + sub + 8 * k];
  }
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < kQkDim / 8; ++k) {
    const int d = sub + 8 * k;
    amax = fmaxf(amax, fabsf((ok ? qv[k] : 0.0f) * (d < kLatentDim ? lat_base : 1.0f)));
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 4));
  int e = 0;
  if (amax > 0.0f && amax <= 3.4e38f) {
    int ex;
    (void)frexpf(amax, &ex);
    e = std::clamp(15 - ex, -100, 100);
  }
  if (sub == 0) row_sc[n] = ldexpf(p.scale_log2, -e);
  const float mlat = ldexpf(lat_base, e), mrope = ldexpf(1.0f, e);
#pragma unroll 4
  for (int ks = 0; ks < kWgKSteps; ++ks) {
    const int kk = 2 * sub;
    const int d0 = wg_qdim<F, Vt>(ks, kk), d1 = wg_qdim<F, Vt>(ks, kk + 1);
    uint32_t v;
    if (ks < 32) {
      v = ptx::pack_f16x2(q_at(d0) * mlat, q_at(d1) * mlat);
    } else if constexpr (f16_rope(F)) {
      v = ptx::pack_f16x2(q_at(d0) * mrope, q_at(d1) * mrope);
    } else {
      v = mlakv::cuda::ptx::pack_bf16x2(q_at(d0) * mrope, q_at(d1) * mrope);
    }
    *reinterpret_cast<uint32_t*>(qt + 512 * ks + wg_b_offset(n, kk)) = v;
  }
  ptx::fence_proxy_async();  // the tensor cores read Q^T through the async proxy
}

#endif  // MLAKV_SM90_DEVICE

template <KvFormat F, bool Vt = wg_vtile<F>()>
__global__ void __launch_bounds__(kThreads, 2) attention_wg_kernel(const __grid_constant__ AttentionParams p) {
#if MLAKV_SM90_DEVICE
  static_assert(!Vt || wg_vtile<F>());
  constexpr int S = wg_stages<F, Vt>();
  constexpr int kRec = Fmt<F>::kRecord;
  constexpr int kCopies = wg_pt_copies<F>();
  constexpr bool kFp8 = F == KvFormat::kFp8DsMla;
  constexpr bool kVt = Vt;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* ring = smem;
  uint8_t* qt = smem + static_cast<std::size_t>(S) * kT * kRec;
  uint8_t* pt = qt + kQtBytes;
  uint8_t* vt = pt + kCopies * kPtBytes;  // the V tile (kVt only)
  float* red = reinterpret_cast<float*>(vt + (kVt ? kVtBytes : 0));  // [4 warps][16 rows], then [4 warps][4 scales]
  uint8_t* misc = reinterpret_cast<uint8_t*>(red) + kWgRedBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(misc);
  uint64_t* empty = full + kMaxStages;
  uint32_t* vmask = reinterpret_cast<uint32_t*>(empty + kMaxStages);
  int32_t* row_vis = reinterpret_cast<int32_t*>(vmask + kMaxStages);
  float* row_sc = reinterpret_cast<float*>(row_vis + kRows);
  ptx::launch_dependents();  // smxx's combine may launch now (it waits for this grid's results)

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int split = blockIdx.z;
  const CtaWork cw = cta_work<kRows, kWgTile, kWgTile>(p);  // cuda/common/cta_work.cuh
  const int b = cw.b, i_fixed = cw.i_fixed, rows_req = cw.rows_req, row0 = cw.row0;
  const int64_t begin = cw.begin, end = cw.end;
  const int n_tiles = cw.n_tiles;
  auto row_query = [&](int r) { return cw.query(p, r); };
  auto row_head = [&](int r) { return cw.head(p, r); };

  init_ring<S, kRows>(p, cw, full, empty, kConsumerWarps, row_vis, tid);

  if (warp == kConsumerWarps) {
    produce<F, S, kRec>(p, b, i_fixed, begin, end, 2 * n_tiles, ring, full, empty, vmask, lane);
    return;
  }

  // ================= consumers: one warpgroup =================
  const int w = warp, g = lane >> 2, c = lane & 3;
  wg_store_qt<F, Vt>(p, cw, tid, qt, row_sc);  // ---- Q^T into shared memory ----
  ptx::named_barrier(kConsumerBarrier, kConsumerThreads);

  // The thread's 4 query rows: 8j + 2c + e (accumulator column of d[4j + 2h + e]).
  float rsc[2][2];
  int vis[2][2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      rsc[j][e] = row_sc[8 * j + 2 * c + e];
      vis[j][e] = row_vis[8 * j + 2 * c + e];
    }
  }
  const uint32_t pt_addr = mlakv::cuda::ptx::smem_addr(pt);
  // Descriptor words of Q^T and P^T (k-step i at + 32 i: 512 B apart).
  const uint32_t q_lo = ptx::desc_lo(mlakv::cuda::ptx::smem_addr(qt), 128), p_lo = ptx::desc_lo(pt_addr, 128);
  const uint32_t b_hi = ptx::desc_hi(256);
  const int wg_g = 8 * w + g;
  // V tile (kVt): this thread's tokens 16w + g (+ 8) are token group 2w (+ 1), row g;
  // chunk kc's 16 dims 64kc + 16c .. are dim groups 8kc + 2c, + 1. Descriptor words of
  // its two views: M-major A of P V (dims = M: SBO = the group stride, LBO = 128 B per 8
  // tokens) and K-major A of the scores (tokens = M: SBO = 128, LBO = the group stride).
  uint8_t* vt_mine = vt + 2 * w * 128 + 16 * g + 2 * c * kVtGroupStride;
  const uint32_t v_lo = ptx::desc_lo(mlakv::cuda::ptx::smem_addr(vt), 128), v_hi = ptx::desc_hi(kVtGroupStride);
  const uint32_t k_lo = ptx::desc_lo(mlakv::cuda::ptx::smem_addr(vt), kVtGroupStride), k_hi = ptx::desc_hi(128);

  float o[8][8];  // O^T: m-block mb (64 dims), fragment as wgmma's d
#pragma unroll
  for (int mb = 0; mb < 8; ++mb) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[mb][i] = 0.0f;
  }
  float m_run[2][2], l_run[2][2];
#pragma unroll
  for (int j = 0; j < 2; ++j) m_run[j][0] = m_run[j][1] = -INFINITY, l_run[j][0] = l_run[j][1] = 0.0f;
  float sig[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // fp8: O rows of tile q are in units of sig[q]

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int pt0 = 2 * tile, pt1 = 2 * tile + 1;
    const int st0 = pt0 % S, st1 = pt1 % S;
    ptx::mbar_wait(mlakv::cuda::ptx::smem_addr(&full[st0]), (pt0 / S) & 1);
    ptx::mbar_wait(mlakv::cuda::ptx::smem_addr(&full[st1]), (pt1 / S) & 1);
    const uint8_t* stage0 = ring + st0 * kT * kRec;
    const uint8_t* stage1 = ring + st1 * kT * kRec;
    // ---- scores of this warp's 16 tokens ----
    const uint8_t* mystage = (w >> 1) ? stage1 : stage0;
    const int tl = 16 * (w & 1) + g;  // token of row g inside its stage
    const uint8_t* rg = mystage + tl * kRec;
    const uint8_t* rg8 = rg + 8 * kRec;
    // fp8: quarter q accumulates into acc[q & 1] and is folded into sf (times the
    // tokens' tile scale q) once its chunks are done, so two accumulators suffice.
    using P = record::Parts<F>;
    float ts[4][2];  // fp8: tile scales of tokens g (h = 0), g + 8 (h = 1)
    if constexpr (kFp8) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 t4 = *reinterpret_cast<const float4*>((h ? rg8 : rg) + P::kScaleOffset);
        ts[0][h] = t4.x;
        ts[1][h] = t4.y;
        ts[2][h] = t4.z;
        ts[3][h] = t4.w;
      }
    }
    float acc[2][8], accr[8], sf[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) sf[i] = 0.0f;
    auto fold = [&](int q) {
#pragma unroll
      for (int i = 0; i < 8; ++i) sf[i] = fmaf(acc[q & 1][i], ts[q][(i >> 1) & 1], sf[i]);
    };
    uint32_t smask = 0;            // kVt: the stage's validity mask, read before the release
    float srs[2] = {1.0f, 1.0f};   // kVt, 8-bit rope: the rope scales of tokens g, g + 8
    if constexpr (kVt) {
      // e2m1: each element converted once, into the V tile (16-B stores, conflict-free);
      // after one warpgroup barrier the scores read it as K-major A (the same bytes P V
      // reads M-major): 32 latent wgmma with nothing to wait for in between, the rope
      // (4 k-steps) from registers. The stages go back before the wgmmas.
#pragma unroll
      for (int kc = 0; kc < 8; ++kc) {
        uint32_t a[4][4];
        wg_k_chunk<F>(rg, rg8, kc, c, a);
        uint8_t* v0 = vt_mine + 8 * kc * kVtGroupStride;
        ptx::sts128(v0, a[0][0], a[1][0], a[2][0], a[3][0]);
        ptx::sts128(v0 + kVtGroupStride, a[0][2], a[1][2], a[2][2], a[3][2]);
        ptx::sts128(v0 + 128, a[0][1], a[1][1], a[2][1], a[3][1]);
        ptx::sts128(v0 + 128 + kVtGroupStride, a[0][3], a[1][3], a[2][3], a[3][3]);
      }
      uint32_t ar[4][4];
      wg_rope<F>(rg, rg8, c, ar);
      smask = vmask[(w >> 1) ? st1 : st0];
      if constexpr (f16_rope(F)) {
        srs[0] = ldsf(rg + P::kRopeScaleOffset);
        srs[1] = ldsf(rg8 + P::kRopeScaleOffset);
      }
      __syncwarp();
      if (lane == 0) {  // done with both stages
        ptx::mbar_arrive(mlakv::cuda::ptx::smem_addr(&empty[st0]));
        ptx::mbar_arrive(mlakv::cuda::ptx::smem_addr(&empty[st1]));
      }
      ptx::fence_proxy_async();
      ptx::named_barrier(kConsumerBarrier, kConsumerThreads);
      ptx::wg_fence();
#pragma unroll
      for (int ks = 0; ks < 32; ++ks) {
        ptx::wgmma_f16_ss<0>(acc[0], k_lo + (2 * ks * kVtGroupStride) / 16, k_hi, q_lo + 32 * ks, b_hi, ks == 0 ? 0 : 1);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t d = q_lo + 32 * (32 + j);
        if constexpr (f16_rope(F)) ptx::wgmma_f16(accr, ar[j], d, b_hi, j == 0 ? 0 : 1);
        else ptx::wgmma_bf16(accr, ar[j], d, b_hi, j == 0 ? 0 : 1);
      }
    } else {
#pragma unroll
      for (int kc = 0; kc < 8; ++kc) {
        uint32_t a[4][4];
        wg_k_chunk<F>(rg, rg8, kc, c, a);
        ptx::wg_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int qa = kFp8 ? ((kc >> 1) & 1) : 0;
          const int first = kFp8 ? ((kc & 1) == 0 && j == 0) : (kc == 0 && j == 0);
          ptx::wgmma_f16(acc[qa], a[j], q_lo + 32 * (4 * kc + j), b_hi, first ? 0 : 1);
        }
        // At most two chunks in flight: the A registers of chunk kc - 1 are free again.
        ptx::wg_commit();
        ptx::wg_wait<1>();
        if constexpr (kFp8) {
          if (kc >= 2 && (kc & 1) == 0) {  // chunks of quarter kc/2 - 1 are done
            ptx::wg_hold(acc[((kc >> 1) - 1) & 1]);
            fold((kc >> 1) - 1);
          }
        }
      }
      {
        uint32_t a[4][4];
        wg_rope<F>(rg, rg8, c, a);
        ptx::wg_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t d = q_lo + 32 * (32 + j);
          if constexpr (f16_rope(F)) ptx::wgmma_f16(accr, a[j], d, b_hi, j == 0 ? 0 : 1);
          else ptx::wgmma_bf16(accr, a[j], d, b_hi, j == 0 ? 0 : 1);
        }
      }
    }
    ptx::wg_commit();
    ptx::wg_wait<0>();
    ptx::wg_hold(acc[0]);
    ptx::wg_hold(acc[1]);
    ptx::wg_hold(accr);
    if constexpr (kFp8) fold(3);

    // ---- scores -> masked, scaled (log2 domain) ----
    float s[8];
    const uint32_t mask = kVt ? smask : vmask[(w >> 1) ? st1 : st0];
    const int64_t tb = begin + static_cast<int64_t>(tile) * kWgTile + 16 * w + g;  // position of token g
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int j = i >> 2, h = (i >> 1) & 1, e = i & 1;
      float x;
      if constexpr (kFp8) {
        x = sf[i] + accr[i];
      } else if constexpr (F == KvFormat::kNvfp4DsMla) {
        x = acc[0][i] + accr[i];
      } else if constexpr (kVt) {
        x = fmaf(accr[i], srs[h], acc[0][i]);
      } else {
        x = fmaf(accr[i], ldsf((h ? rg8 : rg) + P::kRopeScaleOffset), acc[0][i]);
      }
      const bool ok = ((mask >> (tl + 8 * h)) & 1u) && tb + 8 * h < vis[j][e];
      s[i] = ok ? x * rsc[j][e] : -INFINITY;
    }
    if constexpr (kVt) {
      // Lazy rescale (e2m1 formats): P against the running maxima m_run, identical in every
      // warp, unless a score exceeds its row's by more than kLazyLog2 (P <= 2^8 in f16);
      // the P^T barrier ORs that test, so the common tile has one barrier and no exchange.
      bool need = false;
#pragma unroll
      for (int i = 0; i < 8; ++i) need = need || s[i] > m_run[i >> 2][i & 1] + kLazyLog2;
      float pv[8];
      auto put_p = [&]() {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float m = m_run[i >> 2][i & 1];
          pv[i] = m == -INFINITY ? 0.0f : exp2f(s[i] - m);
        }
        ptx::stmatrix_x4_trans(pt_addr + 512 * w + 16 * lane, ptx::pack_f16x2(pv[0], pv[1]),
                               ptx::pack_f16x2(pv[2], pv[3]), ptx::pack_f16x2(pv[4], pv[5]),
                               ptx::pack_f16x2(pv[6], pv[7]));
        ptx::fence_proxy_async();
      };
      put_p();
      if (ptx::named_barrier_or(kLazyBarrier, kConsumerThreads, need)) {  // the whole warpgroup
        float alpha[2][2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float v = fmaxf(s[4 * j + e], s[4 * j + 2 + e]);
            v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 4));
            v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 8));
            v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 16));
            if (g == 0) red[w * kRows + 8 * j + 2 * c + e] = v;
          }
        }
        ptx::named_barrier(kConsumerBarrier, kConsumerThreads);
        bool change = false;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int r = 8 * j + 2 * c + e;
            const float mt = fmaxf(fmaxf(red[r], red[kRows + r]), fmaxf(red[2 * kRows + r], red[3 * kRows + r]));
            const float m_new = fmaxf(m_run[j][e], mt);
            alpha[j][e] = m_run[j][e] == -INFINITY ? 0.0f : exp2f(m_run[j][e] - m_new);
            m_run[j][e] = m_new;
            l_run[j][e] *= alpha[j][e];
            change = change || alpha[j][e] != 1.0f;
          }
        }
        if (__any_sync(0xFFFFFFFFu, change)) {
#pragma unroll
          for (int mb = 0; mb < 8; ++mb) {
#pragma unroll
            for (int i = 0; i < 8; ++i) o[mb][i] *= alpha[i >> 2][i & 1];
          }
        }
        put_p();  // every warp has passed the OR barrier: nothing reads the old P^T
        ptx::named_barrier(kConsumerBarrier, kConsumerThreads);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) l_run[j][e] += pv[4 * j + e] + pv[4 * j + 2 + e];
      }
    } else {
      // ---- row maxima over the 64 tokens: shuffles over g, then across the warps ----
      float mx[2][2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float v = fmaxf(s[4 * j + e], s[4 * j + 2 + e]);
          v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 4));
          v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 8));
          v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 16));
          mx[j][e] = v;
        }
      }
      float tsm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if constexpr (kFp8) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          float v = fmaxf(ts[q][0], ts[q][1]);
          v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 4));
          v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 8));
          v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 16));
          tsm[q] = v;
        }
      }
      if (g == 0) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) red[w * kRows + 8 * j + 2 * c + e] = mx[j][e];
        }
        if (kFp8 && c == 0) {
#pragma unroll
          for (int q = 0; q < 4; ++q) red[kConsumerWarps * kRows + 4 * w + q] = tsm[q];
        }
      }
      ptx::named_barrier(kConsumerBarrier, kConsumerThreads);
      float alpha[2][2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = 8 * j + 2 * c + e;
          const float mt = fmaxf(fmaxf(red[r], red[kRows + r]), fmaxf(red[2 * kRows + r], red[3 * kRows + r]));
          const float m_new = fmaxf(m_run[j][e], mt);
          alpha[j][e] = m_run[j][e] == -INFINITY ? 0.0f : exp2f(m_run[j][e] - m_new);
          m_run[j][e] = m_new;
        }
      }
      float ratio[4] = {1.0f, 1.0f, 1.0f, 1.0f}, inv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if constexpr (kFp8) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float* rs = red + kConsumerWarps * kRows + q;
          const float sm = fmaxf(fmaxf(rs[0], rs[4]), fmaxf(rs[8], rs[12]));
          if (sm > sig[q]) {
            ratio[q] = sig[q] / sm;
            sig[q] = sm;
          }
          inv[q] = sig[q] > 0.0f ? 1.0f / sig[q] : 0.0f;
        }
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int j = i >> 2, e = i & 1;
        const float pv = m_run[j][e] == -INFINITY ? 0.0f : exp2f(s[i] - m_run[j][e]);
        s[i] = pv;
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) l_run[j][e] = l_run[j][e] * alpha[j][e] + s[4 * j + e] + s[4 * j + 2 + e];
      }
      // ---- O rescale (skipped when no factor changes) ----
      bool change = alpha[0][0] != 1.0f || alpha[0][1] != 1.0f || alpha[1][0] != 1.0f || alpha[1][1] != 1.0f;
      if constexpr (kFp8) change = change || ratio[0] != 1.0f || ratio[1] != 1.0f || ratio[2] != 1.0f || ratio[3] != 1.0f;
      if (__any_sync(0xFFFFFFFFu, change)) {
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) {
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const float f = alpha[i >> 2][i & 1] * (kFp8 ? ratio[mb >> 1] : 1.0f);
            o[mb][i] *= f;
          }
        }
      }
      // ---- P^T (f16) by stmatrix.trans: warp w's 16 tokens are P V k-step w ----
#pragma unroll
      for (int q = 0; q < kCopies; ++q) {
        float f0 = 1.0f, f1 = 1.0f;
        if constexpr (kFp8) {
          f0 = ts[q][0] * inv[q];
          f1 = ts[q][1] * inv[q];
        }
        const uint32_t r0 = ptx::pack_f16x2(s[0] * f0, s[1] * f0), r1 = ptx::pack_f16x2(s[2] * f1, s[3] * f1);
        const uint32_t r2 = ptx::pack_f16x2(s[4] * f0, s[5] * f0), r3 = ptx::pack_f16x2(s[6] * f1, s[7] * f1);
        ptx::stmatrix_x4_trans(pt_addr + q * kPtBytes + 512 * w + 16 * lane, r0, r1, r2, r3);
      }
      ptx::fence_proxy_async();
      ptx::named_barrier(kConsumerBarrier, kConsumerThreads);
    }

    // ---- O^T += V^T P^T ----
    if constexpr (kVt) {
      // 32 wgmma with both operands in shared memory: nothing to convert, all in flight.
      ptx::wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) {
          ptx::wgmma_f16_ss<1>(o[mb], v_lo + (8 * mb * kVtGroupStride + 256 * kk) / 16, v_hi, p_lo + 32 * kk, b_hi, 1);
        }
      }
      ptx::wg_commit();
      ptx::wg_wait<0>();
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) ptx::wg_hold(o[mb]);
    } else {
      // (8 groups of 4 m-blocks, at most two in flight)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint8_t* base = ((kk >> 1) ? stage1 : stage0) + (16 * (kk & 1) + 2 * c) * kRec;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          uint32_t a[4][4];
          wg_v_frags<F>(base, base + kRec, base + 8 * kRec, base + 9 * kRec, wg_g, half, a);
          ptx::wg_fence();
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            const int mb = 4 * half + m;
            const int q = kFp8 ? (mb >> 1) : 0;
            ptx::wgmma_f16(o[mb], a[m], p_lo + (q * kPtBytes + 512 * kk) / 16, b_hi, 1);
          }
          ptx::wg_commit();
          if (kk < 3 || half == 0) ptx::wg_wait<1>();
        }
      }
      // Both stages are no longer read by this warp's loads (the wgmmas read only P^T).
      __syncwarp();
      if (lane == 0) {
        ptx::mbar_arrive(mlakv::cuda::ptx::smem_addr(&empty[st0]));
        ptx::mbar_arrive(mlakv::cuda::ptx::smem_addr(&empty[st1]));
      }
      ptx::wg_wait<0>();
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) ptx::wg_hold(o[mb]);
    }
  }

  // ---- finalize: l over the 64 token lanes of each row, then out / lse ----
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v = l_run[j][e];
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 4);
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 8);
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 16);
      l_run[j][e] = v;
    }
  }
  ptx::named_barrier(kConsumerBarrier, kConsumerThreads);  // every warp is done reading red
  if (g == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) red[w * kRows + 8 * j + 2 * c + e] = l_run[j][e];
    }
  }
  ptx::named_barrier(kConsumerBarrier, kConsumerThreads);
  const float post_nv = is_nvfp4(F) ? p.outer_scale * 128.0f : 1.0f;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = 8 * j + 2 * c + e;
      if (row0 + r >= rows_req) continue;
      const float l = red[r] + red[kRows + r] + red[2 * kRows + r] + red[3 * kRows + r];
      const bool is_empty = l == 0.0f;
      const float inv_l = is_empty ? 0.0f : 1.0f / l;
      const float lse = is_empty ? -INFINITY : (m_run[j][e] + log2f(l)) * kLn2;
      const int i = row_query(r), h = row_head(r);
      float* dst = result_row(p, b, split, i, h, lse, w == 0 && g == 0);
      if constexpr (kFp8) {  // o[mb][4j + 2h + e]: dims as in wg_v_frags (runs of 4 floats)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float sc = inv_l * sig[q];
          *reinterpret_cast<float4*>(dst + 128 * q + 4 * wg_g) =
              make_float4(o[2 * q][4 * j + e] * sc, o[2 * q][4 * j + 2 + e] * sc, o[2 * q + 1][4 * j + e] * sc,
                          o[2 * q + 1][4 * j + 2 + e] * sc);
        }
      } else if constexpr (kVt) {
        // o[mb][4j + 2h + e]: O^T row 16w + g + 8h of m-block mb = V tile group 8mb + 2w + h, half g.
        const float sc = inv_l * post_nv;
        float* d0 = dst + 16 * w + vt_dim(g);
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) {
          d0[64 * mb] = o[mb][4 * j + e] * sc;
          d0[64 * mb + 8] = o[mb][4 * j + 2 + e] * sc;
        }
      } else {  // e2m1 on v8 (sparse nvfp4_ds_mla): dims as in wg_v_frags, 16 (8w + g) + 2 mb + h
        const float sc = inv_l * post_nv;
#pragma unroll
        for (int mq = 0; mq < 4; ++mq) {
          *reinterpret_cast<float4*>(dst + 16 * wg_g + 4 * mq) =
              make_float4(o[2 * mq][4 * j + e] * sc, o[2 * mq][4 * j + 2 + e] * sc, o[2 * mq + 1][4 * j + e] * sc,
                          o[2 * mq + 1][4 * j + 2 + e] * sc);
        }
      }
    }
  }
#endif  // MLAKV_SM90_DEVICE
}

// v10, the sparse sets of the 368-B e2m1 formats (wg2; routing: wg_kernel below): two
// consumer warpgroups per CTA share one V tile, so that 4 consumer warps sit on each
// scheduler (two 288-thread CTAs per SM, 96 registers) instead of v9's 2. Warpgroup u
// owns latent dims [256u, 256u + 256) = V tile chunks 4u..4u+3 = score k-steps
// 16u..16u+15 = P V m-blocks 4u..4u+3 end to end (warpgroup barriers only), plus rope
// k-steps 32 + 2u, + 1. The two partial S^T tiles meet in shared memory (4 KB):
// warpgroup u finalizes the scores of query rows 8u..8u+7 (its thread's elements
// 4u..4u+3) and writes their P^T; the lazy softmax's OR barrier is both warpgroups' P^T
// barrier, so the common tile has one 128-thread and two 256-thread barriers. The tensor
// cores see v9's exact f16 operands (a score's f32 sum is taken as two partials). Dense
// sets stay on v9 (v10 measured 3-6% slower there and 4-25% faster on the sparse TP
// shapes: docs/perf.md, "occ"); nvfp4_ds_mla (432 B) has no v10: its 2 stages leave no
// room for the exchange at two CTAs per SM.
constexpr int kWg2Consumers = 2 * kConsumerThreads;  // 256
constexpr int kWg2Threads = kWg2Consumers + 32;      // + the producer warp
constexpr int kWg2XBytes = 2 * kConsumerThreads * 4 * 4;  // partial scores: [receiver][128 threads][4]
[[maybe_unused]] constexpr int kWg2Barrier = 3;      // both consumer warpgroups
[[maybe_unused]] constexpr int kWg2LazyBarrier = 4;  // both, the lazy rescale's OR (= the P^T barrier)
[[maybe_unused]] constexpr int kWg2HalfBarrier = 5;  // + u: warpgroup u alone
template <KvFormat F>
constexpr int wg2_fixed_bytes() {
  return kQtBytes + kPtBytes + kVtBytes + kWg2XBytes + kWgRedBytes + ((kWgMiscBytes + 127) & ~127);
}
template <KvFormat F>
constexpr int wg2_stages() {
  const int n = (kWgSmemBudget - wg2_fixed_bytes<F>()) / (kT * Fmt<F>::kRecord);
  return n < kMaxStages ? n : kMaxStages;
}
template <KvFormat F>
constexpr std::size_t wg2_smem_bytes() {
  return static_cast<std::size_t>(wg2_stages<F>()) * kT * Fmt<F>::kRecord + wg2_fixed_bytes<F>();
}
// The formats that run v10: the e2m1 ones whose 2 stages fit beside the exchange.
template <KvFormat F>
constexpr bool wg2() {
  return wg_vtile<F>() && wg2_stages<F>() >= 2;
}
static_assert(wg2_stages<KvFormat::kNvfp4DsMlaFp8Rope>() >= 2 && wg2_stages<KvFormat::kNvfp4DsMlaInt8Rope>() >= 2);

template <KvFormat F>
__global__ void __launch_bounds__(kWg2Threads, 2) attention_wg2_kernel(const __grid_constant__ AttentionParams p) {
#if MLAKV_SM90_DEVICE
  constexpr int S = wg2_stages<F>();
  static_assert(S >= 2 && wg_vtile<F>() && f16_rope(F));
  constexpr int kRec = Fmt<F>::kRecord;
  using P = record::Parts<F>;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* ring = smem;
  uint8_t* qt = smem + static_cast<std::size_t>(S) * kT * kRec;
  uint8_t* pt = qt + kQtBytes;
  uint8_t* vt = pt + kPtBytes;
  float* xs = reinterpret_cast<float*>(vt + kVtBytes);  // [receiver u][128 threads][4 partial scores]
  float* red = xs + kWg2XBytes / 4;                     // [4 warps][16 rows]
  uint8_t* misc = reinterpret_cast<uint8_t*>(red) + kWgRedBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(misc);
  uint64_t* empty = full + kMaxStages;
  uint32_t* vmask = reinterpret_cast<uint32_t*>(empty + kMaxStages);
  int32_t* row_vis = reinterpret_cast<int32_t*>(vmask + kMaxStages);
  float* row_sc = reinterpret_cast<float*>(row_vis + kRows);
  ptx::launch_dependents();  // smxx's combine may launch now (it waits for this grid's results)

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int split = blockIdx.z;
  const CtaWork cw = cta_work<kRows, kWgTile, kWgTile>(p);  // cuda/common/cta_work.cuh
  const int b = cw.b, i_fixed = cw.i_fixed, rows_req = cw.rows_req, row0 = cw.row0;
  const int64_t begin = cw.begin, end = cw.end;
  const int n_tiles = cw.n_tiles;
  auto row_query = [&](int r) { return cw.query(p, r); };
  auto row_head = [&](int r) { return cw.head(p, r); };

  init_ring<S, kRows>(p, cw, full, empty, 2 * kConsumerWarps, row_vis, tid);

  if (warp == 2 * kConsumerWarps) {
    produce<F, S, kRec>(p, b, i_fixed, begin, end, 2 * n_tiles, ring, full, empty, vmask, lane);
    return;
  }

  // ================= consumers: two warpgroups =================
  const int u = warp >> 2, w = warp & 3, g = lane >> 2, c = lane & 3, wt = tid & (kConsumerThreads - 1);
  if (u == 0) wg_store_qt<F, true>(p, cw, tid, qt, row_sc);  // ---- Q^T into shared memory (warpgroup 0) ----
  ptx::named_barrier(kWg2Barrier, kWg2Consumers);

  // The thread's 4 query rows: 8j + 2c + e (accumulator column of d[4j + 2h + e]); it
  // finalizes the scores of j = u (elements 4u .. 4u + 3).
  float rsc[2], m_run[2][2], l_run[2];
  int vis[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    rsc[e] = row_sc[8 * u + 2 * c + e];
    vis[e] = row_vis[8 * u + 2 * c + e];
    m_run[0][e] = m_run[1][e] = -INFINITY;
    l_run[e] = 0.0f;
  }
  const uint32_t pt_addr = mlakv::cuda::ptx::smem_addr(pt);
  const uint32_t q_lo = ptx::desc_lo(mlakv::cuda::ptx::smem_addr(qt), 128), p_lo = ptx::desc_lo(pt_addr, 128);
  const uint32_t b_hi = ptx::desc_hi(256);
  // V tile views as in v9; this warpgroup's chunks start at group 32u.
  uint8_t* vt_mine = vt + 2 * w * 128 + 16 * g + (2 * c + 32 * u) * kVtGroupStride;
  const uint32_t v_lo = ptx::desc_lo(mlakv::cuda::ptx::smem_addr(vt), 128) + (32 * u * kVtGroupStride) / 16;
  const uint32_t v_hi = ptx::desc_hi(kVtGroupStride);
  const uint32_t k_lo = ptx::desc_lo(mlakv::cuda::ptx::smem_addr(vt), kVtGroupStride) + (32 * u * kVtGroupStride) / 16;
  const uint32_t k_hi = ptx::desc_hi(128);
  const uint32_t qh_lo = q_lo + 32 * 16 * u;  // Q^T k-steps 16u ..
  float4* x_out = reinterpret_cast<float4*>(xs + (1 - u) * 4 * kConsumerThreads) + wt;
  const float4* x_in = reinterpret_cast<const float4*>(xs + u * 4 * kConsumerThreads) + wt;

  float o[4][8];  // O^T m-blocks 4u .. 4u + 3
#pragma unroll
  for (int mb = 0; mb < 4; ++mb) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[mb][i] = 0.0f;
  }

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int pt0 = 2 * tile, pt1 = 2 * tile + 1;
    const int st0 = pt0 % S, st1 = pt1 % S;
    ptx::mbar_wait(mlakv::cuda::ptx::smem_addr(&full[st0]), (pt0 / S) & 1);
    ptx::mbar_wait(mlakv::cuda::ptx::smem_addr(&full[st1]), (pt1 / S) & 1);
    const uint8_t* mystage = ring + ((w >> 1) ? st1 : st0) * kT * kRec;
    const int tl = 16 * (w & 1) + g;  // token of row g inside its stage
    const uint8_t* rg = mystage + tl * kRec;
    const uint8_t* rg8 = rg + 8 * kRec;
    // ---- this warpgroup's half of the V tile (4 chunks of 64 dims) ----
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t a[4][4];
      wg_k_chunk<F>(rg, rg8, 4 * u + q, c, a);
      uint8_t* v0 = vt_mine + 8 * q * kVtGroupStride;
      ptx::sts128(v0, a[0][0], a[1][0], a[2][0], a[3][0]);
      ptx::sts128(v0 + kVtGroupStride, a[0][2], a[1][2], a[2][2], a[3][2]);
      ptx::sts128(v0 + 128, a[0][1], a[1][1], a[2][1], a[3][1]);
      ptx::sts128(v0 + 128 + kVtGroupStride, a[0][3], a[1][3], a[2][3], a[3][3]);
    }
    // rope k-steps 32 + 2u, + 1 (the same wgmma sequence in both warpgroups: a branch
    // around wgmma makes ptxas serialize them, C7520)
    uint32_t ar[2][4];
    {
      uint32_t a4[4][4];
      wg_rope<F>(rg, rg8, c, a4);
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
        for (int r = 0; r < 4; ++r) ar[jj][r] = u ? a4[2 + jj][r] : a4[jj][r];
      }
    }
    const float srs[2] = {ldsf(rg + P::kRopeScaleOffset), ldsf(rg8 + P::kRopeScaleOffset)};
    const uint32_t smask = vmask[(w >> 1) ? st1 : st0];
    __syncwarp();
    if (lane == 0) {  // done with both stages
      ptx::mbar_arrive(mlakv::cuda::ptx::smem_addr(&empty[st0]));
      ptx::mbar_arrive(mlakv::cuda::ptx::smem_addr(&empty[st1]));
    }
    ptx::fence_proxy_async();
    ptx::named_barrier(kWg2HalfBarrier + u, kConsumerThreads);
    // ---- partial S^T over this warpgroup's 16 latent k-steps (+ the rope) ----
    float acc[8], accr[8];
    ptx::wg_fence();
#pragma unroll
    for (int q = 0; q < 16; ++q) {
      ptx::wgmma_f16_ss<0>(acc, k_lo + (2 * q * kVtGroupStride) / 16, k_hi, qh_lo + 32 * q, b_hi, q == 0 ? 0 : 1);
    }
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) ptx::wgmma_f16(accr, ar[jj], q_lo + 32 * (32 + 2 * u + jj), b_hi, jj == 0 ? 0 : 1);
    ptx::wg_commit();
    ptx::wg_wait<0>();
    ptx::wg_hold(acc);
    ptx::wg_hold(accr);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = fmaf(accr[i], srs[(i >> 1) & 1], acc[i]);
    // ---- exchange: send the partner's rows, add its partial of ours ----
    *x_out = u ? make_float4(acc[0], acc[1], acc[2], acc[3]) : make_float4(acc[4], acc[5], acc[6], acc[7]);
    ptx::named_barrier(kWg2Barrier, kWg2Consumers);
    const float4 xin = *x_in;
    const float xv[4] = {xin.x, xin.y, xin.z, xin.w};
    const int64_t tb = begin + static_cast<int64_t>(tile) * kWgTile + 16 * w + g;  // position of token g
    float s[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int h = k >> 1, e = k & 1;
      const float mine = u ? acc[4 + k] : acc[k];
      const float x = mine + xv[k];  // the partner's partial: one sum, done by one warpgroup
      const bool ok = ((smask >> (tl + 8 * h)) & 1u) && tb + 8 * h < vis[e];
      s[k] = ok ? x * rsc[e] : -INFINITY;
    }
    // ---- lazy softmax (v9's rule) over this warpgroup's rows ----
    bool need = false;
#pragma unroll
    for (int k = 0; k < 4; ++k) need = need || s[k] > m_run[u][k & 1] + kLazyLog2;
    float pv[4];
    auto put_p = [&]() {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float m = m_run[u][k & 1];
        pv[k] = m == -INFINITY ? 0.0f : exp2f(s[k] - m);
      }
      ptx::stmatrix_x2_trans(pt_addr + 512 * w + 256 * u + 16 * (lane & 15), ptx::pack_f16x2(pv[0], pv[1]),
                             ptx::pack_f16x2(pv[2], pv[3]));
      ptx::fence_proxy_async();
    };
    put_p();
    if (ptx::named_barrier_or(kWg2LazyBarrier, kWg2Consumers, need)) {  // both warpgroups
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = fmaxf(s[e], s[2 + e]);
        v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 4));
        v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 8));
        v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 16));
        if (g == 0) red[w * kRows + 8 * u + 2 * c + e] = v;
      }
      ptx::named_barrier(kWg2Barrier, kWg2Consumers);
      float alpha[2][2];
      bool change = false;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = 8 * j + 2 * c + e;
          const float mt = fmaxf(fmaxf(red[r], red[kRows + r]), fmaxf(red[2 * kRows + r], red[3 * kRows + r]));
          const float m_new = fmaxf(m_run[j][e], mt);
          alpha[j][e] = m_run[j][e] == -INFINITY ? 0.0f : exp2f(m_run[j][e] - m_new);
          m_run[j][e] = m_new;
          change = change || alpha[j][e] != 1.0f;
        }
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) l_run[e] *= alpha[u][e];
      if (__any_sync(0xFFFFFFFFu, change)) {
#pragma unroll
        for (int mb = 0; mb < 4; ++mb) {
#pragma unroll
          for (int i = 0; i < 8; ++i) o[mb][i] *= alpha[i >> 2][i & 1];
        }
      }
      put_p();  // every warp has passed the OR barrier: nothing reads the old P^T
      ptx::named_barrier(kWg2Barrier, kWg2Consumers);
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) l_run[e] += pv[e] + pv[2 + e];

    // ---- O^T += V^T P^T over this warpgroup's 4 m-blocks: 16 wgmma, both operands in smem ----
    ptx::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int mb = 0; mb < 4; ++mb) {
        ptx::wgmma_f16_ss<1>(o[mb], v_lo + (8 * mb * kVtGroupStride + 256 * kk) / 16, v_hi, p_lo + 32 * kk, b_hi, 1);
      }
    }
    ptx::wg_commit();
    ptx::wg_wait<0>();
#pragma unroll
    for (int mb = 0; mb < 4; ++mb) ptx::wg_hold(o[mb]);
  }

  // ---- finalize: l over the 64 token lanes of each row, then out / lse ----
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    float v = l_run[e];
    v += __shfl_xor_sync(0xFFFFFFFFu, v, 4);
    v += __shfl_xor_sync(0xFFFFFFFFu, v, 8);
    v += __shfl_xor_sync(0xFFFFFFFFu, v, 16);
    l_run[e] = v;
  }
  ptx::named_barrier(kWg2Barrier, kWg2Consumers);  // every warp is done reading red
  if (g == 0) {
#pragma unroll
    for (int e = 0; e < 2; ++e) red[w * kRows + 8 * u + 2 * c + e] = l_run[e];
  }
  ptx::named_barrier(kWg2Barrier, kWg2Consumers);
  const float post_nv = p.outer_scale * 128.0f;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = 8 * j + 2 * c + e;
      if (row0 + r >= rows_req) continue;
      const float l = red[r] + red[kRows + r] + red[2 * kRows + r] + red[3 * kRows + r];
      const bool is_empty = l == 0.0f;
      const float inv_l = is_empty ? 0.0f : 1.0f / l;
      const float lse = is_empty ? -INFINITY : (m_run[j][e] + log2f(l)) * kLn2;
      const int i = row_query(r), h = row_head(r);
      const bool lse_writer = u == 0 && w == 0 && g == 0;
      float* dst = result_row(p, b, split, i, h, lse, lse_writer);
      // o[mb][4j + 2h + e]: O^T row 16w + g + 8h of m-block 4u + mb = V tile group
      // 8 (4u + mb) + 2w + h, half g (as v9).
      const float sc = inv_l * post_nv;
      float* d0 = dst + 256 * u + 16 * w + vt_dim(g);
#pragma unroll
      for (int mb = 0; mb < 4; ++mb) {
        d0[64 * mb] = o[mb][4 * j + e] * sc;
        d0[64 * mb + 8] = o[mb][4 * j + 2 + e] * sc;
      }
    }
  }
#endif  // MLAKV_SM90_DEVICE
}

// Which warpgroup kernel a quantized format runs (docs/perf.md, "occ"): fp8 v8; the e2m1
// formats v9 for dense sets; for sparse sets (scattered per-record copies, whose latency
// v9's 2-stage ring exposes) the 368-B formats v10 and nvfp4_ds_mla v8's register path
// (6 stages; v10's exchange does not fit beside its 2).
enum class WgKernel { kV8, kV9, kV10 };
template <KvFormat F>
constexpr WgKernel wg_kernel(bool sparse) {
  if constexpr (!wg_vtile<F>()) return WgKernel::kV8;
  else if (!sparse) return WgKernel::kV9;
  else if constexpr (wg2<F>()) return WgKernel::kV10;
  else return WgKernel::kV8;
}

template <KvFormat F>
int configure_format() {
  auto raise = [](const void* fn, std::size_t bytes) {
    return static_cast<int>(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  };
  if constexpr (F == KvFormat::kBf16) {
    return raise(reinterpret_cast<const void*>(attention_sm90_kernel<F>), smem_bytes<F>());
  } else {
    int e = raise(reinterpret_cast<const void*>(attention_wg_kernel<F>), wg_smem_bytes<F>());
    if constexpr (wg_vtile<F>() && !wg2<F>()) {
      if (e == 0) e = raise(reinterpret_cast<const void*>(attention_wg_kernel<F, false>), wg_smem_bytes<F, false>());
    }
    if constexpr (wg2<F>()) {
      if (e == 0) e = raise(reinterpret_cast<const void*>(attention_wg2_kernel<F>), wg2_smem_bytes<F>());
    }
    return e;
  }
}

// CTAs per SM: the fewest over the kernels the format may run (all 2 on the H200).
template <KvFormat F>
int occupancy_format() {
  if (configure_format<F>() != 0) return 0;
  auto occ = [](const void* fn, int threads, std::size_t bytes) {
    int n = 0;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, threads, bytes) == cudaSuccess ? n : 0;
  };
  if constexpr (F == KvFormat::kBf16) {
    return occ(reinterpret_cast<const void*>(attention_sm90_kernel<F>), kThreads, smem_bytes<F>());
  } else {
    int n = occ(reinterpret_cast<const void*>(attention_wg_kernel<F>), kThreads, wg_smem_bytes<F>());
    if constexpr (wg_vtile<F>() && !wg2<F>()) {
      n = std::min(n, occ(reinterpret_cast<const void*>(attention_wg_kernel<F, false>), kThreads, wg_smem_bytes<F, false>()));
    }
    if constexpr (wg2<F>()) {
      n = std::min(n, occ(reinterpret_cast<const void*>(attention_wg2_kernel<F>), kWg2Threads, wg2_smem_bytes<F>()));
    }
    return n;
  }
}

template <KvFormat F>
cudaError_t launch_format(const AttentionParams& kp, dim3 grid, cudaStream_t s) {
  if constexpr (F == KvFormat::kBf16) {
    attention_sm90_kernel<F><<<grid, kThreads, smem_bytes<F>(), s>>>(kp);
  } else {
    const WgKernel k = wg_kernel<F>(kp.sparse);
    if (k == WgKernel::kV9) {
      attention_wg_kernel<F><<<grid, kThreads, wg_smem_bytes<F>(), s>>>(kp);
    } else if (k == WgKernel::kV10) {
      if constexpr (wg2<F>()) attention_wg2_kernel<F><<<grid, kWg2Threads, wg2_smem_bytes<F>(), s>>>(kp);
    } else if constexpr (!wg2<F>()) {
      attention_wg_kernel<F, false><<<grid, kThreads, wg_smem_bytes<F, false>(), s>>>(kp);
    }
  }
  return cudaGetLastError();
}

}  // namespace

template <KvFormat F>
int configure(int /*record_bytes*/) {
  return configure_format<F>();
}

template <KvFormat F>
int ctas_per_sm(int /*record_bytes*/) {
  return occupancy_format<F>();
}

template <KvFormat F>
int launch(const kernels::AttentionParams& kp, int row_blocks, void* stream) {
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(kp.sparse ? kp.B * kp.s_q : kp.B),
                  static_cast<unsigned>(kp.num_splits));
  return static_cast<int>(launch_format<F>(kp, grid, static_cast<cudaStream_t>(stream)));
}

template <KvFormat F>
int binary_version() {
  cudaFuncAttributes attr{};
  cudaError_t e;
  if constexpr (F == KvFormat::kBf16) e = cudaFuncGetAttributes(&attr, attention_sm90_kernel<F>);
  else e = cudaFuncGetAttributes(&attr, attention_wg_kernel<F>);  // (its sparse variants are in the same cubin)
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return attr.binaryVersion;
}

}  // namespace mlakv::cuda::sm90
