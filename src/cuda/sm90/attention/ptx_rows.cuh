// PTX wrappers of the many-row sm90 kernel (kernel_rows.cuh): wgmma m64n64k16 (f16 and
// bf16 inputs, A from registers, B from shared memory through a descriptor; fp32
// accumulators). Companion of ptx.cuh (descriptor words, fences, commit/wait there).
// Only compiled into the sm_90 device pass.
#pragma once

#include <cstdint>

#include "cuda/sm90/attention/ptx.cuh"

namespace mlakv::cuda::sm90::ptx {

#if MLAKV_SM90_DEVICE

// d (64 x 64 f32) = a (64 x 16, registers: warp w holds rows 16w..16w+15 as an mma.sync
// A fragment) * B (16 x 64 at the descriptor) + (acc ? d : 0). Fragment of d:
// d[4j + 2h + e] = (row 16w + g + 8h, column 8j + 2c + e), j = 0..7.
#define MLAKV_WGMMA_N64(NAME, TYPE)                                                                                  \
  __device__ __forceinline__ void NAME(float (&d)[32], const uint32_t (&a)[4], uint32_t dlo, uint32_t dhi, int acc) { \
    asm volatile(                                                                                                    \
        "{\n.reg .pred p;\n.reg .b64 desc;\nsetp.ne.b32 p, %38, 0;\nmov.b64 desc, {%36, %37};\n"                     \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE                                                  \
        " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "  \
        "%23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, desc, p, 1, 1, 0;\n}\n"                  \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),            \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),      \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),    \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])     \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(dlo), "r"(dhi), "r"(acc));                                \
  }
MLAKV_WGMMA_N64(wgmma_n64_f16, "f16")
MLAKV_WGMMA_N64(wgmma_n64_bf16, "bf16")
#undef MLAKV_WGMMA_N64

// Register budget of the executing warpgroup (every warp of it runs the same one): the
// producer warpgroup gives registers back, the consumer warpgroups take them.
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Keeps the compiler from moving accesses of a 64 x 64 accumulator across the async MMAs.
__device__ __forceinline__ void wg_hold32(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#endif  // MLAKV_SM90_DEVICE

}  // namespace mlakv::cuda::sm90::ptx
