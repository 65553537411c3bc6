// SIMD bodies of src/model/linear.h, compiled for every x86 target Highway supports and
// dispatched at run time (like src/cpu/attention_kernels.cc).
//
// matmul_nt micro-kernel: MT tokens x NR weight rows (MT, NR <= 4), MT*NR vector
// accumulators. Each k step loads NR weight vectors (widened once) and MT activation
// vectors and issues MT*NR FMAs, so a weight element read from memory serves 4 tokens.
// matmul_nn micro-kernel: MT tokens x 4 vectors of output columns; each k step loads 4
// widened B vectors and broadcasts MT activations.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/linear_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cstring>

#include "model/linear.h"
#include "mlakv/numerics.h"
#include "mlakv/thread_pool.h"

HWY_BEFORE_NAMESPACE();
namespace mlakv {
namespace model {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// f16 weights travel as this tag type (bf16 ones as plain uint16_t).
struct F16 {
  uint16_t bits;
};

// N consecutive weights widened to float.
template <class WT>
HWY_INLINE hn::Vec<DF> LoadW(DF d, const WT* p) {
  if constexpr (std::is_same_v<WT, float>) {
    return hn::LoadU(d, p);
  } else if constexpr (std::is_same_v<WT, uint16_t>) {  // bf16: the high half of a float
    const hn::RebindToUnsigned<DF> du;
    const hn::Rebind<uint16_t, DF> d16;
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
  } else {  // f16
    const hn::Rebind<hwy::float16_t, DF> d16;
    return hn::PromoteTo(d, hn::LoadU(d16, reinterpret_cast<const hwy::float16_t*>(p)));
  }
}

template <class WT>
HWY_INLINE float Scalar(const WT* p) {
  if constexpr (std::is_same_v<WT, float>) {
    return *p;
  } else if constexpr (std::is_same_v<WT, uint16_t>) {
    return bf16_to_f32(*p);
  } else {
    return f16_to_f32(p->bits);
  }
}

template <int MT, int NR, class WT>
HWY_INLINE void TileNt(const float* x, int64_t xs, const WT* w, int64_t ld, int64_t K, float* y, int64_t ys) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  hn::Vec<DF> acc[MT][NR];
  for (int t = 0; t < MT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = hn::Zero(d);
  int64_t k = 0;
  for (; k + N <= K; k += N) {
    hn::Vec<DF> wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = LoadW(d, w + r * ld + k);
    for (int t = 0; t < MT; ++t) {
      const auto xv = hn::LoadU(d, x + t * xs + k);
      for (int r = 0; r < NR; ++r) acc[t][r] = hn::MulAdd(xv, wv[r], acc[t][r]);
    }
  }
  for (int t = 0; t < MT; ++t) {
    for (int r = 0; r < NR; ++r) {
      float s = hn::GetLane(hn::SumOfLanes(d, acc[t][r]));
      for (int64_t kk = k; kk < K; ++kk) s += x[t * xs + kk] * Scalar(w + r * ld + kk);
      y[t * ys + r] = s;
    }
  }
}

template <int MT, class WT>
HWY_INLINE void RowsNt(const float* x, int64_t xs, const WT* w, int64_t ld, int64_t K, int64_t nrows, float* y,
                       int64_t ys) {
  int64_t r = 0;
  for (; r + 4 <= nrows; r += 4) TileNt<MT, 4>(x, xs, w + r * ld, ld, K, y + r, ys);
  for (; r < nrows; ++r) TileNt<MT, 1>(x, xs, w + r * ld, ld, K, y + r, ys);
}

// Rows [n0, n1) of W for every token.
template <class WT>
void BlockNt(const float* x, int64_t T, int64_t xs, const WT* w, int64_t ld, int64_t K, int64_t n0, int64_t n1,
             float* y, int64_t ys) {
  const WT* wb = w + n0 * ld;
  const int64_t nr = n1 - n0;
  int64_t t = 0;
  for (; t + 4 <= T; t += 4) RowsNt<4>(x + t * xs, xs, wb, ld, K, nr, y + t * ys + n0, ys);
  switch (T - t) {
    case 3: RowsNt<3>(x + t * xs, xs, wb, ld, K, nr, y + t * ys + n0, ys); break;
    case 2: RowsNt<2>(x + t * xs, xs, wb, ld, K, nr, y + t * ys + n0, ys); break;
    case 1: RowsNt<1>(x + t * xs, xs, wb, ld, K, nr, y + t * ys + n0, ys); break;
    default: break;
  }
}

void MatmulNtBlock(const float* x, int64_t T, int64_t xs, const WeightMatrix& W, int64_t n0, int64_t n1, float* y,
                   int64_t ys) {
  switch (W.dtype) {
    case DType::kF32:
      BlockNt(x, T, xs, static_cast<const float*>(W.data), W.ld, W.cols, n0, n1, y, ys);
      break;
    case DType::kBF16:
      BlockNt(x, T, xs, static_cast<const uint16_t*>(W.data), W.ld, W.cols, n0, n1, y, ys);
      break;
    default:
      BlockNt(x, T, xs, static_cast<const F16*>(W.data), W.ld, W.cols, n0, n1, y, ys);
      break;
  }
}

template <int MT, int NV, class WT>
HWY_INLINE void TileNn(const float* x, int64_t xs, const WT* b, int64_t ld, int64_t K, float* y, int64_t ys) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  hn::Vec<DF> acc[MT][NV];
  for (int t = 0; t < MT; ++t)
    for (int v = 0; v < NV; ++v) acc[t][v] = hn::Zero(d);
  for (int64_t k = 0; k < K; ++k) {
    hn::Vec<DF> bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = LoadW(d, b + k * ld + v * N);
    for (int t = 0; t < MT; ++t) {
      const auto xv = hn::Set(d, x[t * xs + k]);
      for (int v = 0; v < NV; ++v) acc[t][v] = hn::MulAdd(xv, bv[v], acc[t][v]);
    }
  }
  for (int t = 0; t < MT; ++t)
    for (int v = 0; v < NV; ++v) hn::StoreU(acc[t][v], d, y + t * ys + v * N);
}

template <int MT, class WT>
HWY_INLINE void ColsNn(const float* x, int64_t xs, const WT* b, int64_t ld, int64_t K, int64_t ncols, float* y,
                       int64_t ys) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t c = 0;
  for (; c + 4 * N <= ncols; c += 4 * N) TileNn<MT, 4>(x, xs, b + c, ld, K, y + c, ys);
  for (; c + N <= ncols; c += N) TileNn<MT, 1>(x, xs, b + c, ld, K, y + c, ys);
  for (; c < ncols; ++c) {  // scalar tail columns
    for (int t = 0; t < MT; ++t) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s += x[t * xs + k] * Scalar(b + k * ld + c);
      y[t * ys + c] = s;
    }
  }
}

