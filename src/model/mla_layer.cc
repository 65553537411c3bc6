// The MLA attention layer on the CPU (include/mlakv/mla_layer.h, docs/layer.md).
#include "mlakv/mla_layer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/checked_math.h"
#include "cpu/ops/linear.h"
#include "format/load_float.h"
#include "model/rope.h"
#include "weights/absorb_pair.h"
#include "mlakv/attention.h"
#include "mlakv/numerics.h"
#include "mlakv/thread_pool.h"

namespace mlakv {
namespace {

constexpr int64_t kMaxDim = int64_t{1} << 17;  // any single dimension (D = 7168, H*(P+R) = 24576 today)

// An optional weight (a bias): its data, or nullptr when the checkpoint has none.
const float* data_or_null(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

// x / sqrt(mean(x^2) + eps) * weight, in float64, one rounding.
void rms_norm(const float* x, const std::vector<float>& weight, double eps, int64_t n, float* y) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i)
    y[i] = static_cast<float>(static_cast<double>(x[i]) * r * weight[static_cast<std::size_t>(i)]);
}

Status check_geometry(const ModelConfig& c) {
  MLAKV_RETURN_IF_ERROR(c.validate());
  const struct {
    const char* name;
    int v;
  } dims[] = {{"hidden_size", c.hidden_size},           {"num_attention_heads", c.num_heads},
              {"kv_lora_rank", c.kv_lora_rank},         {"qk_nope_head_dim", c.qk_nope_head_dim},
              {"qk_rope_head_dim", c.qk_rope_head_dim}, {"v_head_dim", c.v_head_dim}};
  for (const auto& d : dims) {
    if (d.v < 1 || d.v > kMaxDim) {
      return invalid_argument(
          fmt::format("{}: {} = {} is out of range [1, {}] for the MLA layer", c.name, d.name, d.v, kMaxDim));
    }
  }
  if (c.q_lora_rank < 0 || c.q_lora_rank > kMaxDim) {
    return invalid_argument(
        fmt::format("{}: q_lora_rank = {} is out of range [0, {}]", c.name, c.q_lora_rank, kMaxDim));
  }
  if (c.qk_rope_head_dim % 2 != 0) {
    return invalid_argument(fmt::format("{}: qk_rope_head_dim = {} must be even for RoPE", c.name, c.qk_rope_head_dim));
  }
  if (c.num_heads * static_cast<int64_t>(c.qk_head_dim() + c.v_head_dim) > kMaxDim * 4 ||
      c.num_heads * static_cast<int64_t>(c.qk_head_dim()) > kMaxDim) {
    return invalid_argument(fmt::format("{}: {} heads x {} dims is too large for the MLA layer", c.name, c.num_heads,
                                        c.qk_head_dim() + c.v_head_dim));
  }
  for (const auto& [name, eps] :
       {std::pair<const char*, double>{"q_norm_eps", c.q_norm_eps}, {"kv_norm_eps", c.kv_norm_eps}}) {
    if (!(eps >= 0.0) || !std::isfinite(eps))
      return invalid_argument(fmt::format("{}: {} must be finite and >= 0, got {}", c.name, name, eps));
  }
  const double scale = c.softmax_scale();
  if (!(scale > 0.0) || !std::isfinite(scale)) {
    return invalid_argument(fmt::format("{}: softmax scale must be finite and > 0, got {}", c.name, scale));
  }
  return Status::Ok();
}

Status check_matches(const MlaLayerWeights& w, const ModelConfig& c) {
  const MlaGeometry& g = w.geometry;
  if (g != c.geometry()) {
    return invalid_argument(fmt::format(
        "weights of layer {} (D {}, H {}, q_lora {}, L {}, P {}, R {}, V {}) do not match config {} (D {}, H {}, "
        "q_lora {}, L {}, P {}, R {}, V {})",
        w.layer, g.hidden_size, g.num_heads, g.q_lora_rank, g.kv_lora_rank, g.qk_nope_head_dim, g.qk_rope_head_dim,
        g.v_head_dim, c.name, c.hidden_size, c.num_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim,
        c.qk_rope_head_dim, c.v_head_dim));
  }
  const int64_t D = g.hidden_size, H = g.num_heads, QL = g.q_lora_rank, L = g.kv_lora_rank, P = g.qk_nope_head_dim,
                R = g.qk_rope_head_dim, V = g.v_head_dim;
  auto want = [](const std::vector<float>& v, int64_t n, bool optional, const char* what) -> Status {
    if (static_cast<int64_t>(v.size()) == n || (optional && v.empty())) return Status::Ok();
    return invalid_argument(fmt::format("MlaLayerWeights::{} has {} values, expected {}", what, v.size(), n));
  };
  if (QL > 0) {
    MLAKV_RETURN_IF_ERROR(want(w.q_a_proj, QL * D, false, "q_a_proj"));
    MLAKV_RETURN_IF_ERROR(want(w.q_a_bias, QL, true, "q_a_bias"));
    MLAKV_RETURN_IF_ERROR(want(w.q_a_norm, QL, false, "q_a_norm"));
    MLAKV_RETURN_IF_ERROR(want(w.q_b_proj, H * (P + R) * QL, false, "q_b_proj"));
  } else {
    MLAKV_RETURN_IF_ERROR(want(w.q_proj, H * (P + R) * D, false, "q_proj"));
  }
  MLAKV_RETURN_IF_ERROR(want(w.kv_a_proj, (L + R) * D, false, "kv_a_proj"));
  MLAKV_RETURN_IF_ERROR(want(w.kv_a_bias, L + R, true, "kv_a_bias"));
  MLAKV_RETURN_IF_ERROR(want(w.kv_a_norm, L, false, "kv_a_norm"));
  MLAKV_RETURN_IF_ERROR(want(w.w_uk_t, H * P * L, false, "w_uk_t"));
  MLAKV_RETURN_IF_ERROR(want(w.w_uv, H * L * V, false, "w_uv"));
  MLAKV_RETURN_IF_ERROR(want(w.o_proj, D * H * V, false, "o_proj"));
  MLAKV_RETURN_IF_ERROR(want(w.o_bias, D, true, "o_bias"));
  return Status::Ok();
}

// A norm weight or bias: [n] f32/bf16/f16. Absent: kNotFound unless `optional`
// (then `out` stays empty).
Status load_vector(const TensorSource& src, const std::string& name, int64_t n, bool optional,
                   std::vector<float>& out) {
  const std::optional<TensorView> t = src.find(name);
  if (!t) {
    if (optional) return Status::Ok();
    return not_found(fmt::format("{}: tensor '{}' is missing", src.describe(), name));
  }
  if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16) {
    return invalid_argument(
        fmt::format("{}: tensor '{}' must be f32, bf16 or f16, got {}", src.describe(), name, dtype_name(t->dtype)));
  }
  if (t->ndim != 1 || t->size(0) != n) {
    return invalid_argument(
        fmt::format("{}: tensor '{}' must have shape [{}], got {}", src.describe(), name, n, t->shape_string()));
  }
  out.resize(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float v = load_as_f32(t->data, t->dtype, i);
    if (!std::isfinite(v)) {
      out.clear();
      return data_loss(fmt::format("{}: tensor '{}' holds a non-finite value {} at [{}]", src.describe(), name, v, i));
    }
    out[static_cast<std::size_t>(i)] = v;
  }
  return Status::Ok();
}

