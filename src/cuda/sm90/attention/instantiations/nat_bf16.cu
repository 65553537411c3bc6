// The natural-arrangement sm90 kernel for bf16 records (kernel_nat.cuh) and its host
// entry points (launch_nat.h); sm_90a only.
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/sm90/attention/kernel_nat.cuh"

namespace mlakv::cuda::sm90 {
namespace {

// cuTensorMapEncodeTiled from the driver the runtime loaded (null where it has none).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

int configure_attention_nat(KvFormat format, int /*record_bytes*/) {
  if (format != KvFormat::kBf16) return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(
      cudaFuncSetAttribute(attention_nat_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, nat::kSmemBytes));
}

int attention_nat_ctas_per_sm(KvFormat format, int record_bytes) {
  if (configure_attention_nat(format, record_bytes) != 0) return 0;
  int n = 0;
  const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_nat_kernel, nat::kThreads, nat::kSmemBytes);
  return e == cudaSuccess ? n : 0;
}

int launch_attention_nat(KvFormat format, const kernels::AttentionParams& kp, int row_blocks, void* stream) {
  if (format != KvFormat::kBf16 || kp.sparse || !nat_supports(format, kp.block_size, kp.num_slots) ||
      kp.record_bytes != kQkDim * 2) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return static_cast<int>(cudaErrorNotSupported);
  // The cache as a [num_slots, 576] bf16 matrix (rows record_bytes apart); boxes of 64
  // dims (128 B, the swizzle span) x min(block_size, 64) slots.
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kQkDim), static_cast<cuuint64_t>(kp.num_slots)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kp.record_bytes)};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(std::min(kp.block_size, kNatTokenTile))};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint8_t*>(kp.cache), dims, strides, box,
                            elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return static_cast<int>(cudaErrorInvalidValue);
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(kp.B), static_cast<unsigned>(kp.num_splits));
  attention_nat_kernel<<<grid, nat::kThreads, nat::kSmemBytes, static_cast<cudaStream_t>(stream)>>>(kp, map);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mlakv::cuda::sm90
