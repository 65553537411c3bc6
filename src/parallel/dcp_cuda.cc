// DCP combine on the device: NCCL collectives through the Communicator, the merge of
// the CUDA backend, one kernel for the reduce-scatter layout (include/mlakv/dcp.h).
#include <fmt/format.h>

#include <limits>

#include "cuda/common/status.h"
#include "mlakv/cuda.h"
#include "mlakv/dcp.h"
#include "mlakv/formats.h"
#include "parallel/dcp_kernels.h"

namespace mlakv::cuda {
namespace {

std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }

Status check_part(const TensorView& t, std::string_view name, std::initializer_list<int64_t> shape, Device dev) {
  MLAKV_RETURN_IF_ERROR(check_tensor(t, name, {{DType::kF32}, shape}, dev));
  if (!t.is_contiguous()) return invalid_argument(fmt::format("{}: must be contiguous", name));
  return Status::Ok();
}

}  // namespace

std::size_t dcp_combine_workspace_bytes(int dcp, int64_t rows, DcpCombine mode) {
  if (dcp < 1 || rows < 0) return 0;
  const std::size_t P = static_cast<std::size_t>(dcp), N = static_cast<std::size_t>(rows);
  const std::size_t lses = align256(P * N * sizeof(float));
  const std::size_t outs = mode == DcpCombine::kAllGather ? align256(P * N * kLatentDim * sizeof(float))
                                                          : align256(N * kLatentDim * sizeof(float));
  return lses + outs;
}

Status dcp_combine(Communicator& comm, const TensorView& out_part, const TensorView& lse_part, DcpCombine mode,
                   const TensorView& out, const TensorView& lse, void* workspace, std::size_t workspace_bytes) {
  // NCCL cannot tell the other ranks that this one gave up: every rank must pass the
  // same shapes (they do by construction: q and seqlens are replicated).
  const Device dev = comm.device();
  if (dev.type != DeviceType::kCuda) {
    return invalid_argument(fmt::format("cuda::dcp_combine: {} is a host communicator; use mlakv::dcp_combine", comm.name()));
  }
  const int P = comm.size(), r = comm.rank();
  MLAKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(dev.index));  // the kernels launch here
  MLAKV_RETURN_IF_ERROR(check_tensor(out_part, "out_part", {{DType::kF32}, {-1, -1, -1, kLatentDim}}, dev));
  const int64_t B = out_part.size(0), s_q = out_part.size(1), H = out_part.size(2);
  MLAKV_RETURN_IF_ERROR(check_part(out_part, "out_part", {B, s_q, H, kLatentDim}, dev));
  MLAKV_RETURN_IF_ERROR(check_part(lse_part, "lse_part", {B, s_q, H}, dev));
  if (mode == DcpCombine::kReduceScatterHeads && H % P != 0) {
    return invalid_argument(fmt::format("cuda::dcp_combine: reduce-scatter over heads needs H ({}) divisible by dcp ({})", H, P));
  }
  const int64_t Hl = mode == DcpCombine::kAllGather ? H : H / P;
  MLAKV_RETURN_IF_ERROR(check_part(out, "out", {B, s_q, Hl, kLatentDim}, dev));
  MLAKV_RETURN_IF_ERROR(check_part(lse, "lse", {B, s_q, Hl}, dev));
  const int64_t N = B * s_q * H;
  if (N > std::numeric_limits<int32_t>::max()) {
    return invalid_argument(fmt::format("cuda::dcp_combine: {} partial rows is more than one launch covers", N));
  }
  const std::size_t need = dcp_combine_workspace_bytes(P, N, mode);
  if (workspace_bytes < need || (need != 0 && workspace == nullptr)) {
    return invalid_argument(fmt::format("cuda::dcp_combine: workspace holds {} bytes, needs {}", workspace_bytes, need));
  }
  if (N == 0) return Status::Ok();
  auto* ws = static_cast<uint8_t*>(workspace);
  float* lses = reinterpret_cast<float*>(ws);
  float* outs = reinterpret_cast<float*>(ws + align256(static_cast<std::size_t>(P * N) * sizeof(float)));

  MLAKV_RETURN_IF_ERROR(comm.all_gather(TensorView::contiguous(lse_part.data, DType::kF32, {N}, dev),
                                        TensorView::contiguous(lses, DType::kF32, {P, N}, dev)));
  if (mode == DcpCombine::kAllGather) {
    MLAKV_RETURN_IF_ERROR(comm.all_gather(TensorView::contiguous(out_part.data, DType::kF32, {N, kLatentDim}, dev),
                                          TensorView::contiguous(outs, DType::kF32, {P, N, kLatentDim}, dev)));
    return merge_attn_states(TensorView::contiguous(outs, DType::kF32, {P, N, kLatentDim}, dev),
                             TensorView::contiguous(lses, DType::kF32, {P, N}, dev),
                             TensorView::contiguous(out.data, DType::kF32, {N, kLatentDim}, dev),
                             TensorView::contiguous(lse.data, DType::kF32, {N}, dev), comm.stream());
  }
  MLAKV_RETURN_IF_ERROR(cuda_status(
      kernels::launch_dcp_rescale_permute(out_part.ptr<const float>(), lses, P, r, N, static_cast<int>(H),
                                          static_cast<int>(Hl), kLatentDim, outs, lse.ptr<float>(), comm.stream()),
      "dcp_rescale_permute_kernel"));
  return comm.reduce_scatter_sum(TensorView::contiguous(outs, DType::kF32, {P, B * s_q * Hl, kLatentDim}, dev),
                                 TensorView::contiguous(out.data, DType::kF32, {B * s_q * Hl, kLatentDim}, dev));
}

}  // namespace mlakv::cuda
