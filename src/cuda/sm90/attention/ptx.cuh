// PTX wrappers for the Hopper (sm_90a) attention kernel: mbarriers, non-tensor bulk
// copies (cp.async.bulk, the TMA engine's 1-D form), proxy fences, named barriers, fp8
// conversions and the f16 mma.sync. Only compiled into the sm_90 device pass; the
// host and sm_80 passes see empty bodies (the kernel is never launched there).
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MLAKV_SM90_DEVICE 1
#else
#define MLAKV_SM90_DEVICE 0
#endif

namespace mlakv::cuda::sm90::ptx {

#if MLAKV_SM90_DEVICE

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the async proxy (the copy engine).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Adds `bytes` to the barrier's expected transaction count of the current phase.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Blocks until the phase with the given parity has completed (acquire).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "MLAKV_WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra MLAKV_WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Global -> shared bulk copy of `bytes` (multiple of 16, both addresses 16-B aligned);
// completion is reported to `bar` as transaction bytes.
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// Orders this thread's generic-proxy shared-memory writes before later async-proxy
// (copy engine) accesses of the same bytes.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Barrier `id` over `threads` threads (a multiple of 32); id 0 is __syncthreads.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Barrier `id` over `threads` threads that also ORs `v` over them: every thread gets the OR.
__device__ __forceinline__ bool named_barrier_or(int id, int threads, bool v) {
  uint32_t r;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, %3, p;\nselp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(r)
      : "r"(static_cast<uint32_t>(v)), "r"(id), "r"(threads)
      : "memory");
  return r != 0;
}

// The two e4m3 bytes in the low (or high) half of x -> f16x2 (low byte -> low half),
// exact (hardware on sm_89+); the half is picked by register selection, not a shift.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t x) {
  uint32_t r;
  asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(r) : "r"(x));
  return r;
}
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t x) {
  uint32_t r;
  asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(r) : "r"(x));
  return r;
}

// e2m1 nibbles J and J+4 of x (dim i in nibble i) -> f16x2 (value * 2^-14, exact, the
// subnormal codes included): magnitude bits to [11:9], sign to bit 15 of each half.
template <int J>
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t x) {
  constexpr int s_mag = 9 - 4 * J, s_sign = 12 - 4 * J;
  const uint32_t mag = s_mag >= 0 ? (x << s_mag) : (x >> -s_mag);
  return (mag & 0x0E000E00u) | ((x << s_sign) & 0x80008000u);
}

