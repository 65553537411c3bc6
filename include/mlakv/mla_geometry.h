// The shape of one MLA attention layer: the single geometry struct that the model
// config, the layer, kv_b_proj dequantization, absorption and the CUDA layer share.
// Names follow config.json (DeepSeek-V2/V3, Kimi K2, GLM); the letters are those of
// docs/reference.md section 1.
#pragma once

#include <cstdint>

namespace mlakv {

struct MlaGeometry {
  int hidden_size = 0;       // D
  int num_heads = 0;         // H (of this shard under tensor parallelism)
  int q_lora_rank = 0;       // 0: plain q_proj
  int kv_lora_rank = 0;      // L
  int qk_nope_head_dim = 0;  // P
  int qk_rope_head_dim = 0;  // R
  int v_head_dim = 0;        // V

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }  // P + R
  // kv_b_proj rows: H * (P + V).
  int64_t kv_b_rows() const { return static_cast<int64_t>(num_heads) * (qk_nope_head_dim + v_head_dim); }
  bool operator==(const MlaGeometry&) const = default;
};

}  // namespace mlakv
