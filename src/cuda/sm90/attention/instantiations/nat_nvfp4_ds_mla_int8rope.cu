// The natural-arrangement sm90 kernel for nvfp4_ds_mla_int8rope records (codes, scales
// and the int8 rope staged by TMA, converted in place by the converter warps) (kernel_nat.cuh) and its host entry
// points (launch_nat.h); sm_90a only.
#include "cuda/sm90/attention/kernel_nat.cuh"

namespace mlakv::cuda::sm90 {

template <>
int configure_attention_nat_for<KvFormat::kNvfp4DsMlaInt8Rope>(int /*record_bytes*/) {
  return nat_configure<KvFormat::kNvfp4DsMlaInt8Rope>();
}

template <>
int attention_nat_ctas_per_sm_for<KvFormat::kNvfp4DsMlaInt8Rope>(int /*record_bytes*/) {
  return nat_ctas_per_sm<KvFormat::kNvfp4DsMlaInt8Rope>();
}

template <>
int launch_attention_nat_for<KvFormat::kNvfp4DsMlaInt8Rope>(const kernels::AttentionParams& kp, int row_blocks, void* stream) {
  return nat_launch<KvFormat::kNvfp4DsMlaInt8Rope>(kp, row_blocks, stream);
}

}  // namespace mlakv::cuda::sm90
