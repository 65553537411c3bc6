// The natural-arrangement sm90 kernel for nvfp4_ds_mla_fp8rope records (codes, scales
// and the e4m3 rope staged by TMA, converted in place by the converter warps) (kernel_nat.cuh) and its host entry
// points (launch_nat.h); sm_90a only.
#include "cuda/sm90/attention/kernel_nat.cuh"

namespace mlakv::cuda::sm90 {

MLAKV_NAT_DEFINE(KvFormat::kNvfp4DsMlaFp8Rope)

}  // namespace mlakv::cuda::sm90
