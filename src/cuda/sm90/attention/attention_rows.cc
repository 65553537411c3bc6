// The many-row sm90 path's runtime-format dispatch onto its instantiations
// (instantiations/rows_<format>.cu); launch_rows.h describes the path.
#include <cuda_runtime.h>

#include "cuda/common/dispatch_format.h"
#include "cuda/sm90/attention/launch_rows.h"

namespace mlakv::cuda::sm90 {

int configure_attention_rows(KvFormat format, int record_bytes_) {
  return dispatch_format<KernelSet::kAll>(format, int{cudaErrorInvalidValue},
                         [&](auto tag) { return configure_rows<decltype(tag)::value>(record_bytes_); });
}

int attention_rows_ctas_per_sm(KvFormat format, int record_bytes_) {
  return dispatch_format<KernelSet::kAll>(format, 0, [&](auto tag) { return ctas_per_sm_rows<decltype(tag)::value>(record_bytes_); });
}

int launch_attention_rows(KvFormat format, const kernels::AttentionParams& p, int row_blocks, void* stream) {
  return dispatch_format<KernelSet::kAll>(format, int{cudaErrorInvalidValue},
                         [&](auto tag) { return launch_rows<decltype(tag)::value>(p, row_blocks, stream); });
}

}  // namespace mlakv::cuda::sm90