// Largest dense projection load_linear builds (DeepSeek-V3's o_proj is 7168 x 16384 f32 =
// 448 MiB); anything larger is refused before allocating.
constexpr int64_t kMaxLinearBytes = int64_t{16} << 30;

Status load_linear(const TensorSource& src, const std::string& prefix, int64_t N, int64_t K, const MlaLoadOptions& opt,
                   std::vector<float>& out) {
  // The tensors present must justify the [N, K] f32 result before it is allocated: a
  // config.json geometry alone could otherwise ask for tens of GiB.
  const Status present = check_weight_storage(src, prefix, N, K, opt.quant);
  if (!present.ok()) return present.with_context(fmt::format("{}: loading '{}' as [{}, {}]", src.describe(), prefix, N, K));
  const std::optional<int64_t> bytes = checked::product({N, K, int64_t{sizeof(float)}});
  if (!bytes || *bytes > kMaxLinearBytes) {
    return resource_exhausted(fmt::format("{}: '{}' as [{}, {}] f32 exceeds the {}-byte limit for one projection",
                                          src.describe(), prefix, N, K, kMaxLinearBytes));
  }
  try {
    out.assign(static_cast<std::size_t>(N * K), 0.0f);
  } catch (const std::bad_alloc&) {
    return resource_exhausted(fmt::format("{}: cannot allocate {} bytes for '{}' [{}, {}]", src.describe(), *bytes,
                                          prefix, N, K));
  }
  const Status st =
      dequantize_weight(src, prefix, N, K, opt.quant, TensorView::contiguous(out.data(), DType::kF32, {N, K}));
  if (!st.ok()) {
    out.clear();
    return st.with_context(fmt::format("{}: loading '{}' as [{}, {}]", src.describe(), prefix, N, K));
  }
  return Status::Ok();
}

