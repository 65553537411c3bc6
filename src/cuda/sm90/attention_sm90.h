// The Hopper (sm_90a) attention kernel: same operation, parameters and output contract
// as the portable mma.sync kernel of src/cuda/attention.cu (kernels::AttentionParams,
// split partials [splits][rows][512] + [splits][rows] in the workspace, empty set ->
// o = 0, lse = -inf). docs/design.md "Hopper kernels" describes the design.
#pragma once

#include <cstdint>

#include "cuda/kernels.h"
#include "mlakv/formats.h"

namespace mlakv::cuda::sm90 {

// True when this binary holds the kernel's sm_90a code and `device` is a Hopper GPU
// that runs it (cached per device).
bool available(int device);
// True for the record geometries and alignments the kernel handles: the four formats
// at L = 512, R = 64, cache base 16-byte aligned (bulk copies move whole records).
bool supports(KvFormat format, int record_bytes, const void* cache);
// Raises the dynamic shared-memory limit (plan time). Returns a cudaError_t as int.
int configure(KvFormat format);
// CTAs of the kernel that fit on one SM (occupancy API); 0 on error.
int ctas_per_sm(KvFormat format);
// Query rows per CTA (the split-count arithmetic of suggest_num_splits uses it).
inline constexpr int kRowsPerCta = 16;
// Launches the kernel (grid: row blocks x requests-or-queries x splits) and, with
// splits, its combine kernel. Returns a cudaError_t as int.
int launch(KvFormat format, const kernels::AttentionParams& p, int row_blocks, void* stream);

}  // namespace mlakv::cuda::sm90
