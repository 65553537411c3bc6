// Ranks and collectives for multi-GPU serving (docs/parallel.md).
//
//   Communicator               one rank of a group: all_gather, reduce_scatter (sum),
//                              all_reduce (sum), barrier.
//   make_thread_communicators  n in-process ranks on the host (threads as ranks): CI
//                              runs the split/merge logic of DCP and TP through it.
//   make_nccl_communicator(s)  one rank per GPU over NCCL (library mlakv_nccl, built
//                              when MLAKV_NCCL is on and NCCL is found).
//   tp_*                       tensor-parallel heads: slicing the absorbed weights per
//                              rank and the o_proj all-reduce.
// Decode context parallelism (the KV cache spread over ranks) is in dcp.h.
//
// Tensor rules for every collective: contiguous tensors of one dtype, on the
// communicator's device() (host memory for the thread communicator, the rank's GPU for
// NCCL); every rank passes the same shapes. "Stacked" tensors hold size() chunks, rank
// k's chunk k, either as [size, *shape] or [size * shape[0], *shape[1:]].
// Failures return a Status naming the collective, argument and rank; nothing aborts.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mlakv/status.h"
#include "mlakv/tensor.h"

namespace mlakv {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the tensors of every collective must live.
  virtual Device device() const = 0;
  virtual std::string name() const = 0;  // "thread 1/4", "nccl 1/4 cuda:1"

  // in [*shape] -> out stacked: out chunk k = rank k's `in`, on every rank. out may
  // contain `in` as its own chunk (NCCL's in-place form).
  virtual Status all_gather(const TensorView& in, const TensorView& out) = 0;
  // in stacked -> out [*shape]: out = sum over ranks k of rank k's chunk rank().
  virtual Status reduce_scatter_sum(const TensorView& in, const TensorView& out) = 0;
  // in, out [*shape]: out = sum over ranks of `in`, on every rank; out may equal in.
  virtual Status all_reduce_sum(const TensorView& in, const TensorView& out) = 0;
  // Returns once every rank has called barrier() (device communicators: and this
  // rank's stream has drained).
  virtual Status barrier() = 0;

  // Device communicators enqueue collectives on stream() (a cudaStream_t) and return
  // before they complete; set_stream() puts them on the caller's compute stream.
  // Host communicators complete each collective before returning, stream() is null
  // and set_stream accepts only null.
  virtual void* stream() const { return nullptr; }
  virtual Status set_stream(void* stream);
  // Waits for everything enqueued on stream(); a no-op on host communicators.
  virtual Status synchronize() { return Status::Ok(); }
};

// ---- in-process ranks --------------------------------------------------------------
struct ThreadCommOptions {
  // A collective that waits longer than this for the other ranks fails on every rank
  // that is waiting, and the group is broken from then on (every later call fails at
  // once) - a missing rank shows as an error, never as a hang.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

// n ranks sharing one rendezvous. Rank r's calls must come from one thread of its own
// (collectives block until all n ranks have arrived). Reductions add in rank order,
// ((x_0 + x_1) + x_2) + ..., in the tensor's dtype, so results are reproducible and,
// for values whose sums are exact, exact. Sums accept f32, f64, i32, i64; gathers any
// dtype. Arguments that differ between ranks (dtype, element count, collective) fail
// on every rank with a message naming the rank; a rank whose own arguments are wrong
// still joins the rendezvous, so the others fail too instead of waiting.
// Fails on n < 1 or n > 4096.
StatusOr<std::vector<std::unique_ptr<Communicator>>> make_thread_communicators(int n,
                                                                             const ThreadCommOptions& opt = {});

// Runs fn(comm) for every communicator on a thread of its own and waits for all.
// Returns OK when every rank returned OK, otherwise the lowest failing rank's Status
// prefixed with "rank r: ".
Status run_ranks(std::span<const std::unique_ptr<Communicator>> comms, const std::function<Status(Communicator&)>& fn);

// ---- NCCL (library mlakv_nccl; link it to use these) --------------------------------
// Never enables NVLink multicast (NVLS): when NCCL_NVLS_ENABLE is unset these set it
// to 0, and they refuse (kFailedPrecondition) when it is set to anything else.
// Collectives are checked on the calling rank only: NCCL cannot tell the other ranks
// that one gave up, so they would wait - every rank must pass the same shapes.
// set_stream() takes a stream of the rank's device. Destroy the communicators of a
// group concurrently, one thread (or process) per rank: NCCL may synchronise ranks
// while tearing down.
struct NcclId {
  std::array<char, 128> bytes{};  // an ncclUniqueId
};
// A fresh id (ncclGetUniqueId); rank 0 makes it and hands it to the others.
StatusOr<NcclId> nccl_unique_id();
// Rank `rank` of `size` on GPU `device` (ncclCommInitRank): every rank of the group
// calls this, each from its own thread or process, and the calls block until all have
// joined. The communicator owns a non-blocking stream on that device.
StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(const NcclId& id, int rank, int size, int device);
// One communicator per listed GPU from a single thread (ncclCommInitAll); rank i on
// devices[i]. The communicators may then be used from one thread each.
StatusOr<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(std::span<const int> devices);

// ---- tensor-parallel heads ----------------------------------------------------------
// Rank r of tp owns heads [r * H / tp, (r + 1) * H / tp) (H % tp == 0).
//
// Copies rank `rank`'s chunk of `in` along dimension `dim` into `out` (same dtype and
// device, CPU, out contiguous; in.size(dim) % tp == 0; out's shape is in's with
// size(dim) / tp). With the head dimension this slices
//   W_UK_T [H, P, L] and W_UV [H, L, V]         (dim 0),
//   q_b_proj viewed [H, P + R, q_lora]          (dim 0: the rank's output rows),
//   o_proj viewed [D, H, V]                     (dim 1: the rank's input columns),
//   q [B, s_q, H, 576]                          (dim 2).
Status tp_slice(const TensorView& in, int dim, int rank, int tp, const TensorView& out);

// The rank's share of out = o_proj . concat_h(o_lat[h] @ W_UV[h]):
//   o_lat   [T, Hr, L] f32   attention output of the rank's Hr heads
//   w_uv    [Hr, L, V] f32   the rank's slice of W_UV
//   o_proj  [D, Hr * V] f32  the rank's columns of o_proj
//   partial [T, D] f32       out: sum over the rank's heads only (no bias)
// Accumulates each output element in float64 and rounds once. CPU tensors.
Status tp_output_partial(const TensorView& o_lat, const TensorView& w_uv, const TensorView& o_proj,
                         const TensorView& partial);

// tp_output_partial, then comm.all_reduce_sum: every rank ends with out [T, D], the
// unsharded projection. o_lat's head count times comm.size() is the model's H.
Status tp_output_projection(Communicator& comm, const TensorView& o_lat, const TensorView& w_uv,
                            const TensorView& o_proj, const TensorView& out);

}  // namespace mlakv
