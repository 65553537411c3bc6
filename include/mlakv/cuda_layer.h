// The MLA attention layer forward on an NVIDIA GPU: the same computation as
// mla_layer_forward (include/mlakv/mla_layer.h) with cuBLAS for the projections and the
// absorbed per-head products, and mlakv's CUDA kernels for RMSNorm, RoPE, the cache
// write and the attention over the paged cache.
//
// Precision: weights and activations float32 (cuBLAS SGEMM, TF32 off); the attention
// kernel rounds q, K/V and P to bf16 (include/mlakv/cuda.h), so the layer matches the
// CPU layer to bf16 attention accuracy (tests/cuda/cuda_harness.cc derives the bound).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "mlakv/cache.h"
#include "mlakv/mla_layer.h"
#include "mlakv/model_config.h"
#include "mlakv/status.h"
#include "mlakv/tensor.h"

namespace mlakv::cuda {

// One layer's float32 weights on a device, a cuBLAS handle and reusable scratch. Weights
// and scratch come from a caching allocator over cudaMalloc (allocator.h): weights are
// allocated first, scratch after, so scratch never fragments the persistent weights.
class DeviceMlaLayer {
 public:
  // Copies `w` to device `device`. `cfg` supplies RoPE and the norm eps; its geometry
  // must match `w` (kInvalidArgument otherwise).
  static StatusOr<std::unique_ptr<DeviceMlaLayer>> upload(const MlaLayerWeights& w, const ModelConfig& cfg,
                                                          int device = 0);
  ~DeviceMlaLayer();
  DeviceMlaLayer(const DeviceMlaLayer&) = delete;
  DeviceMlaLayer& operator=(const DeviceMlaLayer&) = delete;

  // T new tokens of one sequence whose cache layer lives on this device:
  //   cache        the layer's device cache (format and outer scale apply)
  //   block_table  [1, max_blocks] i32 on the device: the sequence's blocks
  //   seqlen       tokens of the sequence in the cache after this call (new ones included)
  //   slots        [T] i64 on the device: where the new tokens' records go
  //   hidden       [T, D] f32 on the device; positions: T host positions (>= 0)
  //   out          [T, D] f32 on the device
  // Enqueues on `stream` and synchronizes it before returning (scratch is reused).
  Status forward(const CacheLayerView& cache, const TensorView& block_table, int32_t seqlen, const TensorView& slots,
                 const TensorView& hidden, std::span<const int64_t> positions, const TensorView& out,
                 int num_splits = 1, void* stream = nullptr);

  int device() const;

 private:
  struct Impl;
  explicit DeviceMlaLayer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mlakv::cuda
