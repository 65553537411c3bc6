// Weight absorption for MLA decode (docs/reference.md sections 1 and 6, docs/absorb.md).
//
// kv_b_proj.weight is [H*(P+V), L]; viewed [H, P+V, L] the first P rows of each head
// are W_UK, the last V rows W_UV. Absorbed decode multiplies by
//   W_UK_T [H, P, L]   W_UK_T[h][p][l] = W[h*(P+V) + p][l]        q_lat[h] = q_nope[h] @ W_UK_T[h]
//   W_UV   [H, L, V]   W_UV[h][l][v]   = W[h*(P+V) + P + v][l]    o[h]     = o_lat[h] @ W_UV[h]
// (H = the heads of this tensor-parallel rank). The conventions are vLLM's; the facts
// they were checked against are listed at the top of src/weights/absorb.cc.
//
// Memory discipline (PR #156): the pair is persistent, the dequantized kv_b_proj
// [H*(P+V), L] is transient scratch. By default the pair is allocated BEFORE the
// scratch (AllocationOrder::kPersistentFirst) so long-lived tensors do not land in the
// holes the scratch leaves; kScratchFirst is the legacy order, kept so the two can be
// compared (`mlakv absorb --report`). Only the activation-dtype path allocates a pair;
// a backend that multiplies by the checkpoint's fp8/fp4 storage (AbsorbPath::
// kQuantizedBmm) allocates nothing. A reload into a layer that already holds a pair
// reuses it when compatible (same shape, dtype, device) and copies in place, so every
// address a CUDA graph captured stays valid; otherwise it allocates new storage and
// says so in a LayerStorageChange.
//
// Errors follow mlakv/status.h: every function validates its arguments and returns a
// Status naming the layer, tensor and what was expected; nothing throws or aborts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mlakv/allocator.h"
#include "mlakv/kv_b_proj.h"
#include "mlakv/mla_geometry.h"
#include "mlakv/model_config.h"
#include "mlakv/status.h"
#include "mlakv/tensor.h"
#include "mlakv/tensor_source.h"

namespace mlakv {

enum class AllocationOrder : uint8_t {
  kPersistentFirst,  // W_UK_T, W_UV, then staged quantized tensors and the scratch (default)
  kScratchFirst,     // legacy: staged tensors and scratch, dequantize, then W_UK_T and W_UV
};
std::string_view allocation_order_name(AllocationOrder order);  // "persistent_first", "scratch_first"

enum class AbsorbPath : uint8_t {
  // W_UK_T / W_UV in the activation dtype (vLLM's generic 16-bit path; f32 allowed):
  // the only path that allocates (pair, scratch, staging).
  kActivation,
  // The attention backend multiplies by the checkpoint's fp8/fp4 kv_b_proj itself: the
  // storage is resolved and validated, nothing is allocated, and a pair the layer held
  // before is released.
  kQuantizedBmm,
};

struct AbsorbOptions {
  DType dtype = DType::kBF16;  // W_UK_T and W_UV: kBF16 or kF32
  // The dequantized kv_b_proj: kF32 or kBF16; nullopt = `dtype` (vLLM dequantizes to
  // the activation dtype). A bf16 pair is bit-identical from either scratch dtype (one
  // round-to-nearest-even of the same f32 value); an f32 pair from a bf16 scratch
  // carries the bf16 rounding.
  std::optional<DType> scratch_dtype;
  AllocationOrder order = AllocationOrder::kPersistentFirst;
  AbsorbPath path = AbsorbPath::kActivation;
  // Copy the layer's quantized tensors into allocator memory first and dequantize from
  // that copy, as a device loader uploads them before its dequantization kernel; the
  // copies are freed right after dequantization. Part of the transient scratch.
  bool stage_quantized = false;
  // Make every allocation of a real load, in the same order and sizes, but write no
  // byte: the pair's contents are undefined afterwards. Storage presence and shapes
  // are still validated. Required when the allocator's memory is not host memory (a
  // virtual backing modelling a GPU).
  bool placement_only = false;
  WeightQuantOptions quant;  // encoding (nullopt: detected per layer), GPTQ/AWQ/fp8 block parameters
};

// Where a layer's kv_b_proj lives and what its encoding reads.
struct KvBProjStorage {
  WeightEncoding encoding = WeightEncoding::kDense;
  std::string storage_name;          // the tensor holding the weight: <prefix>weight, weight_packed or qweight
  Device device;                     // that tensor's device (TensorSource views are on the cpu)
  std::vector<std::string> tensors;  // every tensor the encoding reads that is present (full names)
  std::size_t bytes = 0;             // their total size
};

// Resolves the layer's storage from whichever tensor it has (weight, weight_packed,
// qweight; `quant.encoding` forces the encoding) and checks it against `geo`:
//  - kNotFound listing EVERY tensor of the encoding that is missing (and what the
//    prefix does hold);
//  - kInvalidArgument when the storage tensor's shape is not the one `geo` implies
//    (dense/fp8 [N, L], NVFP4 [N, L/2], GPTQ qweight [L/8, N], AWQ [L, N/8], N =
//    H*(P+V)): the message names the tensor, both shapes and the geometry, i.e. the
//    checkpoint and the model config disagree;
//  - whatever detect_weight_encoding reports for storage no encoding matches.
// Scale shapes are checked by the dequantizer. A prefix without a trailing '.' gets one.
StatusOr<KvBProjStorage> resolve_kv_b_proj_storage(const TensorSource& src, std::string_view prefix,
                                                   const MlaGeometry& geo, const WeightQuantOptions& quant);

// One layer's absorbed pair. Owns its storage: the CachingAllocator it came from must
// outlive it. Move-only.
struct AbsorbedLayer {
  int layer = -1;                 // decoder layer index (-1 when absorbed on its own)
  MlaGeometry geometry;  // H = the heads of this rank; the pair is [H, P, L], [H, L, V]
  DType dtype = DType::kBF16;     // of W_UK_T and W_UV
  Device device;                  // where the pair lives: the allocator's device
  WeightEncoding source_encoding = WeightEncoding::kDense;
  bool values_written = false;    // false after a placement-only absorption (contents undefined)
  Allocation w_uk_t_storage;      // H*P*L elements of `dtype`
  Allocation w_uv_storage;        // H*L*V elements of `dtype`

