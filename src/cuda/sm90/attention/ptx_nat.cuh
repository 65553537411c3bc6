// PTX wrappers of the natural-arrangement sm90 kernel (kernel_nat.cuh): 2-D TMA loads
// (cp.async.bulk.tensor over a CUtensorMap), the combined arrive + expect_tx, named
// barrier arrive, shared-memory matrix descriptors of the 128-byte swizzled canonical
// layouts, and wgmma m64n64k16 (both operands from shared memory) / m64n256k16 (A from
// registers or shared memory, B MN-major). Companion of ptx.cuh / ptx_rows.cuh (fences,
// commit / wait, setmaxnreg there). Only compiled into the sm_90 device pass.
#pragma once

#include <cstdint>

#include "cuda/sm90/attention/ptx.cuh"

namespace mlakv::cuda::sm90::ptx {

#if MLAKV_SM90_DEVICE

// Arrives on `bar` and adds `bytes` to its expected transaction count, in one step.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Box (c0 = column in elements, c1 = row) of the 2-D tensor map at `tmap` (a
// __grid_constant__ kernel parameter) into shared memory at `dst`; completion is reported
// to `bar` as transaction bytes (the whole box).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void prefetch_tensormap(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}
// 2^x (MUFU.EX2, subnormal results flushed to zero: a softmax weight below 2^-126 is
// negligible next to the row maximum's weight 1 in every sum it enters).
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Matrix descriptor of a 128-byte swizzled canonical layout (bits 62-63 = 1): rows of 128
// B, 8-row groups 1024 B apart (sbo), atoms 1024-byte aligned (base offset 0). K-major
// (Q, K, P): lbo unused (1); a k16 step advances the start address by 32 B inside the
// atom. MN-major (V): lbo = bytes between 64-element column blocks, sbo = between
// 8-row (8-token) groups.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>(((addr & 0x3FFFFu) >> 4) | ((lbo >> 4) << 16)) |
         (static_cast<uint64_t>((sbo >> 4) | (1u << 30)) << 32);
}

#define MLAKV_NAT_D32                                                                                               \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),      \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),       \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),      \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define MLAKV_NAT_R32                                                                                               \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"

// d (64 x 64 f32) = A (64 x 16, K-major, descriptor) * B (16 x 64, K-major, descriptor) + (acc ? d : 0).
// Fragment of d: d[4j + 2h + e] = (row 16w + g + 8h, column 8j + 2c + e), j = 0..7.
__device__ __forceinline__ void wgmma_n64_bf16_ss(float (&d)[32], uint64_t da, uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MLAKV_NAT_R32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
               : MLAKV_NAT_D32
               : "l"(da), "l"(db), "r"(acc));
}

// d (64 x 64 f32) = A (64 x 16, the mma.sync A fragment of each warp's 16 rows, from
// registers) * B (16 x 64, K-major, descriptor) + (acc ? d : 0); fragment of d as above.
__device__ __forceinline__ void wgmma_n64_bf16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MLAKV_NAT_R32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
               : MLAKV_NAT_D32
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
#undef MLAKV_NAT_D32
#undef MLAKV_NAT_R32

#define MLAKV_NAT_D16                                                                                                \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),       \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define MLAKV_NAT_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"

// d (64 x 32 f32) = A (64 x 16, K-major, descriptor) * B (16 x 32, K-major, descriptor) + (acc ? d : 0).
// Fragment of d: d[4j + 2h + e] = (row 16w + g + 8h, column 8j + 2c + e), j = 0..3.
__device__ __forceinline__ void wgmma_n32_bf16_ss(float (&d)[16], uint64_t da, uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " MLAKV_NAT_R16 ", %16, %17, p, 1, 1, 0, 0;\n}\n"
               : MLAKV_NAT_D16
               : "l"(da), "l"(db), "r"(acc));
}
// The same with A from registers (the mma.sync A fragment of each warp's 16 rows).
__device__ __forceinline__ void wgmma_n32_bf16_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " MLAKV_NAT_R16 ", {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
               : MLAKV_NAT_D16
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
#undef MLAKV_NAT_D16
#undef MLAKV_NAT_R16

#define MLAKV_NAT_D128                                                                                               \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),      \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),       \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),      \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),      \
      "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),      \
      "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),      \
      "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),      \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),      \
      "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),      \
      "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),      \
      "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),      \
      "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),      \
      "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), \
      "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),            \
      "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]),            \
      "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),            \
      "+f"(d[126]), "+f"(d[127])
#define MLAKV_NAT_R128                                                                                              \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "   \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, "   \
  "%68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, "   \
  "%90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, "   \
  "%110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

// d (64 x 256 f32) = A (64 x 16) * B (16 x 256, MN-major: transpose bit set) with A
// from registers (the mma.sync A fragment of each warp's 16 rows). Fragment of d: d[4j + 2h + e] = (row 16w + g + 8h, column
// 8j + 2c + e), j = 0..31; + (acc ? d : 0).
__device__ __forceinline__ void wgmma_n256_bf16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " MLAKV_NAT_R128
               ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
               : MLAKV_NAT_D128
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
// The same with A (64 x 16, K-major) from shared memory (descriptor).
__device__ __forceinline__ void wgmma_n256_bf16_ss(float (&d)[128], uint64_t da, uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " MLAKV_NAT_R128
               ", %128, %129, p, 1, 1, 0, 1;\n}\n"
               : MLAKV_NAT_D128
               : "l"(da), "l"(db), "r"(acc));
}
#undef MLAKV_NAT_D128
#undef MLAKV_NAT_R128

#define MLAKV_NAT_D64 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define MLAKV_NAT_R64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// d (64 x 128 f32) = A (64 x 16) * B (16 x 128, MN-major: transpose bit set), A from
// registers (the mma.sync A fragment of each warp's 16 rows); d[4j + 2h + e] = (row 16w + g
// + 8h, column 8j + 2c + e), j = 0..15 (the first half of the n256 form's fragment); +
// (acc ? d : 0). 64 accumulator registers per instruction instead of 128: what the
// register target of a 512-thread CTA (128) can compile.
__device__ __forceinline__ void wgmma_n128_bf16_rs(float* d, const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " MLAKV_NAT_R64
               ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
               : MLAKV_NAT_D64
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
// The same with A (64 x 16, K-major) from shared memory (descriptor).
__device__ __forceinline__ void wgmma_n128_bf16_ss(float* d, uint64_t da, uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " MLAKV_NAT_R64
               ", %64, %65, p, 1, 1, 0, 1;\n}\n"
               : MLAKV_NAT_D64
               : "l"(da), "l"(db), "r"(acc));
}
#undef MLAKV_NAT_D64
#undef MLAKV_NAT_R64

// Keeps the compiler from moving accesses of a 64 x 256 accumulator across the async MMAs.
__device__ __forceinline__ void wg_hold128(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The same for a 64 x 32 accumulator.
__device__ __forceinline__ void wg_hold16(float (&d)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#endif  // MLAKV_SM90_DEVICE

}  // namespace mlakv::cuda::sm90::ptx
