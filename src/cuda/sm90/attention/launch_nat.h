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

// The cache geometries the kernel's TMA boxes cover: bf16 records, block sizes that are
// a multiple of 64 or one of 8, 16, 32 (a box never crosses a page and lands on a 1 KB
// boundary of the swizzled tile), and slot ids that fit the TMA's 32-bit coordinates.
inline bool nat_supports(KvFormat format, int block_size, int64_t num_slots) {
  const bool bs_ok = block_size > 0 && (block_size % 64 == 0 || block_size == 8 || block_size == 16 || block_size == 32);
  return format == KvFormat::kBf16 && bs_ok && num_slots >= 1 && num_slots <= 0x7FFFFFFF;
}

// The dynamic shared-memory limit (plan time), CTAs per SM (0 on error), and the launch
// on grid (row_blocks, B, num_splits): the TMA descriptor of the cache is encoded on the
// host at every launch (cuTensorMapEncodeTiled through cudaGetDriverEntryPointByVersion,
// no libcuda link) and passed by value, so a captured graph replays it as launched.
// Formats other than bf16: cudaErrorInvalidValue.
int configure_attention_nat(KvFormat format, int record_bytes);
int attention_nat_ctas_per_sm(KvFormat format, int record_bytes);
int launch_attention_nat(KvFormat format, const kernels::AttentionParams& p, int row_blocks, void* stream);

}  // namespace mlakv::cuda::sm90
