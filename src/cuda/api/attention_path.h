// The dispatch point between attention kernel paths. Each path is a set of
// host-callable entry points (its launch.h); the API layer (attention_api.cc) asks
// select_attention_path which one serves a call and then calls only through
// attention_kernels(path), so a new architecture path plugs in here and nowhere else:
//   1. add its enumerator below and its AttentionKernels entry in attention_path.cc
//      (e.g. kSm90: src/cuda/sm90/attention/launch.h, built only for sm_90a);
//   2. return it from select_attention_path for the devices, formats and shapes it
//      serves. The choice must be a pure function of the params and the device, so
//      that plan_mla_attention and run_mla_attention (which both ask) agree;
//   3. keep the split-KV workspace layout of params/attention.h (part_o / part_lse),
//      so smxx's combine serves every path.
#pragma once

#include <cstdint>

#include "cuda/params/attention.h"
#include "mlakv/attention.h"
#include "mlakv/formats.h"

namespace mlakv::cuda {

enum class AttentionPath : uint8_t {
  kSm80 = 0,  // sm_80 and later: mma.sync + cp.async (src/cuda/sm80/attention)
};

struct AttentionKernels {
  const char* name;  // "sm80"
  int rows_per_cta;  // query rows one CTA covers (the plan's row_blocks unit)
  // Each returns a cudaError_t as int (ctas_per_sm: a CTA count, 0 on error).
  int (*configure)(KvFormat format, int record_bytes);
  int (*ctas_per_sm)(KvFormat format, int record_bytes);
  int (*launch)(KvFormat format, const kernels::AttentionParams& p, int row_blocks, void* stream);
};

// The path that serves p on p.cache.device. Today always kSm80 (every supported GPU
// runs it); an sm90 path would be chosen here for sm_90 devices and the formats and
// shapes it covers.
AttentionPath select_attention_path(const MlaAttentionParams& p);

const AttentionKernels& attention_kernels(AttentionPath path);

}  // namespace mlakv::cuda
