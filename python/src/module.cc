// The Python binding of mlakv (nanobind). It only converts: every operation is the C++
// library's, reached through include/mlakv/ (the public API); tensors cross as DLPack
// views (numpy arrays, torch tensors, anything with __dlpack__) without copies.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "mlakv/attention.h"
#ifdef MLAKV_PY_CUDA
#include "mlakv/cuda.h"
#endif
#include "mlakv/cache.h"
#include "mlakv/codec.h"
#include "mlakv/formats.h"
#include "mlakv/hf_config.h"
#include "mlakv/model_config.h"
#include "mlakv/latent_calib.h"
#include "mlakv/latent_transform.h"
#include "mlakv/outer_scales.h"
#include "mlakv/plan.h"
#include "mlakv/status.h"
#include "mlakv/tensor.h"
#include "mlakv/thread_pool.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mlakv::python {
namespace {

// ---- errors -----------------------------------------------------------------------------

// A failed Status becomes the Python exception of its kind, with the library's message.
[[noreturn]] void raise(const Status& s) {
  const std::string& m = s.message();
  switch (s.code()) {
    case StatusCode::kInvalidArgument: throw nb::value_error(m.c_str());
    case StatusCode::kOutOfRange: throw nb::index_error(m.c_str());
    case StatusCode::kResourceExhausted: throw std::bad_alloc();
    default: throw std::runtime_error(m);
  }
}
void check(const Status& s) {
  if (!s.ok()) raise(s);
}
template <class T>
T value(StatusOr<T> v) {
  if (!v.ok()) raise(v.status());
  return std::move(v).value();
}

// ---- tensors ------------------------------------------------------------------------------

using AnyArray = nb::ndarray<nb::ro>;  // any dtype, shape, device (read access is checked below)
using AnyMutArray = nb::ndarray<>;

template <class A>
TensorView view_of(const A& a, const char* name) {
  TensorView t;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  const nb::dlpack::dtype d = a.dtype();
  if (d.lanes != 1) throw nb::type_error((std::string(name) + ": vector dtypes are not supported").c_str());
  using C = nb::dlpack::dtype_code;
  const auto code = static_cast<C>(d.code);
  if (code == C::Float && d.bits == 32) t.dtype = DType::kF32;
  else if (code == C::Float && d.bits == 64) t.dtype = DType::kF64;
  else if (code == C::Float && d.bits == 16) t.dtype = DType::kF16;
  else if (code == C::Bfloat && d.bits == 16) t.dtype = DType::kBF16;
  else if (code == C::Int && d.bits == 32) t.dtype = DType::kI32;
  else if (code == C::Int && d.bits == 64) t.dtype = DType::kI64;
  else if (code == C::Int && d.bits == 8) t.dtype = DType::kI8;
  else if (code == C::Int && d.bits == 16) t.dtype = DType::kI16;
  else if (code == C::UInt && d.bits == 8) t.dtype = DType::kU8;
  else {
    throw nb::type_error((std::string(name) + ": unsupported dtype (code " + std::to_string(d.code) + ", " +
                          std::to_string(d.bits) + " bits)").c_str());
  }
  if (a.device_type() == nb::device::cpu::value) {
    t.device = Device::cpu();
  } else if (a.device_type() == nb::device::cuda::value) {
    t.device = Device::cuda(a.device_id());
  } else {
    throw nb::type_error((std::string(name) + ": tensors must live on the CPU or a CUDA device").c_str());
  }
  if (a.ndim() > static_cast<size_t>(kMaxTensorDims)) {
    throw nb::value_error((std::string(name) + ": at most " + std::to_string(kMaxTensorDims) + " dimensions").c_str());
  }
  t.ndim = static_cast<int>(a.ndim());
  for (int i = 0; i < t.ndim; ++i) {
    t.shape[static_cast<size_t>(i)] = static_cast<int64_t>(a.shape(static_cast<size_t>(i)));
    t.strides[static_cast<size_t>(i)] = static_cast<int64_t>(a.stride(static_cast<size_t>(i)));
  }
  return t;
}

void require_contiguous(const TensorView& t, const char* name) {
  if (!t.is_contiguous()) {
    throw nb::value_error((std::string(name) + ": must be contiguous (got strides of a non-contiguous view; "
                                               "call .contiguous() / np.ascontiguousarray first)").c_str());
  }
}
void require_cpu(const TensorView& t, const char* name) {
  if (t.device.type != DeviceType::kCpu) {
    throw nb::value_error((std::string(name) + ": must be a CPU tensor here, got " + device_name(t.device)).c_str());
  }
}

// A new numpy array owning its buffer.
template <class T>
nb::ndarray<nb::numpy, T> new_array(std::vector<size_t> shape) {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  T* data = new T[std::max<size_t>(n, 1)]();
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  return nb::ndarray<nb::numpy, T>(data, shape.size(), shape.data(), owner);
}

// ---- names ----------------------------------------------------------------------------------

KvFormat format_of(const std::string& name) {
  if (auto f = parse_format(name)) return *f;
  std::string all;
  for (const FormatInfo& i : all_formats()) all += (all.empty() ? "" : ", ") + std::string(i.name);
  throw nb::value_error(("format: unknown record format '" + name + "' (one of " + all + ")").c_str());
}
Fp8ScaleMode fp8_mode_of(const std::string& name) {
  if (name == "pow2") return Fp8ScaleMode::kPow2;
  if (name == "exact") return Fp8ScaleMode::kExact;
  throw nb::value_error(("fp8_scales: expected 'pow2' or 'exact', got '" + name + "'").c_str());
}

// ---- the thread pool of the CPU kernels --------------------------------------------------

std::mutex g_pool_mu;
std::unique_ptr<ThreadPool> g_pool;
ThreadPool* pool() {
  std::lock_guard<std::mutex> l(g_pool_mu);
  if (!g_pool) g_pool = std::make_unique<ThreadPool>(0);
  return g_pool.get();
}

// ---- cache layers -----------------------------------------------------------------------------

// One layer of a paged cache as the kernels read it, over memory the object keeps alive
// (a PagedCache's buffer, or a caller's kv_cache tensor).
struct CacheLayer {
  CacheLayerView view;
  nb::object owner;  // keeps the memory alive
};

CacheLayer cache_layer_from_tensor(nb::handle obj, const AnyMutArray& kv, const std::string& format, float outer_scale,
                                   bool token_scale = false) {
  const TensorView t = view_of(kv, "kv_cache");
  const KvFormat f = format_of(format);
  if (t.dtype != DType::kU8 || t.ndim != 3) {
    throw nb::value_error(("kv_cache: expected a [num_blocks, block_size, record_bytes] uint8 tensor, got " +
                           std::string(dtype_name(t.dtype)) + " " + t.shape_string()).c_str());
  }
  require_contiguous(t, "kv_cache");
  if (t.size(2) != record_bytes(f)) {
    throw nb::value_error(("kv_cache: the last dimension must be " + std::to_string(record_bytes(f)) + " bytes for " +
                           format + ", got " + std::to_string(t.size(2))).c_str());
  }
  CacheLayer c;
  c.view.data = static_cast<uint8_t*>(t.data);
  c.view.num_blocks = t.size(0);
  c.view.block_size = static_cast<int>(t.size(1));
  c.view.record_bytes = static_cast<int>(t.size(2));
  c.view.format = f;
  c.view.outer_scale = outer_scale;
  c.view.token_scale = token_scale;
  c.view.device = t.device;
  check(check_cache_view(c.view, "kv_cache"));
  c.owner = nb::borrow(obj);
  return c;
}

class PagedCache {
 public:
  PagedCache(int64_t num_blocks, int block_size, int num_layers, std::vector<std::string> formats,
             std::vector<double> outer_scales, const std::string& fp8_scales, bool token_scale) {
    KvCache::Config cfg;
    cfg.num_blocks = num_blocks;
    cfg.block_size = block_size;
    cfg.num_layers = num_layers;
    cfg.fp8_scales = fp8_mode_of(fp8_scales);
    if (formats.empty()) throw nb::value_error("format: give one format or one per layer");
    if (formats.size() != 1 && static_cast<int>(formats.size()) != num_layers) {
      throw nb::value_error(("format: " + std::to_string(formats.size()) + " formats for " +
                             std::to_string(num_layers) + " layers (give one, or one per layer)").c_str());
    }
    if (!outer_scales.empty() && static_cast<int>(outer_scales.size()) != num_layers) {
      throw nb::value_error(("outer_scales: " + std::to_string(outer_scales.size()) + " scales for " +
                             std::to_string(num_layers) + " layers").c_str());
    }
    cfg.layers.clear();
    for (int l = 0; l < num_layers; ++l) {
      LayerFormat lf;
      lf.format = format_of(formats[formats.size() == 1 ? 0 : static_cast<size_t>(l)]);
      if (!outer_scales.empty()) lf.outer_scale = static_cast<float>(outer_scales[static_cast<size_t>(l)]);
      lf.token_scale = token_scale;
      cfg.layers.push_back(lf);
    }
    cache_ = value(PagedKvCache::create_cpu(cfg));
  }

