// The natural-arrangement sm90 kernel for bf16 records (2-D TMA straight into the swizzled tile) (kernel_nat.cuh) and its host entry
// points (launch_nat.h); sm_90a only.
#include "cuda/sm90/attention/kernel_nat.cuh"

namespace mlakv::cuda::sm90 {

template <>
int configure_attention_nat_for<KvFormat::kBf16>(int /*record_bytes*/) {
  return nat_configure<KvFormat::kBf16>();
}

template <>
int attention_nat_ctas_per_sm_for<KvFormat::kBf16>(int /*record_bytes*/) {
  return nat_ctas_per_sm<KvFormat::kBf16>();
}

template <>
int launch_attention_nat_for<KvFormat::kBf16>(const kernels::AttentionParams& kp, int row_blocks, void* stream) {
  return nat_launch<KvFormat::kBf16>(kp, row_blocks, stream);
}

}  // namespace mlakv::cuda::sm90
