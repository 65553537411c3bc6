// The many-row sm90 attention kernel for nvfp4_ds_mla_int8rope records (kernel_rows.cuh; one format per
// file so that the instantiations compile in parallel; sm_90a only).
#include "cuda/sm90/attention/kernel_rows.cuh"

namespace mlakv::cuda::sm90 {

template int configure_rows<KvFormat::kNvfp4DsMlaInt8Rope>(int record_bytes);
template int ctas_per_sm_rows<KvFormat::kNvfp4DsMlaInt8Rope>(int record_bytes);
template int launch_rows<KvFormat::kNvfp4DsMlaInt8Rope>(const kernels::AttentionParams& p, int row_blocks, void* stream);

}  // namespace mlakv::cuda::sm90