  int64_t add_sequence() { return cache_->add_sequence(); }
  nb::ndarray<nb::numpy, int64_t> append(int64_t seq, int64_t n) {
    std::vector<int64_t> slots = value(cache_->append(seq, n));
    auto a = new_array<int64_t>({slots.size()});
    std::copy(slots.begin(), slots.end(), a.data());
    return a;
  }
  int64_t fork(int64_t seq) { return value(cache_->fork(seq)); }
  void free(int64_t seq) { check(cache_->free(seq)); }
  int64_t length(int64_t seq) const { return value(cache_->blocks().length(seq)); }
  nb::ndarray<nb::numpy, int32_t> block_table(int64_t seq) const {
    auto t = value(cache_->blocks().block_table(seq));
    auto a = new_array<int32_t>({t.size()});
    std::copy(t.begin(), t.end(), a.data());
    return a;
  }
  std::tuple<nb::ndarray<nb::numpy, int32_t>, nb::ndarray<nb::numpy, int32_t>> tables(std::vector<int64_t> seqs) const {
    std::vector<int32_t> table, seqlens;
    int64_t max_blocks = 0;
    check(cache_->blocks().fill_tables(seqs, table, max_blocks, seqlens));
    auto t = new_array<int32_t>({seqs.size(), static_cast<size_t>(max_blocks)});
    std::copy(table.begin(), table.end(), t.data());
    auto s = new_array<int32_t>({seqlens.size()});
    std::copy(seqlens.begin(), seqlens.end(), s.data());
    return {t, s};
  }
  void write(int layer, const AnyArray& slots, const AnyArray& latent, const AnyArray& rope) {
    TensorView sv = view_of(slots, "slots"), lv = view_of(latent, "latent"), rv = view_of(rope, "rope");
    nb::gil_scoped_release nogil;
    check(cache_->storage().write(layer, sv, lv, rv));
  }
  CacheLayerView layer_view(int l) const { return value(cache_->storage().layer(l)); }

