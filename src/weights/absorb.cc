// Weight absorption (mlakv/absorb.h, docs/absorb.md).
//
// Conventions, checked against vLLM (read for facts; nothing copied):
//  - vllm/model_executor/layers/attention/mla_attention.py
//    `MLAAttention.process_weights_after_loading` (and its predecessor in
//    vllm/v1/attention/backends/mla/common.py `MLACommonImpl.process_weights_after_loading`):
//    the dequantized kv_b_proj [H*(P+V), L] is transposed to [L, H*(P+V)], viewed
//    [L, H, P+V] and split on the last dimension into W_UK [L, H, P] and W_UV [L, H, V];
//    "Convert from (L, N, V) to (N, L, V)": W_UV = W_UV.transpose(0, 1) -> [H, L, V];
//    "Convert from (L, N, P) to (N, P, L)": W_UK_T = W_UK.permute(1, 2, 0) -> [H, P, L].
//    Decode: ql_nope [H, B, L] = bmm(q_nope [H, B, P], W_UK_T); the attention output
//    [H, B, L] is brought back with bmm(x, W_UV) -> [H, B, V]. Hence
//      W_UK_T[h][p][l] = W[h*(P+V) + p][l]   and   W_UV[h][l][v] = W[h*(P+V) + P + v][l],
//    which is what split_kv_b_proj() below stores.
//  - The dequantization goes to the activation dtype: get_and_maybe_dequant_weights(
//    kv_b_proj, out_dtype=act_dtype) (quantization/utils/quant_utils.py): unquantized
//    weights are cast; non-Marlin, non-DeepGEMM fp8 goes through scaled_dequantize (an f32
//    product, then the output dtype); everything else multiplies the layer by eye(L) and
//    transposes. So vLLM's scratch is [N, L] in the activation dtype (our default).
//  - The pair is stored with replace_parameter(..., prefer_copy=True). Its comment: there
//    are no quantized bmm's, "so we just store fp16/bf16 copies"; the ROCm Aiter fp8/fp4
//    BMM branches instead keep quantized W_K / W_V (our AbsorbPath::kQuantizedBmm).
//  - kv_b_proj itself stays loaded: the prefill path up-projects the latent with it. The
//    allocation experiment therefore keeps a persistent device copy by default.
//  - local-inference-lab/vllm PR #156 (supersedes #148): allocate W_UV and W_UK_T before
//    the dequantization scratch; preallocate only on the generic 16-bit path; resolve the
//    device from weight, qweight, weight_packed, a wrapped base layer, parameters or
//    buffers; reuse compatible absorbed tensors on reload and copy in place
//    (prefer_copy=True) so CUDA-graph-visible data_ptr values survive. vllm-ascend's MLA
//    does the same on re-processing ("the weight address is expected to be the same
//    across iterations, so we need to copy the weight to the original address").
#include "mlakv/absorb.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <type_traits>
#include <utility>

#include "mlakv/numerics.h"
#include "weights/absorb_pair.h"

namespace mlakv {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::string normalize_prefix(std::string_view prefix) {
  std::string p(prefix);
  if (!p.empty() && p.back() != '.') p.push_back('.');
  return p;
}

std::size_t nbytes_of(const TensorView& t) { return static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype); }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", s[i]);
  return out + "]";
}

// A TensorSource of views into memory someone else owns: staged copies in allocator
// memory, or the rows of one tensor-parallel rank.
class ViewSource final : public TensorSource {
 public:
  explicit ViewSource(std::string what) : what_(std::move(what)) {}
  void add(const std::string& name, const TensorView& v) { views_.insert_or_assign(name, v); }
  std::optional<TensorView> find(std::string_view name) const override {
    auto it = views_.find(name);
    if (it == views_.end()) return std::nullopt;
    return it->second;
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& kv : views_) out.push_back(kv.first);
    return out;
  }
  std::string describe() const override { return what_; }

 private:
  std::string what_;
  std::map<std::string, TensorView, std::less<>> views_;
};

// The tensors each encoding reads (suffixes after the prefix) and which one holds the weight.
struct EncodingTensors {
  std::vector<const char*> required;
  std::vector<const char*> optional;
  const char* storage;
};

EncodingTensors tensors_of(WeightEncoding e) {
  switch (e) {
    case WeightEncoding::kDense: return {{"weight"}, {}, "weight"};
    case WeightEncoding::kFp8Block: return {{"weight", "weight_scale_inv"}, {}, "weight"};
    case WeightEncoding::kModelOptNvfp4: return {{"weight", "weight_scale", "weight_scale_2"}, {}, "weight"};
    case WeightEncoding::kCompressedTensorsNvfp4:
      return {{"weight_packed", "weight_scale", "weight_global_scale"}, {}, "weight_packed"};
    case WeightEncoding::kGptq: return {{"qweight", "qzeros", "scales"}, {"g_idx"}, "qweight"};
    case WeightEncoding::kAwq: return {{"qweight", "qzeros", "scales"}, {}, "qweight"};
  }
  return {{"weight"}, {}, "weight"};
}

