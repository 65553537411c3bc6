// Communicator defaults, run_ranks and the argument checks every implementation shares.
#include <fmt/format.h>

#include <thread>

#include "mlakv/parallel.h"
#include "parallel/collective_checks.h"

namespace mlakv {

Status Communicator::set_stream(void* stream) {
  if (stream == nullptr) return Status::Ok();
  return invalid_argument(fmt::format("{}: set_stream: this communicator runs on the host and takes no stream", name()));
}

Status run_ranks(std::span<const std::unique_ptr<Communicator>> comms, const std::function<Status(Communicator&)>& fn) {
  if (comms.empty()) return invalid_argument("run_ranks: no communicators");
  for (std::size_t r = 0; r < comms.size(); ++r) {
    if (!comms[r]) return invalid_argument(fmt::format("run_ranks: communicator {} is null", r));
  }
  std::vector<Status> results(comms.size());
  std::vector<std::thread> threads;
  threads.reserve(comms.size());
  for (std::size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] { results[r] = fn(*comms[r]); });
  }
  for (auto& t : threads) t.join();
  for (std::size_t r = 0; r < comms.size(); ++r) {
    if (!results[r].ok()) return results[r].with_context(fmt::format("rank {}", r));
  }
  return Status::Ok();
}

namespace parallel_internal {

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::kAllGather: return "all_gather";
    case Collective::kReduceScatterSum: return "reduce_scatter_sum";
    case Collective::kAllReduceSum: return "all_reduce_sum";
    case Collective::kBarrier: return "barrier";
  }
  return "?";
}

Status check_comm_tensor(const TensorView& t, std::string_view op, std::string_view arg, Device device) {
  if (t.ndim < 1) return invalid_argument(fmt::format("{}: {} must have at least one dimension", op, arg));
  for (int d = 0; d < t.ndim; ++d) {
    if (t.size(d) < 0) return invalid_argument(fmt::format("{}: {} has a negative extent: {}", op, arg, t.shape_string()));
  }
  if (!(t.device == device)) {
    return invalid_argument(fmt::format("{}: {} must be on {}, got {}", op, arg, device_name(device), device_name(t.device)));
  }
  if (t.data == nullptr && t.numel() != 0) return invalid_argument(fmt::format("{}: {} has a null data pointer", op, arg));
  if (!t.is_contiguous()) {
    return invalid_argument(fmt::format("{}: {} must be contiguous, got shape {} with non-row-major strides", op, arg,
                                        t.shape_string()));
  }
  return Status::Ok();
}

Status check_stacked(const TensorView& chunk, std::string_view chunk_arg, const TensorView& stacked,
                     std::string_view stacked_arg, int size, std::string_view op) {
  if (stacked.dtype != chunk.dtype) {
    return invalid_argument(fmt::format("{}: {} has dtype {} but {} has {}", op, stacked_arg, dtype_name(stacked.dtype),
                                        chunk_arg, dtype_name(chunk.dtype)));
  }
  bool ok = false;
  if (stacked.ndim == chunk.ndim + 1 && stacked.size(0) == size) {  // [size, *shape]
    ok = true;
    for (int d = 0; d < chunk.ndim; ++d) ok = ok && stacked.size(d + 1) == chunk.size(d);
  }
  if (!ok && stacked.ndim == chunk.ndim && stacked.size(0) == static_cast<int64_t>(size) * chunk.size(0)) {
    ok = true;  // [size * shape[0], *shape[1:]]
    for (int d = 1; d < chunk.ndim; ++d) ok = ok && stacked.size(d) == chunk.size(d);
  }
  if (!ok) {
    return invalid_argument(fmt::format(
        "{}: {} must hold {} chunks of {}'s shape {} ([{}, ...] or [{} x dim 0, ...]), got {}", op, stacked_arg, size,
        chunk_arg, chunk.shape_string(), size, size, stacked.shape_string()));
  }
  return Status::Ok();
}

Status check_collective(Collective op, const TensorView& in, const TensorView& out, int size, Device device,
                        bool (*sum_ok)(DType)) {
  const std::string_view name = collective_name(op);
  MLAKV_RETURN_IF_ERROR(check_comm_tensor(in, name, "in", device));
  MLAKV_RETURN_IF_ERROR(check_comm_tensor(out, name, "out", device));
  switch (op) {
    case Collective::kAllGather:
      return check_stacked(in, "in", out, "out", size, name);
    case Collective::kReduceScatterSum:
      MLAKV_RETURN_IF_ERROR(check_stacked(out, "out", in, "in", size, name));
      break;
    case Collective::kAllReduceSum:
      if (in.dtype != out.dtype || in.ndim != out.ndim || in.shape != out.shape) {
        return invalid_argument(fmt::format("{}: out ({} {}) must match in ({} {})", name, dtype_name(out.dtype),
                                            out.shape_string(), dtype_name(in.dtype), in.shape_string()));
      }
      break;
    case Collective::kBarrier:
      return Status::Ok();
  }
  if (!sum_ok(in.dtype)) {
    return invalid_argument(fmt::format("{}: cannot add dtype {} here", name, dtype_name(in.dtype)));
  }
  return Status::Ok();
}

}  // namespace parallel_internal
}  // namespace mlakv