  int64_t num_blocks() const { return cache_->blocks().num_blocks(); }
  int block_size() const { return cache_->blocks().block_size(); }
  int num_layers() const { return cache_->storage().num_layers(); }
  int64_t num_free_blocks() const { return cache_->blocks().num_free_blocks(); }
  size_t nbytes() const { return cache_->storage().bytes(); }

 private:
  std::unique_ptr<PagedKvCache> cache_;
};

// ---- attention ------------------------------------------------------------------------------------

nb::object mla_decode(const AnyArray& q, const CacheLayer& layer, std::optional<AnyArray> block_table,
                      std::optional<AnyArray> seqlens, float softmax_scale, bool causal,
                      std::optional<AnyArray> indices, std::optional<AnyArray> topk_length,
                      std::optional<int> num_splits, bool return_lse, std::optional<AnyMutArray> out,
                      std::optional<AnyMutArray> lse, std::optional<AnyMutArray> workspace, uintptr_t stream) {
  MlaAttentionParams p;
  p.q = view_of(q, "q");
  p.cache = layer.view;
  const bool on_cuda = p.cache.device.type == DeviceType::kCuda;
#ifndef MLAKV_PY_CUDA
  if (on_cuda) {
    throw nb::value_error("cache_layer: a CUDA layer, but this build of mlakv has no CUDA backend "
                          "(mlakv.cuda_available() is False)");
  }
#endif
  if (on_cuda && (!out || !lse)) {
    throw nb::value_error("out/lse: on CUDA the caller passes out [B, S, H, 512] f32 and lse [B, S, H] f32 "
                          "(mla_decode allocates nothing on the device, so it can be captured in a CUDA graph)");
  }
  if (indices) {
    p.indices = view_of(*indices, "indices");
    if (topk_length) p.topk_length = view_of(*topk_length, "topk_length");
    if (block_table || seqlens) throw nb::value_error("block_table/seqlens: sparse decode (indices=) takes neither");
  } else {
    if (!block_table || !seqlens) throw nb::value_error("block_table and seqlens are required for dense decode");
    if (topk_length) throw nb::value_error("topk_length: only with indices= (sparse decode)");
    p.block_table = view_of(*block_table, "block_table");
    p.seqlens = view_of(*seqlens, "seqlens");
  }
  p.softmax_scale = softmax_scale;
  p.causal = causal;
  if (p.q.ndim != 4) {
    throw nb::value_error(("q: expected [batch, s_q, heads, 576], got " + p.q.shape_string()).c_str());
  }
  const size_t B = static_cast<size_t>(p.q.size(0)), S = static_cast<size_t>(p.q.size(1)),
               H = static_cast<size_t>(p.q.size(2));
  nb::object out_obj, lse_obj;
  if (out) {
    p.out = view_of(*out, "out");
    out_obj = nb::cast(*out);
  } else {
    auto a = new_array<float>({B, S, H, static_cast<size_t>(kLatentDim)});
    p.out = TensorView::contiguous(a.data(), DType::kF32, {p.q.size(0), p.q.size(1), p.q.size(2), kLatentDim});
    out_obj = nb::cast(a);
  }
  if (lse) {
    p.lse = view_of(*lse, "lse");
    lse_obj = nb::cast(*lse);
  } else {
    auto a = new_array<float>({B, S, H});
    p.lse = TensorView::contiguous(a.data(), DType::kF32, {p.q.size(0), p.q.size(1), p.q.size(2)});
    lse_obj = nb::cast(a);
  }
  p.num_splits = num_splits ? *num_splits : 1;
#ifdef MLAKV_PY_CUDA
  if (on_cuda) {
    const cuda::AttentionPlan plan = value(cuda::plan_mla_attention(p));
    void* ws = nullptr;
    if (plan.workspace_bytes > 0) {
      if (!workspace) {
        throw nb::value_error(("workspace: num_splits > 1 needs a CUDA uint8 workspace of " +
                               std::to_string(plan.workspace_bytes) +
                               " bytes (mlakv.decode_workspace_bytes gives the size)").c_str());
      }
      const TensorView w = view_of(*workspace, "workspace");
      if (w.device != p.cache.device || w.dtype != DType::kU8 || !w.is_contiguous() ||
          static_cast<size_t>(w.numel()) < plan.workspace_bytes) {
        throw nb::value_error(("workspace: needs a contiguous uint8 tensor of >= " +
                               std::to_string(plan.workspace_bytes) + " bytes on " + device_name(p.cache.device))
                                  .c_str());
      }
      ws = w.data;
    }
    nb::gil_scoped_release nogil;
    check(cuda::run_mla_attention(p, plan, ws, reinterpret_cast<void*>(stream)));
  } else
#endif
  {
    ThreadPool* tp = pool();
    nb::gil_scoped_release nogil;
    check(mla_attention_cpu(p, {tp}));
  }
  if (return_lse) return nb::make_tuple(out_obj, lse_obj);
  return out_obj;
}

nb::object merge_states(const AnyArray& o_parts, const AnyArray& lse_parts, std::optional<AnyMutArray> out,
                        std::optional<AnyMutArray> lse) {
  const TensorView o = view_of(o_parts, "o_parts"), l = view_of(lse_parts, "lse_parts");
  if (o.ndim != 3) throw nb::value_error(("o_parts: expected [parts, rows, dim], got " + o.shape_string()).c_str());
  TensorView ov, lv;
  nb::object out_obj, lse_obj;
  if (out) { ov = view_of(*out, "out"); out_obj = nb::cast(*out); }
  else {
    auto a = new_array<float>({static_cast<size_t>(o.size(1)), static_cast<size_t>(o.size(2))});
    ov = TensorView::contiguous(a.data(), DType::kF32, {o.size(1), o.size(2)});
    out_obj = nb::cast(a);
  }
  if (lse) { lv = view_of(*lse, "lse"); lse_obj = nb::cast(*lse); }
  else {
    auto a = new_array<float>({static_cast<size_t>(o.size(1))});
    lv = TensorView::contiguous(a.data(), DType::kF32, {o.size(1)});
    lse_obj = nb::cast(a);
  }
  check(merge_attn_states(o, l, ov, lv));
  return nb::make_tuple(out_obj, lse_obj);
}

// ---- codecs -----------------------------------------------------------------------------------------

nb::object encode(const AnyArray& latent, const AnyArray& rope, const std::string& format, float outer_scale,
                  const std::string& fp8_scales, std::optional<AnyMutArray> out, bool token_scale) {
  CodecParams p{format_of(format), outer_scale, fp8_mode_of(fp8_scales)};
  p.token_scale = token_scale;
  const TensorView lv = view_of(latent, "latent"), rv = view_of(rope, "rope");
  require_cpu(lv, "latent");
  require_cpu(rv, "rope");
  if (lv.ndim != 2) throw nb::value_error(("latent: expected [n, 512], got " + lv.shape_string()).c_str());
  p.latent_dim = static_cast<int>(lv.size(1));
  p.rope_dim = rv.ndim == 2 ? static_cast<int>(rv.size(1)) : kRopeDim;
  const int rb = value(codec_record_bytes(p));
  TensorView records;
  nb::object obj;
  if (out) { records = view_of(*out, "out"); obj = nb::cast(*out); }
  else {
    auto a = new_array<uint8_t>({static_cast<size_t>(lv.size(0)), static_cast<size_t>(rb)});
    records = TensorView::contiguous(a.data(), DType::kU8, {lv.size(0), rb});
    obj = nb::cast(a);
  }
  {
    nb::gil_scoped_release nogil;
    check(encode_records(p, lv, rv, records));
  }
  return obj;
}

std::tuple<nb::object, nb::object> decode(const AnyArray& records, const std::string& format, float outer_scale,
                                          int latent_dim, int rope_dim, bool token_scale) {
  CodecParams p{format_of(format), outer_scale, Fp8ScaleMode::kPow2, latent_dim, rope_dim, token_scale};
  const TensorView r = view_of(records, "records");
  require_cpu(r, "records");
  if (r.ndim != 2) throw nb::value_error(("records: expected [n, record_bytes], got " + r.shape_string()).c_str());
  const int rb = value(codec_record_bytes(p));
  (void)rb;
  const size_t n = static_cast<size_t>(r.size(0));
  auto lat = new_array<float>({n, static_cast<size_t>(latent_dim)});
  auto rp = new_array<float>({n, static_cast<size_t>(rope_dim)});
  {
    nb::gil_scoped_release nogil;
    check(decode_records(p, r, TensorView::contiguous(lat.data(), DType::kF32, {r.size(0), latent_dim}),
                         TensorView::contiguous(rp.data(), DType::kF32, {r.size(0), rope_dim})));
  }
  return {nb::cast(lat), nb::cast(rp)};
}

void write_cache(const AnyMutArray& kv_cache, const AnyArray& slot_mapping, const AnyArray& latent,
                 const AnyArray& rope, const std::string& format, float outer_scale, const std::string& fp8_scales,
                 uintptr_t stream, bool token_scale) {
  nb::object holder = nb::cast(kv_cache);
  CacheLayer layer = cache_layer_from_tensor(holder, kv_cache, format, outer_scale, token_scale);
  const TensorView s = view_of(slot_mapping, "slot_mapping"), l = view_of(latent, "latent"), r = view_of(rope, "rope");
  const Fp8ScaleMode mode = fp8_mode_of(fp8_scales);
  if (layer.view.device.type == DeviceType::kCuda) {
#ifdef MLAKV_PY_CUDA
    nb::gil_scoped_release nogil;
    check(cuda::write_cache(layer.view, s, l, r, mode, reinterpret_cast<void*>(stream)));
    return;
#else
    throw nb::value_error("kv_cache: a CUDA tensor, but this build of mlakv has no CUDA backend");
#endif
  }
  nb::gil_scoped_release nogil;
  check(write_cache_layer(layer.view, s, l, r, mode));
}

// ---- planning and scales ----------------------------------------------------------------------------------

ModelConfig model_of(const std::string& model) {
  if (auto p = find_model_preset(model)) return p->config;
  return value(load_hf_config(model));
}

nb::dict plan(const std::string& model, const std::string& format, int gpus, double gpu_mem_gib, int tp, int dcp,
              double mem_util, double reserved_gib, int block_size) {
  PlanParams pp;
  pp.format = format_of(format);
  pp.gpus = gpus;
  pp.gpu_mem_gib = gpu_mem_gib;
  pp.tp = tp;
  pp.dcp = dcp;
  pp.mem_util = mem_util;
  pp.reserved_gib = reserved_gib;
  pp.block_size = block_size;
  const PlanResult r = value(plan_capacity(model_of(model), pp));
  nb::dict d;
  d["record_bytes"] = r.record_bytes;
  d["cache_layers"] = r.cache_layers;
  d["indexer_layers"] = r.indexer_layers;
  d["bytes_per_token"] = r.bytes_per_token;
  d["block_bytes"] = r.block_bytes;
  d["kv_gib_per_gpu"] = r.kv_gib_per_gpu;
  d["blocks_per_gpu"] = r.blocks_per_gpu;
  d["tokens_per_gpu"] = r.tokens_per_gpu;
  d["replicas"] = r.replicas;
  d["tokens_per_replica"] = r.tokens_per_replica;
  d["max_request_tokens"] = r.max_request_tokens;
  d["total_tokens"] = r.total_tokens;
  return d;
}

class Calibrator {
 public:
  void add(int layer, const AnyArray& kv_c_normed) {
    const TensorView t = view_of(kv_c_normed, "kv_c_normed");
    check(c_.add(layer, t));
  }
  std::vector<double> max_abs() const { return c_.max_abs(); }
  OuterScales finish(int num_layers) const { return value(c_.finish(num_layers)); }

