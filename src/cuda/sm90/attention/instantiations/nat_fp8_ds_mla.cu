// The natural-arrangement sm90 kernel for fp8_ds_mla records (codes and scales
// staged by TMA, converted to bf16(e4m3 * scale) in place by the converter warps) (kernel_nat.cuh) and its host entry
// points (launch_nat.h); sm_90a only.
#include "cuda/sm90/attention/kernel_nat.cuh"

namespace mlakv::cuda::sm90 {

template <>
int configure_attention_nat_for<KvFormat::kFp8DsMla>(int /*record_bytes*/) {
  return nat_configure<KvFormat::kFp8DsMla>();
}

template <>
int attention_nat_ctas_per_sm_for<KvFormat::kFp8DsMla>(int /*record_bytes*/) {
  return nat_ctas_per_sm<KvFormat::kFp8DsMla>();
}

template <>
int launch_attention_nat_for<KvFormat::kFp8DsMla>(const kernels::AttentionParams& kp, int row_blocks, void* stream) {
  return nat_launch<KvFormat::kFp8DsMla>(kp, row_blocks, stream);
}

}  // namespace mlakv::cuda::sm90
