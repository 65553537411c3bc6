// The many-row sm90 attention path (Hopper, sm_90a only; built with the sm90 path and
// listed as AttentionPath::kSm90Rows in api/attention_path.cc): 64 query rows per CTA,
// two consumer warpgroups of 32 rows each reading one shared record ring that one
// producer warp fills, the KV tile as the M dimension of wgmma m64n32k16. Routed where
// a request has at least 64 rows (dense: s_q * H >= 64; sparse: H >= 64, the rows of
// one query), so each KV tile is read once per 64 rows instead of once per 16. Same
// operation, params and split-KV output contract as the other paths (params/attention.h).
// kernel_rows.cuh holds the kernel; docs/design.md "Hopper kernels, many rows".
//
// Every entry returns a cudaError_t as an int (0 = success).
#pragma once

#include "cuda/params/attention.h"
#include "mlakv/formats.h"

namespace mlakv::cuda::sm90 {

inline constexpr int kRowsPerCta = 64;  // query rows per CTA of the many-row kernel
inline constexpr int kRowsMinRows = 64; // rows per request (dense s_q * H, sparse H) from which it is routed
inline constexpr int kRowsTokenTile = 64;  // tokens per consumer tile: split chunks are rounded up to it

// One format (kernel_rows.cuh, instantiated in instantiations/rows_<format>.cu): the
// dynamic shared-memory limit (plan time), CTAs per SM (0 on error), the launch on grid
// (row_blocks, B or B * s_q when sparse, num_splits).
template <KvFormat F>
int configure_rows(int record_bytes);
template <KvFormat F>
int ctas_per_sm_rows(int record_bytes);
template <KvFormat F>
int launch_rows(const kernels::AttentionParams& p, int row_blocks, void* stream);

// The same with the format chosen at run time (attention_rows.cc).
int configure_attention_rows(KvFormat format, int record_bytes);
int attention_rows_ctas_per_sm(KvFormat format, int record_bytes);
int launch_attention_rows(KvFormat format, const kernels::AttentionParams& p, int row_blocks, void* stream);

}  // namespace mlakv::cuda::sm90
