// The sm80 attention kernel's configuration: tile sizes, the per-format pipeline
// depth, and the shared-memory carve. Host code (the launch) and device code (the
// kernel) read the same constexprs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/sm80/attention/launch.h"
#include "mlakv/formats.h"

namespace mlakv::cuda::sm80 {

constexpr int kRows = kAttentionRows;  // query rows per CTA: one m16 MMA tile
constexpr int kTile = 32;        // tokens per tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kKStride = kQkDim + 8;  // bf16 per smem K/Q row: 1168 B = 292 words -> conflict-free ldmatrix
constexpr int kPStride = kTile + 8;   // bf16 per P row: 80 B = 20 words -> conflict-free ldmatrix
constexpr int kSStride = kTile + 2;   // f32 per partial-S row (even: float2 stores)
constexpr int kDimsPerWarp = kQkDim / kWarps;   // 144 = 9 k-steps of 16
constexpr int kColsPerWarp = kLatentDim / kWarps;  // 128 = 16 n-tiles of 8
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kDimsPerWarp % 16 == 0 && kColsPerWarp % 16 == 0);

// Pipeline depth: compressed formats stage raw records and dequantize them into the
// bf16 K tile; bf16 records are the K tile already, so they are copied straight into a
// double-buffered K tile (1 tile in flight). Staging depth is chosen per format so that
// three CTAs fit in an SM's 228 KB (nvfp4: two stages; fp8: one; bf16: two CTAs/SM).
__host__ __device__ constexpr bool direct_k(KvFormat f) { return f == KvFormat::kBf16; }
__host__ __device__ constexpr int staging_stages(KvFormat f) {
  return direct_k(f) ? 0 : (f == KvFormat::kFp8DsMla ? 1 : 2);
}
__host__ __device__ constexpr int issue_distance(KvFormat f) { return direct_k(f) ? 1 : staging_stages(f); }
__host__ __device__ constexpr bool uses_lut(KvFormat f) { return is_nvfp4_format(f); }
constexpr int kSlotRing = 4;  // tiles t .. t+3 (in use, in flight, issued, being fetched)
constexpr int kLutEntries = 16;  // nvfp4: one float per e2m1 code

struct Smem {
  uint16_t* k;        // K tile(s) (bf16, padded rows) [kbuf][kTile][kKStride]; Q is staged here first
  uint8_t* staging;   // compressed formats: [staging_stages][kTile][record_bytes]
  float* lut;         // nvfp4: e2m1 code -> value [kLutEntries]
  float* s_part;      // [kWarps][kRows][kSStride]
  uint16_t* p;        // [kRows][kPStride]
  float* red_max;     // [kWarps][kRows]
  float* red_sum;     // [kWarps][kRows]
  int64_t* slots;     // [kSlotRing][kTile]
  int32_t* row_vis;   // [kRows]
};

__host__ __device__ constexpr std::size_t align16(std::size_t x) { return (x + 15) & ~std::size_t{15}; }

__host__ __device__ inline std::size_t smem_bytes(KvFormat f, int record_bytes) {
  const std::size_t kbuf = direct_k(f) ? 2 : 1, stages = staging_stages(f);
  return align16(sizeof(uint16_t) * kbuf * kTile * kKStride) + align16(stages * kTile * record_bytes) +
         (uses_lut(f) ? align16(sizeof(float) * kLutEntries) : 0) + align16(sizeof(float) * kWarps * kRows * kSStride) +
         align16(sizeof(uint16_t) * kRows * kPStride) + 2 * align16(sizeof(float) * kWarps * kRows) +
         align16(sizeof(int64_t) * kSlotRing * kTile) + align16(sizeof(int32_t) * kRows);
}

template <KvFormat F>
__device__ inline Smem carve(uint8_t* base, int record_bytes) {
  Smem s;
  uint8_t* p = base;
  s.k = reinterpret_cast<uint16_t*>(p);
  p += align16(sizeof(uint16_t) * (direct_k(F) ? 2 : 1) * kTile * kKStride);
  s.staging = p;
  p += align16(staging_stages(F) * static_cast<std::size_t>(kTile) * record_bytes);
  s.lut = reinterpret_cast<float*>(p);
  p += uses_lut(F) ? align16(sizeof(float) * kLutEntries) : 0;
  s.s_part = reinterpret_cast<float*>(p);
  p += align16(sizeof(float) * kWarps * kRows * kSStride);
  s.p = reinterpret_cast<uint16_t*>(p);
  p += align16(sizeof(uint16_t) * kRows * kPStride);
  s.red_max = reinterpret_cast<float*>(p);
  p += align16(sizeof(float) * kWarps * kRows);
  s.red_sum = reinterpret_cast<float*>(p);
  p += align16(sizeof(float) * kWarps * kRows);
  s.slots = reinterpret_cast<int64_t*>(p);
  p += align16(sizeof(int64_t) * kSlotRing * kTile);
  s.row_vis = reinterpret_cast<int32_t*>(p);
  return s;
}

}  // namespace mlakv::cuda::sm80
