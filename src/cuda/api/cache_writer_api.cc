// The CUDA cache-writer API: validation on the host, one kernel launch.
#include <fmt/format.h>

#include <cstdint>

#include "cuda/common/status.h"
#include "cuda/smxx/launch.h"
#include "mlakv/cuda.h"

namespace mlakv::cuda {

Status write_cache(const CacheLayerView& layer, const TensorView& slots, const TensorView& latent,
                   const TensorView& rope, Fp8ScaleMode fp8_scales, void* stream, int* error_count) {
  MLAKV_RETURN_IF_ERROR(check_cache_view(layer, "cache"));
  if (layer.device.type != DeviceType::kCuda) {
    return invalid_argument(fmt::format("cache: expected a CUDA cache layer, got {}", device_name(layer.device)));
  }
  if (layer.latent_dim != kLatentDim || layer.rope_dim != kRopeDim) {
    return invalid_argument("cache: the CUDA writers need latent 512 + rope 64");
  }
  // The kernels store records in 16-byte pieces (every record size is a multiple of 16).
  if (reinterpret_cast<std::uintptr_t>(layer.data) % 16 != 0) {
    return invalid_argument(fmt::format("cache: the data pointer must be 16-byte aligned, got {}", static_cast<const void*>(layer.data)));
  }
  MLAKV_RETURN_IF_ERROR(check_tensor(slots, "slots", {{DType::kI64}, {-1}}, layer.device));
  const int64_t n = slots.size(0);
  MLAKV_RETURN_IF_ERROR(check_tensor(latent, "latent", {{DType::kF32, DType::kBF16}, {n, kLatentDim}}, layer.device));
  MLAKV_RETURN_IF_ERROR(check_tensor(rope, "rope", {{latent.dtype}, {n, kRopeDim}}, layer.device));
  if (n > 1 && slots.stride(0) != 1) return invalid_argument("slots: must be contiguous");
  kernels::WriterParams p{layer.data,
                          layer.num_slots(),
                          layer.record_bytes,
                          layer.outer_scale,
                          layer.token_scale,
                          fp8_scales,
                          slots.ptr<const int64_t>(),
                          n,
                          latent.data,
                          latent.stride(0),
                          rope.data,
                          rope.stride(0),
                          latent.dtype == DType::kBF16,
                          error_count};
  return cuda_status(kernels::launch_write_cache(layer.format, p, stream), "write_cache_kernel");
}

}  // namespace mlakv::cuda
