// The natural-arrangement sm90 kernel for nvfp4_ds_mla records (codes and
// scales staged by TMA, converted to e2m1 * sf * 2^-7 in place by the converter warps) (kernel_nat.cuh) and its host entry
// points (launch_nat.h); sm_90a only.
#include "cuda/sm90/attention/kernel_nat.cuh"

namespace mlakv::cuda::sm90 {

MLAKV_NAT_DEFINE(KvFormat::kNvfp4DsMla)

}  // namespace mlakv::cuda::sm90
