// The Python binding of mlakv (nanobind). It only converts: every operation is the C++
// library's, reached through include/mlakv/ (the public API); tensors cross as DLPack
// views (numpy arrays, torch tensors, anything with __dlpack__) without copies.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <array>
#include <filesystem>
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
#include <cuda_runtime.h>

#include "mlakv/cuda.h"
#endif
#include "mlakv/cache.h"
#include "mlakv/codec.h"
#include "mlakv/eval.h"
#include "mlakv/formats.h"
#include "mlakv/hf_config.h"
#include "mlakv/model.h"
#include "mlakv/model_config.h"
#include "mlakv/latent_calib.h"
#include "mlakv/latent_transform.h"
#include "mlakv/outer_scales.h"
#include "mlakv/plan.h"
#include "mlakv/status.h"
#include "mlakv/tensor.h"
#include "mlakv/thread_pool.h"
#include "mlakv/tokenizer.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mlakv::python {
namespace {

// ---- errors -----------------------------------------------------------------------------

// Thrown where the GIL may be released; the translator registered in NB_MODULE raises
// `type` (a builtin exception class) with the message once the GIL is held again.
struct TypedError {
  PyObject* type;
  std::string message;
};
[[noreturn]] void py_raise(PyObject* type, const std::string& m) { throw TypedError{type, m}; }

// A failed Status becomes the Python exception of its kind, with the library's message:
// kInvalidArgument ValueError, kOutOfRange IndexError, kResourceExhausted MemoryError,
// kNotFound FileNotFoundError (a file, tensor or key that does not exist), kIoError OSError,
// kUnimplemented NotImplementedError, anything else RuntimeError.
[[noreturn]] void raise(const Status& s) {
  const std::string& m = s.message();
  switch (s.code()) {
    case StatusCode::kInvalidArgument: throw nb::value_error(m.c_str());
    case StatusCode::kOutOfRange: throw nb::index_error(m.c_str());
    case StatusCode::kResourceExhausted: py_raise(PyExc_MemoryError, m);
    case StatusCode::kNotFound: py_raise(PyExc_FileNotFoundError, m);
    case StatusCode::kIoError: py_raise(PyExc_OSError, m);
    case StatusCode::kUnimplemented: py_raise(PyExc_NotImplementedError, m);
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

Nvfp4ScaleMode nvfp4_mode_of(const std::string& name) {
  if (name == "rn") return Nvfp4ScaleMode::kRn;
  if (name == "search") return Nvfp4ScaleMode::kSearch;
  throw nb::value_error(("nvfp4_scales: expected 'rn' or 'search', got '" + name + "'").c_str());
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
                                   bool token_scale = false, const std::string& nvfp4_scales = "rn") {
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
  c.view.nvfp4_scales = nvfp4_mode_of(nvfp4_scales);
  c.view.device = t.device;
  check(check_cache_view(c.view, "kv_cache"));
  c.owner = nb::borrow(obj);
  return c;
}

class PagedCache {
 public:
  PagedCache(int64_t num_blocks, int block_size, int num_layers, std::vector<std::string> formats,
             std::vector<double> outer_scales, const std::string& fp8_scales, bool token_scale,
             const std::string& nvfp4_scales) {
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
      lf.nvfp4_scales = nvfp4_mode_of(nvfp4_scales);
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

// The token set of a decode: dense (block_table + seqlens) or sparse (indices [+ topk_length]).
void set_token_set(MlaAttentionParams& p, const std::optional<AnyArray>& block_table,
                   const std::optional<AnyArray>& seqlens, const std::optional<AnyArray>& indices,
                   const std::optional<AnyArray>& topk_length) {
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
}

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
  set_token_set(p, block_table, seqlens, indices, topk_length);
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
                               " bytes (mlakv.DecodePlan(...).workspace_bytes gives the size for a shape)").c_str());
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
                  const std::string& fp8_scales, std::optional<AnyMutArray> out, bool token_scale,
                  const std::string& nvfp4_scales) {
  CodecParams p{format_of(format), outer_scale, fp8_mode_of(fp8_scales)};
  p.token_scale = token_scale;
  p.nvfp4_scales = nvfp4_mode_of(nvfp4_scales);
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

// The nvfp4 subnormal-scale check behind the C++ cache's warning (mlakv/codec.h): a Python
// UserWarning naming the fix when most group scales of what was written fell into e4m3
// subnormals (a layer with small latents at an uncalibrated outer scale). The GIL is held.
void warn_on_scales(KvFormat format, const Nvfp4ScaleCheck& c, float outer_scale) {
  const std::string w = nvfp4_scale_warning(format, c, outer_scale);
  if (!w.empty() && PyErr_WarnEx(PyExc_UserWarning, w.c_str(), 1) != 0) throw nb::python_error();
}

#ifdef MLAKV_PY_CUDA
// write_cache on the GPU with the writer's scale tally (cuda::Nvfp4ScaleTally) in a device
// buffer of the cache's device, read back after the stream: synchronizes, so it is opt-in.
Nvfp4ScaleCheck write_cache_cuda_checked(const CacheLayerView& v, const TensorView& s, const TensorView& l,
                                         const TensorView& r, Fp8ScaleMode mode, void* stream) {
  int previous = 0;
  auto cuda_ok = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess) check(internal_error(std::string(what) + ": " + cudaGetErrorString(e)));
  };
  cuda_ok(cudaGetDevice(&previous), "cudaGetDevice");
  cuda_ok(cudaSetDevice(v.device.index), "cudaSetDevice");
  void* d = nullptr;
  cudaError_t e = cudaMalloc(&d, sizeof(cuda::Nvfp4ScaleTally));
  cuda::Nvfp4ScaleTally tally;
  Status st = Status::Ok();
  if (e == cudaSuccess) e = cudaMemsetAsync(d, 0, sizeof tally, static_cast<cudaStream_t>(stream));
  if (e == cudaSuccess) {
    st = cuda::write_cache(v, s, l, r, mode, stream, nullptr, static_cast<cuda::Nvfp4ScaleTally*>(d));
    if (st.ok()) e = cudaMemcpyAsync(&tally, d, sizeof tally, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream));
    if (st.ok() && e == cudaSuccess) e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  }
  if (d != nullptr) (void)cudaFree(d);
  (void)cudaSetDevice(previous);
  check(st);
  cuda_ok(e, "write_cache(check_scales=True)");
  return tally.to_check();
}
#endif

