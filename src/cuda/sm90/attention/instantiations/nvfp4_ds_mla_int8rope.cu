// The sm90 attention kernel for nvfp4_ds_mla_int8rope records (one format per file: the five
// instantiations compile in parallel; sm_90a only).
#include "cuda/sm90/attention/kernel.cuh"

namespace mlakv::cuda::sm90 {

template int configure<KvFormat::kNvfp4DsMlaInt8Rope>(int record_bytes);
template int ctas_per_sm<KvFormat::kNvfp4DsMlaInt8Rope>(int record_bytes);
template int launch<KvFormat::kNvfp4DsMlaInt8Rope>(const kernels::AttentionParams& p, int row_blocks, void* stream);
template int binary_version<KvFormat::kNvfp4DsMlaInt8Rope>();

}  // namespace mlakv::cuda::sm90
