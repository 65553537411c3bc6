// The sm80 attention kernel for nvfp4_ds_mla_int8rope records (one format per file: the
// instantiations compile in parallel).
#include "cuda/sm80/attention/kernel.cuh"

namespace mlakv::cuda::sm80 {

template int configure<KvFormat::kNvfp4DsMlaInt8Rope>(int record_bytes);
template int ctas_per_sm<KvFormat::kNvfp4DsMlaInt8Rope>(int record_bytes);
template int launch<KvFormat::kNvfp4DsMlaInt8Rope>(const kernels::AttentionParams& p, int row_blocks, void* stream);

}  // namespace mlakv::cuda::sm80
