// The absorption transform itself, for the code that has the dense kv_b_proj in hand:
// absorb.cc (from its allocator scratch) and the CPU MLA layer (model/mla_layer.cc).
// Internal: no validation, the caller sized every buffer from `g`.
#pragma once

#include "mlakv/mla_geometry.h"
#include "mlakv/tensor.h"

namespace mlakv {

// kv_b [H*(P+V), L] (viewed [H, P+V, L]) -> W_UK_T [H, P, L] and W_UV [H, L, V]
// (conventions in include/mlakv/absorb.h). kv_b_dtype and dtype are kF32 or kBF16; a
// bf16 output is the round-to-nearest-even of the f32 value. Reads H, P, V, L of `g`.
void split_kv_b_proj(const void* kv_b, DType kv_b_dtype, void* w_uk_t, void* w_uv, DType dtype, const MlaGeometry& g);

}  // namespace mlakv
