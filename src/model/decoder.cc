// The decoder stack of the model runner (include/mlakv/model.h): embedding, every
// decoder layer (MLA attention over the paged or the float32 reference cache, dense MLP
// or MoE), final norm and lm_head.
//
// MLA attention per layer (docs/reference.md section 1), absorbed as the cache requires:
//   q      = q_b(rmsnorm(q_a(x)))  or  q_proj(x)                         [T, H, P+R]
//   [c | k_pe] = kv_a(x);  latent = rmsnorm(c);  k_rot = rope(k_pe)      [T, L], [T, R]
//   q_lat[h] = q_nope[h] @ W_UK[h]    (W_UK[h] = kv_b rows h(P+V) .. h(P+V)+P, [P, L])
//   o_lat    = softmax((q_lat.c + q_rot.k_rot) * scale) @ c    over the cache, causal
//   o[h]     = o_lat[h] @ W_UV[h]     (W_UV[h]^T = kv_b rows h(P+V)+P .. +V, [V, L])
//   out      = o_proj(concat_h o[h])
// kv_b_proj is read in its checkpoint dtype: no absorbed copy is made.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "mlakv/attention.h"
#include "model/model_impl.h"
#include "model/record_writer.h"

namespace mlakv {
namespace {

using model::WeightMatrix;

void parallel(ThreadPool* pool, int64_t n, const std::function<void(int64_t)>& fn) {
  if (pool == nullptr || pool->num_threads() == 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  pool->parallel_for(n, [&](int64_t i, int) { fn(i); });
}

// Attention over one cache layer for the T new tokens: q [T, H, L+R], latent [T, L],
// rope [T, R] in; o_lat [T, H, L] out.
class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual Status attend(int layer, const float* q, const float* latent, const float* rope, int64_t T,
                        float* o_lat) = 0;
};

class PagedBackend final : public AttentionBackend {
 public:
  PagedBackend(PagedKvCache& cache, std::vector<int64_t> slots, std::vector<int32_t> table, int32_t len, int H, int L,
               int R, float scale, int splits, ThreadPool* pool, const FoldedLatentTransform::Impl* transform)
      : cache_(cache), slots_(std::move(slots)), table_(std::move(table)), len_(len), H_(H), L_(L), R_(R),
        scale_(scale), splits_(splits), pool_(pool), transform_(transform) {}

  Status attend(int layer, const float* q, const float* latent, const float* rope, int64_t T, float* o_lat) override {
    // The SIMD writer: the scalar codec's bytes (src/model/record_writer.h), threaded.
    (void)T;
    // With a transform, each token's latent (and k_pe) is transformed in the writer's
    // per-token buffer right before it is encoded.
    const LatentTransformKernel* t =
        transform_ != nullptr ? &transform_->kernels[static_cast<std::size_t>(layer)] : nullptr;
    MLAKV_RETURN_IF_ERROR(model::write_cache_records(cache_.storage(), layer, slots_, latent, rope, pool_, t));
    MLAKV_ASSIGN_OR_RETURN(CacheLayerView view, cache_.storage().layer(layer));
    std::vector<float> lse(static_cast<std::size_t>(T * H_));
    MlaAttentionParams p;
    p.q = TensorView::contiguous(q, DType::kF32, {1, T, H_, L_ + R_});
    p.cache = view;
    p.block_table = TensorView::contiguous(table_.data(), DType::kI32, {1, static_cast<int64_t>(table_.size())});
    p.seqlens = TensorView::contiguous(&len_, DType::kI32, {1});
    p.softmax_scale = scale_;
    p.causal = true;
    p.num_splits = splits_;
    p.out = TensorView::contiguous(o_lat, DType::kF32, {1, T, H_, L_});
    p.lse = TensorView::contiguous(lse.data(), DType::kF32, {1, T, H_});
    return mla_attention_cpu(p, {pool_});
  }

