// Argument checks shared by every Communicator implementation: the tensor rules of
// include/mlakv/parallel.h, checked on one rank's own arguments.
#pragma once

#include <cstdint>
#include <string_view>

#include "mlakv/status.h"
#include "mlakv/tensor.h"

namespace mlakv::parallel_internal {

enum class Collective : int { kAllGather, kReduceScatterSum, kAllReduceSum, kBarrier };
std::string_view collective_name(Collective c);

// A tensor of a collective: on `device`, contiguous, non-null unless empty.
Status check_comm_tensor(const TensorView& t, std::string_view op, std::string_view arg, Device device);

// `stacked` holds `size` chunks of `chunk`'s shape: [size, *shape] or
// [size * shape[0], *shape[1:]]; same dtype.
Status check_stacked(const TensorView& chunk, std::string_view chunk_arg, const TensorView& stacked,
                     std::string_view stacked_arg, int size, std::string_view op);

// Both tensors of a collective, per its rule; sums also check the dtype
// (`sum_ok(dtype)` says which dtypes the implementation can add).
Status check_collective(Collective op, const TensorView& in, const TensorView& out, int size, Device device,
                        bool (*sum_ok)(DType));

}  // namespace mlakv::parallel_internal