 private:
  OuterScaleCalibrator c_;
};

// The mlakv recipe's latent transform (include/mlakv/latent_transform.h): a loaded
// mlakv_latent_transform_v1 file, applied to a writer's latents and folded into weights.
class PyLatentTransform {
 public:
  explicit PyLatentTransform(LatentTransform t) : t_(std::move(t)), k_(value(make_latent_transform_kernels(t_))) {}
  int num_layers() const { return t_.num_layers(); }
  std::vector<double> outer_scales() const {
    std::vector<double> s;
    for (const auto& l : t_.layers) s.push_back(l.outer_scale);
    return s;
  }
  std::string importance() const { return t_.importance; }
  std::string to_json() const { return value(latent_transform_to_json(t_)); }
  void save(const std::string& path) const { check(write_latent_transform(path, t_)); }

  // latent [T, 512], rope [T, 64] f32 CPU -> (c' [T, 512], k' [T, 64]) as the writer stores them.
  std::tuple<nb::object, nb::object> apply(int layer, const AnyArray& latent, const AnyArray& rope) const {
    const LatentTransformKernel& k = kernel(layer);
    const TensorView lv = view_of(latent, "latent"), rv = view_of(rope, "rope");
    check(check_tensor(lv, "latent", {{DType::kF32}, {-1, kLatentDim}, Strides::kContiguous}, Device::cpu()));
    const int64_t T = lv.size(0);
    check(check_tensor(rv, "rope", {{DType::kF32}, {T, kRopeDim}, Strides::kContiguous}, Device::cpu()));
    auto lo = new_array<float>({static_cast<size_t>(T), static_cast<size_t>(kLatentDim)});
    auto ro = new_array<float>({static_cast<size_t>(T), static_cast<size_t>(kRopeDim)});
    for (int64_t t = 0; t < T; ++t) {
      const float m = k.max_scaled_input(lv.ptr<const float>() + t * kLatentDim);
      if (!(m <= LatentTransformKernel::kMaxScaledInput))
        throw nb::value_error(("latent: token " + std::to_string(t) + " is not finite or overflows the transform").c_str());
      k.latent(lv.ptr<const float>() + t * kLatentDim, lo.data() + t * kLatentDim);
      k.rope(rv.ptr<const float>() + t * kRopeDim, ro.data() + t * kRopeDim);
    }
    return {nb::cast(lo), nb::cast(ro)};
  }
  // Rows r [N, 512] of a weight acting on c (W_UK rows, W_UV^T rows) -> H D^-1 r (float64),
  // and r . mu [N] (what each row gains: the W_UV bias).
  std::tuple<nb::object, nb::object> fold_rows(int layer, const AnyArray& rows) const {
    const LatentTransformKernel& k = kernel(layer);
    const TensorView w = view_of(rows, "rows");
    check(check_tensor(w, "rows", {{DType::kF32}, {-1, kLatentDim}, Strides::kContiguous}, Device::cpu()));
    const int64_t N = w.size(0);
    auto out = new_array<double>({static_cast<size_t>(N), static_cast<size_t>(kLatentDim)});
    auto bias = new_array<double>({static_cast<size_t>(N)});
    for (int64_t r = 0; r < N; ++r) {
      k.fold_row(w.ptr<const float>() + r * kLatentDim, out.data() + r * kLatentDim);
      bias.data()[r] = k.dot_mu(w.ptr<const float>() + r * kLatentDim);
    }
    return {nb::cast(out), nb::cast(bias)};
  }
  // A k_pe / q_pe rotation of [T, 64] f32 (the identity when the layer does not rotate RoPE).
  nb::object rotate_rope(int layer, const AnyArray& x) const {
    const LatentTransformKernel& k = kernel(layer);
    const TensorView v = view_of(x, "x");
    check(check_tensor(v, "x", {{DType::kF32}, {-1, kRopeDim}, Strides::kContiguous}, Device::cpu()));
    auto out = new_array<float>({static_cast<size_t>(v.size(0)), static_cast<size_t>(kRopeDim)});
    for (int64_t t = 0; t < v.size(0); ++t) k.rope(v.ptr<const float>() + t * kRopeDim, out.data() + t * kRopeDim);
    return nb::cast(out);
  }
  nb::dict layer(int l) const {
    const LatentTransformLayer& L = kernel(l).layer();
    nb::dict d;
    d["mu"] = L.mu;
    d["d"] = L.d;
    d["rotate"] = L.rotate;
    d["sign_seed"] = L.sign_seed;
    d["rope_rotate"] = L.rope_rotate;
    d["rope_sign_seed"] = L.rope_sign_seed;
    d["outer_scale"] = L.outer_scale;
    return d;
  }

