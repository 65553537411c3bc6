// The table of attention kernel paths (attention_path.h).
#include "cuda/api/attention_path.h"

#include "cuda/sm80/attention/launch.h"

namespace mlakv::cuda {
namespace {

constexpr AttentionKernels kSm80Kernels{"sm80", sm80::kAttentionRows, &sm80::configure_attention,
                                        &sm80::attention_ctas_per_sm, &sm80::launch_attention};

}  // namespace

AttentionPath select_attention_path(const MlaAttentionParams& /*p*/) { return AttentionPath::kSm80; }

const AttentionKernels& attention_kernels(AttentionPath path) {
  switch (path) {
    case AttentionPath::kSm80: return kSm80Kernels;
  }
  return kSm80Kernels;
}

}  // namespace mlakv::cuda
