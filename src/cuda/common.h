// Host-side helpers of the CUDA API layer (.cc files): CUDA errors as Status.
#pragma once

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "mlakv/status.h"

namespace mlakv::cuda {

inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  const StatusCode code = e == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  return Status(code, fmt::format("{}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e)));
}

inline Status cuda_status(int e, const char* what) { return cuda_status(static_cast<cudaError_t>(e), what); }

}  // namespace mlakv::cuda

#define MLAKV_CUDA_RETURN_IF_ERROR(call) MLAKV_RETURN_IF_ERROR(::mlakv::cuda::cuda_status((call), #call))
