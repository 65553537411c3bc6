// Shared by the CPU benchmark binaries: the thread count (MLAKV_THREADS, default every
// hardware thread), one pool of that many threads, and the FMA ceiling measured once per
// process (src/cpu/roofline.h) that GEMM and attention figures are quoted against.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "mlakv/roofline.h"
#include "mlakv/thread_pool.h"

namespace mlakv::bench {

inline int threads() {
  static const int n = [] {
    const char* e = std::getenv("MLAKV_THREADS");
    return e ? std::max(1, std::atoi(e)) : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return n;
}

inline ThreadPool& pool() {
  static ThreadPool p(threads());
  return p;
}

// Single-thread FMA GFLOP/s, measured on first use (0.5 s).
inline double fma_ceiling() {
  static const double g = cpu::measure_fma_gflops(0.5);
  return g;
}

}  // namespace mlakv::bench
