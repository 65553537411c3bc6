// Dense matrix products of the model runner: float32 activations times weights kept in
// their checkpoint dtype (f32, bf16 or f16), SIMD over Highway (compiled for every x86
// target, dispatched at run time) and threaded over output rows.
//
// Numerics: each weight element is widened exactly to float32 (bf16 and f16 are subsets
// of f32), products are fused multiply-adds in float32, accumulated per SIMD lane and
// then summed across lanes: the same arithmetic class as a float32 framework (torch
// on the CPU also blocks its sums), only the summation order differs.
#pragma once

#include <cstdint>

#include "mlakv/tensor.h"

namespace mlakv {
class ThreadPool;
}

namespace mlakv::model {

// A row-major weight matrix [rows, cols] with a row stride `ld` >= cols (in elements),
// dtype f32, bf16 or f16. Non-owning (a view into a mapped checkpoint or an owned buffer).
struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;

  // Rows [r0, r0 + n) as a matrix of the same stride.
  WeightMatrix row_range(int64_t r0, int64_t n) const;
  // Element (r, c) widened to float (for scalar tails and tests).
  float at(int64_t r, int64_t c) const;
  bool empty() const { return data == nullptr || rows == 0; }
};

// y[t, n] = sum_k x[t, k] * W[n, k] for t < T, n < W.rows, k < W.cols (the nn.Linear
// product x W^T). x rows are xs floats apart, y rows ys floats apart; y is overwritten.
// Threads (when `pool` is not null) take blocks of output rows, so each weight row is
// read once per block of 4 tokens.
void matmul_nt(const float* x, int64_t T, int64_t xs, const WeightMatrix& W, float* y, int64_t ys,
               ThreadPool* pool);

// y[t, n] = sum_k x[t, k] * B[k, n] for t < T, k < B.rows, n < B.cols (B used as is,
// [K, N]); single-threaded (callers parallelize over heads). y is overwritten.
void matmul_nn(const float* x, int64_t T, int64_t xs, const WeightMatrix& B, float* y, int64_t ys);

// The SIMD target the kernels dispatch to on this machine ("AVX3", "AVX2", ...).
const char* linear_simd_target();

}  // namespace mlakv::model
