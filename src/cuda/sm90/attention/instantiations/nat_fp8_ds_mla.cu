// The natural-arrangement sm90 kernel for fp8_ds_mla records (codes and scales
// staged by TMA, converted to bf16(e4m3 * scale) in place by the converter warps) (kernel_nat.cuh) and its host entry
// points (launch_nat.h); sm_90a only.
#include "cuda/sm90/attention/kernel_nat.cuh"

namespace mlakv::cuda::sm90 {

MLAKV_NAT_DEFINE(KvFormat::kFp8DsMla)

}  // namespace mlakv::cuda::sm90
