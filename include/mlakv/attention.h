// Absorbed MLA attention over a paged cache of KV records (REFERENCE section 1).
//
// One operation covers decode (s_q = 1), multi-token decode (MTP / speculative, s_q > 1)
// and chunked prefill (s_q = chunk length, reading the tokens it has just written):
//
//   s[h,t] = (q_lat[h] . c_t + q_pe[h] . kpe_t) * softmax_scale
//   out[h] = sum_t softmax(s)[h,t] c_t        lse[h] = ln sum_t exp(s[h,t])
//
// where [c_t | kpe_t] is token t's record decoded (latent 512 | rope 64). Dequantization
// happens inside the kernels; no dequantized copy of the cache is ever made.
//
// Token sets:
//  - dense:  request b's tokens are positions [0, seqlens[b]) of its block table:
//            slot = block_table[b][pos / block_size] * block_size + pos % block_size.
//            With `causal`, query i of request b sees its first seqlens[b] - s_q + i + 1
//            tokens (clamped to >= 0); otherwise all seqlens[b].
//  - sparse: `indices` [B, s_q, topk] slot ids (DSA top-k). Entries that are negative or
//            >= the cache's slot count are skipped; with `topk_length`, only the first
//            topk_length[b] entries of request b count. Entries are attended as listed.
// A query with nothing to attend to gets out = 0 and lse = -inf (the empty-state rule
// of attn_state.h).
#pragma once

#include <cstdint>

#include "mlakv/cache.h"
#include "mlakv/status.h"
#include "mlakv/tensor.h"

namespace mlakv {

class ThreadPool;

struct MlaAttentionParams {
  TensorView q;            // [B, s_q, H, 576] f32 or bf16: absorbed q_lat (512) then rotated q_pe (64)
  CacheLayerView cache;    // one layer of the paged cache (any format, any block size)
  TensorView block_table;  // dense: [B, max_blocks] i32
  TensorView seqlens;      // dense: [B] i32, tokens in the cache per request (new ones included)
  TensorView indices;      // sparse: [B, s_q, topk] i32 slot ids; leave empty (data null) for dense
  TensorView topk_length;  // sparse, optional: [B] i32
  float softmax_scale = 0.0f;
  bool causal = true;      // dense only
  int num_splits = 1;      // split-KV partitions per request (>= 1); results combine by merge
  TensorView out;          // [B, s_q, H, 512] f32
  TensorView lse;          // [B, s_q, H] f32, natural log

  bool sparse() const { return indices.data != nullptr || indices.ndim != 0; }
};

// Checks every tensor's shape, dtype and device, the cache view, the scale and split
// count, and (for CPU tensors) that every block-table entry a request reads names an
// existing block. Messages name the argument, request and entry.
Status validate_mla_attention(const MlaAttentionParams& p);

struct CpuAttentionOptions {
  ThreadPool* pool = nullptr;  // run on this pool; nullptr: the calling thread only
};

// The optimized CPU path: float32, SIMD with runtime dispatch (Highway), threads over
// (request, head group, split). Validates first; on failure writes nothing.
Status mla_attention_cpu(const MlaAttentionParams& p, const CpuAttentionOptions& opt = {});

// The instruction set mla_attention_cpu dispatches to on this machine, by its common
// name: "AVX-512", "AVX2", "SSE4", "NEON", ... (Highway's target, picked at run time).
const char* cpu_attention_isa();

// The specification: a plain float64 implementation (one pass, no splits), reading the
// records through the scalar codec. Slow; used by tests and as the demo's yardstick.
Status mla_attention_reference(const MlaAttentionParams& p);

// The same float64 reference on unquantized keys: `kv` [num_slots, 576] f32 holds, for
// every slot of the cache view, the float latent (512) then rope (64) that was written
// there. The cache view supplies only the geometry (block size, slot count).
Status mla_attention_reference_unquantized(const MlaAttentionParams& p, const TensorView& kv);

// Merges P partial results over disjoint token subsets (split-KV, context-parallel
// ranks). o_parts [P, N, D] f32, lse_parts [P, N] f32 -> out [N, D] f32, lse [N] f32.
// out/lse may not alias the inputs. Empty partials (lse = -inf) contribute nothing.
Status merge_attn_states(const TensorView& o_parts, const TensorView& lse_parts, const TensorView& out,
                         const TensorView& lse);

}  // namespace mlakv
