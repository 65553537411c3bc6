// The one CUDA error policy of mlakv's host code: a cudaError_t becomes a Status that
// names the call, the CUDA error string and its enum name. Used by the CUDA API layer,
// the CUDA MLA layer (src/model), the NCCL communicator and DCP (src/parallel), and the
// GPU tests (tests/cuda, tests/parallel). Benchmarks include only public headers and
// keep their one fail-fast helper in bench/cuda_bench_util.h.
//
// Launchers (smxx/launch.h, sm80/attention/launch.h) return the launch's cudaError_t
// as an int so that their headers need no CUDA headers; cuda_status takes both.
#pragma once

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "mlakv/status.h"

namespace mlakv::cuda {

// Ok for cudaSuccess; kResourceExhausted for an allocation failure; kInternal otherwise.
// Message: "<what>: <cudaGetErrorString> (<cudaGetErrorName>)".
inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  const StatusCode code = e == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  return Status(code, fmt::format("{}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e)));
}

inline Status cuda_status(int e, const char* what) { return cuda_status(static_cast<cudaError_t>(e), what); }

}  // namespace mlakv::cuda

// The Status of one CUDA runtime call, named by its source text.
#define MLAKV_CUDA_STATUS(call) ::mlakv::cuda::cuda_status((call), #call)

// Returns that Status from the enclosing function when the call failed.
#define MLAKV_CUDA_RETURN_IF_ERROR(call) MLAKV_RETURN_IF_ERROR(MLAKV_CUDA_STATUS(call))
