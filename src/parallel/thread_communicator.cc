// In-process ranks: each collective is two rendezvous phases on a shared group.
//
//   phase A  every rank posts its arguments (or the error its own arguments raised) and
//            waits for all; then every rank checks the same posts, so all reach the same
//            verdict, and (if the verdict is OK) computes its result into private
//            scratch, reading the other ranks' inputs in place;
//   phase B  every rank waits until all have finished reading; only then are outputs
//            written (so in-place forms and aliasing between ranks are safe) and may
//            the next collective overwrite the posts.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "mlakv/parallel.h"
#include "parallel/collective_checks.h"

namespace mlakv {
namespace {

using parallel_internal::Collective;
using parallel_internal::collective_name;

struct Post {
  Collective op = Collective::kBarrier;
  const void* in = nullptr;
  DType dtype = DType::kF32;
  int64_t in_numel = 0;
  bool failed = false;
  std::string error;
};

class Group {
 public:
  Group(int n, std::chrono::milliseconds timeout)
      : posts(static_cast<std::size_t>(n)), n_(n), timeout_(timeout), present_(static_cast<std::size_t>(n), false) {}

  // Blocks until all n ranks have called wait() for this phase.
  Status wait(int rank, std::string_view what) {
    std::unique_lock<std::mutex> lk(mu_);
    if (broken_) return failed_precondition(fmt::format("{}: the rank group is broken: {}", what, reason_));
    const int64_t gen = generation_;
    present_[static_cast<std::size_t>(rank)] = true;
    if (++arrived_ == n_) {
      arrived_ = 0;
      std::fill(present_.begin(), present_.end(), false);
      ++generation_;
      cv_.notify_all();
      return Status::Ok();
    }
    const bool done = cv_.wait_for(lk, timeout_, [&] { return generation_ != gen || broken_; });
    if (generation_ != gen) return Status::Ok();
    if (!done) {
      std::vector<int> missing;
      for (int k = 0; k < n_; ++k) {
        if (!present_[static_cast<std::size_t>(k)]) missing.push_back(k);
      }
      broken_ = true;
      reason_ = fmt::format("{} on rank {} waited {} ms; rank(s) {} never arrived", what, rank, timeout_.count(),
                            fmt::join(missing, ", "));
      cv_.notify_all();
    }
    return failed_precondition(fmt::format("{}: the rank group is broken: {}", what, reason_));
  }