// e2m1 nibbles J and J+4 of x -> bf16x2 of value * 2^-126, exactly: the code's magnitude
// bits become the bf16 exponent's low bits and the mantissa's top bit (codes 2..7 normal,
// code 1 (0.5) the subnormal 2^-127, code 0 zero), the sign bit 15 of each half. One shift
// puts the magnitude at [8:6] and the sign at bit 9; adding 63 x (bit 9) moves the sign to
// bit 15 (s - 2^9 + 2^15, no carry out of the half).
template <int J>
__device__ __forceinline__ uint32_t e2m1_pair_bf16(uint32_t x) {
  constexpr int s_mag = 6 - 4 * J;
  const uint32_t t = s_mag >= 0 ? (x << s_mag) : (x >> -s_mag);
  return (t & 0x03C003C0u) + (t & 0x02000200u) * 63u;
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// Two int8 codes of a word -> f16x2 (exact: |code| <= 128), given the word with every
// byte's sign bit flipped (u = x ^ 0x80808080, the codes biased to 0..255): the bytes
// `sel` picks go under the f16 exponent byte 0x64 (1024 + u), then 1024 + 128 comes off.
// sel 0x4140: bytes 0, 1 (low, high half); 0x4342: bytes 2, 3.
template <uint32_t kSel>
__device__ __forceinline__ uint32_t biased_u8x2_to_f16x2(uint32_t u) {
  uint32_t r;
  asm("{\n.reg .b32 t;\nprmt.b32 t, %1, %2, %3;\nsub.rn.f16x2 %0, t, %4;\n}\n"
      : "=r"(r)
      : "r"(u), "r"(0x64646464u), "n"(kSel), "r"(0x64806480u));
  return r;
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// bf16x2 product, rounded to nearest (subnormal inputs and results kept: bf16 arithmetic
// has no flush-to-zero form).
__device__ __forceinline__ uint32_t hmul2_bf16(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// d += a (16x16) * b (16x8), f16 or bf16 inputs, fp32 accumulate; fragment layouts as in
// mma.cuh. Not volatile: pure register functions the compiler may schedule freely.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}


// ---- wgmma (sm_90a): warpgroup MMAs, A from registers, B from shared memory ----------
// B descriptors (K-major, no swizzle): core matrices of 8 rows x 16 B (rows 16 B
// apart); lbo = bytes between the two core matrices of a k16 step (K direction), sbo =
// bytes between 8-row groups (N direction); 16-B aligned. (Checked on the H200 against
// a host product: lbo 128 / sbo 256 for the layout of sm90 kernel.cuh's wg_b_offset.)
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of an accumulator across the async MMAs.
__device__ __forceinline__ void wg_hold(float (&d)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// d (64 x 16 f32, the warpgroup's accumulator fragment) = a (64 x 16, registers; warp
// w holds rows 16w..16w+15 as an mma.sync A fragment) * B (16 x 16 at `desc`) + (acc ? d : 0).
// Fragment of d: d[4j + 2h + e] = (row 16w + g + 8h, column 8j + 2c + e).
// The descriptor travels as two words (lo: start address >> 4 | lbo >> 4 << 16, hi:
// sbo >> 4) so that a k-step's descriptor is one 32-bit add to a hoisted base.
__device__ __forceinline__ uint32_t desc_lo(uint32_t addr, uint32_t lbo) { return ((addr & 0x3FFFFu) >> 4) | ((lbo >> 4) << 16); }
__device__ __forceinline__ uint32_t desc_hi(uint32_t sbo) { return sbo >> 4; }
__device__ __forceinline__ void wgmma_f16(float (&d)[8], const uint32_t (&a)[4], uint32_t dlo, uint32_t dhi, int acc) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 desc;\nsetp.ne.b32 p, %14, 0;\nmov.b64 desc, {%12, %13};\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, desc, "
      "p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(dlo), "r"(dhi), "r"(acc));
}
__device__ __forceinline__ void wgmma_bf16(float (&d)[8], const uint32_t (&a)[4], uint32_t dlo, uint32_t dhi, int acc) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 desc;\nsetp.ne.b32 p, %14, 0;\nmov.b64 desc, {%12, %13};\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, "
      "desc, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(dlo), "r"(dhi), "r"(acc));
}
// d = A (64 x 16 at descriptor a) * B (16 x 16 at descriptor b, K-major) + (acc ? d : 0);
// kTransA 0: A K-major (as B); 1: A M-major, no swizzle: element (m, k) at (m % 8) * 2 +
// (m / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo bytes (core matrices of 8 k-rows x 16 B of m).
template <int kTransA>
__device__ __forceinline__ void wgmma_f16_ss(float (&d)[8], uint32_t alo, uint32_t ahi, uint32_t blo, uint32_t bhi,
                                             int acc) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %12, 0;\nmov.b64 da, {%8, %9};\nmov.b64 db, {%10, %11};\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, da, db, p, 1, 1, %13, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(alo), "r"(ahi), "r"(blo), "r"(bhi), "r"(acc), "n"(kTransA));
}
__device__ __forceinline__ void sts128(uint8_t* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  *reinterpret_cast<uint4*>(p) = make_uint4(a, b, c, d);
}
// Four 8x8 b16 matrices stored transposed: lane l gives the address of memory row
// (l % 8) of matrix (l / 8); register j holds matrix j's fragment (row l / 4, columns
// 2 (l % 4), +1), which lands as column l / 4 of that memory row block.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// Two 8x8 b16 matrices stored transposed, as stmatrix_x4_trans's first two (lanes 0-15
// give the addresses).
__device__ __forceinline__ void stmatrix_x2_trans(uint32_t addr, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};\n" ::"r"(addr), "r"(r0), "r"(r1)
               : "memory");
}

// Programmatic dependent launch: lets the grid launched after this one on the stream
// with programmaticStreamSerialization (smxx's combine) start before this grid ends;
// that grid's griddepcontrol.wait still waits for this grid's completion and memory.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

#endif  // MLAKV_SM90_DEVICE

}  // namespace mlakv::cuda::sm90::ptx