 private:
  PagedKvCache& cache_;
  std::vector<int64_t> slots_;
  std::vector<int32_t> table_;
  int32_t len_;
  int H_, L_, R_;
  float scale_;
  int splits_;
  ThreadPool* pool_;
  const FoldedLatentTransform::Impl* transform_;
};

// float32 attention over the reference cache's rows.
class ReferenceBackend final : public AttentionBackend {
 public:
  ReferenceBackend(ReferenceKvCache& cache, SeqId seq, int64_t p0, int H, int L, int R, float scale, ThreadPool* pool)
      : cache_(cache), seq_(seq), p0_(p0), H_(H), L_(L), R_(R), scale_(scale), pool_(pool) {}

  Status attend(int layer, const float* q, const float* latent, const float* rope, int64_t T, float* o_lat) override {
    std::vector<float>* rows = cache_.rows(seq_, layer);
    const int64_t W = L_ + R_;
    rows->resize(static_cast<std::size_t>((p0_ + T) * W));
    for (int64_t t = 0; t < T; ++t) {
      float* dst = rows->data() + (p0_ + t) * W;
      std::copy_n(latent + t * L_, L_, dst);
      std::copy_n(rope + t * R_, R_, dst + L_);
    }
    const int64_t n = p0_ + T;
    const WeightMatrix keys{rows->data(), DType::kF32, n, W, W};
    const WeightMatrix values{rows->data(), DType::kF32, n, L_, W};
    // One item per token: scores [H, n], softmax per head, o_lat [H, L].
    parallel(pool_, T, [&](int64_t t) {
      const int64_t limit = p0_ + t + 1;  // causal: positions [0, p0 + t]
      std::vector<float> s(static_cast<std::size_t>(H_ * limit));
      model::matmul_nt(q + t * H_ * W, H_, W, keys.row_range(0, limit), s.data(), limit, nullptr);
      for (int h = 0; h < H_; ++h) {
        float* sr = s.data() + h * limit;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < limit; ++j) m = std::max(m, static_cast<double>(sr[j]) * scale_);
        double sum = 0.0;
        for (int64_t j = 0; j < limit; ++j) sum += std::exp(static_cast<double>(sr[j]) * scale_ - m);
        for (int64_t j = 0; j < limit; ++j)
          sr[j] = static_cast<float>(std::exp(static_cast<double>(sr[j]) * scale_ - m) / sum);
      }
      model::matmul_nn(s.data(), H_, limit, values.row_range(0, limit), o_lat + t * H_ * L_, L_);
    });
    return Status::Ok();
  }

 private:
  ReferenceKvCache& cache_;
  SeqId seq_;
  int64_t p0_;
  int H_, L_, R_;
  float scale_;
  ThreadPool* pool_;
};

Status check_finite(const float* x, int64_t n, int layer, const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i]))
      return data_loss(fmt::format("layer {}: {} holds a non-finite value {} at flat index {}", layer, what, x[i], i));
  }
  return Status::Ok();
}

}  // namespace

