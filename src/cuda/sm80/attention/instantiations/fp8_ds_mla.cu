// The sm80 attention kernel for fp8_ds_mla records (one format per file: the four
// instantiations compile in parallel).
#include "cuda/sm80/attention/kernel.cuh"

namespace mlakv::cuda::sm80 {

template int configure<KvFormat::kFp8DsMla>(int record_bytes);
template int ctas_per_sm<KvFormat::kFp8DsMla>(int record_bytes);
template int launch<KvFormat::kFp8DsMla>(const kernels::AttentionParams& p, int row_blocks, void* stream);

}  // namespace mlakv::cuda::sm80
