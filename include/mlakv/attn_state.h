// The split-KV / context-parallel combine, written once for CPU and CUDA.
//
// A partial attention result over a subset of the tokens is the pair {o, lse}:
//   o   = sum_t p_t v_t / sum_t p_t   (normalized over the subset)
//   lse = log(sum_t exp(s_t))         (natural log)
// Two partials over disjoint subsets merge as
//   lse = log(exp(lse_a) + exp(lse_b)),  o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b.
// EMPTY-STATE RULE: a partial with no tokens has lse = -inf and o = 0; it contributes
// nothing, and merging only empty partials gives lse = -inf and o = 0.
#pragma once

#include <cmath>

#include "mlakv/numerics.h"  // MLAKV_HD

namespace mlakv {

struct MergeWeights {
  float lse;  // merged lse (-inf when every part is empty)
  float w_a;  // weight of part a's o
  float w_b;  // weight of part b's o
};

MLAKV_HD MergeWeights merge_weights(float lse_a, float lse_b) {
  const float m = lse_a > lse_b ? lse_a : lse_b;
  if (m == -INFINITY) return {-INFINITY, 0.0f, 0.0f};
  const float ea = expf(lse_a - m), eb = expf(lse_b - m);
  const float sum = ea + eb;
  return {m + logf(sum), ea / sum, eb / sum};
}

// Running merge of any number of partials, one output row of width `dim`.
struct AttnState {
  float lse = -INFINITY;

  // o (dim floats) holds the merged output so far; folds in {o_part, lse_part}.
  MLAKV_HD void merge(float* o, const float* o_part, float lse_part, int dim) {
    const MergeWeights w = merge_weights(lse, lse_part);
    if (w.lse == -INFINITY) {
      for (int i = 0; i < dim; ++i) o[i] = 0.0f;
    } else {
      // A zero weight drops its side entirely, so an empty partial's o is never read
      // (it may hold anything, NaN included).
      for (int i = 0; i < dim; ++i) {
        o[i] = (w.w_a != 0.0f ? w.w_a * o[i] : 0.0f) + (w.w_b != 0.0f ? w.w_b * o_part[i] : 0.0f);
      }
    }
    lse = w.lse;
  }
};

}  // namespace mlakv