// The storage tensor's shape for an [N, L] weight (mlakv/kv_b_proj.h layouts).
std::vector<int64_t> storage_shape(WeightEncoding e, int64_t N, int64_t L) {
  switch (e) {
    case WeightEncoding::kDense:
    case WeightEncoding::kFp8Block: return {N, L};
    case WeightEncoding::kModelOptNvfp4:
    case WeightEncoding::kCompressedTensorsNvfp4: return {N, L / 2};
    case WeightEncoding::kGptq: return {L / 8, N};
    case WeightEncoding::kAwq: return {L, N / 8};
  }
  return {N, L};
}

Status check_geometry(const MlaGeometry& g) {
  if (g.num_heads <= 0 || g.qk_nope_head_dim <= 0 || g.v_head_dim <= 0 || g.kv_lora_rank <= 0) {
    return invalid_argument(fmt::format(
        "kv_b_proj geometry: num_heads {}, qk_nope_head_dim {}, v_head_dim {}, kv_lora_rank {} must all be positive",
        g.num_heads, g.qk_nope_head_dim, g.v_head_dim, g.kv_lora_rank));
  }
  return Status::Ok();
}

std::string geometry_str(const MlaGeometry& g) {
  return fmt::format("{} heads x (qk_nope_head_dim {} + v_head_dim {}), kv_lora_rank {}", g.num_heads,
                     g.qk_nope_head_dim, g.v_head_dim, g.kv_lora_rank);
}

// Resolves storage for a known encoding. Missing tensors are appended to `missing` (when
// given) as well as reported.
StatusOr<KvBProjStorage> resolve_with(const TensorSource& src, const std::string& p, const MlaGeometry& geo,
                                      WeightEncoding enc, std::vector<std::string>* missing) {
  const EncodingTensors et = tensors_of(enc);
  KvBProjStorage st;
  st.encoding = enc;
  st.storage_name = p + et.storage;
  std::vector<std::string> absent;
  for (const char* s : et.required) {
    const std::string name = p + s;
    if (std::optional<TensorView> v = src.find(name)) {
      st.tensors.push_back(name);
      st.bytes += nbytes_of(*v);
    } else {
      absent.push_back(name);
    }
  }
  for (const char* s : et.optional) {
    const std::string name = p + s;
    if (std::optional<TensorView> v = src.find(name)) {
      st.tensors.push_back(name);
      st.bytes += nbytes_of(*v);
    }
  }
  if (!absent.empty()) {
    std::string list;
    for (const std::string& n : absent) list += fmt::format("{}{}", list.empty() ? "" : ", ", n);
    if (missing != nullptr) {
      // The caller gathers names across layers; skip the (whole-checkpoint) name scan.
      missing->insert(missing->end(), absent.begin(), absent.end());
      return not_found(fmt::format("{}: the {} encoding needs {}", p, weight_encoding_name(enc), list));
    }
    std::string under;
    for (const std::string& n : src.names()) {
      if (n.compare(0, p.size(), p) == 0) under += fmt::format("{}{}", under.empty() ? "" : ", ", n);
    }
    return not_found(fmt::format("{}: the {} encoding needs {} missing from {}; tensors under the prefix: {}", p,
                                 weight_encoding_name(enc), list, src.describe(), under.empty() ? "none" : under));
  }
  const TensorView storage = *src.find(st.storage_name);
  st.device = storage.device;
  const std::vector<int64_t> want = storage_shape(enc, geo.kv_b_rows(), geo.kv_lora_rank);
  const std::vector<int64_t> got(storage.shape.begin(), storage.shape.begin() + storage.ndim);
  if (got != want) {
    return invalid_argument(fmt::format(
        "{}: shape {} does not match the model config: kv_b_proj of {} is stored as {} in the {} encoding "
        "(the checkpoint and the config disagree, or the tensor-parallel size is wrong)",
        st.storage_name, shape_str(got), geometry_str(geo), shape_str(want), weight_encoding_name(enc)));
  }
  return st;
}

