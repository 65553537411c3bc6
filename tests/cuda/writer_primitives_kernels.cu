// The CUDA writers' fast element primitives (format/record_codec.h) against the scalar
// codec functions, both run on the device: the hardware e4m3 / bf16 conversions and the
// e2m1 rounding and the nvfp4 group-scale code over every float32, the e4m3 decode over
// every code, the division through the reciprocal over every e4m3
// divisor x two whole binades of dividends, and random divisors of the reciprocal path.
#include <cuda_runtime.h>

#include "format/record_codec.h"
#include "writer_primitives_kernels.h"

namespace mlakv::test {
namespace {

__device__ void note(unsigned long long* counts, unsigned long long* first, int k, uint32_t a, uint32_t b) {
  atomicAdd(counts + k, 1ull);
  atomicCAS(first + k, ~0ull, (static_cast<unsigned long long>(a) << 32) | b);
}

// Every float32 bit pattern x, in the low lane and (as x ^ sign) the high lane.
__global__ void every_float_kernel(unsigned long long* counts, unsigned long long* first) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t u = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < (1ull << 32); u += stride) {
    const uint32_t bits = static_cast<uint32_t>(u);
    const float x = f32_from_bits(bits), y = f32_from_bits(bits ^ 0x5A5A0000u);
    const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u || ((bits ^ 0x5A5A0000u) & 0x7FFFFFFFu) > 0x7F800000u;
    const uint32_t e = codec::e4m3x2_satfinite(x, y);
    const uint32_t e_want = f32_to_e4m3_satfinite(x) | (static_cast<uint32_t>(f32_to_e4m3_satfinite(y)) << 8);
    if (e != e_want) note(counts, first, nan ? kE4m3NaN : kE4m3, bits, e);
    const uint32_t b = codec::bf16x2_rn(x, y);
    const uint32_t b_want = f32_to_bf16(x) | (static_cast<uint32_t>(f32_to_bf16(y)) << 16);
    if (b != b_want) note(counts, first, nan ? kBf16NaN : kBf16, bits, b);
    if ((bits & 0x7FFFFFFFu) <= 0x7F800000u) {
      const uint32_t c = codec::e2m1_code(fabsf(x), x);
      if (c != f32_to_e2m1_satfinite(x)) note(counts, first, kE2m1, bits, c);
    }
    if (bits < 0x40E00000u) {  // [0, 7)
      const uint32_t c7 = f32_bits(codec::e2m1_code_below7_f(x)) - 0x4B000000u;
      if (c7 != f32_to_e2m1_satfinite(x)) note(counts, first, kE2m1Below7, bits, c7);
    }
    if (bits <= 0x7F800000u) {
      const uint32_t sc = codec::nvfp4_group_scale_code_fast(x);
      if (sc != codec::nvfp4_group_scale_code(x)) note(counts, first, kNvfp4ScaleCode, bits, sc);
    }
    if (bits < 256u && (bits & 0x7Fu) != 0x7Fu) {
      const float d = codec::e4m3_to_f32_fast(bits);
      if (f32_bits(d) != f32_bits(e4m3_to_f32(static_cast<uint8_t>(bits)))) note(counts, first, kE4m3Decode, bits, f32_bits(d));
    }
  }
}

// Every e4m3 divisor (blockIdx.y + 1) against every dividend in [1, 4).
__global__ void group_scale_division_kernel(unsigned long long* counts, unsigned long long* first) {
  const float b = e4m3_to_f32(static_cast<uint8_t>(blockIdx.y + 1));
  const float rb = codec::reciprocal_rn(b);
  const uint32_t stride = gridDim.x * blockDim.x;
  for (uint32_t u = 0x3F800000u + blockIdx.x * blockDim.x + threadIdx.x; u < 0x40800000u; u += stride) {
    const float a = f32_from_bits(u);
    const float q = codec::div_rn_by_e4m3(a, b, rb), q2 = codec::div_rn_by_reciprocal(a, b, rb);
    const uint32_t want = f32_bits(__fdiv_rn(a, b));
    if (f32_bits(q) != want || f32_bits(q2) != want) note(counts, first, kDivGroupScale, u, blockIdx.y + 1);
  }
}

__device__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Divisors s with random mantissas in [2^-60, 2^100] (blockIdx.y picks s), dividends over
// a whole binade of mantissas at a random exponent: where div_path picks the reciprocal
// path, |a| >= 2^-100 and the quotient is normal, it must be the IEEE quotient; elsewhere
// on that path below 2^-40.
__global__ void scale_division_kernel(unsigned long long* counts, unsigned long long* first) {
  const uint32_t hs = hash32(blockIdx.y * 7919ull + 1);
  const float s = ldexpf(f32_from_bits(0x3F800000u | (hs & 0x7FFFFFu)), static_cast<int>((hs >> 23) % 161) - 60);
  const float rs = codec::reciprocal_rn(s);
  const uint32_t stride = gridDim.x * blockDim.x;
  for (uint32_t m = blockIdx.x * blockDim.x + threadIdx.x; m < (1u << 23); m += stride) {
    const uint32_t h = hash32((static_cast<uint64_t>(blockIdx.y) << 32) | m);
    const int ea = static_cast<int>(h % 240) - 120;  // quotients from 2^-180 to 2^120
    const float a = ldexpf(f32_from_bits(0x3F800000u | m), ea + ilogbf(s));
    if (codec::div_path(s, a, rs) != codec::DivPath::kReciprocal) continue;
    const float q = codec::div_rn_by_reciprocal(a, s, rs), want = __fdiv_rn(a, s);
    const bool promised = a >= 7.88860905e-31f && want >= 1.17549435e-38f;
    if (promised ? f32_bits(q) != f32_bits(want) : !(fabsf(q) < 9.09494702e-13f)) {
      note(counts, first, kDivScale, f32_bits(a), f32_bits(s));
    }
  }
}

}  // namespace

int check_writer_primitives(unsigned long long* counts_host, unsigned long long* first_host) {
  unsigned long long* d = nullptr;
  if (cudaMalloc(&d, 2 * kNumPrimitiveChecks * sizeof(unsigned long long)) != cudaSuccess) return cudaGetLastError();
  cudaMemset(d, 0, kNumPrimitiveChecks * sizeof(unsigned long long));
  cudaMemset(d + kNumPrimitiveChecks, 0xFF, kNumPrimitiveChecks * sizeof(unsigned long long));
  every_float_kernel<<<132 * 16, 256>>>(d, d + kNumPrimitiveChecks);
  group_scale_division_kernel<<<dim3(64, kE4m3MaxCode), 256>>>(d, d + kNumPrimitiveChecks);
  scale_division_kernel<<<dim3(32, 512), 256>>>(d, d + kNumPrimitiveChecks);
  int err = static_cast<int>(cudaDeviceSynchronize());
  if (err == 0) {
    err = static_cast<int>(cudaMemcpy(counts_host, d, kNumPrimitiveChecks * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  }
  if (err == 0) {
    err = static_cast<int>(cudaMemcpy(first_host, d + kNumPrimitiveChecks, kNumPrimitiveChecks * sizeof(unsigned long long),
                                      cudaMemcpyDeviceToHost));
  }
  cudaFree(d);
  return err;
}

}  // namespace mlakv::test