void write_cache(const AnyMutArray& kv_cache, const AnyArray& slot_mapping, const AnyArray& latent,
                 const AnyArray& rope, const std::string& format, float outer_scale, const std::string& fp8_scales,
                 uintptr_t stream, bool token_scale, std::optional<bool> check_scales, const std::string& nvfp4_scales) {
  nb::object holder = nb::cast(kv_cache);
  CacheLayer layer = cache_layer_from_tensor(holder, kv_cache, format, outer_scale, token_scale, nvfp4_scales);
  const TensorView s = view_of(slot_mapping, "slot_mapping"), l = view_of(latent, "latent"), r = view_of(rope, "rope");
  const Fp8ScaleMode mode = fp8_mode_of(fp8_scales);
  const CacheLayerView& v = layer.view;
  const bool on_cuda = v.device.type == DeviceType::kCuda;
  // What the check is for: formats with an outer scale, outside the per-token scale mode.
  const bool checked = check_scales.value_or(!on_cuda) && format_info(v.format).has_outer_scale && !v.token_scale;
  if (on_cuda) {
#ifdef MLAKV_PY_CUDA
    if (checked) {
      Nvfp4ScaleCheck c;
      {
        nb::gil_scoped_release nogil;
        c = write_cache_cuda_checked(v, s, l, r, mode, reinterpret_cast<void*>(stream));
      }
      warn_on_scales(v.format, c, v.outer_scale);
      return;
    }
    nb::gil_scoped_release nogil;
    check(cuda::write_cache(v, s, l, r, mode, reinterpret_cast<void*>(stream)));
    return;
#else
    throw nb::value_error("kv_cache: a CUDA tensor, but this build of mlakv has no CUDA backend");
#endif
  }
  Nvfp4ScaleCheck c;
  {
    nb::gil_scoped_release nogil;
    check(write_cache_layer(v, s, l, r, mode));
    if (checked) c = value(nvfp4_scale_check(l, v.outer_scale));
  }
  if (checked) warn_on_scales(v.format, c, v.outer_scale);
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
// mlakv_latent_transform_v2 (or v1) file, applied to a writer's latents and folded into weights;
// nvfp4_scales says how the nvfp4 writers encode its records (PagedCache(nvfp4_scales=...)).
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
  std::string nvfp4_scales() const { return std::string(nvfp4_scale_mode_name(t_.nvfp4_scales)); }
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

// ---- the model runner (include/mlakv/model.h, include/mlakv/eval.h) -------------------------

// A progress callable from Python, called with the GIL held from inside C++ work that runs
// without it. An exception it raises stops further calls and is raised when the work ends
// (the C++ run is not interrupted: ProgressFn cannot stop it).
class PyProgress {
 public:
  explicit PyProgress(std::optional<nb::callable> fn) : fn_(std::move(fn)) {}
  ProgressFn fn() {
    if (!fn_) return {};
    return [this](std::string_view what, int64_t done, int64_t total) {
      if (failed_) return;
      nb::gil_scoped_acquire gil;
      try {
        (*fn_)(std::string(what), done, total);
      } catch (nb::python_error& e) {
        e.restore();
        failed_ = true;
      }
    };
  }
  // With the GIL held, after the work: the callable's exception, if it raised one.
  void rethrow() {
    if (failed_) throw nb::python_error();
  }

 private:
  std::optional<nb::callable> fn_;
  bool failed_ = false;
};

class PyTokenizer {
 public:
  explicit PyTokenizer(Tokenizer t) : t_(std::move(t)) {}
  static PyTokenizer load(const std::string& path) { return PyTokenizer(value(Tokenizer::load(path))); }
  static PyTokenizer byte_level() { return PyTokenizer(Tokenizer::byte_level()); }
  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const {
    nb::gil_scoped_release nogil;
    return value(t_.encode(text, add_special_tokens));
  }
  // Bytes that do not form UTF-8 (a cut character) become U+FFFD.
  nb::str decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
    std::string s = value(t_.decode(ids, skip_special_tokens));
    return nb::steal<nb::str>(PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace"));
  }
  int32_t vocab_size() const { return t_.vocab_size(); }
  std::optional<int32_t> bos_id() const { return t_.bos_id(); }
  std::optional<int32_t> eos_id() const { return t_.eos_id(); }
  std::string id_to_token(int32_t id) const { return value(t_.id_to_token(id)); }
  int32_t token_to_id(const std::string& tok) const { return value(t_.token_to_id(tok)); }
  bool is_special(int32_t id) const { return t_.is_special(id); }
  const Tokenizer& get() const { return t_; }

 private:
  Tokenizer t_;
};

nb::str utf8_replace(const std::string& s) {
  return nb::steal<nb::str>(PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace"));
}

class PyModel {
 public:
  static std::unique_ptr<PyModel> load(const std::string& path, int threads) {
    if (threads < 0) throw nb::value_error(("threads: must be >= 0 (0 = all cores), got " + std::to_string(threads)).c_str());
    auto m = std::unique_ptr<PyModel>(new PyModel());
    m->path_ = path;
    {
      nb::gil_scoped_release nogil;
      auto r = Model::load(path, ModelLoadOptions{.threads = threads});
      if (r.ok()) m->model_ = std::move(r).value();
      else m->load_error_ = r.status();
    }
    if (!m->load_error_.ok()) raise(m->load_error_);
    // The CLI's rule: tokenizer.json in the directory, else byte-level for a 256-id vocabulary.
    if (std::filesystem::exists(std::filesystem::path(path) / "tokenizer.json")) {
      nb::gil_scoped_release nogil;
      auto t = Tokenizer::load(path);
      if (t.ok()) m->tok_.emplace(std::move(t).value());
      else m->tok_error_ = t.status().message();
    } else if (m->model_->vocab_size() == 256) {
      m->tok_.emplace(Tokenizer::byte_level());
    } else {
      m->tok_error_ = path + ": no tokenizer.json, and the vocabulary (" + std::to_string(m->model_->vocab_size()) +
                      " ids) is not byte-level; pass token ids instead of text";
    }
    return m;
  }

  const Model& model() const { return *model_; }
  const std::string& path() const { return path_; }
  bool has_tokenizer() const { return tok_.has_value(); }
  const PyTokenizer& tokenizer() const {
    if (!tok_) throw nb::value_error(("tokenizer: " + tok_error_).c_str());
    return *tok_;
  }

  // Text (encoded like `mlakv eval --text`: no special tokens, or with them for a prompt)
  // or token ids (a sequence of ints or a 1-D integer array), checked against the vocabulary.
  std::vector<int32_t> tokens_of(nb::handle input, const char* name, bool add_special_tokens) const {
    std::vector<int32_t> ids;
    if (nb::isinstance<nb::str>(input)) {
      const std::string text = nb::cast<std::string>(input);
      if (text.empty()) throw nb::value_error((std::string(name) + ": the text is empty").c_str());
      ids = tokenizer().encode(text, add_special_tokens);
    } else if (nb::isinstance<nb::bytes>(input)) {
      throw nb::type_error((std::string(name) + ": give text as str (decode the bytes) or token ids").c_str());
    } else if (nb::ndarray_check(input)) {
      const auto a = nb::cast<AnyArray>(input);
      const TensorView t = view_of(a, name);
      require_cpu(t, name);
      if (t.ndim != 1 || (t.dtype != DType::kI32 && t.dtype != DType::kI64)) {
        throw nb::value_error((std::string(name) + ": token ids must be a 1-D int32/int64 array, got " +
                               std::string(dtype_name(t.dtype)) + " " + t.shape_string()).c_str());
      }
      ids.resize(static_cast<size_t>(t.size(0)));
      for (int64_t i = 0; i < t.size(0); ++i) {
        const int64_t v = t.dtype == DType::kI32
                              ? *reinterpret_cast<const int32_t*>(static_cast<const char*>(t.data) + i * t.stride(0) * 4)
                              : *reinterpret_cast<const int64_t*>(static_cast<const char*>(t.data) + i * t.stride(0) * 8);
        if (v < 0 || v >= model_->vocab_size()) bad_id(name, i, v);
        ids[static_cast<size_t>(i)] = static_cast<int32_t>(v);
      }
    } else {
      try {
        const auto seq = nb::cast<std::vector<int64_t>>(input);
        ids.resize(seq.size());
        for (size_t i = 0; i < seq.size(); ++i) {
          if (seq[i] < 0 || seq[i] >= model_->vocab_size()) bad_id(name, static_cast<int64_t>(i), seq[i]);
          ids[i] = static_cast<int32_t>(seq[i]);
        }
      } catch (const nb::cast_error&) {
        throw nb::type_error((std::string(name) + ": expected text (str) or token ids (a sequence of ints or a 1-D "
                                                  "integer array)").c_str());
      }
    }
    if (ids.empty()) throw nb::value_error((std::string(name) + ": no tokens").c_str());
    return ids;
  }

  nb::dict eval(nb::handle input, int64_t context, int64_t windows, std::vector<std::string> formats,
                nb::handle scales, const std::string& recipe, const std::string& importance, int seed_candidates,
                int64_t calib_windows, int needle, int block_size, std::optional<nb::callable> progress,
                const std::string& nvfp4_scales) {
    const std::vector<int32_t> ids = tokens_of(input, "input", false);
    EvalRequest req;
    for (const std::string& f : formats) {
      auto row = parse_eval_format(f);
      if (!row.ok()) raise(row.status());
      req.formats.push_back(*row);
    }
    // None, one source ("auto" or a scale file of either kind), or a list of them (--scales).
    if (nb::isinstance<nb::str>(scales)) req.scales.push_back(nb::cast<std::string>(scales));
    else if (!scales.is_none()) {
      try {
        req.scales = nb::cast<std::vector<std::string>>(scales);
      } catch (const nb::cast_error&) {
        throw nb::type_error("scales: expected None, 'auto', a scale file path or a list of them");
      }
    }
    for (const std::string& s : req.scales) {
      if (s.empty()) throw nb::value_error("scales: give a scale file path or 'auto' (not an empty string)");
    }
    req.recipe = recipe;
    // A name, or "file:PATH" (an mlakv_latent_importance_v1 file), as `mlakv eval --importance`.
    LatentTransformRecipe imp;
    if (const Status st = set_latent_importance(imp, importance); !st.ok()) {
      std::string m = st.message();
      if (m.rfind("--", 0) == 0) m.erase(0, 2);  // "importance: ...", the keyword's name
      if (st.code() == StatusCode::kInvalidArgument) throw nb::value_error(m.c_str());
      check(st);
    }
    req.importance = imp.importance;
    req.importance_weights = std::move(imp.weights);
    req.seed_candidates = seed_candidates;
    req.nvfp4_scales = nvfp4_mode_of(nvfp4_scales);
    req.context = context;
    req.windows = windows;
    req.calib_windows = calib_windows;
    req.needle = needle;
    req.block_size = block_size;
    PyProgress pr(std::move(progress));
    req.progress = pr.fn();
    std::string json;
    Status st;
    {
      nb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> l(mu_);
      auto rep = eval_model(*model_, tok_ ? &tok_->get() : nullptr, ids, req);
      if (rep.ok()) json = eval_report_json(*rep, path_, context, windows, -1);
      else st = rep.status();
    }
    pr.rethrow();
    check(st);
    return nb::cast<nb::dict>(nb::module_::import_("json").attr("loads")(nb::str(json.c_str(), json.size())));
  }

  EvalCacheSpec spec_of(const std::string& format, std::optional<std::string> scales) const {
    EvalCacheSpec spec;
    // "reference" (the f32 cache), a format, or an nvfp4 format + "+token-scale" (as the CLI's --format).
    if (format == "reference") {
      spec.format = KvFormat::kF32;
    } else {
      auto row = parse_eval_format(format);
      if (!row.ok()) raise(row.status());
      spec.format = row->format;
      spec.token_scale = row->token_scale;
      if (spec.token_scale) spec.scales_label = "token";
    }
    if (scales && spec.token_scale) throw nb::value_error("scales: the per-token scale mode replaces outer scales");
    if (scales) {
      if (!format_info(spec.format).has_outer_scale) {
        throw nb::value_error(("scales: " + format + " has no outer scale").c_str());
      }
      spec.scales = value(load_outer_scales(*scales));
      if (spec.scales.num_layers() < model_->num_layers()) {
        throw nb::value_error(("scales " + *scales + ": " + std::to_string(spec.scales.num_layers()) +
                               " layers, the model has " + std::to_string(model_->num_layers())).c_str());
      }
      spec.scales_label = std::filesystem::path(*scales).filename().string();
    }
    return spec;
  }

  nb::dict generate(nb::handle prompt, const std::string& format, int max_tokens, std::optional<std::string> scales,
                    bool stop_at_eos, int block_size) {
    if (max_tokens < 1 || max_tokens > (1 << 20)) {
      throw nb::value_error(("max_tokens: must be in [1, 1048576], got " + std::to_string(max_tokens)).c_str());
    }
    const EvalCacheSpec spec = spec_of(format, scales);
    const std::vector<int32_t> ids = tokens_of(prompt, "prompt", true);
    const int64_t max_pos = model_->config().max_position_embeddings;
    if (max_pos > 0 && static_cast<int64_t>(ids.size()) + max_tokens > max_pos) {
      throw nb::value_error(("prompt (" + std::to_string(ids.size()) + " tokens) + max_tokens " +
                             std::to_string(max_tokens) + " exceed max_position_embeddings (" +
                             std::to_string(max_pos) + ")").c_str());
    }
    std::optional<int32_t> stop;
    if (stop_at_eos && tok_) stop = tok_->eos_id();
    GenerateResult g;
    std::optional<std::string> text;
    Status st;
    {
      nb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> l(mu_);
      auto r = generate_greedy(*model_, ids, max_tokens, &spec, stop, block_size);
      if (r.ok()) {
        g = std::move(r).value();
        if (tok_) {
          auto t = tok_->get().decode(g.tokens, true);
          if (t.ok()) text = std::move(t).value();
          else st = t.status();
        }
      } else {
        st = r.status();
      }
    }
    check(st);
    nb::dict d;
    d["format"] = std::string(format_name(spec.format));
    d["token_scale"] = spec.token_scale;
    d["prompt_tokens"] = ids.size();
    d["generated_tokens"] = g.tokens.size();
    d["tokens"] = g.tokens;
    if (text) d["text"] = utf8_replace(*text);
    else d["text"] = nb::none();
    d["prefill_tokens_per_s"] = g.prefill_seconds > 0 ? ids.size() / g.prefill_seconds : 0.0;
    d["decode_tokens_per_s"] = g.decode_seconds > 0 ? g.tokens.size() / g.decode_seconds : 0.0;
    return d;
  }

  OuterScales calibrate(nb::handle input, int64_t context, int64_t windows, int64_t skip,
                        std::optional<nb::callable> progress) {
    const std::vector<int32_t> ids = tokens_of(input, "input", false);
    const int64_t max_pos = model_->config().max_position_embeddings;
    if (max_pos > 0 && context > max_pos) {
      throw nb::value_error(("context " + std::to_string(context) + " exceeds the model's max_position_embeddings (" +
                             std::to_string(max_pos) + ")").c_str());
    }
    PyProgress pr(std::move(progress));
    const ProgressFn fn = pr.fn();
    StatusOr<OuterScales> r = Status::Ok();
    {
      nb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> l(mu_);
      r = calibrate_outer_scales(*model_, ids, context, windows, skip, fn);
    }
    pr.rethrow();
    return value(std::move(r));
  }

 private:
  PyModel() = default;
  [[noreturn]] void bad_id(const char* name, int64_t i, int64_t v) const {
    throw nb::value_error((std::string(name) + ": token id " + std::to_string(v) + " at position " + std::to_string(i) +
                           " is outside the vocabulary [0, " + std::to_string(model_->vocab_size()) + ")").c_str());
  }

  std::unique_ptr<Model> model_;
  std::string path_;
  Status load_error_;
  std::optional<PyTokenizer> tok_;
  std::string tok_error_;
  std::mutex mu_;  // one forward at a time per Model (model.h)
};

nb::dict config_dict(const ModelConfig& c, const ModelArch& a) {
  nb::dict d;
  d["model_type"] = c.model_type;
  d["num_layers"] = c.num_layers;
  d["num_mtp_layers"] = c.num_mtp_layers;
  d["hidden_size"] = c.hidden_size;
  d["num_heads"] = c.num_heads;
  d["q_lora_rank"] = c.q_lora_rank;
  d["kv_lora_rank"] = c.kv_lora_rank;
  d["qk_nope_head_dim"] = c.qk_nope_head_dim;
  d["qk_rope_head_dim"] = c.qk_rope_head_dim;
  d["v_head_dim"] = c.v_head_dim;
  d["rms_norm_eps"] = c.rms_norm_eps;
  d["rope_theta"] = c.rope.theta;
  d["rope_interleaved"] = c.rope.interleaved;
  d["max_position_embeddings"] = c.max_position_embeddings;
  d["index_topk"] = c.index_topk;
  d["softmax_scale"] = c.softmax_scale();
  d["vocab_size"] = a.vocab_size;
  d["intermediate_size"] = a.intermediate_size;
  d["moe_intermediate_size"] = a.moe_intermediate_size;
  d["n_routed_experts"] = a.routing.num_experts;
  d["num_experts_per_tok"] = a.routing.top_k;
  d["n_shared_experts"] = a.n_shared_experts;
  d["num_moe_layers"] = a.num_moe_layers();
  d["tie_word_embeddings"] = a.tie_word_embeddings;
  return d;
}

// ---- CUDA plan / run ------------------------------------------------------------------------------

// The shape, dtype, device and strides of one tensor of a plan: run() accepts tensors
// equal in all of these (new contents, possibly new buffers).
struct TensorSig {
  bool present = false;
  DType dtype = DType::kF32;
  Device device;
  int ndim = 0;
  std::array<int64_t, kMaxTensorDims> shape{}, strides{};
  static TensorSig of(const TensorView& t) {
    TensorSig s;
    s.present = t.data != nullptr;
    s.dtype = t.dtype;
    s.device = t.device;
    s.ndim = t.ndim;
    for (int i = 0; i < t.ndim; ++i) {
      s.shape[static_cast<size_t>(i)] = t.size(i);
      s.strides[static_cast<size_t>(i)] = t.stride(i);
    }
    return s;
  }
  void require_same(const TensorView& t, const char* name) const {
    const TensorSig o = of(t);
    bool same = o.present == present && o.dtype == dtype && o.device == device && o.ndim == ndim;
    for (int i = 0; same && i < ndim; ++i) {
      same = o.shape[static_cast<size_t>(i)] == shape[static_cast<size_t>(i)] &&
             o.strides[static_cast<size_t>(i)] == strides[static_cast<size_t>(i)];
    }
    if (!same) {
      throw nb::value_error((std::string(name) + ": differs from the planned tensor (got " +
                             std::string(dtype_name(t.dtype)) + " " + t.shape_string() + " on " + device_name(t.device) +
                             "); plan again for a new shape").c_str());
    }
  }
};

#ifdef MLAKV_PY_CUDA
int multiprocessors_of(int device) {
  static std::mutex mu;
  static std::vector<int> cache;
  std::lock_guard<std::mutex> l(mu);
  if (device < 0) return 1;
  if (cache.size() <= static_cast<size_t>(device)) cache.resize(static_cast<size_t>(device) + 1, 0);
  if (cache[static_cast<size_t>(device)] == 0) cache[static_cast<size_t>(device)] = value(cuda::device_properties(device)).multiprocessors;
  return cache[static_cast<size_t>(device)];
}
#endif

class DecodePlan {
 public:
  DecodePlan(const AnyArray& q, const CacheLayer& layer, std::optional<AnyArray> block_table,
             std::optional<AnyArray> seqlens, float softmax_scale, bool causal, std::optional<AnyArray> indices,
             std::optional<AnyArray> topk_length, std::optional<int> num_splits, const AnyMutArray& out,
             const AnyMutArray& lse) {
#ifndef MLAKV_PY_CUDA
    (void)q; (void)layer; (void)block_table; (void)seqlens; (void)softmax_scale; (void)causal; (void)indices;
    (void)topk_length; (void)num_splits; (void)out; (void)lse;
    throw nb::value_error("DecodePlan: this build of mlakv has no CUDA backend (mlakv.cuda_available() is False); "
                          "on the CPU call mlakv.mla_decode");
#else
    MlaAttentionParams& p = p_;
    p.q = view_of(q, "q");
    p.cache = layer.view;
    if (p.cache.device.type != DeviceType::kCuda) {
      throw nb::value_error(("cache_layer: DecodePlan is for CUDA cache layers, got one on " + device_name(p.cache.device) +
                             " (on the CPU call mlakv.mla_decode)").c_str());
    }
    set_token_set(p, block_table, seqlens, indices, topk_length);
    p.softmax_scale = softmax_scale;
    p.causal = causal;
    p.out = view_of(out, "out");
    p.lse = view_of(lse, "lse");
    if (num_splits && *num_splits < 1) {
      throw nb::value_error(("num_splits: must be >= 1 (or None to size it for the GPU), got " +
                             std::to_string(*num_splits)).c_str());
    }
    p.num_splits = 1;
    check(validate_mla_attention(p));  // shapes first, so the split suggestion sees valid ones
    p.num_splits = num_splits ? *num_splits : cuda::suggest_num_splits(p, multiprocessors_of(p.cache.device.index));
    plan_ = value(cuda::plan_mla_attention(p));
    layer_ = layer.view;
    sig_q_ = TensorSig::of(p.q);
    sig_bt_ = TensorSig::of(p.block_table);
    sig_sl_ = TensorSig::of(p.seqlens);
    sig_ix_ = TensorSig::of(p.indices);
    sig_tl_ = TensorSig::of(p.topk_length);
    sig_out_ = TensorSig::of(p.out);
    sig_lse_ = TensorSig::of(p.lse);
#endif
  }

  // Launches on `stream`; allocates nothing and never synchronises, so it may run under
  // CUDA-graph capture. Tensors must match the planned ones in shape, dtype, device and
  // strides (their contents and buffers may differ); the cache layer in geometry and format.
  void run(const AnyArray& q, const CacheLayer& layer, std::optional<AnyArray> block_table,
           std::optional<AnyArray> seqlens, std::optional<AnyArray> indices, std::optional<AnyArray> topk_length,
           const AnyMutArray& out, const AnyMutArray& lse, std::optional<AnyMutArray> workspace, uintptr_t stream) {
#ifndef MLAKV_PY_CUDA
    (void)q; (void)layer; (void)block_table; (void)seqlens; (void)indices; (void)topk_length; (void)out; (void)lse;
    (void)workspace; (void)stream;
    throw nb::value_error("DecodePlan: this build of mlakv has no CUDA backend");
#else
    MlaAttentionParams p = p_;
    p.q = view_of(q, "q");
    sig_q_.require_same(p.q, "q");
    const CacheLayerView& c = layer.view;
    if (c.device != layer_.device || c.num_blocks != layer_.num_blocks || c.block_size != layer_.block_size ||
        c.record_bytes != layer_.record_bytes || c.format != layer_.format) {
      throw nb::value_error("cache_layer: differs from the planned layer (device, blocks, block size or format); "
                            "plan again");
    }
    p.cache = c;
    p.block_table = block_table ? view_of(*block_table, "block_table") : TensorView{};
    sig_bt_.require_same(p.block_table, "block_table");
    p.seqlens = seqlens ? view_of(*seqlens, "seqlens") : TensorView{};
    sig_sl_.require_same(p.seqlens, "seqlens");
    p.indices = indices ? view_of(*indices, "indices") : TensorView{};
    sig_ix_.require_same(p.indices, "indices");
    p.topk_length = topk_length ? view_of(*topk_length, "topk_length") : TensorView{};
    sig_tl_.require_same(p.topk_length, "topk_length");
    p.out = view_of(out, "out");
    sig_out_.require_same(p.out, "out");
    p.lse = view_of(lse, "lse");
    sig_lse_.require_same(p.lse, "lse");
    void* ws = nullptr;
    if (plan_.workspace_bytes > 0) {
      if (!workspace) {
        throw nb::value_error(("workspace: this plan (" + std::to_string(plan_.num_splits) + " splits) needs a CUDA "
                               "uint8 workspace of " + std::to_string(plan_.workspace_bytes) +
                               " bytes (DecodePlan.workspace_bytes)").c_str());
      }
      const TensorView w = view_of(*workspace, "workspace");
      if (w.device != c.device || w.dtype != DType::kU8 || !w.is_contiguous() ||
          static_cast<size_t>(w.numel()) < plan_.workspace_bytes) {
        throw nb::value_error(("workspace: needs a contiguous uint8 tensor of >= " +
                               std::to_string(plan_.workspace_bytes) + " bytes on " + device_name(c.device)).c_str());
      }
      ws = w.data;
    }
    nb::gil_scoped_release nogil;
    check(cuda::run_mla_attention(p, plan_, ws, reinterpret_cast<void*>(stream)));
#endif
  }

  int num_splits() const { return plan_num_splits(); }
  size_t workspace_bytes() const {
#ifdef MLAKV_PY_CUDA
    return plan_.workspace_bytes;
#else
    return 0;
#endif
  }
  std::string path() const {
#ifdef MLAKV_PY_CUDA
    return cuda::attention_path_name(plan_.path);
#else
    return "";
#endif
  }

 private:
  int plan_num_splits() const {
#ifdef MLAKV_PY_CUDA
    return plan_.num_splits;
#else
    return 0;
#endif
  }
#ifdef MLAKV_PY_CUDA
  MlaAttentionParams p_;
  cuda::AttentionPlan plan_;
  CacheLayerView layer_;
  TensorSig sig_q_, sig_bt_, sig_sl_, sig_ix_, sig_tl_, sig_out_, sig_lse_;
#endif
};

}  // namespace
}  // namespace mlakv::python

