// The sm80 attention path (sm_80 and later; built for every architecture in the list):
// mma.sync m16n8k16 bf16 tensor-core MMAs, cp.async record staging, the fused
// dequantization of reader.cuh. Host-callable entry points; the kernel is kernel.cuh,
// instantiated once per record format in instantiations/<format>.cu.
//
// Every entry returns a cudaError_t as an int (0 = success). The split-KV combine is
// not part of this path: the API layer launches smxx's combine after it.
#pragma once

#include "cuda/params/attention.h"
#include "mlakv/formats.h"

namespace mlakv::cuda::sm80 {

inline constexpr int kAttentionRows = 16;  // query rows per CTA (one m16 MMA tile)

// One format (defined in kernel.cuh, instantiated in instantiations/):
// raises the kernel's dynamic shared-memory limit (host call, at plan time, so that a
// run issues nothing but launches, e.g. under graph capture);
template <KvFormat F>
int configure(int record_bytes);
// CTAs that fit on one SM (occupancy API; configures first); 0 on error;
template <KvFormat F>
int ctas_per_sm(int record_bytes);
// launches the kernel on grid (row_blocks, B or B * s_q when sparse, num_splits).
template <KvFormat F>
int launch(const kernels::AttentionParams& p, int row_blocks, void* stream);

// The same with the format chosen at run time (attention.cc, through dispatch_format).
int configure_attention(KvFormat format, int record_bytes);
int attention_ctas_per_sm(KvFormat format, int record_bytes);
int launch_attention(KvFormat format, const kernels::AttentionParams& p, int row_blocks, void* stream);

}  // namespace mlakv::cuda::sm80
