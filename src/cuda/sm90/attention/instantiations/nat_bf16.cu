// The natural-arrangement sm90 kernel for bf16 records (2-D TMA straight into the swizzled tile) (kernel_nat.cuh) and its host entry
// points (launch_nat.h); sm_90a only.
#include "cuda/sm90/attention/kernel_nat.cuh"

namespace mlakv::cuda::sm90 {

MLAKV_NAT_DEFINE(KvFormat::kBf16)

}  // namespace mlakv::cuda::sm90