  std::vector<Post> posts;  // written by each rank before phase A, read by all after it

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  const std::chrono::milliseconds timeout_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  std::vector<bool> present_;
  bool broken_ = false;
  std::string reason_;
};

bool host_sum_ok(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kI32 || t == DType::kI64;
}

// scratch[i] = sum over ranks k (in rank order) of posts[k].in[offset + i], i < count.
template <class T>
void sum_ranks(const std::vector<Post>& posts, int64_t offset, int64_t count, void* scratch) {
  T* dst = static_cast<T*>(scratch);
  for (int64_t i = 0; i < count; ++i) {
    T acc = static_cast<const T*>(posts[0].in)[offset + i];
    for (std::size_t k = 1; k < posts.size(); ++k) acc = acc + static_cast<const T*>(posts[k].in)[offset + i];
    dst[i] = acc;
  }
}

void sum_dispatch(DType t, const std::vector<Post>& posts, int64_t offset, int64_t count, void* scratch) {
  switch (t) {
    case DType::kF32: return sum_ranks<float>(posts, offset, count, scratch);
    case DType::kF64: return sum_ranks<double>(posts, offset, count, scratch);
    case DType::kI32: return sum_ranks<uint32_t>(posts, offset, count, scratch);  // wraps like NCCL, no UB
    case DType::kI64: return sum_ranks<uint64_t>(posts, offset, count, scratch);
    default: return;  // rejected by check_collective
  }
}

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> group, int rank, int size)
      : group_(std::move(group)), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cpu(); }
  std::string name() const override { return fmt::format("thread {}/{}", rank_, size_); }

  Status all_gather(const TensorView& in, const TensorView& out) override {
    return run(Collective::kAllGather, in, out);
  }
  Status reduce_scatter_sum(const TensorView& in, const TensorView& out) override {
    return run(Collective::kReduceScatterSum, in, out);
  }
  Status all_reduce_sum(const TensorView& in, const TensorView& out) override {
    return run(Collective::kAllReduceSum, in, out);
  }
  Status barrier() override { return run(Collective::kBarrier, TensorView{}, TensorView{}); }

 private:
  Status run(Collective op, const TensorView& in, const TensorView& out) {
    const std::string_view what = collective_name(op);
    const Status local = op == Collective::kBarrier
                             ? Status::Ok()
                             : parallel_internal::check_collective(op, in, out, size_, device(), host_sum_ok);
    Post& mine = group_->posts[static_cast<std::size_t>(rank_)];
    mine = Post{op, in.data, in.dtype, op == Collective::kBarrier ? 0 : in.numel(), !local.ok(), local.message()};
    MLAKV_RETURN_IF_ERROR(group_->wait(rank_, what).with_context(name()));

    const Status verdict = local.ok() ? check_posts(op) : local;
    std::size_t out_bytes = 0;
    if (verdict.ok() && op != Collective::kBarrier) {
      const std::size_t es = dtype_size(in.dtype);
      out_bytes = static_cast<std::size_t>(out.numel()) * es;
      scratch_.resize(out_bytes);
      if (op == Collective::kAllGather) {
        const std::size_t chunk = static_cast<std::size_t>(in.numel()) * es;
        for (int k = 0; k < size_; ++k) {
          if (chunk != 0) std::memcpy(scratch_.data() + k * chunk, group_->posts[static_cast<std::size_t>(k)].in, chunk);
        }
      } else if (op == Collective::kReduceScatterSum) {
        sum_dispatch(in.dtype, group_->posts, rank_ * out.numel(), out.numel(), scratch_.data());
      } else {
        sum_dispatch(in.dtype, group_->posts, 0, out.numel(), scratch_.data());
      }
    }
    // Phase B even on a failed verdict: every rank reached the same one, and nobody may
    // move on while another still reads the posts.
    MLAKV_RETURN_IF_ERROR(group_->wait(rank_, what).with_context(name()));
    if (!verdict.ok()) return verdict;
    if (out_bytes != 0) std::memcpy(out.data, scratch_.data(), out_bytes);
    return Status::Ok();
  }

  // The same verdict on every rank: the first rank whose arguments failed, else the
  // first rank whose collective, dtype or element count differs from rank 0's.
  Status check_posts(Collective op) const {
    const auto& posts = group_->posts;
    const std::string_view what = collective_name(op);
    for (int k = 0; k < size_; ++k) {
      const Post& p = posts[static_cast<std::size_t>(k)];
      if (p.failed) return invalid_argument(fmt::format("{}: rank {}'s arguments are invalid: {}", what, k, p.error));
    }
    const Post& p0 = posts[0];
    for (int k = 1; k < size_; ++k) {
      const Post& p = posts[static_cast<std::size_t>(k)];
      if (p.op != p0.op) {
        return failed_precondition(fmt::format("{}: ranks disagree on the collective: rank 0 called {}, rank {} {}",
                                               what, collective_name(p0.op), k, collective_name(p.op)));
      }
      if (op != Collective::kBarrier && (p.dtype != p0.dtype || p.in_numel != p0.in_numel)) {
        return invalid_argument(fmt::format("{}: rank {} passed in = {} elements of {}, rank 0 {} elements of {}", what,
                                            k, p.in_numel, dtype_name(p.dtype), p0.in_numel, dtype_name(p0.dtype)));
      }
    }
    return Status::Ok();
  }

  std::shared_ptr<Group> group_;
  int rank_, size_;
  std::vector<uint8_t> scratch_;
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<Communicator>>> make_thread_communicators(int n, const ThreadCommOptions& opt) {
  if (n < 1 || n > 4096) return invalid_argument(fmt::format("make_thread_communicators: n must be in [1, 4096], got {}", n));
  if (opt.timeout.count() <= 0) {
    return invalid_argument(fmt::format("make_thread_communicators: timeout must be > 0 ms, got {}", opt.timeout.count()));
  }
  auto group = std::make_shared<Group>(n, opt.timeout);
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<ThreadCommunicator>(group, r, n));
  return comms;
}

}  // namespace mlakv
