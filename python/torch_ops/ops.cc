// PyTorch custom ops over mlakv, registered through libtorch's stable ABI
// (STABLE_TORCH_LIBRARY, torch >= 2.9), so one build serves several torch versions:
//   torch.ops.mlakv.write_cache(kv_cache, slot_mapping, latent, rope, format, outer_scale, fp8_exact,
//                               token_scale=False, nvfp4_search=False)
//   torch.ops.mlakv.mla_decode(q, kv_cache, block_table, seqlens, out, lse, format, outer_scale,
//                              softmax_scale, causal, num_splits, workspace, token_scale=False)
//   torch.ops.mlakv.mla_decode_sparse(q, kv_cache, indices, topk_length, out, lse, format, outer_scale,
//                                     softmax_scale, num_splits, workspace, token_scale=False)
// token_scale: the nvfp4 per-token scale mode (CacheLayerView::token_scale; fp32 s_t at
// formats.h nvfp4_token_scale::kOffset replaces s_l, which must then be 1.0); the writer
// and the readers of one cache must agree on it, as on the format and outer scale.
// nvfp4_search: the writer's nvfp4 group-scale choice Nvfp4ScaleMode::kSearch (codec.h; a
// writer-only option, readers need nothing): what a cache of an mlakv-recipe calibration whose
// nvfp4_scales is "search" must be written with to hold the C++ writers' bytes.
// Each mutates its output arguments and returns nothing, so it needs no allocation: on CUDA
// it enqueues on torch's current stream and can be captured in a CUDA graph. The fake
// (meta) implementations are registered in python/mlakv/torch_ops.py.
// The library calls the mlakv C++ API (include/mlakv/) and nothing else; libtorch symbols
// resolve when torch has been imported (the module is loaded with torch.ops.load_library).
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "mlakv/attention.h"
#include "mlakv/cache.h"
#include "mlakv/codec.h"
#include "mlakv/formats.h"
#include "mlakv/tensor.h"
#include "mlakv/thread_pool.h"
#ifdef MLAKV_TORCH_CUDA
#include "mlakv/cuda.h"
#endif

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;
using namespace mlakv;

// Errors: the message is concatenated as std::string (no iostreams) and thrown as
// std::runtime_error, which torch's dispatcher hands to Python as RuntimeError. Not
// STD_TORCH_CHECK: it formats its message with an std::ostringstream compiled into this
// library, and on the GPU image (torch 2.11, Python 3.12, the image's CXX) that formatting
// segfaulted inside std::ostream::_M_insert<long> before anything was thrown
// (docs/gpu-logs/2026-12-01b-py13-torch-ops-crash.log); the throw itself is not the problem.
std::string piece(const std::string& s) { return s; }
std::string piece(const char* s) { return s; }
template <class T>
  requires std::is_arithmetic_v<T>
std::string piece(T v) {
  return std::to_string(v);
}
template <class... A>
[[noreturn]] void fail(const A&... a) {
  std::string m;
  ((m += piece(a)), ...);
  throw std::runtime_error(m);
}
#define MLAKV_OP_CHECK(cond, ...) \
  do {                            \
    if (!(cond)) fail(__VA_ARGS__); \
  } while (0)

void check(const Status& s, const char* op) {
  MLAKV_OP_CHECK(s.ok(), "mlakv.", op, ": ", s.message());
}

TensorView view(const Tensor& t, const char* name) {
  MLAKV_OP_CHECK(t.defined(), name, ": tensor is undefined");
  TensorView v;
  v.data = t.data_ptr();
  switch (t.scalar_type()) {
    case ScalarType::Float: v.dtype = DType::kF32; break;
    case ScalarType::BFloat16: v.dtype = DType::kBF16; break;
    case ScalarType::Half: v.dtype = DType::kF16; break;
    case ScalarType::Int: v.dtype = DType::kI32; break;
    case ScalarType::Long: v.dtype = DType::kI64; break;
    case ScalarType::Byte: v.dtype = DType::kU8; break;
    default: MLAKV_OP_CHECK(false, name, ": unsupported dtype");
  }
  MLAKV_OP_CHECK(t.dim() <= kMaxTensorDims, name, ": at most ", kMaxTensorDims, " dimensions");
  v.ndim = static_cast<int>(t.dim());
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[static_cast<size_t>(i)] = t.size(i);
    v.strides[static_cast<size_t>(i)] = t.stride(i);
  }
  if (t.is_cuda()) v.device = Device::cuda(t.get_device_index());
  else MLAKV_OP_CHECK(t.is_cpu(), name, ": tensors must be on the CPU or a CUDA device");
  return v;
}

