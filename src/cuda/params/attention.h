// Params of the attention op and of the split-KV combine. The API layer
// (api/attention_api.cc) validates shapes, dtypes and devices and fills these; kernels
// of every architecture path read them as given. Strides are in elements; the last
// dimension of every tensor is contiguous. B requests, s_q queries per request, H
// heads; 576 = kQkDim, 512 = kLatentDim.
#pragma once

#include <cstdint>

namespace mlakv::cuda::kernels {

struct AttentionParams {
  const void* q;  // [B, s_q, H, 576] f32, or bf16 when q_bf16; strides q_s0, q_s1, q_s2
  bool q_bf16;
  int64_t q_s0, q_s1, q_s2;
  int B, s_q, H;
  const uint8_t* cache;  // [num_blocks * block_size, record_bytes] u8: one layer, slot-major
  int64_t num_blocks, num_slots;
  int block_size, record_bytes;
  float outer_scale;              // the layer's NVFP4 s_l (1 for the other formats)
  bool token_scale;               // nvfp4 per-token scale mode: each record's s_t at [292, 296) replaces s_l
                                  // (the sm80 path only; attention_path.cc keeps such layers off sm90)
  const int32_t* block_table;     // dense: [B, bt_cols] i32 block ids, strides bt_s0, bt_s1; -1 / out of range: skipped
  int64_t bt_s0, bt_s1;
  int64_t bt_cols;  // max_blocks: positions past bt_cols * block_size are never read
  const int32_t* seqlens;         // dense: [B] i32, stride sl_s0 (clamped to the table on the device)
  int64_t sl_s0;
  bool causal;
  bool sparse;
  const int32_t* indices;         // sparse: [B, s_q, topk] i32 slot ids, strides ix_s0..2; invalid ids skipped
  int64_t ix_s0, ix_s1, ix_s2;
  int topk;
  const int32_t* topk_length;     // sparse: [B] i32, stride tl_s0, or null (all topk entries)
  int64_t tl_s0;
  float scale_log2;  // softmax_scale * log2(e)
  int num_splits;
  float* out;  // [B, s_q, H, 512] f32, strides o_s0, o_s1, o_s2 (written when num_splits == 1)
  int64_t o_s0, o_s1, o_s2;
  float* lse;  // [B, s_q, H] f32, strides l_s0, l_s1, l_s2 (natural log; -inf for an empty row)
  int64_t l_s0, l_s1, l_s2;
  float* part_o;    // num_splits > 1: [num_splits, rows_total, 512] f32 workspace, contiguous
  float* part_lse;  // num_splits > 1: [num_splits, rows_total] f32 workspace, contiguous
  int64_t rows_total;  // B * s_q * H; partial row of (b, i, h) = (b * s_q + i) * H + h
};

// Split-KV combine: out/lse of each row from its num_splits partials (attn_state.h rule).
struct CombineParams {
  const float* part_o;    // [splits, rows, 512] f32, contiguous
  const float* part_lse;  // [splits, rows] f32, contiguous
  int splits;
  int64_t rows;  // B * s_q * H
  int s_q, H;
  float* out;  // [B, s_q, H, 512] f32, strides o_s0, o_s1, o_s2; row (b, i, h) = (b * s_q + i) * H + h
  int64_t o_s0, o_s1, o_s2;
  float* lse;  // [B, s_q, H] f32, strides l_s0, l_s1, l_s2
  int64_t l_s0, l_s1, l_s2;
  // Launch as a programmatic dependent of the attention kernel before it (sm_90 and
  // later: the combine's launch overlaps the attention's tail; it waits for the
  // attention grid's results with griddepcontrol.wait). False: a plain stream launch.
  bool programmatic = false;
};

}  // namespace mlakv::cuda::kernels