 private:
  const LatentTransformKernel& kernel(int layer) const {
    if (layer < 0 || layer >= num_layers())
      throw nb::index_error(("layer " + std::to_string(layer) + " is outside [0, " + std::to_string(num_layers()) + ")").c_str());
    return k_[static_cast<size_t>(layer)];
  }
  LatentTransform t_;
  std::vector<LatentTransformKernel> k_;
};

}  // namespace
}  // namespace mlakv::python

using namespace mlakv;
using namespace mlakv::python;

NB_MODULE(_core, m) {
  m.doc() = "mlakv: MLA attention over compressed, paged KV caches (C++ core)";

  m.def("formats", [] {
    nb::list out;
    for (const FormatInfo& f : all_formats()) {
      nb::dict d;
      d["name"] = std::string(f.name);
      d["record_bytes"] = f.record_bytes;
      d["has_outer_scale"] = f.has_outer_scale;
      d["summary"] = std::string(f.summary);
      nb::list regions;
      for (const RecordRegion& r : f.regions) regions.append(nb::make_tuple(r.offset, r.bytes, std::string(r.what)));
      d["regions"] = regions;
      out.append(d);
    }
    return out;
  });
  m.def("record_bytes", [](const std::string& format) { return record_bytes(format_of(format)); }, "format"_a);

  m.def("encode", &encode, "latent"_a, "rope"_a, "format"_a, nb::kw_only(), "outer_scale"_a = 1.0f,
        "fp8_scales"_a = "pow2", "out"_a = nb::none(), "token_scale"_a = false);
  m.def("decode", &decode, "records"_a, "format"_a, nb::kw_only(), "outer_scale"_a = 1.0f,
        "latent_dim"_a = kLatentDim, "rope_dim"_a = kRopeDim, "token_scale"_a = false);
  m.def("write_cache", &write_cache, "kv_cache"_a, "slot_mapping"_a, "latent"_a, "rope"_a, nb::kw_only(),
        "format"_a, "outer_scale"_a = 1.0f, "fp8_scales"_a = "pow2", "stream"_a = 0, "token_scale"_a = false);

  nb::class_<CacheLayer>(m, "CacheLayer")
      .def_prop_ro("num_blocks", [](const CacheLayer& c) { return c.view.num_blocks; })
      .def_prop_ro("block_size", [](const CacheLayer& c) { return c.view.block_size; })
      .def_prop_ro("record_bytes", [](const CacheLayer& c) { return c.view.record_bytes; })
      .def_prop_ro("format", [](const CacheLayer& c) { return std::string(format_name(c.view.format)); })
      .def_prop_ro("outer_scale", [](const CacheLayer& c) { return c.view.outer_scale; })
      .def_prop_ro("token_scale", [](const CacheLayer& c) { return c.view.token_scale; })
      .def_prop_ro("device", [](const CacheLayer& c) { return device_name(c.view.device); })
      .def("tensor", [](const CacheLayer& c) {
        const size_t shape[3] = {static_cast<size_t>(c.view.num_blocks), static_cast<size_t>(c.view.block_size),
                                 static_cast<size_t>(c.view.record_bytes)};
        return nb::ndarray<nb::numpy, uint8_t>(c.view.data, 3, shape, c.owner);
      }, "The layer's bytes as a [num_blocks, block_size, record_bytes] uint8 array (a view, no copy).");
  m.def("cache_layer", [](nb::handle kv, const std::string& format, float outer_scale, bool token_scale) {
    return cache_layer_from_tensor(kv, nb::cast<AnyMutArray>(kv), format, outer_scale, token_scale);
  }, "kv_cache"_a, "format"_a, nb::kw_only(), "outer_scale"_a = 1.0f, "token_scale"_a = false);

  nb::class_<PagedCache>(m, "PagedCache")
      .def(nb::init<int64_t, int, int, std::vector<std::string>, std::vector<double>, const std::string&, bool>(),
           "num_blocks"_a, nb::kw_only(), "block_size"_a = kDefaultBlockSize, "num_layers"_a = 1,
           "formats"_a = std::vector<std::string>{"bf16"}, "outer_scales"_a = std::vector<double>{},
           "fp8_scales"_a = "pow2", "token_scale"_a = false)
      .def("add_sequence", &PagedCache::add_sequence)
      .def("append", &PagedCache::append, "seq"_a, "n"_a)
      .def("fork", &PagedCache::fork, "seq"_a)
      .def("free", &PagedCache::free, "seq"_a)
      .def("length", &PagedCache::length, "seq"_a)
      .def("block_table", &PagedCache::block_table, "seq"_a)
      .def("tables", &PagedCache::tables, "seqs"_a)
      .def("write", &PagedCache::write, "layer"_a, "slots"_a, "latent"_a, "rope"_a)
      .def("layer", [](nb::handle self, int l) {
        CacheLayer c;
        c.view = nb::cast<PagedCache&>(self).layer_view(l);
        c.owner = nb::borrow(self);
        return c;
      }, "layer"_a)
      .def_prop_ro("num_blocks", &PagedCache::num_blocks)
      .def_prop_ro("block_size", &PagedCache::block_size)
      .def_prop_ro("num_layers", &PagedCache::num_layers)
      .def_prop_ro("num_free_blocks", &PagedCache::num_free_blocks)
      .def_prop_ro("nbytes", &PagedCache::nbytes);

  m.def("mla_decode", &mla_decode, "q"_a, "cache_layer"_a, "block_table"_a = nb::none(), "seqlens"_a = nb::none(),
        nb::kw_only(), "softmax_scale"_a, "causal"_a = true, "indices"_a = nb::none(), "topk_length"_a = nb::none(),
        "num_splits"_a = nb::none(), "return_lse"_a = true, "out"_a = nb::none(), "lse"_a = nb::none(),
        "workspace"_a = nb::none(), "stream"_a = 0);
  // For bench/bench_python.py: the same CPU call repeated `iters` times inside C++ (no
  // binding in the loop); returns the median seconds per call, the yardstick of the
  // binding's own overhead.
  m.def("_cpp_decode_seconds", [](const AnyArray& q, const CacheLayer& layer, const AnyArray& block_table,
                                  const AnyArray& seqlens, float softmax_scale, AnyMutArray out, AnyMutArray lse,
                                  int iters) {
    MlaAttentionParams p;
    p.q = view_of(q, "q");
    p.cache = layer.view;
    p.block_table = view_of(block_table, "block_table");
    p.seqlens = view_of(seqlens, "seqlens");
    p.softmax_scale = softmax_scale;
    p.out = view_of(out, "out");
    p.lse = view_of(lse, "lse");
    ThreadPool* tp = pool();
    std::vector<double> t;
    for (int i = 0; i < std::max(iters, 1); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      check(mla_attention_cpu(p, {tp}));
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  });
  m.def("merge_attn_states", &merge_states, "o_parts"_a, "lse_parts"_a, nb::kw_only(), "out"_a = nb::none(),
        "lse"_a = nb::none());
  m.def("set_num_threads", [](int n) {
    if (n < 0) throw nb::value_error("n: thread count must be >= 0 (0 = all cores)");
    std::lock_guard<std::mutex> l(g_pool_mu);
    g_pool = std::make_unique<ThreadPool>(n);
  }, "n"_a);
  m.def("num_threads", [] { return pool()->num_threads(); });
  m.def("cuda_available", [] {
#ifdef MLAKV_PY_CUDA
    return true;
#else
    return false;
#endif
  });
  m.def("cpu_isa", [] { return std::string(cpu_attention_isa()); });

  m.def("plan", &plan, "model"_a, nb::kw_only(), "format"_a = "fp8_ds_mla", "gpus"_a = 1, "gpu_mem_gib"_a = 80.0,
        "tp"_a = 1, "dcp"_a = 1, "mem_util"_a = 0.9, "reserved_gib"_a = 0.0, "block_size"_a = kDefaultBlockSize);

  nb::class_<OuterScales>(m, "OuterScales")
      .def_prop_ro("scales", [](const OuterScales& s) { return s.scales; })
      .def_prop_ro("max_abs", [](const OuterScales& s) { return s.max_abs; })
      .def_prop_ro("num_layers", &OuterScales::num_layers)
      .def("scale_for", &OuterScales::scale_for, "layer"_a)
      .def("to_json", [](const OuterScales& s) { return value(outer_scales_to_json(s)); })
      .def("save", [](const OuterScales& s, const std::string& path) { check(write_outer_scales(path, s)); }, "path"_a);
  m.def("load_outer_scales", [](const std::string& path) { return value(load_outer_scales(path)); }, "path"_a);
  m.def("parse_outer_scales", [](const std::string& text) { return value(parse_outer_scales(text, "<string>")); },
        "text"_a);
  m.def("outer_scales_from_max_abs", [](std::vector<double> m) { return value(outer_scales_from_max_abs(m)); },
        "max_abs"_a);

  nb::class_<PyLatentTransform>(m, "LatentTransform")
      .def_prop_ro("num_layers", &PyLatentTransform::num_layers)
      .def_prop_ro("outer_scales", &PyLatentTransform::outer_scales)
      .def_prop_ro("importance", &PyLatentTransform::importance)
      .def("layer", &PyLatentTransform::layer, "layer"_a)
      .def("apply", &PyLatentTransform::apply, "layer"_a, "latent"_a, "rope"_a,
           "(c', k') as the writer stores them: c' = H D (c - mu), k' = H_r k_pe")
      .def("fold_rows", &PyLatentTransform::fold_rows, "layer"_a, "rows"_a,
           "(H D^-1 r, r . mu) for weight rows r acting on the latent (W_UK rows, W_UV^T rows)")
      .def("rotate_rope", &PyLatentTransform::rotate_rope, "layer"_a, "x"_a)
      .def("to_json", &PyLatentTransform::to_json)
      .def("save", &PyLatentTransform::save, "path"_a);
  m.def("load_latent_transform", [](const std::string& path) { return PyLatentTransform(value(load_latent_transform(path))); },
        "path"_a);
  m.def("parse_latent_transform",
        [](const std::string& text) { return PyLatentTransform(value(parse_latent_transform(text, "<string>"))); },
        "text"_a);
  m.def("latent_transform_signs", &latent_transform_signs, "seed"_a, "n"_a);

  nb::class_<Calibrator>(m, "Calibrator")
      .def(nb::init<>())
      .def("add", &Calibrator::add, "layer"_a, "kv_c_normed"_a)
      .def_prop_ro("max_abs", &Calibrator::max_abs)
      .def("finish", &Calibrator::finish, "num_layers"_a = 0);

  m.attr("LATENT_DIM") = kLatentDim;
  m.attr("ROPE_DIM") = kRopeDim;
}
