// The MLA layer forward on the GPU (include/mlakv/cuda_layer.h): cuBLAS SGEMMs for the
// projections and the per-head absorbed products, mlakv kernels for the rest.
//
// cuBLAS is column-major. A row-major [rows, cols] matrix is the column-major
// [cols, rows] one with the same leading dimension, so the row-major product
// C[T, N] = A[T, K] * W[N, K]^T (nn.Linear) is the column-major C' = W'^T A'.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "model/rope.h"
#include "cuda/common/status.h"
#include "cuda/smxx/launch.h"
#include "mlakv/allocator.h"
#include "mlakv/cuda.h"
#include "mlakv/cuda_layer.h"

namespace mlakv::cuda {
namespace {

Status cublas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return internal_error(fmt::format("{}: cuBLAS status {}", what, static_cast<int>(s)));
}

}  // namespace

struct DeviceMlaLayer::Impl {
  int device = 0;
  ModelConfig cfg;
  int D = 0, H = 0, QL = 0, L = 0, P = 0, R = 0, V = 0;
  bool has_q_a_bias = false, has_kv_a_bias = false, has_o_bias = false;
  std::unique_ptr<CachingAllocator> alloc;
  // persistent
  Allocation q_a_proj, q_a_bias, q_a_norm, q_b_proj, q_proj, kv_a_proj, kv_a_bias, kv_a_norm, w_uk_t, w_uv, o_proj, o_bias;
  cublasHandle_t blas = nullptr;
  rope::RopeTable rope;

  explicit Impl(rope::RopeTable r) : rope(std::move(r)) {}
  ~Impl() {
    if (blas != nullptr) cublasDestroy(blas);
  }

