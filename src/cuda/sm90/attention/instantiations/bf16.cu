// The sm90 attention kernel for bf16 records (one format per file: the four
// instantiations compile in parallel; sm_90a only).
#include "cuda/sm90/attention/kernel.cuh"

namespace mlakv::cuda::sm90 {

template int configure<KvFormat::kBf16>(int record_bytes);
template int ctas_per_sm<KvFormat::kBf16>(int record_bytes);
template int launch<KvFormat::kBf16>(const kernels::AttentionParams& p, int row_blocks, void* stream);
template int binary_version<KvFormat::kBf16>();

}  // namespace mlakv::cuda::sm90
