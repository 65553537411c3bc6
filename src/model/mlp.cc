// Dense SwiGLU MLP, MoE block, RMSNorm and biased linear of the model runner
// (src/model/model_impl.h; docs/reference.md section 11).
#include <algorithm>
#include <cmath>

#include "model/model_impl.h"
#include "model/moe_router.h"

namespace mlakv::model {

void linear_forward(const Linear& l, const float* x, int64_t T, float* y, ThreadPool* pool) {
  matmul_nt(x, T, l.in(), l.w, y, l.out(), pool);
  if (!l.bias.empty()) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < l.out(); ++n) y[t * l.out() + n] += l.bias[static_cast<std::size_t>(n)];
  }
}

void rms_norm_rows(const float* x, int64_t T, int64_t n, const std::vector<float>& weight, double eps, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * n;
    float* yr = y + t * n;
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i) {
      // transformers rounds x * rsqrt(var + eps) to the activation dtype, then multiplies
      // by the weight: two float32 roundings, kept here.
      const float normed = static_cast<float>(static_cast<double>(xr[i]) * r);
      yr[i] = weight[static_cast<std::size_t>(i)] * normed;
    }
  }
}

void mlp_forward(const Mlp& m, const float* x, int64_t T, int64_t D, float* y, ThreadPool* pool) {
  const int64_t I = m.gate.out();
  std::vector<float> g(static_cast<std::size_t>(T * I)), u(static_cast<std::size_t>(T * I));
  linear_forward(m.gate, x, T, g.data(), pool);
  linear_forward(m.up, x, T, u.data(), pool);
  for (std::size_t i = 0; i < g.size(); ++i) {
    // silu(g) = g * sigmoid(g) rounded to float, then times up (one more rounding).
    const double gv = g[i];
    const float act = static_cast<float>(gv / (1.0 + std::exp(-gv)));
    g[i] = act * u[i];
  }
  (void)D;
  linear_forward(m.down, g.data(), T, y, pool);
}

void moe_forward(const MoeWeights& m, const MoeRouting& r, const float* x, int64_t T, int64_t D, float* y,
                 ThreadPool* pool) {
  const int E = r.num_experts;
  std::vector<float> logits(static_cast<std::size_t>(T * E));
  matmul_nt(x, T, D, m.router, logits.data(), E, pool);
  // Tokens per expert, in token order, with the routing weight.
  std::vector<std::vector<std::pair<int64_t, float>>> by_expert(static_cast<std::size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const Route route = route_token(r, std::span<const float>(logits.data() + t * E, static_cast<std::size_t>(E)),
                                    m.bias);
    for (std::size_t j = 0; j < route.experts.size(); ++j)
      by_expert[static_cast<std::size_t>(route.experts[j])].emplace_back(t, route.weights[j]);
  }
  // transformers: final = 0; for each hit expert in ascending order, final[tokens] +=
  // expert(x[tokens]) * w (index_add_), then + shared_experts(x). Same order here.
  std::fill(y, y + T * D, 0.0f);
  std::vector<float> xe, ye;
  for (int e = 0; e < E; ++e) {
    const auto& toks = by_expert[static_cast<std::size_t>(e)];
    if (toks.empty()) continue;
    const int64_t n = static_cast<int64_t>(toks.size());
    xe.resize(static_cast<std::size_t>(n * D));
    ye.resize(static_cast<std::size_t>(n * D));
    for (int64_t i = 0; i < n; ++i) std::copy_n(x + toks[static_cast<std::size_t>(i)].first * D, D, xe.data() + i * D);
    mlp_forward(m.experts[static_cast<std::size_t>(e)], xe.data(), n, D, ye.data(), pool);
    for (int64_t i = 0; i < n; ++i) {
      const auto [t, w] = toks[static_cast<std::size_t>(i)];
      float* dst = y + t * D;
      const float* src = ye.data() + i * D;
      for (int64_t d = 0; d < D; ++d) dst[d] += src[d] * w;
    }
  }
  if (m.has_shared) {
    std::vector<float> sh(static_cast<std::size_t>(T * D));
    mlp_forward(m.shared, x, T, D, sh.data(), pool);
    for (int64_t i = 0; i < T * D; ++i) y[i] += sh[static_cast<std::size_t>(i)];
  }
}

}  // namespace mlakv::model
