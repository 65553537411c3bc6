// The sm90 path's host entry points: the device check, the supported geometries and
// the runtime-format dispatch onto the instantiations (instantiations/<format>.cu).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/dispatch_format.h"
#include "cuda/sm90/attention/launch.h"

namespace mlakv::cuda::sm90 {

bool available(int device) {
  static int cached[64];  // 0 unknown, 1 yes, 2 no
  if (device < 0 || device >= 64) return false;
  if (cached[device] == 0) {
    int major = 0, minor = 0;
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
                    major == 9 && minor == 0 && binary_version<KvFormat::kBf16>() == 90;
    if (!ok) (void)cudaGetLastError();
    cached[device] = ok ? 1 : 2;
  }
  return cached[device] == 1;
}

bool supports(KvFormat format, int record_bytes_, const void* cache) {
  return record_bytes_ == record_bytes(format) && (reinterpret_cast<uintptr_t>(cache) & 15u) == 0;
}

int split_granule_of(KvFormat format) { return split_granule(format); }

int configure_attention(KvFormat format, int record_bytes_) {
  return dispatch_format<KernelSet::kAll>(format, int{cudaErrorInvalidValue},
                         [&](auto tag) { return configure<decltype(tag)::value>(record_bytes_); });
}

int attention_ctas_per_sm(KvFormat format, int record_bytes_) {
  return dispatch_format<KernelSet::kAll>(format, 0, [&](auto tag) { return ctas_per_sm<decltype(tag)::value>(record_bytes_); });
}

int launch_attention(KvFormat format, const kernels::AttentionParams& p, int row_blocks, void* stream) {
  return dispatch_format<KernelSet::kAll>(format, int{cudaErrorInvalidValue},
                         [&](auto tag) { return launch<decltype(tag)::value>(p, row_blocks, stream); });
}

}  // namespace mlakv::cuda::sm90
