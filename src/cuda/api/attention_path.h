// The dispatch point between attention kernel paths. Each path is a set of
// host-callable entry points (its launch.h); the API layer (attention_api.cc) asks
// select_attention_path which one serves a call, stores it in the plan and then calls
// only through attention_kernels(path), so a new architecture path plugs in here and
// nowhere else:
//   1. add its enumerator to AttentionPath (include/mlakv/cuda.h) and its
//      AttentionKernels entry in attention_path.cc, guarded by the
//      MLAKV_CUDA_HAVE_ARCH_<arch> of its arch-only sources (cmake/Cuda.cmake);
//   2. let its `serves` accept the devices, formats and shapes it covers and give it
//      its place in select_attention_path's order. `serves` must be a pure function of
//      the params and the device, so that run_mla_attention can check a plan's path;
//   3. keep the split-KV workspace layout of params/attention.h (part_o / part_lse),
//      so smxx's combine serves every path.
#pragma once

#include <cstdint>

#include "cuda/params/attention.h"
#include "mlakv/attention.h"
#include "mlakv/cuda.h"
#include "mlakv/formats.h"
#include "mlakv/status.h"

namespace mlakv::cuda {

struct AttentionKernels {
  const char* name;  // "sm80", "sm90", "sm90_rows", "sm90_nat" (= attention_path_name, = the MLAKV_CUDA_ATTENTION value)
  int rows_per_cta;  // query rows one CTA covers (the plan's row_blocks unit)
  // True when this path can run p on p.cache.device (binary built for it, device,
  // format, record geometry and alignment).
  bool (*serves)(const MlaAttentionParams& p);
  // Each returns a cudaError_t as int (ctas_per_sm: a CTA count, 0 on error).
  int (*configure)(KvFormat format, int record_bytes);
  int (*ctas_per_sm)(KvFormat format, int record_bytes);
  int (*launch)(KvFormat format, const kernels::AttentionParams& p, int row_blocks, void* stream);
  // Tokens the kernel rounds a split's chunk up to (its token tile), for the split
  // policy (suggest_num_splits); null: 1 (chunks not rounded).
  int (*split_granule)(KvFormat format) = nullptr;
  // The kernel triggers programmatic dependents (griddepcontrol.launch_dependents), so
  // the combine after it is launched as one (smxx/combine.cu).
  bool programmatic_combine = false;
};

// The path that serves p on p.cache.device: kSm90Nat where it serves p (bf16, dense,
// >= 64 rows, block sizes its TMA boxes tile), else kSm90Rows where it serves p (requests
// of >= 64 rows), else kSm90 where it serves p, else kSm80 (every supported GPU runs it).
// MLAKV_CUDA_ATTENTION=sm80 forces kSm80; =sm90 requires the 16-row kSm90,
// =sm90_rows requires kSm90Rows and =sm90_nat kSm90Nat, each an InvalidArgument where it
// does not serve p;
// any other non-empty value but "auto" is an InvalidArgument too.
StatusOr<AttentionPath> select_attention_path(const MlaAttentionParams& p);

const AttentionKernels& attention_kernels(AttentionPath path);

}  // namespace mlakv::cuda