CacheLayerView layer_of(const Tensor& kv, int64_t format, double outer_scale, bool token_scale,
                        bool nvfp4_search = false) {
  MLAKV_OP_CHECK(format >= 0 && format < static_cast<int64_t>(all_formats().size()), "format: unknown format code ",
                  format, " (mlakv.torch_ops.FORMATS)");
  const KvFormat f = all_formats()[static_cast<size_t>(format)].format;
  const TensorView t = view(kv, "kv_cache");
  MLAKV_OP_CHECK(t.dtype == DType::kU8 && t.ndim == 3 && t.is_contiguous(),
                  "kv_cache: expected a contiguous [num_blocks, block_size, record_bytes] uint8 tensor, got ",
                  t.shape_string());
  MLAKV_OP_CHECK(t.size(2) == record_bytes(f), "kv_cache: last dimension must be ", record_bytes(f), " for ",
                  std::string(format_name(f)), ", got ", t.size(2));
  CacheLayerView c;
  c.data = static_cast<uint8_t*>(t.data);
  c.num_blocks = t.size(0);
  c.block_size = static_cast<int>(t.size(1));
  c.record_bytes = static_cast<int>(t.size(2));
  c.format = f;
  c.outer_scale = static_cast<float>(outer_scale);
  c.token_scale = token_scale;
  c.nvfp4_scales = nvfp4_search ? Nvfp4ScaleMode::kSearch : Nvfp4ScaleMode::kRn;
  c.device = t.device;
  check(check_cache_view(c, "kv_cache"), "cache");
  return c;
}

ThreadPool* cpu_pool() {
  static std::once_flag once;
  static std::unique_ptr<ThreadPool> pool;
  std::call_once(once, [] { pool = std::make_unique<ThreadPool>(0); });
  return pool.get();
}

#ifdef MLAKV_TORCH_CUDA
void* current_stream(const TensorView& t) {
  void* s = nullptr;
  MLAKV_OP_CHECK(aoti_torch_get_current_cuda_stream(t.device.index, &s) == AOTI_TORCH_SUCCESS,
                 "torch's current CUDA stream of device ", t.device.index, " is not available");
  return s;
}
#endif

void run_attention(MlaAttentionParams& p, int64_t num_splits, const std::optional<Tensor>& workspace) {
  MLAKV_OP_CHECK(num_splits >= 1, "num_splits: must be >= 1, got ", num_splits);
  p.num_splits = static_cast<int>(num_splits);
  if (p.cache.device.type == DeviceType::kCpu) {
    check(mla_attention_cpu(p, {cpu_pool()}), "mla_decode");
    return;
  }
#ifdef MLAKV_TORCH_CUDA
  auto plan = cuda::plan_mla_attention(p);
  check(plan.status(), "mla_decode");
  void* ws = nullptr;
  if (plan->workspace_bytes > 0) {
    MLAKV_OP_CHECK(workspace.has_value(), "workspace: num_splits > 1 needs a CUDA uint8 workspace of ",
                    plan->workspace_bytes, " bytes (mlakv.DecodePlan(...).workspace_bytes gives the size for a shape)");
    const TensorView w = view(*workspace, "workspace");
    MLAKV_OP_CHECK(w.device == p.cache.device && w.dtype == DType::kU8 && w.is_contiguous() &&
                        static_cast<size_t>(w.numel()) >= plan->workspace_bytes,
                    "workspace: needs a contiguous uint8 tensor of >= ", plan->workspace_bytes, " bytes on the cache's device");
    ws = w.data;
  }
  check(cuda::run_mla_attention(p, *plan, ws, current_stream(p.q)), "mla_decode");
#else
  MLAKV_OP_CHECK(false, "mla_decode: a CUDA cache, but this build of the mlakv ops has no CUDA backend");
#endif
}