StatusOr<std::vector<int64_t>> read_positions(const TensorView& positions, int64_t T) {
  MLAKV_RETURN_IF_ERROR(check_tensor(positions, "positions", {{DType::kI64, DType::kI32}, {T}}, Device::cpu()));
  std::vector<int64_t> pos(static_cast<std::size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = positions.dtype == DType::kI64 ? positions.ptr<const int64_t>()[t * positions.stride(0)]
                                                     : positions.ptr<const int32_t>()[t * positions.stride(0)];
    if (p < 0 || p > (int64_t{1} << 40)) {
      return out_of_range(fmt::format("positions[{}] = {} is outside [0, 2^40]", t, p));
    }
    pos[static_cast<std::size_t>(t)] = p;
  }
  return pos;
}

bool overlaps(const TensorView& a, const TensorView& b) {
  const auto* a0 = static_cast<const uint8_t*>(a.data);
  const auto* b0 = static_cast<const uint8_t*>(b.data);
  const auto* a1 = a0 + a.numel() * static_cast<int64_t>(dtype_size(a.dtype));
  const auto* b1 = b0 + b.numel() * static_cast<int64_t>(dtype_size(b.dtype));
  return a0 < b1 && b0 < a1;
}

}  // namespace

Status validate_mla_layer_weights(const MlaLayerWeights& w, const ModelConfig& cfg) {
  MLAKV_RETURN_IF_ERROR(check_geometry(cfg));
  return check_matches(w, cfg);
}

std::size_t MlaLayerWeights::bytes() const {
  std::size_t n = 0;
  for (const auto* v : {&q_a_proj, &q_a_bias, &q_a_norm, &q_b_proj, &q_proj, &kv_a_proj, &kv_a_bias, &kv_a_norm,
                        &w_uk_t, &w_uv, &o_proj, &o_bias}) {
    n += v->size() * sizeof(float);
  }
  return n;
}

Status absorb_kv_b_proj(const std::vector<float>& kv_b, const MlaGeometry& geo, std::vector<float>& w_uk_t,
                        std::vector<float>& w_uv) {
  const int H = geo.num_heads, P = geo.qk_nope_head_dim, V = geo.v_head_dim, L = geo.kv_lora_rank;
  if (H < 1 || P < 1 || V < 1 || L < 1) {
    return invalid_argument(fmt::format("absorb_kv_b_proj: H {}, P {}, V {}, L {} must all be >= 1", H, P, V, L));
  }
  const std::size_t want = static_cast<std::size_t>(geo.kv_b_rows()) * static_cast<std::size_t>(L);
  if (kv_b.size() != want) {
    return invalid_argument(
        fmt::format("absorb_kv_b_proj: kv_b has {} values, expected H*(P+V)*L = {}", kv_b.size(), want));
  }
  w_uk_t.resize(static_cast<std::size_t>(H) * P * L);
  w_uv.resize(static_cast<std::size_t>(H) * L * V);
  split_kv_b_proj(kv_b.data(), DType::kF32, w_uk_t.data(), w_uv.data(), DType::kF32, geo);
  return Status::Ok();
}