template <class WT>
void RunNn(const float* x, int64_t T, int64_t xs, const WT* b, int64_t ld, int64_t K, int64_t ncols, float* y,
           int64_t ys) {
  int64_t t = 0;
  for (; t + 4 <= T; t += 4) ColsNn<4>(x + t * xs, xs, b, ld, K, ncols, y + t * ys, ys);
  switch (T - t) {
    case 3: ColsNn<3>(x + t * xs, xs, b, ld, K, ncols, y + t * ys, ys); break;
    case 2: ColsNn<2>(x + t * xs, xs, b, ld, K, ncols, y + t * ys, ys); break;
    case 1: ColsNn<1>(x + t * xs, xs, b, ld, K, ncols, y + t * ys, ys); break;
    default: break;
  }
}

void MatmulNn(const float* x, int64_t T, int64_t xs, const WeightMatrix& B, float* y, int64_t ys) {
  switch (B.dtype) {
    case DType::kF32:
      RunNn(x, T, xs, static_cast<const float*>(B.data), B.ld, B.rows, B.cols, y, ys);
      break;
    case DType::kBF16:
      RunNn(x, T, xs, static_cast<const uint16_t*>(B.data), B.ld, B.rows, B.cols, y, ys);
      break;
    default:
      RunNn(x, T, xs, static_cast<const F16*>(B.data), B.ld, B.rows, B.cols, y, ys);
      break;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace model
}  // namespace mlakv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mlakv {
namespace model {

HWY_EXPORT(MatmulNtBlock);
HWY_EXPORT(MatmulNn);

WeightMatrix WeightMatrix::row_range(int64_t r0, int64_t n) const {
  WeightMatrix m = *this;
  m.data = static_cast<const uint8_t*>(data) + r0 * ld * static_cast<int64_t>(dtype_size(dtype));
  m.rows = n;
  return m;
}

float WeightMatrix::at(int64_t r, int64_t c) const {
  const int64_t i = r * ld + c;
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
  }
}

void matmul_nt(const float* x, int64_t T, int64_t xs, const WeightMatrix& W, float* y, int64_t ys,
               ThreadPool* pool) {
  if (T <= 0 || W.rows <= 0) return;
  if (W.cols == 0) {
    for (int64_t t = 0; t < T; ++t) std::fill(y + t * ys, y + t * ys + W.rows, 0.0f);
    return;
  }
  // Blocks of rows: enough blocks to balance the threads, each at least 16 rows and
  // ~64 KiB of weights so the per-item overhead stays small.
  const int64_t row_bytes = W.cols * static_cast<int64_t>(dtype_size(W.dtype));
  int64_t rows_per_block = std::max<int64_t>(16, (int64_t{64} << 10) / std::max<int64_t>(row_bytes, 1));
  const int threads = pool == nullptr ? 1 : pool->num_threads();
  if (threads > 1) rows_per_block = std::min(rows_per_block, std::max<int64_t>(4, W.rows / (4 * threads)));
  rows_per_block = (rows_per_block + 3) / 4 * 4;
  const int64_t blocks = (W.rows + rows_per_block - 1) / rows_per_block;
  // Tokens in chunks of 64 (outermost): a chunk's activations (64 x K floats, 512 KiB at
  // K = 2048) stay in L2 while every weight row streams past once per chunk; sweeping all
  // tokens per row block instead re-reads the activations once per block.
  constexpr int64_t kTokenChunk = 64;
  for (int64_t t0 = 0; t0 < T; t0 += kTokenChunk) {
    const int64_t tn = std::min(kTokenChunk, T - t0);
    const float* xc = x + t0 * xs;
    float* yc = y + t0 * ys;
    auto run = [&](int64_t b) {
      const int64_t n0 = b * rows_per_block, n1 = std::min(W.rows, n0 + rows_per_block);
      HWY_DYNAMIC_DISPATCH(MatmulNtBlock)(xc, tn, xs, W, n0, n1, yc, ys);
    };
    if (pool == nullptr || threads == 1 || blocks == 1) {
      for (int64_t b = 0; b < blocks; ++b) run(b);
    } else {
      pool->parallel_for(blocks, [&](int64_t b, int) { run(b); });
    }
  }
}

void matmul_nn(const float* x, int64_t T, int64_t xs, const WeightMatrix& B, float* y, int64_t ys) {
  if (T <= 0 || B.cols <= 0) return;
  HWY_DYNAMIC_DISPATCH(MatmulNn)(x, T, xs, B, y, ys);
}

const char* linear_simd_target() {
  const int64_t t = hwy::SupportedTargets() & HWY_TARGETS;
  return hwy::TargetName(t & -t);
}

}  // namespace model
}  // namespace mlakv
#endif
