// What one attention CTA works on, from its grid position (every attention path launches
// the grid of params/attention.h: x = block of kRowsPerCta query rows, y = request b, or
// b * s_q + query when sparse, z = KV split): the request's rows, the split's token range
// and the tiles covering it. One definition for the sm80 and sm90 kernels, so the split
// chunks agree with the host's split policy (suggest_num_splits rounds to the same
// granule: AttentionKernels::split_granule).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/params/attention.h"
#include "mlakv/formats.h"

namespace mlakv::cuda {

struct CtaWork {
  int b = 0, i_fixed = 0;  // request, and the query of a sparse CTA
  int rows_req = 0;        // rows of the request (dense: s_q * H) or of the query (sparse: H)
  int row0 = 0;            // the CTA's first row
  int32_t seqlen = 0;      // dense: the request's length, clamped to what its block table covers
  int64_t begin = 0, end = 0;  // the split's tokens
  int n_tiles = 0;             // tiles of kTile tokens over [begin, end)

  // CTA row r -> (query i, head h); rows past the request are inert.
  __device__ __forceinline__ int query(const kernels::AttentionParams& p, int r) const {
    return p.sparse ? i_fixed : (row0 + r) / p.H;
  }
  __device__ __forceinline__ int head(const kernels::AttentionParams& p, int r) const {
    return p.sparse ? row0 + r : (row0 + r) % p.H;
  }
  // Tokens CTA row r sees: 0 past the request, every one when sparse, the causal prefix of
  // its query when dense.
  __device__ __forceinline__ int32_t visible(const kernels::AttentionParams& p, int r) const {
    if (row0 + r >= rows_req) return 0;
    if (p.sparse) return 0x7FFFFFFF;
    const int i = query(p, r);
    return p.causal ? std::max(0, std::min(seqlen, seqlen - p.s_q + i + 1)) : seqlen;
  }
};

// kGranule: split chunks are ceil(n / num_splits) rounded up to it (1: not rounded).
template <int kRowsPerCta, int kGranule, int kTile>
__device__ __forceinline__ CtaWork cta_work(const kernels::AttentionParams& p) {
  CtaWork w;
  const int split = blockIdx.z;
  if (p.sparse) {
    w.b = blockIdx.y / p.s_q;
    w.i_fixed = blockIdx.y % p.s_q;
  } else {
    w.b = blockIdx.y;
  }
  w.rows_req = p.sparse ? p.H : p.s_q * p.H;
  w.row0 = blockIdx.x * kRowsPerCta;
  // Device seqlens are not validated by the host: clamp them to what the table covers.
  w.seqlen = p.sparse ? 0
                      : static_cast<int32_t>(std::clamp<int64_t>(p.seqlens[w.b * p.sl_s0], 0, p.bt_cols * p.block_size));
  int64_t n_max;
  if (p.sparse) {
    n_max = p.topk;
    if (p.topk_length != nullptr) n_max = std::clamp<int64_t>(p.topk_length[w.b * p.tl_s0], 0, n_max);
  } else {
    const int last_row = std::min(w.row0 + kRowsPerCta, w.rows_req) - 1;
    const int i_last = last_row / p.H;
    n_max = p.causal ? std::min<int64_t>(w.seqlen, std::max<int64_t>(0, w.seqlen - p.s_q + i_last + 1)) : w.seqlen;
  }
  const int64_t per_split = (n_max + p.num_splits - 1) / p.num_splits;
  const int64_t chunk = (per_split + kGranule - 1) / kGranule * kGranule;
  w.begin = std::min<int64_t>(n_max, split * chunk);
  w.end = std::min<int64_t>(n_max, w.begin + chunk);
  w.n_tiles = static_cast<int>((w.end - w.begin + kTile - 1) / kTile);
  return w;
}

// Where the result row of query i, head h of request b goes: the output (and its LSE) with one
// split, else this split's partial slots, which the combine (smxx/combine.cu) reads. Writes
// the LSE when `write_lse` (one thread per row) and returns the row's first output float.
__device__ __forceinline__ float* result_row(const kernels::AttentionParams& p, int b, int split, int i, int h,
                                             float lse, bool write_lse) {
  float* dst;
  if (p.num_splits == 1) {
    dst = p.out + b * p.o_s0 + static_cast<int64_t>(i) * p.o_s1 + static_cast<int64_t>(h) * p.o_s2;
    if (write_lse) p.lse[b * p.l_s0 + static_cast<int64_t>(i) * p.l_s1 + static_cast<int64_t>(h) * p.l_s2] = lse;
  } else {
    const int64_t grow = (static_cast<int64_t>(b) * p.s_q + i) * p.H + h;
    dst = p.part_o + (static_cast<int64_t>(split) * p.rows_total + grow) * kLatentDim;
    if (write_lse) p.part_lse[static_cast<int64_t>(split) * p.rows_total + grow] = lse;
  }
  return dst;
}

}  // namespace mlakv::cuda