Status validate_options(const AbsorbOptions& opt) {
  if (opt.dtype != DType::kBF16 && opt.dtype != DType::kF32) {
    return invalid_argument(
        fmt::format("absorb options: dtype {} is not an activation dtype (bf16 or f32)", dtype_name(opt.dtype)));
  }
  const DType sdt = opt.scratch_dtype.value_or(opt.dtype);
  if (sdt != DType::kBF16 && sdt != DType::kF32) {
    return invalid_argument(
        fmt::format("absorb options: scratch_dtype {} must be f32 or bf16 (what the dequantizer writes)",
                    dtype_name(sdt)));
  }
  if (opt.order != AllocationOrder::kPersistentFirst && opt.order != AllocationOrder::kScratchFirst) {
    return invalid_argument(fmt::format("absorb options: unknown allocation order {}", static_cast<int>(opt.order)));
  }
  if (opt.path != AbsorbPath::kActivation && opt.path != AbsorbPath::kQuantizedBmm) {
    return invalid_argument(fmt::format("absorb options: unknown path {}", static_cast<int>(opt.path)));
  }
  return Status::Ok();
}

// ---- the absorption transform -------------------------------------------------------------

struct F32 {
  using T = float;
};
struct BF16 {
  using T = uint16_t;
};
inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t b) { return bf16_to_f32(b); }
template <class D>
inline typename D::T from_f32(float v) {
  if constexpr (std::is_same_v<D, F32>) {
    return v;
  } else {
    return f32_to_bf16(v);  // round to nearest even; exact for a bf16 source
  }
}

// scratch [H, P+V, L] -> W_UK_T [H, P, L] and W_UV [H, L, V] (conventions at the top).
template <class S, class D>
void write_pair_t(const void* scratch, void* ukt, void* uv, const MlaGeometry& g) {
  const auto* s = static_cast<const typename S::T*>(scratch);
  auto* k = static_cast<typename D::T*>(ukt);
  auto* o = static_cast<typename D::T*>(uv);
  const int64_t H = g.num_heads, P = g.qk_nope_head_dim, V = g.v_head_dim, L = g.kv_lora_rank;
  for (int64_t h = 0; h < H; ++h) {
    const typename S::T* head = s + h * (P + V) * L;
    // W_UK_T[h] is W_UK[h] itself: rows p of the head, L contiguous.
    for (int64_t i = 0; i < P * L; ++i) k[h * P * L + i] = from_f32<D>(to_f32(head[i]));
    // W_UV[h] is the head's last V rows transposed.
    const typename S::T* wuv = head + P * L;
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t l = 0; l < L; ++l) o[(h * L + l) * V + v] = from_f32<D>(to_f32(wuv[v * L + l]));
    }
  }
}


// Why `layer`'s pair cannot take the new one in place ("" when it can).
std::string incompatibility(const AbsorbedLayer& layer, const MlaGeometry& g, DType dt, Device dev) {
  std::vector<std::string> why;
  const MlaGeometry& o = layer.geometry;
  if (o.num_heads != g.num_heads || o.qk_nope_head_dim != g.qk_nope_head_dim || o.v_head_dim != g.v_head_dim ||
      o.kv_lora_rank != g.kv_lora_rank) {
    const std::vector<int64_t> ok = {o.num_heads, o.qk_nope_head_dim, o.kv_lora_rank};
    const std::vector<int64_t> nk = {g.num_heads, g.qk_nope_head_dim, g.kv_lora_rank};
    const std::vector<int64_t> ov = {o.num_heads, o.kv_lora_rank, o.v_head_dim};
    const std::vector<int64_t> nv = {g.num_heads, g.kv_lora_rank, g.v_head_dim};
    why.push_back(fmt::format("W_UK_T {} -> {}, W_UV {} -> {}", shape_str(ok), shape_str(nk), shape_str(ov),
                              shape_str(nv)));
  }
  if (layer.dtype != dt) why.push_back(fmt::format("dtype {} -> {}", dtype_name(layer.dtype), dtype_name(dt)));
  if (!(layer.device == dev)) {
    why.push_back(fmt::format("device {} -> {}", device_name(layer.device), device_name(dev)));
  }
  std::string out;
  for (const std::string& w : why) out += fmt::format("{}{}", out.empty() ? "" : "; ", w);
  return out;
}

