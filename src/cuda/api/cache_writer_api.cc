// The CUDA cache-writer API: validation on the host, one kernel launch.
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda/common/status.h"
#include "cuda/smxx/launch.h"
#include "mlakv/cuda.h"

namespace mlakv::cuda {

namespace {

Status write_cache_impl(const CacheLayerView& layer, const TensorView& slots, const TensorView& latent,
                        const TensorView& rope, Fp8ScaleMode fp8_scales, const DeviceLatentTransform* transform,
                        void* stream, int* error_count, Nvfp4ScaleTally* tally) {
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
                          error_count,
                          nullptr,
                          nullptr,
                          nullptr,
                          false};
  static_assert(sizeof(Nvfp4ScaleTally) == 4 * sizeof(unsigned long long) &&
                offsetof(Nvfp4ScaleTally, max_abs_bits) == 3 * sizeof(unsigned long long));
  // (check_cache_view accepted kSearch only on an nvfp4 layer outside token-scale mode.)
  p.nvfp4_search = layer.nvfp4_scales == Nvfp4ScaleMode::kSearch;
  if (tally != nullptr && is_nvfp4_format(layer.format) && !layer.token_scale) {
    p.tally = reinterpret_cast<unsigned long long*>(tally);
  }
  if (transform != nullptr) {
    if (transform->device() != layer.device.index) {
      return invalid_argument(fmt::format("transform: uploaded to cuda:{}, the cache is on {}", transform->device(),
                                          device_name(layer.device)));
    }
    if (format_info(layer.format).has_outer_scale && !layer.token_scale && layer.outer_scale != transform->outer_scale()) {
      return invalid_argument(fmt::format("cache: outer_scale {} is not the transform's s_l {} (the records would be "
                                          "scaled by one and read back with the other)",
                                          layer.outer_scale, transform->outer_scale()));
    }
    p.t_mu = transform->mu();
    p.t_gain = transform->gain();
    p.t_rope_gain = transform->rope_gain();
    p.t_rotate = transform->rotate();
  }
  return cuda_status(kernels::launch_write_cache(layer.format, p, stream), "write_cache_kernel");
}

}  // namespace

Status write_cache(const CacheLayerView& layer, const TensorView& slots, const TensorView& latent,
                   const TensorView& rope, Fp8ScaleMode fp8_scales, void* stream, int* error_count,
                   Nvfp4ScaleTally* scale_tally) {
  return write_cache_impl(layer, slots, latent, rope, fp8_scales, nullptr, stream, error_count, scale_tally);
}

Status write_cache(const CacheLayerView& layer, const TensorView& slots, const TensorView& latent,
                   const TensorView& rope, Fp8ScaleMode fp8_scales, const DeviceLatentTransform& transform,
                   void* stream, int* error_count, Nvfp4ScaleTally* scale_tally) {
  return write_cache_impl(layer, slots, latent, rope, fp8_scales, &transform, stream, error_count, scale_tally);
}

Nvfp4ScaleCheck Nvfp4ScaleTally::to_check() const {
  Nvfp4ScaleCheck c;
  c.tokens = static_cast<int64_t>(tokens);
  c.groups = static_cast<int64_t>(groups);
  c.subnormal_groups = static_cast<int64_t>(subnormal_groups);
  float m = 0.0f;
  std::memcpy(&m, &max_abs_bits, sizeof m);
  c.max_abs = m;
  return c;
}

// ---- DeviceLatentTransform ----------------------------------------------------------------

StatusOr<DeviceLatentTransform> DeviceLatentTransform::upload(const LatentTransformKernel& kernel, int device) {
  // [mu (512) | gain (512) | rope gain (64, when the rope rotates)]
  std::vector<float> host(2 * kLatentDim + kRopeDim, 0.0f);
  std::copy_n(kernel.mu_data(), kLatentDim, host.data());
  std::copy_n(kernel.gain_data(), kLatentDim, host.data() + kLatentDim);
  if (kernel.rotates_rope()) std::copy_n(kernel.rope_gain_data(), kRopeDim, host.data() + 2 * kLatentDim);
  int prev = 0;
  MLAKV_CUDA_RETURN_IF_ERROR(cudaGetDevice(&prev));
  MLAKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  DeviceLatentTransform t;
  t.device_ = device;
  t.rotate_ = kernel.rotates_latent();
  t.rope_rotate_ = kernel.rotates_rope();
  t.outer_scale_ = kernel.layer().outer_scale;
  Status st = MLAKV_CUDA_STATUS(cudaMalloc(&t.data_, host.size() * sizeof(float)));
  if (st.ok()) {
    st = MLAKV_CUDA_STATUS(cudaMemcpy(t.data_, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  (void)cudaSetDevice(prev);
  if (!st.ok()) return st;  // t's destructor frees what was allocated
  return t;
}

DeviceLatentTransform::DeviceLatentTransform(DeviceLatentTransform&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      device_(o.device_),
      rotate_(o.rotate_),
      rope_rotate_(o.rope_rotate_),
      outer_scale_(o.outer_scale_) {}

DeviceLatentTransform& DeviceLatentTransform::operator=(DeviceLatentTransform&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(o.data_, nullptr);
    device_ = o.device_;
    rotate_ = o.rotate_;
    rope_rotate_ = o.rope_rotate_;
    outer_scale_ = o.outer_scale_;
  }
  return *this;
}

DeviceLatentTransform::~DeviceLatentTransform() {
  if (data_ != nullptr) cudaFree(data_);
}

}  // namespace mlakv::cuda