namespace {
StatusOr<MlaLayerWeights> load_layer(const TensorSource& src, const ModelConfig& cfg, int layer,
                                     const MlaLoadOptions& opt);
}  // namespace

StatusOr<MlaLayerWeights> load_mla_layer(const TensorSource& src, const ModelConfig& cfg, int layer,
                                         const MlaLoadOptions& opt) {
  try {
    return load_layer(src, cfg, layer, opt);
  } catch (const std::bad_alloc&) {  // every size was checked against the tensors first; memory may still run out
    return resource_exhausted(fmt::format("{}: out of memory loading layer {}", cfg.name, layer));
  }
}

namespace {
StatusOr<MlaLayerWeights> load_layer(const TensorSource& src, const ModelConfig& cfg, int layer,
                                     const MlaLoadOptions& opt) {
  MLAKV_RETURN_IF_ERROR(check_geometry(cfg));
  if (layer < 0 || layer >= cfg.cache_layers()) {
    return out_of_range(fmt::format("{}: layer {} is outside [0, {}) ({} decoder + {} MTP layers)", cfg.name, layer,
                                    cfg.cache_layers(), cfg.num_layers, cfg.num_mtp_layers));
  }
  MlaLayerWeights w;
  w.layer = layer;
  w.geometry = cfg.geometry();
  const MlaGeometry& geo = w.geometry;
  const int64_t D = geo.hidden_size, H = geo.num_heads, QL = geo.q_lora_rank, L = geo.kv_lora_rank,
                P = geo.qk_nope_head_dim, R = geo.qk_rope_head_dim, V = geo.v_head_dim;
  const std::string pre = opt.prefix.empty() ? fmt::format("model.layers.{}.self_attn.", layer) : opt.prefix;

  if (QL > 0) {
    MLAKV_RETURN_IF_ERROR(load_linear(src, pre + "q_a_proj", QL, D, opt, w.q_a_proj));
    MLAKV_RETURN_IF_ERROR(load_vector(src, pre + "q_a_proj.bias", QL, true, w.q_a_bias));
    MLAKV_RETURN_IF_ERROR(load_vector(src, pre + "q_a_layernorm.weight", QL, false, w.q_a_norm));
    MLAKV_RETURN_IF_ERROR(load_linear(src, pre + "q_b_proj", H * (P + R), QL, opt, w.q_b_proj));
  } else {
    MLAKV_RETURN_IF_ERROR(load_linear(src, pre + "q_proj", H * (P + R), D, opt, w.q_proj));
  }
  MLAKV_RETURN_IF_ERROR(load_linear(src, pre + "kv_a_proj_with_mqa", L + R, D, opt, w.kv_a_proj));
  MLAKV_RETURN_IF_ERROR(load_vector(src, pre + "kv_a_proj_with_mqa.bias", L + R, true, w.kv_a_bias));
  MLAKV_RETURN_IF_ERROR(load_vector(src, pre + "kv_a_layernorm.weight", L, false, w.kv_a_norm));
  {
    // The dense kv_b_proj is transient: only the absorbed pair is kept.
    std::vector<float> kv_b;
    MLAKV_RETURN_IF_ERROR(load_linear(src, pre + "kv_b_proj", H * (P + V), L, opt, kv_b));
    MLAKV_RETURN_IF_ERROR(absorb_kv_b_proj(kv_b, w.geometry, w.w_uk_t, w.w_uv));
  }
  MLAKV_RETURN_IF_ERROR(load_linear(src, pre + "o_proj", D, H * V, opt, w.o_proj));
  MLAKV_RETURN_IF_ERROR(load_vector(src, pre + "o_proj.bias", D, true, w.o_bias));
  return w;
}
}  // namespace