// absorb_kv_b_proj once the storage is resolved (`st` describes `src` under `p`).
Status absorb_resolved(const TensorSource& src, const std::string& p, const KvBProjStorage& st, const MlaGeometry& geo,
                       CachingAllocator& alloc, const AbsorbOptions& opt, AbsorbedLayer& layer,
                       LayerStorageChange* change) {
  if (opt.path == AbsorbPath::kQuantizedBmm) {
    // Nothing to allocate: the backend reads the checkpoint's storage where it lives.
    LayerStorageChange c{layer.layer, layer.has_pair(), false, ""};
    if (c.had_pair) c.reason = "the quantized-BMM path keeps no absorbed pair: W_UK_T and W_UV released";
    layer.w_uk_t_storage.reset();
    layer.w_uv_storage.reset();
    layer.geometry = geo;
    layer.device = st.device;
    layer.source_encoding = st.encoding;
    layer.values_written = false;
    if (change != nullptr) *change = std::move(c);
    return Status::Ok();
  }
  const Device dev = alloc.device();
  if (!opt.placement_only && !(dev == Device::cpu())) {
    return unimplemented(fmt::format(
        "{}: the allocator's memory is on {} and this build writes absorbed weights only to host memory; "
        "set placement_only to model the placement without values",
        p, device_name(dev)));
  }
  if (!opt.placement_only && !(st.device == Device::cpu())) {
    return unimplemented(fmt::format("{}: stored on {}; dequantization reads cpu tensors only", st.storage_name,
                                     device_name(st.device)));
  }
  const int64_t H = geo.num_heads, P = geo.qk_nope_head_dim, V = geo.v_head_dim, L = geo.kv_lora_rank;
  const DType sdt = opt.scratch_dtype.value_or(opt.dtype);
  const std::size_t es = dtype_size(opt.dtype);
  const std::size_t ukt_bytes = static_cast<std::size_t>(H * P * L) * es;
  const std::size_t uv_bytes = static_cast<std::size_t>(H * L * V) * es;
  const std::size_t scratch_bytes = static_cast<std::size_t>(geo.kv_b_rows() * L) * dtype_size(sdt);

  const bool had = layer.has_pair();
  const std::string reason = had ? incompatibility(layer, geo, opt.dtype, dev) : std::string();
  const bool reuse = had && reason.empty();

  Allocation new_ukt, new_uv;
  auto allocate_pair = [&]() -> Status {
    if (reuse) return Status::Ok();
    StatusOr<Allocation> a = alloc.allocate(ukt_bytes);
    if (!a.ok()) {
      return a.status().with_context(fmt::format("{}: allocating W_UK_T [{}, {}, {}] {}", p, H, P, L,
                                                 dtype_name(opt.dtype)));
    }
    new_ukt = std::move(*a);
    StatusOr<Allocation> b = alloc.allocate(uv_bytes);
    if (!b.ok()) {
      return b.status().with_context(fmt::format("{}: allocating W_UV [{}, {}, {}] {}", p, H, L, V,
                                                 dtype_name(opt.dtype)));
    }
    new_uv = std::move(*b);
    return Status::Ok();
  };

  if (opt.order == AllocationOrder::kPersistentFirst) MLAKV_RETURN_IF_ERROR(allocate_pair());

  // Transient part: staged quantized tensors (optional), then the dequantized scratch.
  std::vector<Allocation> staged;
  ViewSource staged_src(fmt::format("{} (staged in {} memory)", src.describe(), device_name(dev)));
  const TensorSource* deq_src = &src;
  if (opt.stage_quantized) {
    for (const std::string& name : st.tensors) {
      const TensorView v = *src.find(name);
      const std::size_t n = nbytes_of(v);
      StatusOr<Allocation> a = alloc.allocate(n);
      if (!a.ok()) return a.status().with_context(fmt::format("staging {} ({} B)", name, n));
      TensorView copy = v;
      copy.data = a->data();
      copy.device = dev;
      if (!opt.placement_only && n != 0) {
        if (!v.is_contiguous()) {
          return invalid_argument(fmt::format("{}: expected a contiguous tensor, got shape {}", name,
                                              v.shape_string()));
        }
        std::memcpy(a->data(), v.data, n);
      }
      staged_src.add(name, copy);
      staged.push_back(std::move(*a));
    }
    deq_src = &staged_src;
  }
  StatusOr<Allocation> scratch = alloc.allocate(scratch_bytes);
  if (!scratch.ok()) {
    return scratch.status().with_context(
        fmt::format("{}: allocating the dequantization scratch [{}, {}] {}", p, geo.kv_b_rows(), L, dtype_name(sdt)));
  }
  if (!opt.placement_only) {
    WeightQuantOptions q = opt.quant;
    q.encoding = st.encoding;
    MLAKV_RETURN_IF_ERROR(
        dequantize_kv_b_proj(*deq_src, p, geo, q, TensorView::contiguous(scratch->data(), sdt, {geo.kv_b_rows(), L})));
  }
  staged.clear();  // the quantized copies are done with once dequantized

  if (opt.order == AllocationOrder::kScratchFirst) MLAKV_RETURN_IF_ERROR(allocate_pair());

  void* ukt = reuse ? layer.w_uk_t_storage.data() : new_ukt.data();
  void* uv = reuse ? layer.w_uv_storage.data() : new_uv.data();
  if (!opt.placement_only) split_kv_b_proj(scratch->data(), sdt, ukt, uv, opt.dtype, geo);
  scratch->reset();

  // Commit: only now may the old pair go (on any earlier failure the layer is untouched).
  if (!reuse) {
    layer.w_uk_t_storage = std::move(new_ukt);
    layer.w_uv_storage = std::move(new_uv);
  }
  layer.geometry = geo;
  layer.dtype = opt.dtype;
  layer.device = dev;
  layer.source_encoding = st.encoding;
  layer.values_written = !opt.placement_only;
  if (change != nullptr) *change = LayerStorageChange{layer.layer, had, reuse, reuse ? std::string() : reason};
  return Status::Ok();
}