using namespace mlakv;
using namespace mlakv::python;

NB_MODULE(_core, m) {
  m.doc() = "mlakv: MLA attention over compressed, paged KV caches (C++ core)";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const TypedError& e) {
      PyErr_SetString(e.type, e.message.c_str());
    }
  });

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
        "fp8_scales"_a = "pow2", "out"_a = nb::none(), "token_scale"_a = false, "nvfp4_scales"_a = "rn");
  m.def("decode", &decode, "records"_a, "format"_a, nb::kw_only(), "outer_scale"_a = 1.0f,
        "latent_dim"_a = kLatentDim, "rope_dim"_a = kRopeDim, "token_scale"_a = false);
  m.def("write_cache", &write_cache, "kv_cache"_a, "slot_mapping"_a, "latent"_a, "rope"_a, nb::kw_only(),
        "format"_a, "outer_scale"_a = 1.0f, "fp8_scales"_a = "pow2", "stream"_a = 0, "token_scale"_a = false,
        "check_scales"_a = nb::none(), "nvfp4_scales"_a = "rn");

  nb::class_<CacheLayer>(m, "CacheLayer")
      .def_prop_ro("num_blocks", [](const CacheLayer& c) { return c.view.num_blocks; })
      .def_prop_ro("block_size", [](const CacheLayer& c) { return c.view.block_size; })
      .def_prop_ro("record_bytes", [](const CacheLayer& c) { return c.view.record_bytes; })
      .def_prop_ro("format", [](const CacheLayer& c) { return std::string(format_name(c.view.format)); })
      .def_prop_ro("outer_scale", [](const CacheLayer& c) { return c.view.outer_scale; })
      .def_prop_ro("token_scale", [](const CacheLayer& c) { return c.view.token_scale; })
      .def_prop_ro("nvfp4_scales", [](const CacheLayer& c) { return std::string(nvfp4_scale_mode_name(c.view.nvfp4_scales)); })
      .def_prop_ro("device", [](const CacheLayer& c) { return device_name(c.view.device); })
      .def("tensor", [](const CacheLayer& c) {
        const size_t shape[3] = {static_cast<size_t>(c.view.num_blocks), static_cast<size_t>(c.view.block_size),
                                 static_cast<size_t>(c.view.record_bytes)};
        return nb::ndarray<nb::numpy, uint8_t>(c.view.data, 3, shape, c.owner);
      }, "The layer's bytes as a [num_blocks, block_size, record_bytes] uint8 array (a view, no copy).");
  m.def("cache_layer", [](nb::handle kv, const std::string& format, float outer_scale, bool token_scale,
                          const std::string& nvfp4_scales) {
    return cache_layer_from_tensor(kv, nb::cast<AnyMutArray>(kv), format, outer_scale, token_scale, nvfp4_scales);
  }, "kv_cache"_a, "format"_a, nb::kw_only(), "outer_scale"_a = 1.0f, "token_scale"_a = false, "nvfp4_scales"_a = "rn");

  nb::class_<PagedCache>(m, "PagedCache")
      .def(nb::init<int64_t, int, int, std::vector<std::string>, std::vector<double>, const std::string&, bool,
                    const std::string&>(),
           "num_blocks"_a, nb::kw_only(), "block_size"_a = kDefaultBlockSize, "num_layers"_a = 1,
           "formats"_a = std::vector<std::string>{"bf16"}, "outer_scales"_a = std::vector<double>{},
           "fp8_scales"_a = "pow2", "token_scale"_a = false, "nvfp4_scales"_a = "rn")
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
      .def_prop_ro("nvfp4_scales", &PyLatentTransform::nvfp4_scales)
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

  nb::class_<PyTokenizer>(m, "Tokenizer")
      .def_static("load", &PyTokenizer::load, "path"_a, "tokenizer.json (or its directory) -> Tokenizer")
      .def_static("byte_level", &PyTokenizer::byte_level)
      .def("encode", &PyTokenizer::encode, "text"_a, nb::kw_only(), "add_special_tokens"_a = true)
      .def("decode", &PyTokenizer::decode, "ids"_a, nb::kw_only(), "skip_special_tokens"_a = false)
      .def("id_to_token", &PyTokenizer::id_to_token, "id"_a)
      .def("token_to_id", &PyTokenizer::token_to_id, "token"_a)
      .def("is_special", &PyTokenizer::is_special, "id"_a)
      .def_prop_ro("vocab_size", &PyTokenizer::vocab_size)
      .def_prop_ro("bos_id", &PyTokenizer::bos_id)
      .def_prop_ro("eos_id", &PyTokenizer::eos_id);

  nb::class_<PyModel>(m, "Model")
      .def_static("load", &PyModel::load, "path"_a, nb::kw_only(), "threads"_a = 0)
      .def_prop_ro("path", &PyModel::path)
      .def_prop_ro("config", [](const PyModel& pm) { return config_dict(pm.model().config(), pm.model().arch()); })
      .def_prop_ro("num_layers", [](const PyModel& pm) { return pm.model().num_layers(); })
      .def_prop_ro("vocab_size", [](const PyModel& pm) { return pm.model().vocab_size(); })
      .def_prop_ro("notes", [](const PyModel& pm) { return pm.model().notes(); })
      .def_prop_ro("memory", [](const PyModel& pm) {
        const ModelMemory& mm = pm.model().memory();
        nb::dict d;
        d["checkpoint_bytes"] = mm.checkpoint_bytes;
        d["mapped_bytes"] = mm.mapped_bytes;
        d["dequantized_bytes"] = mm.dequantized_bytes;
        d["routed_expert_bytes"] = mm.routed_expert_bytes;
        d["resident_bytes"] = mm.resident_bytes();
        return d;
      })
      .def_prop_ro("has_tokenizer", &PyModel::has_tokenizer)
      .def_prop_ro("tokenizer", &PyModel::tokenizer, nb::rv_policy::reference_internal)
      .def("encode", [](const PyModel& pm, const std::string& text, bool add_special_tokens) {
        return pm.tokenizer().encode(text, add_special_tokens);
      }, "text"_a, nb::kw_only(), "add_special_tokens"_a = true)
      .def("decode", [](const PyModel& pm, const std::vector<int32_t>& ids, bool skip_special_tokens) {
        return pm.tokenizer().decode(ids, skip_special_tokens);
      }, "ids"_a, nb::kw_only(), "skip_special_tokens"_a = false)
      .def("eval", &PyModel::eval, "input"_a, nb::kw_only(), "context"_a = 2048, "windows"_a = 32,
           "formats"_a = std::vector<std::string>{"bf16", "fp8_ds_mla", "nvfp4_ds_mla", "nvfp4_ds_mla_fp8rope",
                                                  "nvfp4_ds_mla_int8rope"},
           "scales"_a = nb::none(), "recipe"_a = "",
           "importance"_a = std::string(latent_importance_name(LatentTransformRecipe{}.importance)),
           "seed_candidates"_a = LatentTransformRecipe{}.seed_candidates, "calib_windows"_a = 4, "needle"_a = 0, "block_size"_a = kDefaultBlockSize, "progress"_a = nb::none(),
           "nvfp4_scales"_a = std::string(nvfp4_scale_mode_name(LatentTransformRecipe{}.nvfp4_scales)))
      .def("generate", &PyModel::generate, "prompt"_a, nb::kw_only(), "format"_a = "bf16", "max_tokens"_a = 64,
           "scales"_a = nb::none(), "stop_at_eos"_a = true, "block_size"_a = kDefaultBlockSize)
      .def("calibrate", &PyModel::calibrate, "input"_a, nb::kw_only(), "context"_a = 2048, "windows"_a = 8,
           "skip"_a = 0, "progress"_a = nb::none());

  nb::class_<DecodePlan>(m, "DecodePlan")
      .def(nb::init<const AnyArray&, const CacheLayer&, std::optional<AnyArray>, std::optional<AnyArray>, float, bool,
                    std::optional<AnyArray>, std::optional<AnyArray>, std::optional<int>, const AnyMutArray&,
                    const AnyMutArray&>(),
           "q"_a, "cache_layer"_a, "block_table"_a = nb::none(), "seqlens"_a = nb::none(), nb::kw_only(),
           "softmax_scale"_a, "causal"_a = true, "indices"_a = nb::none(), "topk_length"_a = nb::none(),
           "num_splits"_a = nb::none(), "out"_a, "lse"_a)
      .def("run", &DecodePlan::run, "q"_a, "cache_layer"_a, "block_table"_a = nb::none(), "seqlens"_a = nb::none(),
           nb::kw_only(), "indices"_a = nb::none(), "topk_length"_a = nb::none(), "out"_a, "lse"_a,
           "workspace"_a = nb::none(), "stream"_a = 0)
      .def_prop_ro("num_splits", &DecodePlan::num_splits)
      .def_prop_ro("workspace_bytes", &DecodePlan::workspace_bytes)
      .def_prop_ro("path", &DecodePlan::path);

  m.attr("LATENT_DIM") = kLatentDim;
  m.attr("ROPE_DIM") = kRopeDim;
}