namespace model {

// One decoder layer's attention: x [T, D] (input-normed) -> out [T, D].
Status attention_forward(const Model::Impl& m, int layer, const float* x, int64_t T, std::span<const int64_t> pos,
                         AttentionBackend& be, const ForwardOptions& opt, float* out) {
  const LatentObserver& observer = opt.observer;
  const FoldedLatentTransform::Impl* ft = opt.transform != nullptr ? &opt.transform->impl() : nullptr;
  const ModelConfig& c = m.arch.mla;
  const AttentionWeights& a = m.layers[static_cast<std::size_t>(layer)].attn;
  ThreadPool* pool = m.pool.get();
  const int64_t D = c.hidden_size, H = c.num_heads, QL = c.q_lora_rank, L = c.kv_lora_rank, P = c.qk_nope_head_dim,
                R = c.qk_rope_head_dim, V = c.v_head_dim, QW = H * (P + R);
  std::vector<float> qf(static_cast<std::size_t>(T * QW));
  if (QL > 0) {
    std::vector<float> qa(static_cast<std::size_t>(T * QL));
    linear_forward(a.q_a, x, T, qa.data(), pool);
    rms_norm_rows(qa.data(), T, QL, a.q_a_norm, c.q_norm_eps, qa.data());
    linear_forward(a.q_b, qa.data(), T, qf.data(), pool);
  } else {
    linear_forward(a.q_proj, x, T, qf.data(), pool);
  }
  std::vector<float> kv(static_cast<std::size_t>(T * (L + R)));
  linear_forward(a.kv_a, x, T, kv.data(), pool);
  std::vector<float> latent(static_cast<std::size_t>(T * L)), rot(static_cast<std::size_t>(T * R));
  for (int64_t t = 0; t < T; ++t) {
    rms_norm_rows(kv.data() + t * (L + R), 1, L, a.kv_a_norm, c.kv_norm_eps, latent.data() + t * L);
    std::copy_n(kv.data() + t * (L + R) + L, R, rot.data() + t * R);
    m.rope->rotate(rot.data() + t * R, pos[static_cast<std::size_t>(t)]);
  }
  MLAKV_RETURN_IF_ERROR(check_finite(latent.data(), T * L, layer, "kv_c_normed"));
  if (observer) observer(layer, TensorView::contiguous(latent.data(), DType::kF32, {T, L}));

  // Absorbed query [T, H, L+R]. With a transform, kv_b is the folded copy (rows H D^-1 r),
  // so q_lat' = H D^-1 q_lat, and q_pe is rotated by H_r after RoPE.
  const int64_t QK = L + R;
  const WeightMatrix kv_b = ft != nullptr ? WeightMatrix{ft->kv_b[static_cast<std::size_t>(layer)].data(),
                                                         DType::kF32, H * (P + V), L, L}
                                          : a.kv_b.w;
  const LatentTransformKernel* kt = ft != nullptr ? &ft->kernels[static_cast<std::size_t>(layer)] : nullptr;
  std::vector<float> q(static_cast<std::size_t>(T * H * QK));
  if (opt.query_observer) {
    // The untransformed absorbed query, for calibration (an extra product only when observed).
    std::vector<float> q0(q.size());
    parallel(pool, H, [&](int64_t h) {
      matmul_nn(qf.data() + h * (P + R), T, QW, a.kv_b.w.row_range(h * (P + V), P), q0.data() + h * QK, H * QK);
      for (int64_t t = 0; t < T; ++t) {
        float* dst = q0.data() + (t * H + h) * QK + L;
        std::copy_n(qf.data() + t * QW + h * (P + R) + P, R, dst);
        m.rope->rotate(dst, pos[static_cast<std::size_t>(t)]);
      }
    });
    opt.query_observer(layer, TensorView::contiguous(q0.data(), DType::kF32, {T, H, QK}));
  }
  parallel(pool, H, [&](int64_t h) {
    const WeightMatrix w_uk = kv_b.row_range(h * (P + V), P);  // [P, L]
    matmul_nn(qf.data() + h * (P + R), T, QW, w_uk, q.data() + h * QK, H * QK);
    for (int64_t t = 0; t < T; ++t) {
      float* dst = q.data() + (t * H + h) * QK + L;
      std::copy_n(qf.data() + t * QW + h * (P + R) + P, R, dst);
      m.rope->rotate(dst, pos[static_cast<std::size_t>(t)]);
      if (kt != nullptr && kt->rotates_rope()) kt->rope(dst, dst);
    }
  });

  std::vector<float> o_lat(static_cast<std::size_t>(T * H * L));
  MLAKV_RETURN_IF_ERROR(be.attend(layer, q.data(), latent.data(), rot.data(), T, o_lat.data()));

  std::vector<float> o(static_cast<std::size_t>(T * H * V));
  parallel(pool, H, [&](int64_t h) {
    const WeightMatrix w_uv_t = kv_b.row_range(h * (P + V) + P, V);  // [V, L]
    matmul_nt(o_lat.data() + h * L, T, H * L, w_uv_t, o.data() + h * V, H * V, nullptr);
  });
  if (ft != nullptr) {
    // sum_t p_t c_t = D^-1 H^T o' + mu: the mu part is W_UV^T mu per head.
    const std::vector<float>& b = ft->uv_bias[static_cast<std::size_t>(layer)];
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < H * V; ++k) o[static_cast<std::size_t>(t * H * V + k)] += b[static_cast<std::size_t>(k)];
  }
  linear_forward(a.o, o.data(), T, out, pool);
  (void)D;
  return Status::Ok();
}

