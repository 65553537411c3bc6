// Params of the cache writer (include/mlakv/cuda.h write_cache): n tokens encoded
// into their slots of one device cache layer. Strides in elements.
#pragma once

#include <cstdint>

#include "mlakv/codec.h"

namespace mlakv::cuda::kernels {

struct WriterParams {
  uint8_t* cache;  // [num_slots, record_bytes] u8: one layer, slot-major
  int64_t num_slots;
  int record_bytes;
  float outer_scale;       // nvfp4 s_l: latents are encoded as latent / s_l
  bool token_scale;        // nvfp4 per-token scale mode: latent / s_t, s_t stored at [292, 296) (then s_l is 1)
  Fp8ScaleMode fp8_mode;   // fp8_ds_mla tile scales
  const int64_t* slots;    // [n] i64, contiguous; < 0 skipped, >= num_slots skipped and counted
  int64_t n;
  const void* latent;      // [n, 512] f32, or bf16 when bf16_input; row stride latent_stride
  int64_t latent_stride;
  const void* rope;        // [n, 64] same dtype as latent; row stride rope_stride
  int64_t rope_stride;
  bool bf16_input;
  int* error_count;        // [1] i32 on the device, or null: += 1 per slot past the layer
  // The latent transform (DeviceLatentTransform), or all null: c' = (c - mu) * gain, then
  // the 512-point butterflies when t_rotate; k' = k * t_rope_gain, then the 64-point ones.
  const float* t_mu = nullptr;         // [512] device
  const float* t_gain = nullptr;       // [512] device
  const float* t_rope_gain = nullptr;  // [64] device, or null: rope unrotated
  bool t_rotate = false;
  // The nvfp4 subnormal-scale tally (include/mlakv/cuda.h), device, or null.
  unsigned long long* tally = nullptr;
  // Nvfp4ScaleMode::kSearch (nvfp4 formats outside token-scale mode; the API validated it):
  // codec::nvfp4_group_search_fast per group.
  bool nvfp4_search = false;  // [tokens, groups, subnormal_groups, (max |latent| bits) as u32 pair]
};

}  // namespace mlakv::cuda::kernels
