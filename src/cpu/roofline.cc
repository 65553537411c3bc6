// FMA peak loop (Highway, dispatched like the attention kernel) and memcpy bandwidth.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/roofline.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <chrono>
#include <cstring>
#include <memory>

#include "mlakv/roofline.h"

HWY_BEFORE_NAMESPACE();
namespace mlakv {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 12 independent accumulator chains hide the FMA latency (4-5 cycles x 2 pipes).
// Returns FLOPs performed; `sink` keeps the result alive.
double FmaLoop(int64_t iters, float* sink) {
  const hn::ScalableTag<float> d;
  // Distinct run-time start values: identical chains would let the compiler merge
  // them into one and report a multiple of the real peak.
  volatile float base = *sink;
  auto a0 = hn::Set(d, base + 1.0f), a1 = hn::Set(d, base + 2.0f), a2 = hn::Set(d, base + 3.0f),
       a3 = hn::Set(d, base + 4.0f), a4 = hn::Set(d, base + 5.0f), a5 = hn::Set(d, base + 6.0f),
       a6 = hn::Set(d, base + 7.0f), a7 = hn::Set(d, base + 8.0f), a8 = hn::Set(d, base + 9.0f),
       a9 = hn::Set(d, base + 10.0f), a10 = hn::Set(d, base + 11.0f), a11 = hn::Set(d, base + 12.0f);
  volatile float mv = 0.9999999f, cv = 1e-7f;
  const auto m = hn::Set(d, mv), c = hn::Set(d, cv);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = hn::MulAdd(a0, m, c); a1 = hn::MulAdd(a1, m, c); a2 = hn::MulAdd(a2, m, c); a3 = hn::MulAdd(a3, m, c);
    a4 = hn::MulAdd(a4, m, c); a5 = hn::MulAdd(a5, m, c); a6 = hn::MulAdd(a6, m, c); a7 = hn::MulAdd(a7, m, c);
    a8 = hn::MulAdd(a8, m, c); a9 = hn::MulAdd(a9, m, c); a10 = hn::MulAdd(a10, m, c); a11 = hn::MulAdd(a11, m, c);
  }
  const auto s = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                         hn::Add(hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)), hn::Add(hn::Add(a8, a9), hn::Add(a10, a11))));
  *sink = hn::GetLane(s);
  return 2.0 * 12.0 * static_cast<double>(hn::Lanes(d)) * static_cast<double>(iters);
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace mlakv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mlakv {
namespace cpu {

HWY_EXPORT(FmaLoop);

double measure_fma_gflops(double seconds) {
  using clock = std::chrono::steady_clock;
  float sink = 0;
  HWY_DYNAMIC_DISPATCH(FmaLoop)(1 << 20, &sink);  // warm up, spin the clock up
  double best = 0;
  int64_t iters = 1 << 22;
  const auto t_end = clock::now() + std::chrono::duration<double>(seconds);
  do {
    const auto t0 = clock::now();
    const double flops = HWY_DYNAMIC_DISPATCH(FmaLoop)(iters, &sink);
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    if (dt > 0) best = std::max(best, flops / dt * 1e-9);
  } while (clock::now() < t_end);
  if (sink == 12345.0f) best += 0;  // keep `sink` observable
  return best;
}

double measure_memcpy_gbps(std::size_t bytes, int reps) {
  using clock = std::chrono::steady_clock;
  std::unique_ptr<char[]> a(new char[bytes]), b(new char[bytes]);
  std::memset(a.get(), 1, bytes);
  std::memset(b.get(), 2, bytes);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clock::now();
    std::memcpy(b.get(), a.get(), bytes);
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(bytes) / dt * 1e-9);
    std::swap(a, b);
  }
  return best;
}

}  // namespace cpu
}  // namespace mlakv
#endif
