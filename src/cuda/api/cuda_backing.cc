// cudaMalloc-backed segments for the caching allocator, and device queries.
#include <fmt/format.h>

#include "cuda/common/status.h"
#include "mlakv/cuda.h"

namespace mlakv::cuda {
namespace {

class CudaBacking final : public MemoryBacking {
 public:
  CudaBacking(int device, std::optional<std::size_t> limit) : device_(device), limit_(limit) {}

  StatusOr<void*> allocate(std::size_t bytes) override {
    if (bytes == 0) return invalid_argument("cuda backing: allocate(0): a segment must have bytes > 0");
    if (limit_ && bytes > *limit_ - held_) {
      return resource_exhausted(fmt::format("cuda backing: {} B requested with {} B of the {} B limit held", bytes,
                                            held_, *limit_));
    }
    int prev = 0;
    MLAKV_CUDA_RETURN_IF_ERROR(cudaGetDevice(&prev));
    MLAKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    cudaSetDevice(prev);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky allocation error
      return cuda_status(e, fmt::format("cudaMalloc({} B) on cuda:{}", bytes, device_).c_str());
    }
    held_ += bytes;
    return p;
  }

  void release(void* p, std::size_t bytes) override {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    cudaFree(p);
    cudaSetDevice(prev);
    held_ -= bytes;
  }

  Device device() const override { return Device::cuda(device_); }
  std::string name() const override {
    return limit_ ? fmt::format("cuda:{}(limit {} B)", device_, *limit_) : fmt::format("cuda:{}", device_);
  }

 private:
  int device_;
  std::optional<std::size_t> limit_;
  std::size_t held_ = 0;
};

}  // namespace

std::unique_ptr<MemoryBacking> make_cuda_backing(int device, std::optional<std::size_t> capacity_limit) {
  return std::make_unique<CudaBacking>(device, capacity_limit);
}

StatusOr<DeviceProperties> device_properties(int device) {
  cudaDeviceProp prop{};
  MLAKV_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  DeviceProperties d;
  d.name = prop.name;
  d.major = prop.major;
  d.minor = prop.minor;
  d.multiprocessors = prop.multiProcessorCount;
  d.global_memory = prop.totalGlobalMem;
  d.l2_bytes = static_cast<std::size_t>(prop.l2CacheSize);
  d.shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
  return d;
}

}  // namespace mlakv::cuda
