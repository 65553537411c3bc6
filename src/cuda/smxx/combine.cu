// The split-KV combine of the attention op: each output row merges its num_splits
// partials {o, lse} from the workspace. Shared by every attention path.
//
// The rule is attn_state.h's (lse = log sum_k exp(lse_k), o = sum_k exp(lse_k - lse) o_k,
// a part of zero weight dropped unused, only empty parts -> o = 0, lse = -inf), computed
// in the order that keeps every load independent: the row's lse values (one load per
// thread) and the first batch of o_k (8 per thread, splits spread over up to 4 thread
// groups) all in flight together, then the lse maximum m, w_k = exp(lse_k - m) and
// o = sum_k w_k o_k / sum_k w_k, later batches (over 32 splits) loaded where w_k != 0:
// one L2 round trip before the sums up to 32 splits (docs/perf.md, thirteenth session).
// (The running merge of AttnState chains every load behind the previous merge: about one
// L2 round trip per split, which at 32-64 splits cost more than the attention kernel
// itself; docs/perf.md "tp".)
//
// On sm_90 the API layer launches this kernel as a programmatic dependent of the
// attention kernel (launch attribute programmaticStreamSerialization; the sm90 kernels
// trigger their dependents when they start), so its launch and CTA start-up overlap the
// attention's tail; griddepcontrol.wait below then waits for the attention grid to finish
// and its partials to be visible. Launched without the attribute it waits for nothing.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "cuda/smxx/launch.h"
#include "mlakv/formats.h"

namespace mlakv::cuda::kernels {
namespace {

constexpr int kGroupThreads = kLatentDim / 4;  // a group's thread t merges columns [4t, 4t+4)
static_assert(kGroupThreads == 128);
constexpr int kMaxGroups = 4;
constexpr int kBatch = 8;          // o loads a thread issues before it uses them
constexpr int kMaxSplits = 256;    // attention's num_splits limit (validate_mla_attention)

// One CTA per output row, `groups` x 128 threads: group j sums splits j, j + groups, ...
__global__ void __launch_bounds__(kGroupThreads* kMaxGroups) combine_kernel(const CombineParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  __shared__ float w_s[kMaxSplits];                  // lse_k, then w_k = exp(lse_k - m)
  __shared__ float4 acc_s[kMaxGroups - 1][kGroupThreads];
  __shared__ float red[kGroupThreads * kMaxGroups / 32];
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x, nthreads = blockDim.x, groups = nthreads / kGroupThreads;
  const int grp = tid / kGroupThreads, t = tid % kGroupThreads;
  const int splits = p.splits;
  const int h = static_cast<int>(row % p.H), i = static_cast<int>((row / p.H) % p.s_q);
  const int64_t b = row / (static_cast<int64_t>(p.H) * p.s_q);
  float* dst = p.out + b * p.o_s0 + i * p.o_s1 + h * p.o_s2;

  // The first batch of o_k loads goes out with the lse loads (the weights only decide
  // whether a part is used, not where it is): one L2 round trip before the sums instead
  // of two for up to kBatch x groups (32) splits. A part of zero weight is loaded but
  // never used (its bytes may be anything: empty splits write no o).
  float4 v0[kBatch];
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
    const int k = grp + j * groups;
    v0[j] = k < splits ? reinterpret_cast<const float4*>(p.part_o + (k * p.rows + row) * kLatentDim)[t]
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }

  // ---- the row's lse values and their maximum ----
  float m = -INFINITY;
  for (int k = tid; k < splits; k += nthreads) {
    const float l = p.part_lse[k * p.rows + row];
    w_s[k] = l;
    m = fmaxf(m, l);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  if ((tid & 31) == 0) red[tid >> 5] = m;
  __syncthreads();
  m = red[0];
  for (int wi = 1; wi < nthreads / 32; ++wi) m = fmaxf(m, red[wi]);
  if (m == -INFINITY) {  // only empty parts (or none): o = 0, lse = -inf
    if (grp == 0) {
      reinterpret_cast<float4*>(dst)[t] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (t == 0) p.lse[b * p.l_s0 + i * p.l_s1 + h * p.l_s2] = -INFINITY;
    }
    return;
  }
  for (int k = tid; k < splits; k += nthreads) w_s[k] = expf(w_s[k] - m);  // -inf -> 0
  __syncthreads();

  // ---- o = sum_k w_k o_k: batches of independent loads; zero weights never read ----
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int k0 = grp; k0 < splits; k0 += kBatch * groups) {
    float wv[kBatch];
    float4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int k = k0 + j * groups;
      wv[j] = k < splits ? w_s[k] : 0.0f;
      if (k0 == grp) {
        v[j] = v0[j];
      } else {
        v[j] = wv[j] != 0.0f ? reinterpret_cast<const float4*>(p.part_o + (k * p.rows + row) * kLatentDim)[t]
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (wv[j] != 0.0f) {
        acc.x = fmaf(wv[j], v[j].x, acc.x);
        acc.y = fmaf(wv[j], v[j].y, acc.y);
        acc.z = fmaf(wv[j], v[j].z, acc.z);
        acc.w = fmaf(wv[j], v[j].w, acc.w);
      }
    }
  }
  if (grp > 0) acc_s[grp - 1][t] = acc;
  __syncthreads();
  if (grp != 0) return;
  for (int g = 1; g < groups; ++g) {
    const float4 a = acc_s[g - 1][t];
    acc.x += a.x;
    acc.y += a.y;
    acc.z += a.z;
    acc.w += a.w;
  }
  float sum = 0.0f;  // the same order in every thread: one value per row
  for (int k = 0; k < splits; ++k) sum += w_s[k];
  const float inv = 1.0f / sum;  // sum >= 1: the maximum's own weight is exp(0)
  reinterpret_cast<float4*>(dst)[t] = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  if (t == 0) p.lse[b * p.l_s0 + i * p.l_s1 + h * p.l_s2] = m + logf(sum);
}

// Thread groups for `splits` parts: one batch of loads per thread where 4 groups suffice.
int combine_groups(int splits) { return std::clamp((splits + kBatch - 1) / kBatch, 1, kMaxGroups); }

}  // namespace

int launch_combine(const CombineParams& p, void* stream) {
  if (p.rows == 0) return 0;
  if (p.splits < 1 || p.splits > kMaxSplits) return static_cast<int>(cudaErrorInvalidValue);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(p.rows));
  cfg.blockDim = dim3(static_cast<unsigned>(kGroupThreads * combine_groups(p.splits)));
  cfg.dynamicSmemBytes = 0;
  cfg.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attr[1];
  if (p.programmatic) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  const cudaError_t e = cudaLaunchKernelEx(&cfg, combine_kernel, p);
  return static_cast<int>(e != cudaSuccess ? e : cudaGetLastError());
}

}  // namespace mlakv::cuda::kernels