// Embedding -> layers -> norm -> lm_head for T tokens at positions p0 .. p0+T-1.
Status run_model(Model::Impl& m, AttentionBackend& be, int64_t p0, std::span<const int32_t> tokens,
                 const TensorView& logits, const ForwardOptions& opt) {
  const ModelArch& a = m.arch;
  const int64_t D = a.mla.hidden_size, T = static_cast<int64_t>(tokens.size());
  ThreadPool* pool = m.pool.get();
  std::vector<int64_t> pos(static_cast<std::size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[static_cast<std::size_t>(t)] = p0 + t;
  std::vector<float> h(static_cast<std::size_t>(T * D)), xn(h.size()), y(h.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) h[static_cast<std::size_t>(t * D + d)] = m.embed.at(tokens[static_cast<std::size_t>(t)], d);
  for (int i = 0; i < a.mla.num_layers; ++i) {
    const LayerWeights& lw = m.layers[static_cast<std::size_t>(i)];
    rms_norm_rows(h.data(), T, D, lw.input_norm, a.mla.rms_norm_eps, xn.data());
    MLAKV_RETURN_IF_ERROR(attention_forward(m, i, xn.data(), T, pos, be, opt, y.data()));
    for (std::size_t k = 0; k < h.size(); ++k) h[k] += y[k];
    rms_norm_rows(h.data(), T, D, lw.post_norm, a.mla.rms_norm_eps, xn.data());
    if (lw.moe) {
      moe_forward(lw.moe_w, a.routing, xn.data(), T, D, y.data(), pool);
    } else {
      mlp_forward(lw.mlp, xn.data(), T, D, y.data(), pool);
    }
    for (std::size_t k = 0; k < h.size(); ++k) h[k] += y[k];
    MLAKV_RETURN_IF_ERROR(check_finite(h.data(), T * D, i, "the hidden state"));
  }
  const int64_t first = opt.last_token_only ? T - 1 : 0, rows = T - first;
  rms_norm_rows(h.data() + first * D, rows, D, m.final_norm, a.mla.rms_norm_eps, xn.data());
  linear_forward(m.lm_head, xn.data(), rows, logits.ptr<float>(), pool);
  return Status::Ok();
}

}  // namespace model

namespace {

Status check_forward_args(const Model::Impl& m, std::span<const int32_t> tokens, const TensorView& logits,
                          const ForwardOptions& opt, int cache_layers) {
  const ModelArch& a = m.arch;
  if (tokens.empty()) return invalid_argument("forward: no tokens (T must be >= 1)");
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= a.vocab_size)
      return out_of_range(fmt::format("forward: token {} at index {} is outside the vocabulary [0, {})", tokens[i], i,
                                      a.vocab_size));
  }
  const int64_t rows = opt.last_token_only ? 1 : static_cast<int64_t>(tokens.size());
  MLAKV_RETURN_IF_ERROR(check_tensor(logits, "logits", {{DType::kF32}, {rows, a.vocab_size}}, Device::cpu()));
  if (!logits.is_contiguous()) return invalid_argument("logits: must be contiguous");
  if (cache_layers != a.mla.num_layers)
    return invalid_argument(fmt::format("forward: the cache has {} layers, the model {}", cache_layers,
                                        a.mla.num_layers));
  if (opt.num_splits < 1) return invalid_argument(fmt::format("num_splits must be >= 1, got {}", opt.num_splits));
  return Status::Ok();
}

