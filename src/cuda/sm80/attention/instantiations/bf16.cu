// The sm80 attention kernel for bf16 records (one format per file: the four
// instantiations compile in parallel).
#include "cuda/sm80/attention/kernel.cuh"

namespace mlakv::cuda::sm80 {

template int configure<KvFormat::kBf16>(int record_bytes);
template int ctas_per_sm<KvFormat::kBf16>(int record_bytes);
template int launch<KvFormat::kBf16>(const kernels::AttentionParams& p, int row_blocks, void* stream);

}  // namespace mlakv::cuda::sm80
