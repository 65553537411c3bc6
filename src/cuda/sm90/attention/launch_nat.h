// The natural-arrangement many-row sm90 attention path for bf16 records (Hopper, sm_90a
// only; built with the sm90 path and listed as AttentionPath::kSm90Nat in
// api/attention_path.cc): 64 query rows per CTA as the wgmma M dimension, each 64-token KV
// tile loaded by 2-D TMA into the 128-byte swizzled canonical layout and read from shared
// memory by the tensor cores as K^T and (transposed) as V; two consumer warpgroups in
// FlashMLA's "seesaw" schedule (each computes the scores of every other tile and half of
// the 512 output dims of all of them). Dense token sets (block-table walk) at block sizes
// that tile a 64-token tile with whole TMA boxes. Same operation, params and split-KV
// output contract as the other paths (params/attention.h). kernel_nat.cuh
// holds the kernel; docs/design.md "Hopper kernels, natural arrangement".
//
// Every entry returns a cudaError_t as an int (0 = success).
#pragma once

#include <cstdint>

#include "cuda/params/attention.h"
#include "mlakv/formats.h"

namespace mlakv::cuda::sm90 {

inline constexpr int kNatRowsPerCta = 64;  // query rows per CTA
inline constexpr int kNatTokenTile = 64;   // tokens per tile: split chunks are rounded up to it

// The cache geometries the kernel's TMA boxes cover: bf16, fp8_ds_mla or the three nvfp4
// records (the quantized formats' codes, scales and 8-bit ropes are staged by TMA and
// converted to the bf16 tile in shared memory; not the token-scale mode, which
// sm90_rows_serves refuses), block sizes that are a multiple of 64 or one of 8, 16, 32 (a
// box never crosses a page and lands on a 1 KB boundary of the swizzled tile), and slot
// ids that fit the TMA's 32-bit coordinates. Sparse (top-k) sets: the quantized formats
// at any block size (the converters gather each token's bytes with cp.async; bf16 records
// have no converters and stay on sm90_rows).
inline bool nat_supports(KvFormat format, int block_size, int64_t num_slots, bool sparse) {
  const bool quant = format == KvFormat::kFp8DsMla || is_nvfp4_format(format);
  const bool bs_ok = sparse ? block_size > 0
                            : block_size > 0 && (block_size % 64 == 0 || block_size == 8 || block_size == 16 || block_size == 32);
  const bool fmt_ok = quant || (!sparse && format == KvFormat::kBf16);
  return fmt_ok && bs_ok && num_slots >= 1 && num_slots <= 0x7FFFFFFF;
}

// Whether the plan picks the kernel by itself where nat_supports holds: every format and
// token set it serves (on the H200 it is faster than sm90_rows for each; docs/perf.md,
// seventh session for dense sets, ninth for sparse ones).
inline bool nat_is_default(KvFormat format, bool sparse) { return nat_supports(format, 64, 1, sparse); }

// Per format (instantiations/nat_<format>.cu): the dynamic shared-memory limit (plan time),
// CTAs per SM (0 on error), and the launch on grid (row_blocks, B, num_splits): the TMA
// descriptors of the cache are encoded on the host at every launch (cuTensorMapEncodeTiled
// through cudaGetDriverEntryPointByVersion, no libcuda link) and passed by value, so a
// captured graph replays them as launched.
template <KvFormat F>
int configure_attention_nat_for(int record_bytes);
template <KvFormat F>
int attention_nat_ctas_per_sm_for(int record_bytes);
template <KvFormat F>
int launch_attention_nat_for(const kernels::AttentionParams& p, int row_blocks, void* stream);
#define MLAKV_NAT_DECLARE(F)                                             \
  template <>                                                            \
  int configure_attention_nat_for<F>(int record_bytes);                  \
  template <>                                                            \
  int attention_nat_ctas_per_sm_for<F>(int record_bytes);                \
  template <>                                                            \
  int launch_attention_nat_for<F>(const kernels::AttentionParams& p, int row_blocks, void* stream);
MLAKV_NAT_DECLARE(KvFormat::kBf16)
MLAKV_NAT_DECLARE(KvFormat::kFp8DsMla)
MLAKV_NAT_DECLARE(KvFormat::kNvfp4DsMla)
MLAKV_NAT_DECLARE(KvFormat::kNvfp4DsMlaFp8Rope)
MLAKV_NAT_DECLARE(KvFormat::kNvfp4DsMlaInt8Rope)
#undef MLAKV_NAT_DECLARE

// fn(FormatTag<F>{}) for a format the kernel has an instantiation of, else `fallback`.
template <class Fn>
int nat_dispatch(KvFormat format, int fallback, Fn&& fn) {
  return visit_format(format, fallback, [&](auto tag) -> int {
    constexpr KvFormat F = decltype(tag)::value;
    if constexpr (F == KvFormat::kBf16 || F == KvFormat::kFp8DsMla || is_nvfp4_format(F)) return fn(tag);
    else return fallback;
  });
}

// The path table's entries: dispatch on the format; other formats: cudaErrorInvalidValue
// (1) or 0 CTAs.
inline int configure_attention_nat(KvFormat format, int record_bytes) {
  return nat_dispatch(format, 1, [&](auto tag) { return configure_attention_nat_for<decltype(tag)::value>(record_bytes); });
}
inline int attention_nat_ctas_per_sm(KvFormat format, int record_bytes) {
  return nat_dispatch(format, 0, [&](auto tag) { return attention_nat_ctas_per_sm_for<decltype(tag)::value>(record_bytes); });
}
inline int launch_attention_nat(KvFormat format, const kernels::AttentionParams& p, int row_blocks, void* stream) {
  return nat_dispatch(format, 1, [&](auto tag) { return launch_attention_nat_for<decltype(tag)::value>(p, row_blocks, stream); });
}

}  // namespace mlakv::cuda::sm90