void note_topk(Model::Impl& m, int64_t length) {
  if (m.arch.mla.index_topk > 0 && length > m.arch.mla.index_topk) m.dense_beyond_topk = true;
}

}  // namespace

Status Model::forward(PagedKvCache& cache, SeqId seq, std::span<const int32_t> tokens, const TensorView& logits,
                      const ForwardOptions& opt) {
  Impl& m = *impl_;
  const ModelConfig& c = m.arch.mla;
  MLAKV_RETURN_IF_ERROR(check_forward_args(m, tokens, logits, opt, cache.storage().num_layers()));
  if (c.kv_lora_rank != kLatentDim || c.qk_rope_head_dim != kRopeDim) {
    return unimplemented(fmt::format(
        "forward: the paged cache's attention needs kv_lora_rank {} and qk_rope_head_dim {}, the model has {} and {} "
        "(use the reference cache)",
        kLatentDim, kRopeDim, c.kv_lora_rank, c.qk_rope_head_dim));
  }
  const KvCache::Config& kc = cache.storage().config();
  if (kc.latent_dim != c.kv_lora_rank || kc.rope_dim != c.qk_rope_head_dim)
    return invalid_argument(fmt::format("forward: cache records hold latent {} + rope {}, the model {} + {}",
                                        kc.latent_dim, kc.rope_dim, c.kv_lora_rank, c.qk_rope_head_dim));
  if (opt.transform != nullptr) {
    const FoldedLatentTransform::Impl& ft = opt.transform->impl();
    if (ft.model != &m)
      return invalid_argument("forward: the latent transform was folded for another model (fold it for this one)");
    for (int l = 0; l < c.num_layers; ++l) {
      MLAKV_ASSIGN_OR_RETURN(CacheLayerView v, cache.storage().layer(l));
      const float want = ft.transform.layers[static_cast<std::size_t>(l)].outer_scale;
      if (format_info(v.format).has_outer_scale && v.outer_scale != want)
        return invalid_argument(fmt::format(
            "forward: cache layer {} has outer scale {}, the latent transform's s_l is {} (create the cache with "
            "Model::transform_layer_formats)",
            l, v.outer_scale, want));
      // The writers apply the cache layer's nvfp4 group-scale choice; the transform's file
      // says which one its calibration (s_l, the seed) was made with. A cache of the other
      // mode would write records that silently differ from the calibrated ones.
      const Nvfp4ScaleMode want_nv = is_nvfp4_format(v.format) ? ft.transform.nvfp4_scales : Nvfp4ScaleMode::kRn;
      if (v.nvfp4_scales != want_nv)
        return invalid_argument(fmt::format(
            "forward: cache layer {} ({}{}) writes nvfp4 group scales '{}', the latent transform's nvfp4_scales is "
            "'{}' (create the cache with Model::transform_layer_formats{})",
            l, format_name(v.format), v.token_scale ? ", per-token scale mode" : "",
            nvfp4_scale_mode_name(v.nvfp4_scales), nvfp4_scale_mode_name(want_nv),
            v.token_scale ? "; the per-token scale mode always rounds to nearest" : ""));
    }
  }
  MLAKV_ASSIGN_OR_RETURN(int64_t p0, cache.blocks().length(seq));
  const int64_t T = static_cast<int64_t>(tokens.size());
  if (p0 + T > INT32_MAX) return out_of_range(fmt::format("forward: sequence {} would exceed 2^31 tokens", seq));
  MLAKV_ASSIGN_OR_RETURN(std::vector<int64_t> slots, cache.append(seq, T));
  MLAKV_ASSIGN_OR_RETURN(std::span<const int32_t> table, cache.blocks().block_table(seq));
  note_topk(m, p0 + T);
  PagedBackend be(cache, std::move(slots), std::vector<int32_t>(table.begin(), table.end()),
                  static_cast<int32_t>(p0 + T), c.num_heads, c.kv_lora_rank, c.qk_rope_head_dim,
                  static_cast<float>(c.softmax_scale()), opt.num_splits, m.pool.get(),
                  opt.transform != nullptr ? &opt.transform->impl() : nullptr);
  return model::run_model(m, be, p0, tokens, logits, opt);
}

