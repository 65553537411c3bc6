// The issue rate of the wgmma shapes the sm90 kernels use (sm_90a only): one CTA per
// SM, one or two warpgroups each issuing 16 wgmma per group back to back on the same
// shared-memory operands (contents irrelevant), committing and waiting once per group;
// clock64 around 400 groups. Prints clocks per wgmma per warpgroup and MAC/clock/SM (the
// H100/H200 dense bf16 peak is 1024 x 2 = 2048 MAC/clock/SM). docs/perf.md quotes it for the
// question "which shapes run at the tensor peak when both operands come from shared
// memory" (m64n32k16 SS needs 192 B of shared memory per clock at peak; the SM gives 128).
//   usage: wgmma_rate          (exit 1 when no sm_90 device or a launch fails)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "cuda/sm80/attention/mma.cuh"
#include "cuda/sm90/attention/ptx.cuh"
#include "cuda/sm90/attention/ptx_nat.cuh"
#include "cuda/sm90/attention/ptx_rows.cuh"

namespace {

namespace ptx = mlakv::cuda::sm90::ptx;

enum Kind { kN32SS, kN32RS, kN64SS, kN256RS };
constexpr int kPerGroup = 16, kGroups = 400, kCtas = 132;
constexpr int kSmem = 200 * 1024;

template <int kKind, int kWgs>
__global__ void __launch_bounds__(256, 1) rate_kernel(long long* clocks) {
#if MLAKV_SM90_DEVICE
  extern __shared__ __align__(1024) uint8_t smem[];
  const int wg = threadIdx.x / 128;
  if (wg >= kWgs) return;
  const uint32_t base = (mlakv::cuda::ptx::smem_addr(smem) + 1023) & ~1023u;
  float d16[16], d32[32], d128[128];
  for (float& x : d16) x = 0.0f;
  for (float& x : d32) x = 0.0f;
  for (float& x : d128) x = 0.0f;
  ptx::wg_hold16(d16);
  ptx::wg_hold32(d32);
  ptx::wg_hold128(d128);
  const uint32_t a[4] = {0, 0, 0, 0};
  const uint64_t da = ptx::desc_sw128(base, 16, 1024), db = ptx::desc_sw128(base + 65536, 16, 1024);
  const uint64_t dv = ptx::desc_sw128(base + 65536, 4096, 1024);
  const long long t0 = clock64();
  for (int it = 0; it < kGroups; ++it) {
    ptx::wg_fence();
#pragma unroll
    for (int i = 0; i < kPerGroup; ++i) {
      if constexpr (kKind == kN32SS) ptx::wgmma_n32_bf16_ss(d16, da + 2 * i, db + 2 * i, 1);
      if constexpr (kKind == kN32RS) ptx::wgmma_n32_bf16_rs(d16, a, db + 2 * i, 1);
      if constexpr (kKind == kN64SS) ptx::wgmma_n64_bf16_ss(d32, da + 2 * i, db + 2 * i, 1);
      if constexpr (kKind == kN256RS) ptx::wgmma_n256_bf16_rs(d128, a, dv + 2 * i, 1);
    }
    ptx::wg_commit();
    ptx::wg_wait<0>();
  }
  const long long t1 = clock64();
  ptx::wg_hold16(d16);
  ptx::wg_hold32(d32);
  ptx::wg_hold128(d128);
  float sink = 0.0f;  // keeps the accumulators (and so the wgmma) alive
  for (float x : d16) sink += x;
  for (float x : d32) sink += x;
  for (float x : d128) sink += x;
  if (threadIdx.x % 128 == 0) clocks[blockIdx.x * 2 + wg] = (t1 - t0) + (sink == 1.0e30f ? 1 : 0);
#else
  (void)clocks;
#endif
}

template <int kKind, int kWgs>
bool run(const char* name, double macs) {
  long long* d = nullptr;
  if (cudaMalloc(&d, kCtas * 2 * sizeof(long long)) != cudaSuccess) return false;
  cudaFuncSetAttribute(rate_kernel<kKind, kWgs>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  cudaError_t e = cudaSuccess;
  for (int rep = 0; rep < 2 && e == cudaSuccess; ++rep) {  // the first launch warms up
    rate_kernel<kKind, kWgs><<<kCtas, 256, kSmem>>>(d);
    e = cudaDeviceSynchronize();
  }
  long long h[kCtas * 2] = {};
  if (e == cudaSuccess) e = cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
  cudaFree(d);
  if (e != cudaSuccess) {
    std::fprintf(stderr, "error: %s: %s\n", name, cudaGetErrorString(e));
    return false;
  }
  double worst = 0;  // the slowest CTA's warpgroup 0
  for (int b = 0; b < kCtas; ++b) worst = std::max(worst, static_cast<double>(h[2 * b]));
  const double clk = worst / (kGroups * kPerGroup);
  std::printf("%-16s warpgroups %d: %6.1f clocks per wgmma per warpgroup, %5.0f MAC/clock/SM\n", name, kWgs, clk,
              kWgs * macs / clk);
  return true;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9) {
    std::fprintf(stderr, "error: wgmma_rate needs an sm_90 device\n");
    return 1;
  }
  std::printf("%s, %d SMs; %d CTAs x %d groups x %d wgmma\n", prop.name, prop.multiProcessorCount, kCtas, kGroups, kPerGroup);
  bool ok = true;
  ok &= run<kN32SS, 1>("m64n32k16 SS", 64.0 * 32 * 16) && run<kN32SS, 2>("m64n32k16 SS", 64.0 * 32 * 16);
  ok &= run<kN32RS, 1>("m64n32k16 RS", 64.0 * 32 * 16) && run<kN32RS, 2>("m64n32k16 RS", 64.0 * 32 * 16);
  ok &= run<kN64SS, 1>("m64n64k16 SS", 64.0 * 64 * 16) && run<kN64SS, 2>("m64n64k16 SS", 64.0 * 64 * 16);
  ok &= run<kN256RS, 1>("m64n256k16 RS", 64.0 * 256 * 16) && run<kN256RS, 2>("m64n256k16 RS", 64.0 * 256 * 16);
  return ok ? 0 : 1;
}
