// The sm90 attention kernel for fp8_ds_mla records (one format per file: the four
// instantiations compile in parallel; sm_90a only).
#include "cuda/sm90/attention/kernel.cuh"

namespace mlakv::cuda::sm90 {

template int configure<KvFormat::kFp8DsMla>(int record_bytes);
template int ctas_per_sm<KvFormat::kFp8DsMla>(int record_bytes);
template int launch<KvFormat::kFp8DsMla>(const kernels::AttentionParams& p, int row_blocks, void* stream);
template int binary_version<KvFormat::kFp8DsMla>();

}  // namespace mlakv::cuda::sm90