  StatusOr<Allocation> upload(const std::vector<float>& h) {
    if (h.empty()) return Allocation();
    MLAKV_ASSIGN_OR_RETURN(Allocation a, alloc->allocate(h.size() * sizeof(float)));
    MLAKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(a.data(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    return a;
  }

  // Row-major C[T, N] (ldc) = A[T, K] (lda) * W[N, K]^T.
  Status linear(const float* A, int64_t lda, const float* W, int N, int K, float* C, int64_t ldc, int T) {
    const float one = 1.0f, zero = 0.0f;
    return cublas_status(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, W, K, A, static_cast<int>(lda),
                                     &zero, C, static_cast<int>(ldc)),
                         "cublasSgemm");
  }
};

DeviceMlaLayer::DeviceMlaLayer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceMlaLayer::~DeviceMlaLayer() = default;
int DeviceMlaLayer::device() const { return impl_->device; }

StatusOr<std::unique_ptr<DeviceMlaLayer>> DeviceMlaLayer::upload(const MlaLayerWeights& w, const ModelConfig& cfg,
                                                                 int device) {
  MLAKV_RETURN_IF_ERROR(validate_mla_layer_weights(w, cfg));
  if (cfg.kv_lora_rank != kLatentDim || cfg.qk_rope_head_dim != kRopeDim) {
    return invalid_argument(fmt::format("the GPU layer needs latent {} + rope {}, model {} has {} + {}", kLatentDim,
                                        kRopeDim, cfg.name, cfg.kv_lora_rank, cfg.qk_rope_head_dim));
  }
  MLAKV_ASSIGN_OR_RETURN(rope::RopeTable table, rope::RopeTable::create(cfg.rope, cfg.qk_rope_head_dim));
  auto impl = std::make_unique<Impl>(std::move(table));
  Impl& m = *impl;
  m.device = device;
  m.cfg = cfg;
  m.D = w.hidden_size;
  m.H = w.num_heads;
  m.QL = w.q_lora_rank;
  m.L = w.kv_lora_rank;
  m.P = w.qk_nope_head_dim;
  m.R = w.qk_rope_head_dim;
  m.V = w.v_head_dim;
  MLAKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  m.alloc = std::make_unique<CachingAllocator>(make_cuda_backing(device));
  // Persistent weights first (docs/allocator.md: long-lived tensors before scratch).
  MLAKV_ASSIGN_OR_RETURN(m.q_a_proj, m.upload(w.q_a_proj));
  MLAKV_ASSIGN_OR_RETURN(m.q_a_bias, m.upload(w.q_a_bias));
  MLAKV_ASSIGN_OR_RETURN(m.q_a_norm, m.upload(w.q_a_norm));
  MLAKV_ASSIGN_OR_RETURN(m.q_b_proj, m.upload(w.q_b_proj));
  MLAKV_ASSIGN_OR_RETURN(m.q_proj, m.upload(w.q_proj));
  MLAKV_ASSIGN_OR_RETURN(m.kv_a_proj, m.upload(w.kv_a_proj));
  MLAKV_ASSIGN_OR_RETURN(m.kv_a_bias, m.upload(w.kv_a_bias));
  MLAKV_ASSIGN_OR_RETURN(m.kv_a_norm, m.upload(w.kv_a_norm));
  MLAKV_ASSIGN_OR_RETURN(m.w_uk_t, m.upload(w.w_uk_t));
  MLAKV_ASSIGN_OR_RETURN(m.w_uv, m.upload(w.w_uv));
  MLAKV_ASSIGN_OR_RETURN(m.o_proj, m.upload(w.o_proj));
  MLAKV_ASSIGN_OR_RETURN(m.o_bias, m.upload(w.o_bias));
  m.has_q_a_bias = !w.q_a_bias.empty();
  m.has_kv_a_bias = !w.kv_a_bias.empty();
  m.has_o_bias = !w.o_bias.empty();
  MLAKV_RETURN_IF_ERROR(cublas_status(cublasCreate(&m.blas), "cublasCreate"));
  // Exact float32 products (no TF32) so the layer tracks the CPU one.
  MLAKV_RETURN_IF_ERROR(cublas_status(cublasSetMathMode(m.blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
  return std::unique_ptr<DeviceMlaLayer>(new DeviceMlaLayer(std::move(impl)));
}

Status DeviceMlaLayer::forward(const CacheLayerView& cache, const TensorView& block_table, int32_t seqlen,
                               const TensorView& slots, const TensorView& hidden, std::span<const int64_t> positions,
                               const TensorView& out, int num_splits, void* stream) {
  Impl& m = *impl_;
  const Device dev = Device::cuda(m.device);
  MLAKV_RETURN_IF_ERROR(check_tensor(hidden, "hidden", {{DType::kF32}, {-1, m.D}}, dev));
  const int64_t T = hidden.size(0);
  if (T < 1) return invalid_argument("hidden: at least one token is needed");
  if (hidden.stride(0) != m.D) return invalid_argument("hidden: rows must be contiguous");
  MLAKV_RETURN_IF_ERROR(check_tensor(out, "out", {{DType::kF32}, {T, m.D}}, dev));
  if (out.stride(0) != m.D) return invalid_argument("out: rows must be contiguous");
  MLAKV_RETURN_IF_ERROR(check_tensor(slots, "slots", {{DType::kI64}, {T}}, dev));
  if (static_cast<int64_t>(positions.size()) != T) {
    return invalid_argument(fmt::format("positions: {} given for {} tokens", positions.size(), T));
  }
  for (std::size_t i = 0; i < positions.size(); ++i) {
    if (positions[i] < 0) return invalid_argument(fmt::format("positions[{}] = {} is negative", i, positions[i]));
  }
  if (seqlen < T) return invalid_argument(fmt::format("seqlen {} is smaller than the {} new tokens", seqlen, T));
  MLAKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  MLAKV_RETURN_IF_ERROR(cublas_status(cublasSetStream(m.blas, s), "cublasSetStream"));
  const int D = m.D, H = m.H, QL = m.QL, L = m.L, P = m.P, R = m.R, V = m.V;
  const int QW = H * (P + R);  // q row width

  // Scratch (after the weights; freed back to the cache at the end of the call).
  auto scratch = [&](std::size_t floats) { return m.alloc->allocate(floats * sizeof(float)); };
  MLAKV_ASSIGN_OR_RETURN(Allocation qa, scratch(static_cast<std::size_t>(T) * std::max(QL, 1)));
  MLAKV_ASSIGN_OR_RETURN(Allocation q, scratch(static_cast<std::size_t>(T) * QW));
  MLAKV_ASSIGN_OR_RETURN(Allocation kv, scratch(static_cast<std::size_t>(T) * (L + R)));
  MLAKV_ASSIGN_OR_RETURN(Allocation latent, scratch(static_cast<std::size_t>(T) * L));
  MLAKV_ASSIGN_OR_RETURN(Allocation krope, scratch(static_cast<std::size_t>(T) * R));
  MLAKV_ASSIGN_OR_RETURN(Allocation qabs, scratch(static_cast<std::size_t>(T) * H * kQkDim));
  MLAKV_ASSIGN_OR_RETURN(Allocation olat, scratch(static_cast<std::size_t>(T) * H * kLatentDim));
  MLAKV_ASSIGN_OR_RETURN(Allocation lse, scratch(static_cast<std::size_t>(T) * H));
  MLAKV_ASSIGN_OR_RETURN(Allocation ov, scratch(static_cast<std::size_t>(T) * H * V));
  MLAKV_ASSIGN_OR_RETURN(Allocation cs, scratch(static_cast<std::size_t>(T) * R));  // cos | sin
  MLAKV_ASSIGN_OR_RETURN(Allocation seq, m.alloc->allocate(sizeof(int32_t)));
  auto f = [](const Allocation& a) { return static_cast<float*>(a.data()); };
  const float* x = hidden.ptr<const float>();

  // cos / sin of every position, from the same float64 table as the CPU layer.
  std::vector<float> hcs(static_cast<std::size_t>(T) * R);
  {
    const bool long_f = m.rope.uses_long_factors(positions);
    std::vector<double> c(static_cast<std::size_t>(R / 2)), sn(static_cast<std::size_t>(R / 2));
    for (int64_t t = 0; t < T; ++t) {
      m.rope.cos_sin(positions[static_cast<std::size_t>(t)], long_f, c.data(), sn.data());
      for (int i = 0; i < R / 2; ++i) {
        hcs[static_cast<std::size_t>(t * (R / 2) + i)] = static_cast<float>(c[static_cast<std::size_t>(i)]);
        hcs[static_cast<std::size_t>(T * (R / 2) + t * (R / 2) + i)] = static_cast<float>(sn[static_cast<std::size_t>(i)]);
      }
    }
  }
  MLAKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(cs.data(), hcs.data(), hcs.size() * sizeof(float), cudaMemcpyHostToDevice, s));
  MLAKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(seq.data(), &seqlen, sizeof(int32_t), cudaMemcpyHostToDevice, s));

  // q path.
  if (QL > 0) {
    MLAKV_RETURN_IF_ERROR(m.linear(x, D, f(m.q_a_proj), QL, D, f(qa), QL, static_cast<int>(T)));
    if (m.has_q_a_bias) MLAKV_RETURN_IF_ERROR(cuda_status(kernels::launch_add_bias(f(qa), QL, f(m.q_a_bias), QL, T, s), "bias"));
    MLAKV_RETURN_IF_ERROR(cuda_status(kernels::launch_rmsnorm(f(qa), QL, QL, f(m.q_a_norm), static_cast<float>(m.cfg.q_norm_eps),
                                                              f(qa), QL, T, s),
                                      "rmsnorm(q_a)"));
    MLAKV_RETURN_IF_ERROR(m.linear(f(qa), QL, f(m.q_b_proj), QW, QL, f(q), QW, static_cast<int>(T)));
  } else {
    MLAKV_RETURN_IF_ERROR(m.linear(x, D, f(m.q_proj), QW, D, f(q), QW, static_cast<int>(T)));
  }
  // kv path.
  MLAKV_RETURN_IF_ERROR(m.linear(x, D, f(m.kv_a_proj), L + R, D, f(kv), L + R, static_cast<int>(T)));
  if (m.has_kv_a_bias) MLAKV_RETURN_IF_ERROR(cuda_status(kernels::launch_add_bias(f(kv), L + R, f(m.kv_a_bias), L + R, T, s), "bias"));
  MLAKV_RETURN_IF_ERROR(cuda_status(kernels::launch_rmsnorm(f(kv), L + R, L, f(m.kv_a_norm), static_cast<float>(m.cfg.kv_norm_eps),
                                                            f(latent), L, T, s),
                                    "rmsnorm(kv_a)"));
  // RoPE: k_pe -> krope [T, R]; q_pe -> qabs[t, h, 512:576].
  kernels::RopeArgs ra{};
  ra.cos = f(cs);
  ra.sin = f(cs) + T * (R / 2);
  ra.tokens = T;
  ra.rope_dim = R;
  ra.interleaved = m.rope.interleaved();
  ra.src = f(kv);
  ra.src_row_stride = L + R;
  ra.src_offset = L;
  ra.dst = f(krope);
  ra.dst_row_stride = R;
  ra.heads = 1;
  MLAKV_RETURN_IF_ERROR(cuda_status(kernels::launch_rope(ra, s), "rope(k)"));
  ra.src = f(q);
  ra.src_row_stride = QW;
  ra.src_head_stride = P + R;
  ra.src_offset = P;
  ra.dst = f(qabs);
  ra.dst_row_stride = static_cast<int64_t>(H) * kQkDim;
  ra.dst_head_stride = kQkDim;
  ra.dst_offset = kLatentDim;
  ra.heads = H;
  MLAKV_RETURN_IF_ERROR(cuda_status(kernels::launch_rope(ra, s), "rope(q)"));
  // q_lat[t, h] = q_nope[t, h] @ W_UK_T[h]: per head C[T, L] = A[T, P] B[P, L].
  {
    const float one = 1.0f, zero = 0.0f;
    MLAKV_RETURN_IF_ERROR(cublas_status(
        cublasSgemmStridedBatched(m.blas, CUBLAS_OP_N, CUBLAS_OP_N, L, static_cast<int>(T), P, &one, f(m.w_uk_t), L,
                                  static_cast<long long>(P) * L, f(q), QW, P + R, &zero, f(qabs), H * kQkDim, kQkDim, H),
        "absorb q"));
  }
  // The cache write (records read back by the attention: read-after-write).
  MLAKV_RETURN_IF_ERROR(write_cache(cache, slots, TensorView::contiguous(f(latent), DType::kF32, {T, L}, dev),
                                    TensorView::contiguous(f(krope), DType::kF32, {T, R}, dev), Fp8ScaleMode::kPow2, s));
  // Attention: one request, s_q = T, causal.
  MlaAttentionParams ap;
  ap.q = TensorView::contiguous(f(qabs), DType::kF32, {1, T, H, kQkDim}, dev);
  ap.cache = cache;
  ap.block_table = block_table;
  ap.seqlens = TensorView::contiguous(seq.data(), DType::kI32, {1}, dev);
  ap.softmax_scale = static_cast<float>(m.cfg.softmax_scale());
  ap.causal = true;
  ap.num_splits = num_splits;
  ap.out = TensorView::contiguous(f(olat), DType::kF32, {1, T, H, kLatentDim}, dev);
  ap.lse = TensorView::contiguous(f(lse), DType::kF32, {1, T, H}, dev);
  MLAKV_ASSIGN_OR_RETURN(AttentionPlan plan, plan_mla_attention(ap));
  Allocation ws;
  if (plan.workspace_bytes > 0) {
    MLAKV_ASSIGN_OR_RETURN(ws, m.alloc->allocate(plan.workspace_bytes));
  }
  MLAKV_RETURN_IF_ERROR(run_mla_attention(ap, plan, ws.data(), s));
  // o[t, h] = o_lat[t, h] @ W_UV[h]: per head C[T, V] = A[T, L] B[L, V]; then o_proj.
  {
    const float one = 1.0f, zero = 0.0f;
    MLAKV_RETURN_IF_ERROR(cublas_status(
        cublasSgemmStridedBatched(m.blas, CUBLAS_OP_N, CUBLAS_OP_N, V, static_cast<int>(T), L, &one, f(m.w_uv), V,
                                  static_cast<long long>(L) * V, f(olat), H * kLatentDim, kLatentDim, &zero, f(ov), H * V,
                                  V, H),
        "W_UV"));
  }
  MLAKV_RETURN_IF_ERROR(m.linear(f(ov), static_cast<int64_t>(H) * V, f(m.o_proj), D, H * V, out.ptr<float>(), D,
                                 static_cast<int>(T)));
  if (m.has_o_bias) MLAKV_RETURN_IF_ERROR(cuda_status(kernels::launch_add_bias(out.ptr<float>(), D, f(m.o_bias), D, T, s), "bias"));
  // Scratch returns to the allocator when this scope ends: finish the work first.
  MLAKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return Status::Ok();
}

}  // namespace mlakv::cuda