// ---- tensor parallelism: one rank's rows, as views ------------------------------------------

// The rows [r0, r0 + rows) of a contiguous 2-D tensor whose first dimension must be `full_rows`.
StatusOr<TensorView> row_slice(const TensorView& t, const std::string& name, int64_t full_rows, int64_t r0,
                               int64_t rows) {
  if (t.ndim != 2 || t.size(0) != full_rows) {
    return invalid_argument(fmt::format("{}: expected {} rows to split across tensor-parallel ranks, got shape {}",
                                        name, full_rows, t.shape_string()));
  }
  if (!t.is_contiguous()) {
    return invalid_argument(fmt::format("{}: expected a contiguous tensor, got shape {}", name, t.shape_string()));
  }
  TensorView v = t;
  v.data = static_cast<uint8_t*>(t.data) + static_cast<std::size_t>(r0 * t.size(1)) * dtype_size(t.dtype);
  v.shape[0] = rows;
  return v;
}

// The rank's share of the layer under `p`: row slices of the N-major tensors, the
// per-tensor scalars as they are.
StatusOr<std::unique_ptr<ViewSource>> shard_layer(const TensorSource& src, const std::string& p,
                                                  const KvBProjStorage& st, const MlaGeometry& full, int tp, int rank,
                                                  const WeightQuantOptions& quant) {
  if (st.encoding == WeightEncoding::kGptq || st.encoding == WeightEncoding::kAwq) {
    return unimplemented(fmt::format(
        "{}: tensor-parallel slicing of a {} kv_b_proj (output columns of qweight) is not implemented; use tp 1",
        st.storage_name, weight_encoding_name(st.encoding)));
  }
  const int64_t N = full.kv_b_rows(), rows = N / tp, r0 = rows * rank;
  auto out = std::make_unique<ViewSource>(
      fmt::format("{} (tensor-parallel rank {} of {})", src.describe(), rank, tp));
  for (const std::string& name : st.tensors) {
    const TensorView t = *src.find(name);
    const std::string suffix = name.substr(p.size());
    if (suffix == "weight_scale_2" || suffix == "weight_global_scale") {
      out->add(name, t);  // per-tensor scalar: every rank uses it whole
      continue;
    }
    if (suffix == "weight_scale_inv") {
      const int64_t bn = quant.fp8_block_rows;
      if (bn <= 0 || rows % bn != 0) {
        return unimplemented(fmt::format(
            "{}: the rank's {} rows are not a multiple of the fp8 block rows {}, so its scales are not a row range",
            name, rows, bn));
      }
      MLAKV_ASSIGN_OR_RETURN(TensorView v, row_slice(t, name, (N + bn - 1) / bn, r0 / bn, rows / bn));
      out->add(name, v);
      continue;
    }
    MLAKV_ASSIGN_OR_RETURN(TensorView v, row_slice(t, name, N, r0, rows));  // weight, weight_packed, weight_scale
    out->add(name, v);
  }
  return out;
}

// ---- whole models ----------------------------------------------------------------------------

struct LayerPlan {
  int index = 0;
  std::string prefix;
  KvBProjStorage storage;  // of the full tensors
};

struct ModelPlan {
  MlaGeometry full, rank;
  std::vector<LayerPlan> layers;
};

