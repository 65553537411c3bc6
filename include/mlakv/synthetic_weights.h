// Synthetic kv_b_proj checkpoints: the tensors a checkpoint of `config` would hold for
// every layer's kv_b_proj, generated instead of read, so the absorption and its memory
// experiment (`mlakv absorb --synthetic glm-5.2 --tp 4 --report`) run without the real
// weights.
//
// Values: W ~ N(0, 0.02^2) per element (a typical trained projection's scale),
// quantized the way each format's producer does it (REFERENCE.md section 7):
//   dense                    bf16 W, round to nearest even
//   fp8_block                per 128x128 tile s = amax / 448, weight = e4m3(W / s),
//                            weight_scale_inv = s (f32)
//   modelopt_nvfp4           scale_2 = amax(W) / (6 * 448); per 16 inputs
//                            scale = e4m3(amax_g / 6 / scale_2), weight = e2m1(W / (scale * scale_2)),
//                            even k in the low nibble
//   compressed_tensors_nvfp4 the same codes, weight_global_scale = 1 / scale_2 (a divisor)
// Every layer serves the SAME bytes (one buffer per tensor): the experiment is about
// placement, and one layer's worth of memory keeps the full GLM-5.2 geometry cheap
// (fp8: 14 MiB for [28672, 512]). Tensors hold all H heads, as a checkpoint does;
// tensor-parallel ranks slice them like real ones.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mlakv/kv_b_proj.h"
#include "mlakv/model_config.h"
#include "mlakv/status.h"
#include "mlakv/tensor_source.h"

namespace mlakv::synthetic {

struct KvBProjCheckpointSpec {
  int layers = 0;  // served as layer_prefix + i + ".self_attn.kv_b_proj.*" for i in [0, layers)
  WeightEncoding encoding = WeightEncoding::kFp8Block;
  uint64_t seed = 2026;
  std::string layer_prefix = "model.layers.";
};

// Errors: kInvalidArgument for layers < 1 or a config that fails validate();
// kUnimplemented for GPTQ / AWQ (not generated).
StatusOr<std::unique_ptr<TensorSource>> make_kv_b_proj_checkpoint(const ModelConfig& config,
                                                                  const KvBProjCheckpointSpec& spec);

}  // namespace mlakv::synthetic
