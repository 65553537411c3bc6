// The sm90 attention kernel for nvfp4_ds_mla records (one format per file: the four
// instantiations compile in parallel; sm_90a only).
#include "cuda/sm90/attention/kernel.cuh"

namespace mlakv::cuda::sm90 {

template int configure<KvFormat::kNvfp4DsMla>(int record_bytes);
template int ctas_per_sm<KvFormat::kNvfp4DsMla>(int record_bytes);
template int launch<KvFormat::kNvfp4DsMla>(const kernels::AttentionParams& p, int row_blocks, void* stream);
template int binary_version<KvFormat::kNvfp4DsMla>();

}  // namespace mlakv::cuda::sm90
