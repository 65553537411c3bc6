// A small fixed thread pool for the CPU kernels. Owned by the caller and passed in
// explicitly (no global pool). parallel_for is not reentrant: one call at a time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mlakv {

class ThreadPool {
 public:
  // num_threads counts the calling thread; 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(item, thread) for every item in [0, n); `thread` in [0, num_threads())
  // identifies the executing thread (for per-thread scratch). Items are handed out
  // dynamically. Returns when all items are done.
  void parallel_for(int64_t n, const std::function<void(int64_t item, int thread)>& fn);

 private:
  void worker_loop(int index);
  void run_items(int thread);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t next_ = 0;
  int64_t generation_ = 0;
  int active_ = 0;
  bool stop_ = false;
};

}  // namespace mlakv
