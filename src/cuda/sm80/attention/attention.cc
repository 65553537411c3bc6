// The sm80 path's runtime-format entry points: dispatch_format picks the explicit
// instantiation (instantiations/<format>.cu) for the layer's record format.
#include <cuda_runtime.h>

#include "cuda/common/dispatch_format.h"
#include "cuda/sm80/attention/launch.h"

namespace mlakv::cuda::sm80 {

int configure_attention(KvFormat format, int record_bytes) {
  return dispatch_format<KernelSet::kAll>(format, int{cudaErrorInvalidValue},
                         [&](auto tag) { return configure<decltype(tag)::value>(record_bytes); });
}

int attention_ctas_per_sm(KvFormat format, int record_bytes) {
  return dispatch_format<KernelSet::kAll>(format, 0, [&](auto tag) { return ctas_per_sm<decltype(tag)::value>(record_bytes); });
}

int launch_attention(KvFormat format, const kernels::AttentionParams& p, int row_blocks, void* stream) {
  return dispatch_format<KernelSet::kAll>(format, int{cudaErrorInvalidValue},
                         [&](auto tag) { return launch<decltype(tag)::value>(p, row_blocks, stream); });
}

}  // namespace mlakv::cuda::sm80