StatusOr<ModelPlan> plan_model(const TensorSource& src, const ModelConfig& config, const AbsorbModelOptions& opt) {
  MLAKV_RETURN_IF_ERROR(validate_options(opt.absorb));
  MLAKV_RETURN_IF_ERROR(config.validate());
  if (opt.tp_size < 1) return invalid_argument(fmt::format("tp_size {}: must be >= 1", opt.tp_size));
  if (opt.tp_rank < 0 || opt.tp_rank >= opt.tp_size) {
    return invalid_argument(fmt::format("tp_rank {}: must be in [0, {})", opt.tp_rank, opt.tp_size));
  }
  if (config.num_heads % opt.tp_size != 0) {
    return invalid_argument(fmt::format("tp_size {} does not divide model {}'s {} attention heads", opt.tp_size,
                                        config.name, config.num_heads));
  }
  ModelPlan plan;
  plan.full = config.geometry();
  plan.rank = plan.full;
  plan.rank.num_heads /= opt.tp_size;
  const int count = config.num_layers + (opt.include_mtp ? config.num_mtp_layers : 0);

  // Pass 1: each layer's encoding; the first one found stands in for layers with no storage
  // at all, so that their missing tensors can be named.
  std::vector<StatusOr<WeightEncoding>> enc;
  std::optional<WeightEncoding> reference = opt.absorb.quant.encoding;
  for (int i = 0; i < count; ++i) {
    const std::string p = fmt::format("{}{}.self_attn.kv_b_proj.", opt.layer_prefix, i);
    if (opt.absorb.quant.encoding) {
      enc.emplace_back(*opt.absorb.quant.encoding);
    } else {
      enc.push_back(detect_weight_encoding(src, p));
      if (!reference && enc.back().ok()) reference = *enc.back();
    }
  }
  // Pass 2: resolve every layer; missing tensors are gathered across layers.
  std::vector<std::string> missing;
  int layers_missing = 0;
  for (int i = 0; i < count; ++i) {
    const std::string p = fmt::format("{}{}.self_attn.kv_b_proj.", opt.layer_prefix, i);
    WeightEncoding e;
    if (enc[static_cast<std::size_t>(i)].ok()) {
      e = *enc[static_cast<std::size_t>(i)];
    } else if (enc[static_cast<std::size_t>(i)].status().code() == StatusCode::kNotFound && reference) {
      e = *reference;
    } else {
      return enc[static_cast<std::size_t>(i)].status().with_context(fmt::format("layer {}", i));
    }
    const std::size_t before = missing.size();
    StatusOr<KvBProjStorage> st = resolve_with(src, p, plan.full, e, &missing);
    if (!st.ok()) {
      if (st.status().code() == StatusCode::kNotFound) {
        layers_missing += missing.size() > before ? 1 : 0;
        continue;
      }
      return st.status().with_context(fmt::format("layer {}", i));
    }
    plan.layers.push_back({i, p, std::move(*st)});
  }
  if (!missing.empty()) {
    constexpr std::size_t kList = 32;
    std::string list;
    for (std::size_t j = 0; j < std::min(missing.size(), kList); ++j) {
      list += fmt::format("{}{}", j ? ", " : "", missing[j]);
    }
    if (missing.size() > kList) list += fmt::format(", ... ({} more)", missing.size() - kList);
    return not_found(fmt::format("kv_b_proj tensors missing for {} of {} layers in {}: {} ({} tensors)",
                                 layers_missing, count, src.describe(), list, missing.size()));
  }
  return plan;
}

// The source and storage one rank absorbs layer `lp` from (the full tensors when tp == 1).
struct RankLayer {
  std::unique_ptr<ViewSource> shard;  // null when tp == 1
  KvBProjStorage storage;
  const TensorSource* src = nullptr;
};

StatusOr<RankLayer> rank_layer(const TensorSource& src, const ModelPlan& plan, const LayerPlan& lp,
                               const AbsorbModelOptions& opt) {
  RankLayer r;
  if (opt.tp_size == 1) {
    r.storage = lp.storage;
    r.src = &src;
    return r;
  }
  MLAKV_ASSIGN_OR_RETURN(r.shard,
                         shard_layer(src, lp.prefix, lp.storage, plan.full, opt.tp_size, opt.tp_rank,
                                     opt.absorb.quant));
  MLAKV_ASSIGN_OR_RETURN(r.storage, resolve_with(*r.shard, lp.prefix, plan.rank, lp.storage.encoding, nullptr));
  r.src = r.shard.get();
  return r;
}

Status absorb_plan(const TensorSource& src, const ModelPlan& plan, CachingAllocator& alloc,
                   const AbsorbModelOptions& opt, std::vector<AbsorbedLayer>& layers,
                   std::vector<LayerStorageChange>* changes) {
  const int total = static_cast<int>(plan.layers.size());
  for (std::size_t j = 0; j < plan.layers.size(); ++j) {
    const LayerPlan& lp = plan.layers[j];
    const std::string ctx = fmt::format("layer {}", lp.index);
    if (opt.before_layer) MLAKV_RETURN_IF_ERROR(opt.before_layer(lp.index).with_context(ctx));
    StatusOr<RankLayer> rl = rank_layer(src, plan, lp, opt);
    if (!rl.ok()) return rl.status().with_context(ctx);
    LayerStorageChange change;
    MLAKV_RETURN_IF_ERROR(
        absorb_resolved(*rl->src, lp.prefix, rl->storage, plan.rank, alloc, opt.absorb, layers[j], &change)
            .with_context(ctx));
    if (changes != nullptr) changes->push_back(std::move(change));
    if (opt.progress) opt.progress(static_cast<int>(j) + 1, total);
  }
  return Status::Ok();
}

}  // namespace

