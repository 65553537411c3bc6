// The sm90 attention path (Hopper, sm_90a only; cmake's mlakv_cuda_arch_only_sources
// builds it when MLAKV_CUDA_ARCHS holds 90a and defines MLAKV_CUDA_HAVE_ARCH_90a for
// api/attention_path.cc): a warp-specialized kernel, one producer warp issuing bulk
// copies (cp.async.bulk) of whole records into an mbarrier ring of shared-memory stages,
// four consumer warps: mma.sync through ldmatrix for bf16 records, one warpgroup of
// wgmma m64n16k16 with the dequantized KV tile as the M operand for the quantized
// formats (from registers, or from an f16 V tile in shared memory for the e2m1 formats'
// dense sets; two warpgroups sharing that tile for the 368-B records' sparse sets: the
// launch picks the variant per call). Same operation, params and
// output contract as the sm80 path (params/attention.h: split partials [splits][rows]
// [512] + [splits][rows] in the workspace, merged by smxx's combine; empty set -> o = 0,
// lse = -inf). docs/design.md "Hopper kernels" describes the design.
//
// Every entry but available/supports returns a cudaError_t as an int (0 = success).
#pragma once

#include "cuda/params/attention.h"
#include "mlakv/formats.h"

namespace mlakv::cuda::sm90 {

inline constexpr int kAttentionRows = 16;  // query rows per CTA (one m16 MMA tile), as on sm80
// Tokens a split's chunk is rounded up to (the kernel's tile: 32 for bf16's v7 kernel,
// 64 for the quantized formats' v8 kernel; kernel.cuh checks both).
inline constexpr int split_granule(KvFormat format) { return format == KvFormat::kBf16 ? 32 : 64; }
int split_granule_of(KvFormat format);  // the same, callable through a function pointer (attention.cc)

// True when this binary's sm90 kernels carry sm_90a code and `device` is a compute
// capability 9.0 GPU that runs them (cached per device; attention.cc).
bool available(int device);
// True for the record geometries and alignments the kernel handles: the five formats
// at L = 512, R = 64 (record_bytes = the format's), cache base 16-byte aligned (bulk
// copies move whole records).
bool supports(KvFormat format, int record_bytes, const void* cache);

// One format (defined in kernel.cuh, instantiated in instantiations/): raises the
// kernel's dynamic shared-memory limit (plan time);
template <KvFormat F>
int configure(int record_bytes);
// CTAs that fit on one SM (occupancy API; configures first); 0 on error;
template <KvFormat F>
int ctas_per_sm(int record_bytes);
// launches the kernel on grid (row_blocks, B or B * s_q when sparse, num_splits); the
// API layer launches smxx's combine after it when num_splits > 1;
template <KvFormat F>
int launch(const kernels::AttentionParams& p, int row_blocks, void* stream);
// the binary version of the kernel's code (90 when built for sm_90a), 0 on error.
template <KvFormat F>
int binary_version();

// The same with the format chosen at run time (attention.cc, through dispatch_format).
int configure_attention(KvFormat format, int record_bytes);
int attention_ctas_per_sm(KvFormat format, int record_bytes);
int launch_attention(KvFormat format, const kernels::AttentionParams& p, int row_blocks, void* stream);

}  // namespace mlakv::cuda::sm90