  bool has_pair() const { return !w_uk_t_storage.empty() && !w_uv_storage.empty(); }
  TensorView w_uk_t() const;  // [H, P, L] on `device`; a null view when !has_pair()
  TensorView w_uv() const;    // [H, L, V] on `device`; a null view when !has_pair()
};

// What an absorption did with the pair a layer held before.
struct LayerStorageChange {
  int layer = -1;
  bool had_pair = false;  // the layer held a pair before the call
  bool reused = false;    // ...compatible: new values copied in place, addresses unchanged
  // When had_pair && !reused: why the pair was replaced, e.g. "W_UK_T [16, 192, 512] ->
  // [8, 192, 512], W_UV [16, 512, 256] -> [8, 512, 256]" or "dtype bf16 -> f32"; the
  // old addresses are invalid (CUDA graphs that captured them must be re-captured).
  std::string reason;
};

// Absorbs the kv_b_proj under `prefix` (e.g. "model.layers.3.self_attn.kv_b_proj.")
// whose geometry is `geo` (H, P, V, L are read; a ModelConfig passes as its geometry)
// into `layer`, allocating from `alloc`.
//  - A pair `layer` already holds with the same H, P, V, L, dtype and device is reused:
//    values are copied in place and its addresses are kept. Otherwise new storage is
//    allocated and the old pair released once the new one is written.
//  - Allocation order per `opt.order`; scratch and staged tensors are freed before
//    returning, on success or failure.
//  - On failure `layer` is unchanged (its previous pair keeps its values and
//    addresses), because every value is dequantized into the scratch before the pair
//    is written; `change` is left untouched.
// Errors: invalid options (dtype, scratch dtype), non-positive geometry; those of
// resolve_kv_b_proj_storage and dequantize_kv_b_proj; kUnimplemented when values are
// to be written but the allocator's memory is not host memory (use placement_only);
// kResourceExhausted from the allocator.
Status absorb_kv_b_proj(const TensorSource& src, std::string_view prefix, const MlaGeometry& geo,
                        CachingAllocator& alloc, const AbsorbOptions& opt, AbsorbedLayer& layer,
                        LayerStorageChange* change = nullptr);

struct AbsorbModelOptions {
  AbsorbOptions absorb;
  // Tensor parallelism: this rank holds heads [rank*H/tp, (rank+1)*H/tp), i.e. the
  // contiguous rows [rank*N/tp, (rank+1)*N/tp) of kv_b_proj (vLLM's ColumnParallelLinear
  // split). tp must divide H; fp8 block needs N/tp to be a multiple of the block rows.
  // GPTQ/AWQ shards (columns of qweight) are not implemented for tp > 1.
  int tp_size = 1;
  int tp_rank = 0;
  bool include_mtp = true;  // also the config's MTP layers (they keep a KV cache too)
  // Layer i's kv_b_proj is layer_prefix + i + ".self_attn.kv_b_proj."
  std::string layer_prefix = "model.layers.";
  // Called before layer i is absorbed: a loader places the layer's other weights here.
  // An error stops the load (returned with the layer as context).
  std::function<Status(int layer)> before_layer;
  std::function<void(int done, int total)> progress;  // after each layer
};

// Absorbs every layer of `config` (num_layers, plus num_mtp_layers with include_mtp).
// Before allocating anything, every layer's storage is resolved; missing tensors are
// reported together for all layers (kNotFound listing up to 32 names and the count).
// Other errors name the layer ("layer 5: ..."). On failure every pair allocated so far
// is released. Also fails when config.validate() fails, tp_size < 1, tp_rank outside
// [0, tp_size) or tp_size not dividing H (kInvalidArgument).
StatusOr<std::vector<AbsorbedLayer>> absorb_model(const TensorSource& src, const ModelConfig& config,
                                                  CachingAllocator& alloc, const AbsorbModelOptions& opt);

// Reloads new weights into `layers` (from absorb_model with the same model): each
// layer's pair is reused in place when compatible, else replaced; the returned changes
// (one per layer, in order) say which and why. Every layer is validated before any is
// written. kFailedPrecondition when `layers` does not have one entry per layer of
// `config` in order (a model/config mismatch: absorb anew). When a layer fails midway
// (e.g. a NaN weight) the layers before it hold the new weights, it and those after it
// the old ones; the Status names the layer.
StatusOr<std::vector<LayerStorageChange>> reload_model(const TensorSource& src, const ModelConfig& config,
                                                       CachingAllocator& alloc, const AbsorbModelOptions& opt,
                                                       std::vector<AbsorbedLayer>& layers);

// ---- the allocation-order experiment (docs/absorb.md) ----------------------------------

// What a loader holds on the device besides the absorbed pair and the scratch.
enum class QuantizedCopy : uint8_t {
  kNone,        // nothing: the quantized kv_b_proj stays on the host
  kTransient,   // uploaded before dequantization, freed after (AbsorbOptions::stage_quantized)
  kPersistent,  // kept on the device for the prefill path (vLLM keeps kv_b_proj), placed
                // with the layer's other weights before the layer is absorbed
};
std::string_view quantized_copy_name(QuantizedCopy q);  // "none", "transient", "persistent"

struct AbsorbMemoryOptions {
  std::size_t device_bytes = std::size_t{96} << 30;  // capacity of the modelled GPU
  // true: a virtual backing of device_bytes and placement-only absorption (no RAM
  // needed); false: a host backing limited to device_bytes, values computed.
  bool virtual_device = true;
  QuantizedCopy quantized_copy = QuantizedCopy::kPersistent;
  // Other persistent weights of each layer, one tensor of this many bytes placed before
  // the layer's quantized kv_b_proj copy and absorption (0: none).
  std::size_t other_weights_bytes = 0;
};

struct AbsorbMemoryRun {
  AllocationOrder order = AllocationOrder::kPersistentFirst;
  AllocatorStats after_load;         // every layer absorbed, nothing released
  AllocatorStats after_empty_cache;  // then empty_cache(): fully free segments returned
  // Bytes the live tensors asked for (pairs, persistent copies, other weights).
  // reserved - requested is all the layout wastes: cached free blocks
  // (reserved_but_unallocated) plus the unsplit tails inside handed-out blocks.
  std::size_t requested_bytes = 0;
  // The largest single allocation (a KV cache) that still succeeds after empty_cache:
  // max(largest free block, capacity - reserved rounded down to 2 MiB).
  std::size_t kv_cache_max_bytes = 0;
};

struct AbsorbMemoryReport {
  int layers = 0;
  MlaGeometry rank_geometry;  // the config's, with H = heads per rank
  WeightEncoding encoding = WeightEncoding::kDense;  // of layer 0
  std::size_t pair_bytes_per_layer = 0;     // W_UK_T + W_UV
  std::size_t scratch_bytes_per_layer = 0;  // the dequantized kv_b_proj
  std::size_t quantized_bytes_per_layer = 0;  // the rank's quantized tensors (layer 0)
  AbsorbMemoryRun scratch_first;
  AbsorbMemoryRun persistent_first;
};

// Loads every layer's kv_b_proj through a fresh allocator of `mem.device_bytes` twice,
// once per order (opt.absorb.order is ignored), and returns both allocators' figures.
// Errors: those of absorb_model (each run's with the order as context); kInvalidArgument
// when device_bytes is 0.
StatusOr<AbsorbMemoryReport> measure_absorb_memory(const TensorSource& src, const ModelConfig& config,
                                                   const AbsorbModelOptions& opt, const AbsorbMemoryOptions& mem);

}  // namespace mlakv