void split_kv_b_proj(const void* kv_b, DType kv_b_dtype, void* w_uk_t, void* w_uv, DType dtype, const MlaGeometry& g) {
  if (kv_b_dtype == DType::kF32) {
    if (dtype == DType::kF32) return write_pair_t<F32, F32>(kv_b, w_uk_t, w_uv, g);
    return write_pair_t<F32, BF16>(kv_b, w_uk_t, w_uv, g);
  }
  if (dtype == DType::kF32) return write_pair_t<BF16, F32>(kv_b, w_uk_t, w_uv, g);
  return write_pair_t<BF16, BF16>(kv_b, w_uk_t, w_uv, g);
}

std::string_view allocation_order_name(AllocationOrder order) {
  switch (order) {
    case AllocationOrder::kPersistentFirst: return "persistent_first";
    case AllocationOrder::kScratchFirst: return "scratch_first";
  }
  return "?";
}

std::string_view quantized_copy_name(QuantizedCopy q) {
  switch (q) {
    case QuantizedCopy::kNone: return "none";
    case QuantizedCopy::kTransient: return "transient";
    case QuantizedCopy::kPersistent: return "persistent";
  }
  return "?";
}

TensorView AbsorbedLayer::w_uk_t() const {
  if (!has_pair()) return {};
  const MlaGeometry& g = geometry;
  return TensorView::contiguous(w_uk_t_storage.data(), dtype, {g.num_heads, g.qk_nope_head_dim, g.kv_lora_rank},
                                device);
}

TensorView AbsorbedLayer::w_uv() const {
  if (!has_pair()) return {};
  const MlaGeometry& g = geometry;
  return TensorView::contiguous(w_uv_storage.data(), dtype, {g.num_heads, g.kv_lora_rank, g.v_head_dim}, device);
}

StatusOr<KvBProjStorage> resolve_kv_b_proj_storage(const TensorSource& src, std::string_view prefix,
                                                   const MlaGeometry& geo, const WeightQuantOptions& quant) {
  MLAKV_RETURN_IF_ERROR(check_geometry(geo));
  const std::string p = normalize_prefix(prefix);
  WeightEncoding enc;
  if (quant.encoding) {
    enc = *quant.encoding;
  } else {
    MLAKV_ASSIGN_OR_RETURN(enc, detect_weight_encoding(src, p));
  }
  return resolve_with(src, p, geo, enc, nullptr);
}

Status absorb_kv_b_proj(const TensorSource& src, std::string_view prefix, const MlaGeometry& geo,
                        CachingAllocator& alloc, const AbsorbOptions& opt, AbsorbedLayer& layer,
                        LayerStorageChange* change) {
  MLAKV_RETURN_IF_ERROR(validate_options(opt));
  MLAKV_RETURN_IF_ERROR(alloc.status());
  MLAKV_ASSIGN_OR_RETURN(KvBProjStorage st, resolve_kv_b_proj_storage(src, prefix, geo, opt.quant));
  return absorb_resolved(src, normalize_prefix(prefix), st, geo, alloc, opt, layer, change);
}

StatusOr<std::vector<AbsorbedLayer>> absorb_model(const TensorSource& src, const ModelConfig& config,
                                                  CachingAllocator& alloc, const AbsorbModelOptions& opt) {
  MLAKV_RETURN_IF_ERROR(alloc.status());
  MLAKV_ASSIGN_OR_RETURN(ModelPlan plan, plan_model(src, config, opt));
  std::vector<AbsorbedLayer> layers(plan.layers.size());
  for (std::size_t j = 0; j < layers.size(); ++j) layers[j].layer = plan.layers[j].index;
  MLAKV_RETURN_IF_ERROR(absorb_plan(src, plan, alloc, opt, layers, nullptr));
  return layers;
}

StatusOr<std::vector<LayerStorageChange>> reload_model(const TensorSource& src, const ModelConfig& config,
                                                       CachingAllocator& alloc, const AbsorbModelOptions& opt,
                                                       std::vector<AbsorbedLayer>& layers) {
  MLAKV_RETURN_IF_ERROR(alloc.status());
  MLAKV_ASSIGN_OR_RETURN(ModelPlan plan, plan_model(src, config, opt));
  bool same = layers.size() == plan.layers.size();
  for (std::size_t j = 0; same && j < layers.size(); ++j) same = layers[j].layer == plan.layers[j].index;
  if (!same) {
    return failed_precondition(fmt::format(
        "reload: {} absorbed layers held, model {} gives {} (model/config mismatch: absorb the new model anew)",
        layers.size(), config.name, plan.layers.size()));
  }
  std::vector<LayerStorageChange> changes;
  MLAKV_RETURN_IF_ERROR(absorb_plan(src, plan, alloc, opt, layers, &changes));
  return changes;
}