void write_cache(Tensor kv_cache, Tensor slot_mapping, Tensor latent, Tensor rope, int64_t format, double outer_scale,
                 bool fp8_exact, bool token_scale, bool nvfp4_search) {
  const CacheLayerView c = layer_of(kv_cache, format, outer_scale, token_scale, nvfp4_search);
  const TensorView s = view(slot_mapping, "slot_mapping"), l = view(latent, "latent"), r = view(rope, "rope");
  const Fp8ScaleMode mode = fp8_exact ? Fp8ScaleMode::kExact : Fp8ScaleMode::kPow2;
  if (c.device.type == DeviceType::kCpu) {
    check(write_cache_layer(c, s, l, r, mode), "write_cache");
    return;
  }
#ifdef MLAKV_TORCH_CUDA
  check(cuda::write_cache(c, s, l, r, mode, current_stream(s)), "write_cache");
#else
  MLAKV_OP_CHECK(false, "write_cache: a CUDA cache, but this build of the mlakv ops has no CUDA backend");
#endif
}

void mla_decode(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seqlens, Tensor out, Tensor lse, int64_t format,
                double outer_scale, double softmax_scale, bool causal, int64_t num_splits,
                std::optional<Tensor> workspace, bool token_scale) {
  MlaAttentionParams p;
  p.q = view(q, "q");
  p.cache = layer_of(kv_cache, format, outer_scale, token_scale);
  p.block_table = view(block_table, "block_table");
  p.seqlens = view(seqlens, "seqlens");
  p.out = view(out, "out");
  p.lse = view(lse, "lse");
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.causal = causal;
  run_attention(p, num_splits, workspace);
}

void mla_decode_sparse(Tensor q, Tensor kv_cache, Tensor indices, std::optional<Tensor> topk_length, Tensor out,
                       Tensor lse, int64_t format, double outer_scale, double softmax_scale, int64_t num_splits,
                       std::optional<Tensor> workspace, bool token_scale) {
  MlaAttentionParams p;
  p.q = view(q, "q");
  p.cache = layer_of(kv_cache, format, outer_scale, token_scale);
  p.indices = view(indices, "indices");
  if (topk_length.has_value()) p.topk_length = view(*topk_length, "topk_length");
  p.out = view(out, "out");
  p.lse = view(lse, "lse");
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.causal = false;
  run_attention(p, num_splits, workspace);
}

}  // namespace

STABLE_TORCH_LIBRARY(mlakv, m) {
  m.def("write_cache(Tensor(a!) kv_cache, Tensor slot_mapping, Tensor latent, Tensor rope, int format, "
        "float outer_scale, bool fp8_exact, bool token_scale=False, bool nvfp4_search=False) -> ()");
  m.def("mla_decode(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seqlens, Tensor(a!) out, "
        "Tensor(b!) lse, int format, float outer_scale, float softmax_scale, bool causal, int num_splits, "
        "Tensor(c!)? workspace, bool token_scale=False) -> ()");
  m.def("mla_decode_sparse(Tensor q, Tensor kv_cache, Tensor indices, Tensor? topk_length, Tensor(a!) out, "
        "Tensor(b!) lse, int format, float outer_scale, float softmax_scale, int num_splits, "
        "Tensor(c!)? workspace, bool token_scale=False) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(mlakv, CPU, m) {
  m.impl("write_cache", TORCH_BOX(&write_cache));
  m.impl("mla_decode", TORCH_BOX(&mla_decode));
  m.impl("mla_decode_sparse", TORCH_BOX(&mla_decode_sparse));
}

#ifdef MLAKV_TORCH_CUDA
STABLE_TORCH_LIBRARY_IMPL(mlakv, CUDA, m) {
  m.impl("write_cache", TORCH_BOX(&write_cache));
  m.impl("mla_decode", TORCH_BOX(&mla_decode));
  m.impl("mla_decode_sparse", TORCH_BOX(&mla_decode_sparse));
}
#endif
