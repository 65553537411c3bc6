// Model loading (include/mlakv/model.h): config.json -> ModelArch, the safetensors
// checkpoint mapped, every weight checked against the config and viewed in place.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "mlakv/file_io.h"
#include "mlakv/kv_b_proj.h"
#include "mlakv/numerics.h"
#include "model/model_impl.h"
#include "model/record_writer.h"

namespace mlakv {
namespace {

using model::Linear;
using model::Mlp;
using model::WeightMatrix;

bool dense_dtype(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

class Loader {
 public:
  Loader(const Checkpoint& src, const WeightQuantOptions& quant, ModelMemory& mem, std::set<std::string>& quantized)
      : src_(src), quant_(quant), mem_(mem), quantized_(quantized) {}

  // A [N, K] linear weight under `prefix` ("model.layers.0.mlp.gate_proj"): dense
  // dtypes are viewed in place; quantized encodings dequantized to an owned f32 copy.
  Status linear(const std::string& prefix, int64_t N, int64_t K, Linear& out, bool bias_allowed = false) {
    const std::string wname = prefix + ".weight";
    const std::optional<TensorView> t = src_.find(wname);
    if (t && dense_dtype(t->dtype)) {
      if (t->ndim != 2 || t->size(0) != N || t->size(1) != K) {
        return invalid_argument(fmt::format("{}: tensor '{}' must have shape [{}, {}], got {}", src_.describe(), wname,
                                            N, K, t->shape_string()));
      }
      out.w = WeightMatrix{t->data, t->dtype, N, K, K};
      const std::size_t bytes = static_cast<std::size_t>(N * K) * dtype_size(t->dtype);
      mem_.checkpoint_bytes += bytes;
      mem_.mapped_bytes += bytes;
    } else {
      // Not a dense weight (or none at all): the dequantizers detect the encoding and
      // name what is missing.
      MLAKV_ASSIGN_OR_RETURN(WeightEncoding enc, detect_weight_encoding(src_, prefix));
      out.owned.assign(static_cast<std::size_t>(N * K), 0.0f);
      Status st = dequantize_weight(src_, prefix, N, K, quant_,
                                    TensorView::contiguous(out.owned.data(), DType::kF32, {N, K}));
      if (!st.ok()) return st.with_context(fmt::format("{}: loading '{}' as [{}, {}]", src_.describe(), prefix, N, K));
      out.w = WeightMatrix{out.owned.data(), DType::kF32, N, K, K};
      // The storage tensors of every encoding kv_b_proj.h reads (looked up by name: a
      // scan of the checkpoint's names per weight would be quadratic on real models).
      for (const char* part : {"weight", "weight_scale_inv", "weight_scale", "weight_scale_2", "weight_packed",
                               "weight_global_scale", "input_scale", "qweight", "qzeros", "scales", "g_idx"}) {
        const std::optional<TensorView> v = src_.find(prefix + "." + part);
        if (v) mem_.checkpoint_bytes += static_cast<std::size_t>(v->numel()) * dtype_size(v->dtype);
      }
      mem_.dequantized_bytes += out.owned.size() * sizeof(float);
      quantized_.insert(std::string(weight_encoding_name(enc)));
    }
    if (bias_allowed) MLAKV_RETURN_IF_ERROR(vector(prefix + ".bias", N, true, out.bias));
    return Status::Ok();
  }

  // A [n] vector (norm weight, bias, router bias) copied to f32.
  Status vector(const std::string& name, int64_t n, bool optional, std::vector<float>& out) {
    const std::optional<TensorView> t = src_.find(name);
    if (!t) {
      if (optional) return Status::Ok();
      return not_found(fmt::format("{}: tensor '{}' is missing", src_.describe(), name));
    }
    if (!dense_dtype(t->dtype)) {
      return invalid_argument(fmt::format("{}: tensor '{}' must be f32, bf16 or f16, got {}", src_.describe(), name,
                                          dtype_name(t->dtype)));
    }
    if (t->ndim != 1 || t->size(0) != n) {
      return invalid_argument(
          fmt::format("{}: tensor '{}' must have shape [{}], got {}", src_.describe(), name, n, t->shape_string()));
    }
    const WeightMatrix m{t->data, t->dtype, 1, n, n};
    out.resize(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      out[static_cast<std::size_t>(i)] = m.at(0, i);
      if (!std::isfinite(out[static_cast<std::size_t>(i)])) {
        out.clear();
        return data_loss(fmt::format("{}: tensor '{}' holds a non-finite value at [{}]", src_.describe(), name, i));
      }
    }
    const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(t->dtype);
    mem_.checkpoint_bytes += bytes;
    mem_.dequantized_bytes += out.size() * sizeof(float);
    return Status::Ok();
  }

  Status mlp(const std::string& prefix, int64_t D, int64_t I, Mlp& m) {
    MLAKV_RETURN_IF_ERROR(linear(prefix + ".gate_proj", I, D, m.gate));
    MLAKV_RETURN_IF_ERROR(linear(prefix + ".up_proj", I, D, m.up));
    return linear(prefix + ".down_proj", D, I, m.down);
  }

  // transformers' in-memory fused layout, should a checkpoint store it:
  // experts.gate_up_proj [E, 2I, D] (gate rows first, then up: .chunk(2)) and
  // experts.down_proj [E, D, I]; accepted with or without a ".weight" suffix.
  StatusOr<bool> fused_experts(const std::string& prefix, int64_t E, int64_t D, int64_t I, std::vector<Mlp>& experts) {
    std::optional<TensorView> gu = src_.find(prefix + ".gate_up_proj");
    std::string gu_name = prefix + ".gate_up_proj";
    if (!gu) {
      gu_name += ".weight";
      gu = src_.find(gu_name);
    }
    if (!gu) return false;
    std::string dn_name = prefix + ".down_proj";
    std::optional<TensorView> dn = src_.find(dn_name);
    if (!dn) {
      dn_name += ".weight";
      dn = src_.find(dn_name);
    }
    if (!dn) return not_found(fmt::format("{}: '{}' is present but '{}' is missing", src_.describe(), gu_name, dn_name));
    for (const auto& [name, t, a, b] : {std::tuple{gu_name, *gu, 2 * I, D}, std::tuple{dn_name, *dn, D, I}}) {
      if (!dense_dtype(t.dtype))
        return unimplemented(fmt::format("{}: fused expert tensor '{}' is {}; only f32, bf16 and f16 are supported",
                                         src_.describe(), name, dtype_name(t.dtype)));
      if (t.ndim != 3 || t.size(0) != E || t.size(1) != a || t.size(2) != b)
        return invalid_argument(fmt::format("{}: tensor '{}' must have shape [{}, {}, {}], got {}", src_.describe(),
                                            name, E, a, b, t.shape_string()));
      const std::size_t bytes = static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype);
      mem_.checkpoint_bytes += bytes;
      mem_.mapped_bytes += bytes;
    }
    const WeightMatrix gum{gu->data, gu->dtype, E * 2 * I, D, D};
    const WeightMatrix dnm{dn->data, dn->dtype, E * D, I, I};
    experts.resize(static_cast<std::size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      Mlp& m = experts[static_cast<std::size_t>(e)];
      m.gate.w = gum.row_range(e * 2 * I, I);
      m.up.w = gum.row_range(e * 2 * I + I, I);
      m.down.w = dnm.row_range(e * D, D);
    }
    return true;
  }

 private:
  const Checkpoint& src_;
  const WeightQuantOptions& quant_;
  ModelMemory& mem_;
  std::set<std::string>& quantized_;
};

}  // namespace

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;
const ModelArch& Model::arch() const { return impl_->arch; }
const ModelMemory& Model::memory() const { return impl_->memory; }
const std::vector<std::string>& Model::notes() const { return impl_->notes; }
bool Model::dense_beyond_topk() const { return impl_->dense_beyond_topk; }

StatusOr<std::unique_ptr<Model>> Model::load(const std::string& dir, const ModelLoadOptions& opt) {
  if (opt.threads < 0) return invalid_argument(fmt::format("threads must be >= 0, got {}", opt.threads));
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return not_found(fmt::format("model directory '{}' does not exist or is not a directory", dir));
  const std::string cfg_path = (std::filesystem::path(dir) / "config.json").string();
  MLAKV_ASSIGN_OR_RETURN(std::vector<uint8_t> cfg_bytes, io::read_file(cfg_path, io::kMaxConfigBytes));
  const std::string_view cfg_text(reinterpret_cast<const char*>(cfg_bytes.data()), cfg_bytes.size());
  auto impl = std::make_unique<Impl>();
  MLAKV_ASSIGN_OR_RETURN(impl->arch, parse_model_arch(cfg_text, cfg_path));
  ModelArch& a = impl->arch;
  ModelConfig& c = a.mla;
  WeightQuantOptions quant;
  if (cfg_text.find("\"quantization_config\"") != std::string_view::npos) {
    MLAKV_ASSIGN_OR_RETURN(quant, parse_weight_quant_options(cfg_text));
  }
  MLAKV_ASSIGN_OR_RETURN(impl->ckpt, Checkpoint::open(dir));
  const Checkpoint& src = *impl->ckpt;

  const int64_t D = c.hidden_size, H = c.num_heads, QL = c.q_lora_rank, L = c.kv_lora_rank, P = c.qk_nope_head_dim,
                R = c.qk_rope_head_dim, V = c.v_head_dim, VOC = a.vocab_size;
  if (R % 2 != 0) return invalid_argument(fmt::format("{}: qk_rope_head_dim = {} must be even", cfg_path, R));
  MLAKV_ASSIGN_OR_RETURN(rope::RopeTable table, rope::RopeTable::create(c.rope, static_cast<int>(R)));
  impl->rope = std::make_unique<rope::RopeTable>(std::move(table));
  const double scale = c.softmax_scale();
  if (!(scale > 0.0) || !std::isfinite(scale))
    return invalid_argument(fmt::format("{}: softmax scale must be finite and > 0, got {}", cfg_path, scale));

  std::set<std::string> quantized;
  Loader ld(src, quant, impl->memory, quantized);
  {
    const std::string en = "model.embed_tokens.weight";
    const std::optional<TensorView> t = src.find(en);
    if (!t) return not_found(fmt::format("{}: tensor '{}' is missing", src.describe(), en));
    if (!dense_dtype(t->dtype) || t->ndim != 2 || t->size(0) != VOC || t->size(1) != D) {
      return invalid_argument(fmt::format("{}: tensor '{}' must be f32/bf16/f16 [{}, {}], got {} {}", src.describe(),
                                          en, VOC, D, dtype_name(t->dtype), t->shape_string()));
    }
    impl->embed = WeightMatrix{t->data, t->dtype, VOC, D, D};
    const std::size_t bytes = static_cast<std::size_t>(VOC * D) * dtype_size(t->dtype);
    impl->memory.checkpoint_bytes += bytes;
    impl->memory.mapped_bytes += bytes;
  }
  if (a.tie_word_embeddings) {
    impl->lm_head.w = impl->embed;
  } else {
    MLAKV_RETURN_IF_ERROR(ld.linear("lm_head", VOC, D, impl->lm_head));
  }
  MLAKV_RETURN_IF_ERROR(ld.vector("model.norm.weight", D, false, impl->final_norm));

  impl->layers.resize(static_cast<std::size_t>(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    model::LayerWeights& lw = impl->layers[static_cast<std::size_t>(i)];
    const std::string pre = fmt::format("model.layers.{}.", i);
    MLAKV_RETURN_IF_ERROR(ld.vector(pre + "input_layernorm.weight", D, false, lw.input_norm));
    MLAKV_RETURN_IF_ERROR(ld.vector(pre + "post_attention_layernorm.weight", D, false, lw.post_norm));
    model::AttentionWeights& at = lw.attn;
    const std::string ap = pre + "self_attn.";
    if (QL > 0) {
      MLAKV_RETURN_IF_ERROR(ld.linear(ap + "q_a_proj", QL, D, at.q_a, true));
      MLAKV_RETURN_IF_ERROR(ld.vector(ap + "q_a_layernorm.weight", QL, false, at.q_a_norm));
      MLAKV_RETURN_IF_ERROR(ld.linear(ap + "q_b_proj", H * (P + R), QL, at.q_b));
    } else {
      MLAKV_RETURN_IF_ERROR(ld.linear(ap + "q_proj", H * (P + R), D, at.q_proj));
    }
    MLAKV_RETURN_IF_ERROR(ld.linear(ap + "kv_a_proj_with_mqa", L + R, D, at.kv_a, true));
    MLAKV_RETURN_IF_ERROR(ld.vector(ap + "kv_a_layernorm.weight", L, false, at.kv_a_norm));
    MLAKV_RETURN_IF_ERROR(ld.linear(ap + "kv_b_proj", H * (P + V), L, at.kv_b));
    MLAKV_RETURN_IF_ERROR(ld.linear(ap + "o_proj", D, H * V, at.o, true));

    lw.moe = a.moe_layer[static_cast<std::size_t>(i)];
    const std::string mp = pre + "mlp";
    if (!lw.moe) {
      MLAKV_RETURN_IF_ERROR(ld.mlp(mp, D, a.intermediate_size, lw.mlp));
      continue;
    }
    model::MoeWeights& mw = lw.moe_w;
    const int64_t E = a.routing.num_experts, I = a.moe_intermediate_size;
    Linear router;
    MLAKV_RETURN_IF_ERROR(ld.linear(mp + ".gate", E, D, router));
    mw.router_owned = std::move(router.owned);
    mw.router = router.w;
    if (!mw.router_owned.empty()) mw.router.data = mw.router_owned.data();
    if (a.routing.scoring == MoeScoring::kSigmoid) {
      MLAKV_RETURN_IF_ERROR(ld.vector(mp + ".gate.e_score_correction_bias", E, false, mw.bias));
    }
    const std::size_t before = impl->memory.resident_bytes();
    MLAKV_ASSIGN_OR_RETURN(bool fused, ld.fused_experts(mp + ".experts", E, D, I, mw.experts));
    if (!fused) {
      mw.experts.resize(static_cast<std::size_t>(E));
      for (int64_t e = 0; e < E; ++e)
        MLAKV_RETURN_IF_ERROR(ld.mlp(fmt::format("{}.experts.{}", mp, e), D, I, mw.experts[static_cast<std::size_t>(e)]));
    }
    impl->memory.routed_expert_bytes += impl->memory.resident_bytes() - before;
    if (a.n_shared_experts > 0) {
      mw.has_shared = true;
      MLAKV_RETURN_IF_ERROR(ld.mlp(mp + ".shared_experts", D, I * a.n_shared_experts, mw.shared));
    }
  }

  // Load-time notes for frontends.
  if (c.index_topk > 0) {
    impl->notes.push_back(fmt::format(
        "{}: the DSA indexer is not run; attention is dense over every cached token, which equals DSA only while a "
        "sequence holds at most index_topk = {} tokens",
        c.model_type, c.index_topk));
  }
  int64_t mtp_tensors = 0;
  const std::string mtp_prefix = fmt::format("model.layers.{}.", c.num_layers);
  for (const std::string& n : src.names()) mtp_tensors += n.rfind(mtp_prefix, 0) == 0 ? 1 : 0;
  if (mtp_tensors > 0) {
    impl->notes.push_back(fmt::format("skipped {} MTP tensors ({}*): next-token prediction layers are not run",
                                      mtp_tensors, mtp_prefix));
  }
  if (!quantized.empty()) {
    std::string list;
    for (const std::string& q : quantized) list += (list.empty() ? "" : ", ") + q;
    impl->notes.push_back(fmt::format("dequantized {} weights to float32 at load ({:.1f} MiB)", list,
                                      static_cast<double>(impl->memory.dequantized_bytes) / (1 << 20)));
  }
  impl->pool = std::make_unique<ThreadPool>(opt.threads);
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

StatusOr<std::unique_ptr<PagedKvCache>> Model::create_cache(const std::vector<LayerFormat>& layers,
                                                            int64_t max_tokens, int block_size) const {
  if (max_tokens < 1) return invalid_argument(fmt::format("max_tokens must be >= 1, got {}", max_tokens));
  if (block_size < 1) return invalid_argument(fmt::format("block_size must be >= 1, got {}", block_size));
  const ModelConfig& c = config();
  if (layers.size() != 1 && static_cast<int>(layers.size()) != c.num_layers) {
    return invalid_argument(fmt::format("{} layer formats given for a model of {} layers (give 1 or {})",
                                        layers.size(), c.num_layers, c.num_layers));
  }
  KvCache::Config kc;
  kc.num_layers = c.num_layers;
  kc.block_size = block_size;
  kc.num_blocks = (max_tokens + block_size - 1) / block_size;
  kc.layers = layers;
  kc.latent_dim = c.kv_lora_rank;
  kc.rope_dim = c.qk_rope_head_dim;
  return PagedKvCache::create_cpu(kc);
}

Status linear_cpu(const TensorView& x, const TensorView& w, const TensorView& y, ThreadPool* pool) {
  MLAKV_RETURN_IF_ERROR(check_tensor(w, "w", {{DType::kF32, DType::kBF16, DType::kF16}, {-1, -1}}, Device::cpu()));
  const int64_t N = w.size(0), K = w.size(1);
  MLAKV_RETURN_IF_ERROR(check_tensor(x, "x", {{DType::kF32}, {-1, K}}, Device::cpu()));
  const int64_t T = x.size(0);
  MLAKV_RETURN_IF_ERROR(check_tensor(y, "y", {{DType::kF32}, {T, N}}, Device::cpu()));
  if (w.stride(0) < K) return invalid_argument(fmt::format("w: row stride {} is below its {} columns", w.stride(0), K));
  if (x.stride(0) < K) return invalid_argument(fmt::format("x: row stride {} is below its {} columns", x.stride(0), K));
  if (y.stride(0) < N) return invalid_argument(fmt::format("y: row stride {} is below its {} columns", y.stride(0), N));
  model::matmul_nt(x.ptr<const float>(), T, x.stride(0), WeightMatrix{w.data, w.dtype, N, K, w.stride(0)},
                   y.ptr<float>(), y.stride(0), pool);
  return Status::Ok();
}

Status write_records_simd(PagedKvCache& cache, int layer, std::span<const int64_t> slots, const TensorView& latent,
                          const TensorView& rope, ThreadPool* pool, const LatentTransformKernel* transform) {
  const KvCache::Config& kc = cache.storage().config();
  const int64_t n = static_cast<int64_t>(slots.size());
  MLAKV_RETURN_IF_ERROR(check_tensor(latent, "latent", {{DType::kF32}, {n, kc.latent_dim}}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_tensor(rope, "rope", {{DType::kF32}, {n, kc.rope_dim}}, Device::cpu()));
  if (!latent.is_contiguous() || !rope.is_contiguous()) return invalid_argument("latent, rope: must be contiguous");
  return model::write_cache_records(cache.storage(), layer, slots, latent.ptr<const float>(), rope.ptr<const float>(),
                                    pool, transform);
}

FoldedLatentTransform::FoldedLatentTransform(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FoldedLatentTransform::~FoldedLatentTransform() = default;
const LatentTransform& FoldedLatentTransform::transform() const { return impl_->transform; }
std::size_t FoldedLatentTransform::bytes() const {
  std::size_t n = 0;
  for (const auto& v : impl_->kv_b) n += v.size() * sizeof(float);
  for (const auto& v : impl_->uv_bias) n += v.size() * sizeof(float);
  return n;
}

StatusOr<std::shared_ptr<const FoldedLatentTransform>> Model::fold_latent_transform(const LatentTransform& t) const {
  const ModelConfig& c = config();
  if (t.num_layers() != c.num_layers)
    return invalid_argument(
        fmt::format("latent transform: {} layers given for a model of {} layers", t.num_layers(), c.num_layers));
  if (c.kv_lora_rank != kLatentDim || c.qk_rope_head_dim != kRopeDim)
    return unimplemented(fmt::format("latent transform: needs kv_lora_rank {} and qk_rope_head_dim {}, the model has "
                                     "{} and {}",
                                     kLatentDim, kRopeDim, c.kv_lora_rank, c.qk_rope_head_dim));
  auto f = std::make_unique<FoldedLatentTransform::Impl>();
  f->model = impl_.get();
  f->transform = t;
  MLAKV_ASSIGN_OR_RETURN(f->kernels, make_latent_transform_kernels(t));
  const int64_t H = c.num_heads, P = c.qk_nope_head_dim, V = c.v_head_dim, L = c.kv_lora_rank;
  std::vector<std::vector<float>>& kv_b = f->kv_b;
  kv_b.resize(static_cast<std::size_t>(c.num_layers));
  f->uv_bias.resize(static_cast<std::size_t>(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    const LatentTransformKernel& k = f->kernels[static_cast<std::size_t>(l)];
    const WeightMatrix& w = impl_->layers[static_cast<std::size_t>(l)].attn.kv_b.w;
    std::vector<float>& out = kv_b[static_cast<std::size_t>(l)];
    std::vector<float>& bias = f->uv_bias[static_cast<std::size_t>(l)];
    out.resize(static_cast<std::size_t>(H * (P + V) * L));
    bias.resize(static_cast<std::size_t>(H * V));
    const int64_t rows = H * (P + V);
    impl_->pool->parallel_for(rows, [&](int64_t r, int) {
      std::vector<float> row(static_cast<std::size_t>(L));
      std::vector<double> folded(static_cast<std::size_t>(L));
      for (int64_t i = 0; i < L; ++i) row[static_cast<std::size_t>(i)] = w.at(r, i);
      k.fold_row(row.data(), folded.data());
      for (int64_t i = 0; i < L; ++i) out[static_cast<std::size_t>(r * L + i)] = static_cast<float>(folded[static_cast<std::size_t>(i)]);
      const int64_t h = r / (P + V), j = r % (P + V);
      if (j >= P) bias[static_cast<std::size_t>(h * V + (j - P))] = static_cast<float>(k.dot_mu(row.data()));
    });
  }
  return std::shared_ptr<const FoldedLatentTransform>(new FoldedLatentTransform(std::move(f)));
}

StatusOr<std::vector<LayerFormat>> Model::transform_layer_formats(KvFormat format, const LatentTransform& t) const {
  if (static_cast<int>(format) >= kNumKvFormats)
    return invalid_argument(fmt::format("unknown format id {}", static_cast<int>(format)));
  if (t.num_layers() != num_layers())
    return invalid_argument(
        fmt::format("latent transform: {} layers given for a model of {} layers", t.num_layers(), num_layers()));
  MLAKV_RETURN_IF_ERROR(validate_latent_transform(t));
  const bool outer = format_info(format).has_outer_scale;
  std::vector<LayerFormat> out;
  // The file's nvfp4 scale mode on the nvfp4 formats (it is an nvfp4 encoder option).
  const Nvfp4ScaleMode nv = is_nvfp4_format(format) ? t.nvfp4_scales : Nvfp4ScaleMode::kRn;
  for (const LatentTransformLayer& l : t.layers) out.push_back({format, outer ? l.outer_scale : 1.0f, false, nv});
  return out;
}

StatusOr<std::vector<double>> Model::latent_output_energy(int layer) const {
  const ModelConfig& c = config();
  if (layer < 0 || layer >= c.num_layers)
    return out_of_range(fmt::format("latent_output_energy: layer {} is outside [0, {})", layer, c.num_layers));
  const int64_t H = c.num_heads, P = c.qk_nope_head_dim, V = c.v_head_dim, L = c.kv_lora_rank, D = c.hidden_size;
  const model::AttentionWeights& a = impl_->layers[static_cast<std::size_t>(layer)].attn;
  std::vector<double> e(static_cast<std::size_t>(L), 0.0);
  // e_i = sum_h r_hi^T G_h r_hi, G_h = W_o,h^T W_o,h [V, V], r_hi = column i of W_UV^T,h.
  std::vector<double> G(static_cast<std::size_t>(V * V));
  for (int64_t h = 0; h < H; ++h) {
    std::fill(G.begin(), G.end(), 0.0);
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t u = 0; u < V; ++u) {
        const double wu = a.o.w.at(d, h * V + u);
        for (int64_t v = 0; v < V; ++v) G[static_cast<std::size_t>(u * V + v)] += wu * a.o.w.at(d, h * V + v);
      }
    }
    std::vector<double> r(static_cast<std::size_t>(V));
    for (int64_t i = 0; i < L; ++i) {
      for (int64_t v = 0; v < V; ++v) r[static_cast<std::size_t>(v)] = a.kv_b.w.at(h * (P + V) + P + v, i);
      double s = 0.0;
      for (int64_t u = 0; u < V; ++u) {
        double gu = 0.0;
        for (int64_t v = 0; v < V; ++v) gu += G[static_cast<std::size_t>(u * V + v)] * r[static_cast<std::size_t>(v)];
        s += r[static_cast<std::size_t>(u)] * gu;
      }
      e[static_cast<std::size_t>(i)] += s;
    }
  }
  return e;
}

StatusOr<std::unique_ptr<ReferenceKvCache>> Model::create_reference_cache() const {
  return ReferenceKvCache::create(config().num_layers, config().kv_lora_rank, config().qk_rope_head_dim);
}

}  // namespace mlakv