StatusOr<AbsorbMemoryReport> measure_absorb_memory(const TensorSource& src, const ModelConfig& config,
                                                   const AbsorbModelOptions& opt, const AbsorbMemoryOptions& mem) {
  if (mem.device_bytes == 0) return invalid_argument("device_bytes: the modelled device needs a capacity > 0");
  MLAKV_ASSIGN_OR_RETURN(ModelPlan plan, plan_model(src, config, opt));
  if (plan.layers.empty()) return invalid_argument(fmt::format("model {}: no layers to absorb", config.name));

  // The rank's quantized tensor sizes per layer (what a persistent device copy holds).
  std::map<int, std::vector<std::size_t>> quantized;
  for (const LayerPlan& lp : plan.layers) {
    MLAKV_ASSIGN_OR_RETURN(RankLayer rl, rank_layer(src, plan, lp, opt));
    std::vector<std::size_t>& sizes = quantized[lp.index];
    for (const std::string& name : rl.storage.tensors) sizes.push_back(nbytes_of(*rl.src->find(name)));
  }

  AbsorbMemoryReport report;
  report.layers = static_cast<int>(plan.layers.size());
  report.rank_geometry = plan.rank;
  report.encoding = plan.layers[0].storage.encoding;
  const MlaGeometry& g = plan.rank;
  const DType sdt = opt.absorb.scratch_dtype.value_or(opt.absorb.dtype);
  report.pair_bytes_per_layer = static_cast<std::size_t>(g.kv_b_rows() * g.kv_lora_rank) * dtype_size(opt.absorb.dtype);
  report.scratch_bytes_per_layer = static_cast<std::size_t>(g.kv_b_rows() * g.kv_lora_rank) * dtype_size(sdt);
  for (std::size_t b : quantized[plan.layers[0].index]) report.quantized_bytes_per_layer += b;

  for (AllocationOrder order : {AllocationOrder::kScratchFirst, AllocationOrder::kPersistentFirst}) {
    const std::string ctx = fmt::format("{} order", allocation_order_name(order));
    CachingAllocator alloc(mem.virtual_device ? make_virtual_backing(mem.device_bytes)
                                              : make_host_backing(mem.device_bytes));
    std::vector<Allocation> resident;  // other weights and persistent quantized copies
    AbsorbModelOptions o = opt;
    o.absorb.order = order;
    o.absorb.placement_only = mem.virtual_device;
    o.absorb.stage_quantized = mem.quantized_copy == QuantizedCopy::kTransient;
    o.before_layer = [&](int layer) -> Status {
      if (mem.other_weights_bytes > 0) {
        StatusOr<Allocation> a = alloc.allocate(mem.other_weights_bytes);
        if (!a.ok()) return a.status().with_context("placing the layer's other weights");
        resident.push_back(std::move(*a));
      }
      if (mem.quantized_copy == QuantizedCopy::kPersistent) {
        for (std::size_t n : quantized[layer]) {
          StatusOr<Allocation> a = alloc.allocate(n);
          if (!a.ok()) return a.status().with_context("placing the quantized kv_b_proj");
          resident.push_back(std::move(*a));
        }
      }
      return opt.before_layer ? opt.before_layer(layer) : Status::Ok();
    };
    std::vector<AbsorbedLayer> layers(plan.layers.size());
    for (std::size_t j = 0; j < layers.size(); ++j) layers[j].layer = plan.layers[j].index;
    MLAKV_RETURN_IF_ERROR(absorb_plan(src, plan, alloc, o, layers, nullptr).with_context(ctx));

    AbsorbMemoryRun& run = order == AllocationOrder::kScratchFirst ? report.scratch_first : report.persistent_first;
    run.order = order;
    run.after_load = alloc.stats();
    for (const AbsorbedLayer& l : layers) run.requested_bytes += l.w_uk_t_storage.size() + l.w_uv_storage.size();
    for (const Allocation& a : resident) run.requested_bytes += a.size();
    alloc.empty_cache();
    run.after_empty_cache = alloc.stats();
    const std::size_t headroom = (mem.device_bytes - run.after_empty_cache.reserved_bytes) / (2 * kMiB) * (2 * kMiB);
    run.kv_cache_max_bytes = std::max(run.after_empty_cache.largest_free_block, headroom);
    layers.clear();
    resident.clear();
  }
  return report;
}

}  // namespace mlakv
