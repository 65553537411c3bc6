// A function-preserving reparametrization of an MLA checkpoint's latent scale, per layer:
//   kv_a_layernorm.weight *= a_l        (so kv_c_normed, the cached latent, is a_l times larger)
//   kv_b_proj.weight      /= a_l        (its input columns ARE the latent: q_lat . c and
//                                        o = P V W_UV are unchanged)
// The model computes the same function (exactly in exact arithmetic; with a_l a power of
// two also exactly in bf16/f32 storage, barring under/overflow), but the cache holds
// latents of a different magnitude - how the project reproduces GLM-5.2-like layers
// (max |kv_c_normed| from 0.02 to 5) on a small model, where uncalibrated nvfp4 collapses
// and the outer scale restores it (docs/eval.md).
#pragma once

#include <span>
#include <string>

#include "mlakv/status.h"

namespace mlakv {

// Writes `dst_dir` (created; must not exist) with the reparametrized checkpoint of
// `src_dir`: config.json, tokenizer and generation files copied, one model.safetensors
// holding every tensor of the source with the two per-layer tensors scaled (in their own
// dtype when every a_l is a power of two, else as float32). `a` has one factor per
// decoder layer (finite, > 0). Errors: kNotFound (missing files/tensors), kInvalidArgument
// (a count or factor), kUnimplemented (a quantized kv_b_proj), kAlreadyExists (dst_dir
// exists). Nothing is left at dst_dir on failure.
Status reparametrize_latent_scale(const std::string& src_dir, const std::string& dst_dir, std::span<const double> a);

}  // namespace mlakv
