// Tensor-parallel heads: per-rank slices of the absorbed weights and the o_proj
// all-reduce (include/mlakv/parallel.h, docs/parallel.md).
#include <fmt/format.h>

#include <cstring>
#include <vector>

#include "cpu/ops/linear.h"
#include "mlakv/parallel.h"

namespace mlakv {

Status tp_slice(const TensorView& in, int dim, int rank, int tp, const TensorView& out) {
  if (tp < 1) return invalid_argument(fmt::format("tp_slice: tp must be >= 1, got {}", tp));
  if (rank < 0 || rank >= tp) return invalid_argument(fmt::format("tp_slice: rank {} is outside [0, {})", rank, tp));
  if (in.ndim < 1 || dim < 0 || dim >= in.ndim) {
    return invalid_argument(fmt::format("tp_slice: dim {} is not a dimension of in {}", dim, in.shape_string()));
  }
  if (in.device.type != DeviceType::kCpu || out.device.type != DeviceType::kCpu) {
    return invalid_argument(fmt::format("tp_slice: in ({}) and out ({}) must be cpu tensors", device_name(in.device),
                                        device_name(out.device)));
  }
  if (in.size(dim) % tp != 0) {
    return invalid_argument(fmt::format("tp_slice: in's dimension {} ({}) is not divisible by tp {}", dim, in.size(dim), tp));
  }
  if (out.dtype != in.dtype) {
    return invalid_argument(fmt::format("tp_slice: out dtype {} differs from in's {}", dtype_name(out.dtype), dtype_name(in.dtype)));
  }
  const int64_t chunk = in.size(dim) / tp;
  bool shape_ok = out.ndim == in.ndim;
  for (int d = 0; shape_ok && d < in.ndim; ++d) shape_ok = out.size(d) == (d == dim ? chunk : in.size(d));
  if (!shape_ok) {
    TensorView want = in;
    want.shape[static_cast<std::size_t>(dim)] = chunk;
    return invalid_argument(fmt::format("tp_slice: out must have shape {}, got {}", want.shape_string(), out.shape_string()));
  }
  for (int d = 0; d < in.ndim; ++d) {
    if (in.stride(d) < 0) return invalid_argument(fmt::format("tp_slice: in has a negative stride in dimension {}", d));
  }
  if (out.numel() == 0) return Status::Ok();
  if (in.data == nullptr || out.data == nullptr) return invalid_argument("tp_slice: null data pointer");
  if (!out.is_contiguous()) return invalid_argument("tp_slice: out must be contiguous");

  // Walk out in row-major order; in's offset adds rank * chunk along `dim`.
  const std::size_t es = dtype_size(in.dtype);
  const int last = in.ndim - 1;
  const int64_t row = out.size(last);
  const int64_t rows = out.numel() / row;
  std::vector<int64_t> idx(static_cast<std::size_t>(in.ndim), 0);
  auto* dst = static_cast<uint8_t*>(out.data);
  const auto* src = static_cast<const uint8_t*>(in.data);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = 0;
    for (int d = 0; d < last; ++d) off += (idx[static_cast<std::size_t>(d)] + (d == dim ? rank * chunk : 0)) * in.stride(d);
    if (last == dim) off += rank * chunk * in.stride(last);
    for (int64_t c = 0; c < row; ++c) {
      std::memcpy(dst, src + static_cast<std::size_t>(off + c * in.stride(last)) * es, es);
      dst += es;
    }
    for (int d = last - 1; d >= 0; --d) {  // next row index
      if (++idx[static_cast<std::size_t>(d)] < out.size(d)) break;
      idx[static_cast<std::size_t>(d)] = 0;
    }
  }
  return Status::Ok();
}

Status tp_output_partial(const TensorView& o_lat, const TensorView& w_uv, const TensorView& o_proj,
                         const TensorView& partial) {
  MLAKV_RETURN_IF_ERROR(
      check_tensor(o_lat, "o_lat", {{DType::kF32}, {-1, -1, -1}, Strides::kContiguous}, Device::cpu()));
  const int64_t T = o_lat.size(0), Hr = o_lat.size(1), L = o_lat.size(2);
  if (Hr < 1 || L < 1) return invalid_argument(fmt::format("o_lat: heads and L must be >= 1, got {}", o_lat.shape_string()));
  MLAKV_RETURN_IF_ERROR(check_tensor(w_uv, "w_uv", {{DType::kF32}, {Hr, L, -1}, Strides::kContiguous}, Device::cpu()));
  const int64_t V = w_uv.size(2);
  MLAKV_RETURN_IF_ERROR(
      check_tensor(o_proj, "o_proj", {{DType::kF32}, {-1, Hr * V}, Strides::kContiguous}, Device::cpu()));
  const int64_t D = o_proj.size(0);
  MLAKV_RETURN_IF_ERROR(check_tensor(partial, "partial", {{DType::kF32}, {T, D}, Strides::kContiguous}, Device::cpu()));
  cpu::mla_output_projection(o_lat.ptr<const float>(), w_uv.ptr<const float>(), o_proj.ptr<const float>(), nullptr, T,
                             Hr, L, V, D, partial.ptr<float>(), nullptr);
  return Status::Ok();
}

Status tp_output_projection(Communicator& comm, const TensorView& o_lat, const TensorView& w_uv,
                            const TensorView& o_proj, const TensorView& out) {
  const Status local = tp_output_partial(o_lat, w_uv, o_proj, out);
  // A rank with bad arguments still joins the all-reduce (with a tensor every rank's
  // collective rejects), so the others fail instead of waiting for it.
  const TensorView t = local.ok() ? out : TensorView{};
  const Status reduced = comm.all_reduce_sum(t, t);
  MLAKV_RETURN_IF_ERROR(local.with_context(fmt::format("tp rank {}/{}", comm.rank(), comm.size())));
  return reduced;
}

}  // namespace mlakv