Status mla_layer_project(const MlaLayerWeights& w, const ModelConfig& cfg, const TensorView& hidden,
                         const TensorView& positions, const TensorView& q, const TensorView& latent,
                         const TensorView& rope, ThreadPool* pool) {
  MLAKV_RETURN_IF_ERROR(check_geometry(cfg));
  MLAKV_RETURN_IF_ERROR(check_matches(w, cfg));
  const MlaGeometry& geo = w.geometry;
  const int64_t D = geo.hidden_size, H = geo.num_heads, QL = geo.q_lora_rank, L = geo.kv_lora_rank,
                P = geo.qk_nope_head_dim, R = geo.qk_rope_head_dim;
  if (hidden.ndim != 2)
    return invalid_argument(fmt::format("hidden: expected [T, {}], got {}", D, hidden.shape_string()));
  const int64_t T = hidden.size(0);
  MLAKV_RETURN_IF_ERROR(check_tensor(hidden, "hidden", {{DType::kF32}, {T, D}, Strides::kContiguous}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_tensor(q, "q", {{DType::kF32}, {T, H, L + R}, Strides::kContiguous}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_tensor(latent, "latent", {{DType::kF32}, {T, L}, Strides::kContiguous}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_tensor(rope, "rope", {{DType::kF32}, {T, R}, Strides::kContiguous}, Device::cpu()));
  MLAKV_ASSIGN_OR_RETURN(std::vector<int64_t> pos, read_positions(positions, T));
  MLAKV_ASSIGN_OR_RETURN(rope::RopeTable table, rope::RopeTable::create(cfg.rope, static_cast<int>(R)));
  const bool long_factors = table.uses_long_factors(pos);
  const float* x = hidden.ptr<const float>();
  for (int64_t i = 0; i < T * D; ++i) {
    if (!std::isfinite(x[i])) {
      return invalid_argument(fmt::format("hidden[{}, {}] is not finite ({})", i / D, i % D, x[i]));
    }
  }

  // q path -> q_full [T, H*(P+R)]
  const int64_t QW = H * (P + R);
  std::vector<float> q_full(static_cast<std::size_t>(T * QW));
  if (QL > 0) {
    std::vector<float> qa(static_cast<std::size_t>(T * QL));
    cpu::linear(w.q_a_proj.data(), data_or_null(w.q_a_bias), QL, D, x, D, T, qa.data(), QL, pool);
    for (int64_t t = 0; t < T; ++t) rms_norm(qa.data() + t * QL, w.q_a_norm, cfg.q_norm_eps, QL, qa.data() + t * QL);
    cpu::linear(w.q_b_proj.data(), nullptr, QW, QL, qa.data(), QL, T, q_full.data(), QW, pool);
  } else {
    cpu::linear(w.q_proj.data(), nullptr, QW, D, x, D, T, q_full.data(), QW, pool);
  }

  // kv path: [c | k_pe] -> latent = rmsnorm(c), rope = rotate(k_pe)
  std::vector<float> kv(static_cast<std::size_t>(T * (L + R)));
  cpu::linear(w.kv_a_proj.data(), data_or_null(w.kv_a_bias), L + R, D, x, D, T, kv.data(), L + R, pool);
  float* lat = latent.ptr<float>();
  float* kr = rope.ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    rms_norm(kv.data() + t * (L + R), w.kv_a_norm, cfg.kv_norm_eps, L, lat + t * L);
    std::copy_n(kv.data() + t * (L + R) + L, R, kr + t * R);
    table.rotate(kr + t * R, pos[static_cast<std::size_t>(t)], long_factors);
  }

  // q_lat[h] = q_nope[h] @ W_UK_T[h]; q_pe rotated.
  float* qo = q.ptr<float>();
  cpu::parallel_items(pool, T * H, [&](int64_t item) {
    const int64_t t = item / H, h = item % H;
    const float* qh = q_full.data() + t * QW + h * (P + R);
    float* dst = qo + (t * H + h) * (L + R);
    std::vector<double> acc(static_cast<std::size_t>(L));
    cpu::vecmat(qh, w.w_uk_t.data() + h * P * L, P, L, acc.data(), dst);
    std::copy_n(qh + P, R, dst + L);
    table.rotate(dst + L, pos[static_cast<std::size_t>(t)], long_factors);
  });
  return Status::Ok();
}

Status mla_layer_output(const MlaLayerWeights& w, const TensorView& attn_latent, const TensorView& out,
                        ThreadPool* pool) {
  const MlaGeometry& geo = w.geometry;
  const int64_t D = geo.hidden_size, H = geo.num_heads, L = geo.kv_lora_rank, V = geo.v_head_dim;
  if (D < 1 || H < 1 || L < 1 || V < 1 || static_cast<int64_t>(w.w_uv.size()) != H * L * V ||
      static_cast<int64_t>(w.o_proj.size()) != D * H * V ||
      (!w.o_bias.empty() && static_cast<int64_t>(w.o_bias.size()) != D)) {
    return invalid_argument(fmt::format(
        "weights of layer {}: w_uv / o_proj / o_bias sizes do not match D {}, H {}, L {}, V {}", w.layer, D, H, L, V));
  }
  if (attn_latent.ndim != 3) {
    return invalid_argument(fmt::format("attn_latent: expected [T, {}, {}], got {}", H, L, attn_latent.shape_string()));
  }
  const int64_t T = attn_latent.size(0);
  MLAKV_RETURN_IF_ERROR(
      check_tensor(attn_latent, "attn_latent", {{DType::kF32}, {T, H, L}, Strides::kContiguous}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_tensor(out, "out", {{DType::kF32}, {T, D}, Strides::kContiguous}, Device::cpu()));
  if (T > 0 && overlaps(attn_latent, out)) return invalid_argument("out: may not overlap attn_latent");
  cpu::mla_output_projection(attn_latent.ptr<const float>(), w.w_uv.data(), w.o_proj.data(), data_or_null(w.o_bias), T,
                             H, L, V, D, out.ptr<float>(), pool);
  return Status::Ok();
}

Status mla_layer_forward(const MlaLayerWeights& w, const ModelConfig& cfg, PagedKvCache& cache, int cache_layer,
                         SeqId seq, const TensorView& hidden, const TensorView& positions, const TensorView& out,
                         const MlaForwardOptions& opt) {
  MLAKV_RETURN_IF_ERROR(check_geometry(cfg));
  MLAKV_RETURN_IF_ERROR(check_matches(w, cfg));
  const MlaGeometry& geo = w.geometry;
  const int64_t D = geo.hidden_size, H = geo.num_heads, L = geo.kv_lora_rank, R = geo.qk_rope_head_dim;
  if (L != kLatentDim || R != kRopeDim) {
    return unimplemented(
        fmt::format("{}: the cached MLA layer needs kv_lora_rank {} and qk_rope_head_dim {} "
                    "(what attention supports), got {} and {}",
                    cfg.name, kLatentDim, kRopeDim, L, R));
  }
  if (cache_layer < 0 || cache_layer >= cache.storage().num_layers()) {
    return out_of_range(fmt::format("cache_layer {} is outside [0, {})", cache_layer, cache.storage().num_layers()));
  }
  if (opt.num_splits < 1) return invalid_argument(fmt::format("num_splits must be >= 1, got {}", opt.num_splits));
  if (hidden.ndim != 2)
    return invalid_argument(fmt::format("hidden: expected [T, {}], got {}", D, hidden.shape_string()));
  const int64_t T = hidden.size(0);
  if (T < 1) return invalid_argument("hidden: T must be >= 1");
  MLAKV_RETURN_IF_ERROR(check_tensor(hidden, "hidden", {{DType::kF32}, {T, D}, Strides::kContiguous}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_tensor(out, "out", {{DType::kF32}, {T, D}, Strides::kContiguous}, Device::cpu()));
  if (overlaps(hidden, out)) return invalid_argument("out: may not overlap hidden");
  MLAKV_ASSIGN_OR_RETURN(CacheLayerView view, cache.storage().layer(cache_layer));
  if (view.latent_dim != L || view.rope_dim != R) {
    return invalid_argument(fmt::format("cache layer {}: latent {} + rope {} does not match the model's {} + {}",
                                        cache_layer, view.latent_dim, view.rope_dim, L, R));
  }
  MLAKV_ASSIGN_OR_RETURN(int64_t len, cache.blocks().length(seq));
  if (len < T) {
    return failed_precondition(
        fmt::format("sequence {} holds {} tokens, fewer than the {} new ones: append them to "
                    "the cache before running the layer",
                    seq, len, T));
  }
  if (len > INT32_MAX) return out_of_range(fmt::format("sequence {} is too long ({} tokens)", seq, len));
  MLAKV_ASSIGN_OR_RETURN(std::span<const int32_t> table, cache.blocks().block_table(seq));
  const int bs = cache.blocks().block_size();
  std::vector<int64_t> slots(static_cast<std::size_t>(T));
  for (int64_t i = 0; i < T; ++i) {
    const int64_t p = len - T + i;
    slots[static_cast<std::size_t>(i)] = static_cast<int64_t>(table[static_cast<std::size_t>(p / bs)]) * bs + p % bs;
  }

  std::vector<float> q(static_cast<std::size_t>(T * H * (L + R))), lat(static_cast<std::size_t>(T * L)),
      rot(static_cast<std::size_t>(T * R));
  MLAKV_RETURN_IF_ERROR(mla_layer_project(w, cfg, hidden, positions,
                                          TensorView::contiguous(q.data(), DType::kF32, {T, H, L + R}),
                                          TensorView::contiguous(lat.data(), DType::kF32, {T, L}),
                                          TensorView::contiguous(rot.data(), DType::kF32, {T, R}), opt.pool));
  if (opt.transform != nullptr) {
    // The cache stores c' = H D (c - mu) and H_r k_pe; q_pe turns with k_pe.
    std::vector<float> lat_t(lat.size()), rot_t(rot.size());
    for (int64_t t = 0; t < T; ++t) {
      const float m = opt.transform->max_scaled_input(lat.data() + t * L);
      if (!(m <= LatentTransformKernel::kMaxScaledInput))
        return invalid_argument(fmt::format("token {}: max |(latent - mu) d| = {} overflows the latent transform", t, m));
      opt.transform->latent(lat.data() + t * L, lat_t.data() + t * L);
      opt.transform->rope(rot.data() + t * R, rot_t.data() + t * R);
      if (opt.transform->rotates_rope()) {
        for (int64_t h = 0; h < H; ++h) {
          float* qp = q.data() + (t * H + h) * (L + R) + L;
          opt.transform->rope(qp, qp);
        }
      }
    }
    MLAKV_RETURN_IF_ERROR(cache.write(cache_layer, slots, TensorView::contiguous(lat_t.data(), DType::kF32, {T, L}),
                                      TensorView::contiguous(rot_t.data(), DType::kF32, {T, R})));
  } else {
    MLAKV_RETURN_IF_ERROR(cache.write(cache_layer, slots, TensorView::contiguous(lat.data(), DType::kF32, {T, L}),
                                      TensorView::contiguous(rot.data(), DType::kF32, {T, R})));
  }

  std::vector<int32_t> tab(table.begin(), table.end()), seqlen = {static_cast<int32_t>(len)};
  std::vector<float> o_lat(static_cast<std::size_t>(T * H * L)), lse(static_cast<std::size_t>(T * H));
  MlaAttentionParams p;
  p.q = TensorView::contiguous(q.data(), DType::kF32, {1, T, H, L + R});
  p.cache = view;
  p.block_table = TensorView::contiguous(tab.data(), DType::kI32, {1, static_cast<int64_t>(tab.size())});
  p.seqlens = TensorView::contiguous(seqlen.data(), DType::kI32, {1});
  p.softmax_scale = static_cast<float>(cfg.softmax_scale());
  p.causal = true;
  p.num_splits = opt.num_splits;
  p.out = TensorView::contiguous(o_lat.data(), DType::kF32, {1, T, H, L});
  p.lse = TensorView::contiguous(lse.data(), DType::kF32, {1, T, H});
  MLAKV_RETURN_IF_ERROR(mla_attention_cpu(p, {opt.pool}));
  MLAKV_RETURN_IF_ERROR(
      mla_layer_output(w, TensorView::contiguous(o_lat.data(), DType::kF32, {T, H, L}), out, opt.pool));
  if (opt.trace != nullptr) {
    opt.trace->kv_c_normed = std::move(lat);
    opt.trace->k_pe = std::move(rot);
    opt.trace->q = std::move(q);
    opt.trace->attn_latent = std::move(o_lat);
  }
  return Status::Ok();
}

Status fold_latent_transform(MlaLayerWeights& w, const LatentTransformLayer& t) {
  const MlaGeometry& geo = w.geometry;
  const int64_t D = geo.hidden_size, H = geo.num_heads, L = geo.kv_lora_rank, P = geo.qk_nope_head_dim,
                V = geo.v_head_dim;
  if (L != kLatentDim)
    return invalid_argument(fmt::format("weights of layer {}: a latent transform needs kv_lora_rank {}, got {}", w.layer,
                                        kLatentDim, L));
  if (static_cast<int64_t>(w.w_uk_t.size()) != H * P * L || static_cast<int64_t>(w.w_uv.size()) != H * L * V ||
      static_cast<int64_t>(w.o_proj.size()) != D * H * V || (!w.o_bias.empty() && static_cast<int64_t>(w.o_bias.size()) != D))
    return invalid_argument(fmt::format("weights of layer {}: w_uk_t / w_uv / o_proj / o_bias sizes do not match the "
                                        "geometry",
                                        w.layer));
  MLAKV_ASSIGN_OR_RETURN(LatentTransformKernel k, LatentTransformKernel::create(t));
  std::vector<float> uk = w.w_uk_t, uv = w.w_uv;
  std::vector<double> bias(static_cast<std::size_t>(D), 0.0);
  std::vector<float> row(static_cast<std::size_t>(L));
  std::vector<double> folded(static_cast<std::size_t>(L));
  for (int64_t hp = 0; hp < H * P; ++hp) {  // W_UK rows: contiguous
    k.fold_row(w.w_uk_t.data() + hp * L, folded.data());
    for (int64_t i = 0; i < L; ++i) uk[static_cast<std::size_t>(hp * L + i)] = static_cast<float>(folded[static_cast<std::size_t>(i)]);
  }
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t v = 0; v < V; ++v) {  // W_UV^T rows: w_uv[h][:][v], stride V
      for (int64_t i = 0; i < L; ++i) row[static_cast<std::size_t>(i)] = w.w_uv[static_cast<std::size_t>((h * L + i) * V + v)];
      k.fold_row(row.data(), folded.data());
      for (int64_t i = 0; i < L; ++i)
        uv[static_cast<std::size_t>((h * L + i) * V + v)] = static_cast<float>(folded[static_cast<std::size_t>(i)]);
      const double b = k.dot_mu(row.data());  // this head's output dim v gains b
      for (int64_t o = 0; o < D; ++o) bias[static_cast<std::size_t>(o)] += static_cast<double>(w.o_proj[static_cast<std::size_t>(o * H * V + h * V + v)]) * b;
    }
  }
  if (w.o_bias.empty()) w.o_bias.assign(static_cast<std::size_t>(D), 0.0f);
  for (int64_t o = 0; o < D; ++o)
    w.o_bias[static_cast<std::size_t>(o)] = static_cast<float>(w.o_bias[static_cast<std::size_t>(o)] + bias[static_cast<std::size_t>(o)]);
  w.w_uk_t = std::move(uk);
  w.w_uv = std::move(uv);
  return Status::Ok();
}

}  // namespace mlakv