Status Model::forward(ReferenceKvCache& cache, SeqId seq, std::span<const int32_t> tokens, const TensorView& logits,
                      const ForwardOptions& opt) {
  Impl& m = *impl_;
  const ModelConfig& c = m.arch.mla;
  MLAKV_RETURN_IF_ERROR(check_forward_args(m, tokens, logits, opt, cache.num_layers()));
  if (opt.transform != nullptr)
    return invalid_argument("forward: the float32 reference cache takes no latent transform (use a paged cache)");
  if (cache.latent_dim() != c.kv_lora_rank || cache.rope_dim() != c.qk_rope_head_dim)
    return invalid_argument(fmt::format("forward: reference cache holds latent {} + rope {}, the model {} + {}",
                                        cache.latent_dim(), cache.rope_dim(), c.kv_lora_rank, c.qk_rope_head_dim));
  MLAKV_ASSIGN_OR_RETURN(int64_t p0, cache.length(seq));
  const int64_t T = static_cast<int64_t>(tokens.size());
  note_topk(m, p0 + T);
  for (auto& [id, s] : cache.seqs_) {
    if (id == seq) s.length = p0 + T;
  }
  ReferenceBackend be(cache, seq, p0, c.num_heads, c.kv_lora_rank, c.qk_rope_head_dim,
                      static_cast<float>(c.softmax_scale()), m.pool.get());
  return model::run_model(m, be, p0, tokens, logits, opt);
}

// ---- ReferenceKvCache ----------------------------------------------------------

StatusOr<std::unique_ptr<ReferenceKvCache>> ReferenceKvCache::create(int num_layers, int latent_dim, int rope_dim) {
  if (num_layers < 1 || latent_dim < 1 || rope_dim < 0)
    return invalid_argument(fmt::format("reference cache: num_layers {} and latent_dim {} must be >= 1, rope_dim {} >= 0",
                                        num_layers, latent_dim, rope_dim));
  std::unique_ptr<ReferenceKvCache> c(new ReferenceKvCache());
  c->num_layers_ = num_layers;
  c->latent_dim_ = latent_dim;
  c->rope_dim_ = rope_dim;
  return c;
}

SeqId ReferenceKvCache::add_sequence() {
  Seq s;
  s.layers.resize(static_cast<std::size_t>(num_layers_));
  seqs_.emplace_back(next_, std::move(s));
  return next_++;
}

Status ReferenceKvCache::free(SeqId seq) {
  for (auto it = seqs_.begin(); it != seqs_.end(); ++it) {
    if (it->first == seq) {
      seqs_.erase(it);
      return Status::Ok();
    }
  }
  return not_found(fmt::format("reference cache: unknown sequence {}", seq));
}

StatusOr<int64_t> ReferenceKvCache::length(SeqId seq) const {
  for (const auto& [id, s] : seqs_)
    if (id == seq) return s.length;
  return not_found(fmt::format("reference cache: unknown sequence {}", seq));
}

std::size_t ReferenceKvCache::bytes() const {
  std::size_t n = 0;
  for (const auto& [id, s] : seqs_)
    for (const auto& l : s.layers) n += l.size() * sizeof(float);
  return n;
}

std::vector<float>* ReferenceKvCache::rows(SeqId seq, int layer) {
  for (auto& [id, s] : seqs_)
    if (id == seq && layer >= 0 && layer < num_layers_) return &s.layers[static_cast<std::size_t>(layer)];
  return nullptr;
}

}  // namespace mlakv
