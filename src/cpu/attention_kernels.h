// The SIMD inner loop of CPU attention (attention_kernels.cc, compiled once per
// instruction set by Highway and picked at run time). One call processes a "unit":
// a set of query rows that share one list of token slots.
#pragma once

#include <cstdint>

#include "mlakv/cache.h"

namespace mlakv::cpu {

inline constexpr int kTileTokens = 96;  // tokens dequantized per tile (multiple of 3: the QK micro-kernel)
inline constexpr int kMaxUnitRows = 256;

struct UnitArgs {
  const CacheLayerView* cache = nullptr;
  const int64_t* slots = nullptr;  // [n_tokens] slot ids, all valid
  int64_t n_tokens = 0;
  const float* q = nullptr;        // [rows, 576], already multiplied by softmax_scale
  int rows = 0;                    // <= kMaxUnitRows
  // [rows]: row r attends to the unit's first row_limit[r] tokens; nullptr = all.
  const int64_t* row_limit = nullptr;
  float* o = nullptr;              // [rows, 512] out: softmax-normalized output (0 if empty)
  float* lse = nullptr;            // [rows] out: natural-log sum of exp (-inf if empty)
};

void run_attention_unit(const UnitArgs& a);

// The instruction set the dispatcher picks on this machine ("AVX2", "AVX3", ...).
const char* attention_simd_target();

// The SIMD record reader run_attention_unit uses (the same dequantization, dispatched
// the same way), exposed for tests/record_reader_test.cc: n records of `cache`'s
// format and outer scale, record_bytes apart from `records`, -> rows [n, 576] f32
// [latent | rope] in natural dim order (the tile's nvfp4 permutation undone).
void dequantize_records_simd(const CacheLayerView& cache, const uint8_t* records, int64_t n, float* rows);

}  // namespace mlakv::cpu
