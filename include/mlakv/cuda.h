// The CUDA backend (built when MLAKV_CUDA is on; link mlakv_cuda). The same
// operations and semantics as the CPU ones, on device tensors:
//   - cache writers for every record format, byte-identical to the CPU codecs;
//   - MLA attention over the paged cache (dense causal / sparse top-k, split-KV),
//     dequantization fused into the kernel, tensor-core MMAs for Q K^T and P V;
//   - merge_attn_states on the device;
//   - a MemoryBacking over cudaMalloc for the caching allocator.
//
// Plan / run: planning is host-only arithmetic on shapes (no device access); running
// launches kernels on the given stream - no allocation, no host synchronisation - so
// a decode step can be captured in a CUDA graph and replayed with new contents.
// Streams are passed as `void*` (a cudaStream_t) so this header needs no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "mlakv/allocator.h"
#include "mlakv/attention.h"
#include "mlakv/cache.h"
#include "mlakv/codec.h"
#include "mlakv/latent_transform.h"
#include "mlakv/status.h"

namespace mlakv::cuda {

// ---- devices ----------------------------------------------------------------------
struct DeviceProperties {
  std::string name;
  int major = 0, minor = 0;
  int multiprocessors = 0;
  std::size_t global_memory = 0;
  std::size_t l2_bytes = 0;
  std::size_t shared_memory_per_block_optin = 0;
};
StatusOr<DeviceProperties> device_properties(int device = 0);

// ---- attention ----------------------------------------------------------------------
// Which attention kernel path a plan runs. kSm80: the portable sm_80+ kernel
// (src/cuda/sm80/attention/, mma.sync + cp.async). kSm90: the warp-specialized Hopper
// kernel (src/cuda/sm90/attention/, bulk copies + mbarrier ring), built when
// MLAKV_CUDA_ARCHS holds 90a and chosen by plan_mla_attention on a compute capability
// 9.0 device for bf16, fp8_ds_mla, nvfp4_ds_mla and nvfp4_ds_mla_fp8rope at L = 512,
// R = 64 without the per-token scale mode (nvfp4_ds_mla_int8rope and token-scale layers
// run on kSm80 everywhere for now). kSm90Rows: the many-row Hopper kernel (64 query
// rows per CTA, src/cuda/sm90/attention/kernel_rows.cuh), same devices and formats as
// kSm90, picked where a request has at least 64 rows (dense s_q * H, sparse H). kSm90Nat:
// the natural-arrangement many-row Hopper kernel for bf16 records (64 query rows per CTA
// as the wgmma M dimension, the KV tile read by TMA and the tensor cores from shared
// memory; src/cuda/sm90/attention/kernel_nat.cuh), dense token sets of >= 64 rows per
// request at block sizes 8, 16, 32 or a multiple of 64; picked before kSm90Rows where it
// serves. The environment variable MLAKV_CUDA_ATTENTION=sm80 forces kSm80, =sm90
// requires the 16-row kSm90 kernel, =sm90_rows requires kSm90Rows, =sm90_nat requires
// kSm90Nat (planning fails where the forced path cannot run), unset, empty or auto picks
// (kSm90Nat, else kSm90Rows, else kSm90, else kSm80).
enum class AttentionPath : uint8_t { kSm80 = 0, kSm90 = 1, kSm90Rows = 2, kSm90Nat = 3 };
// "sm80", "sm90", "sm90_rows", "sm90_nat" (the MLAKV_CUDA_ATTENTION values)
const char* attention_path_name(AttentionPath path);

struct AttentionPlan {
  AttentionPath path = AttentionPath::kSm80;  // the kernel path run_mla_attention launches
  int num_splits = 1;
  int row_blocks = 0;            // CTAs over the rows of one request (16 rows per CTA; 64 on kSm90Rows, kSm90Nat)
  int64_t partial_rows = 0;      // rows of split partials kept in the workspace
  std::size_t workspace_bytes = 0;  // caller allocates this much device memory
};

// A split count that fills every CTA slot of a GPU with `multiprocessors` SMs once for
// this batch shape and record format (uses the CUDA occupancy API; host only), at most
// 64; for a sparse token set also at most one split per kernel token tile, with every
// split covering the same number of tiles (no empty splits).
int suggest_num_splits(const MlaAttentionParams& p, int multiprocessors);

// Validates shapes/dtypes/devices (cache and every tensor on the same CUDA device),
// sizes the workspace for p.num_splits and configures the kernel (shared-memory
// limit). Reads no device memory; call it outside graph capture.
StatusOr<AttentionPlan> plan_mla_attention(const MlaAttentionParams& p);

// Launches the attention (and, with splits, the combine) kernels on `stream`.
// `workspace` must hold plan.workspace_bytes (may be null when that is 0). Device
// block tables are not read by the host: a block id outside the cache makes the
// kernel skip those tokens; it never reads outside the cache.
Status run_mla_attention(const MlaAttentionParams& p, const AttentionPlan& plan, void* workspace, void* stream);

// o_parts [P, N, D] f32, lse_parts [P, N] f32 -> out [N, D], lse [N], on the device.
Status merge_attn_states(const TensorView& o_parts, const TensorView& lse_parts, const TensorView& out,
                         const TensorView& lse, void* stream);

// ---- cache writers --------------------------------------------------------------------
// What the CUDA writer tallies for the nvfp4 subnormal-scale check (mlakv/codec.h
// Nvfp4ScaleCheck, the check behind the warning KvCache::write raises on the CPU): pass a
// zero-initialised one in device memory to write_cache and read it back once the stream is
// done; to_check() is what nvfp4_scale_warning takes. (The launch's Status cannot carry the
// warning: it returns before the kernel runs.) Counted over the tokens written (slots inside
// the layer), at the layer's outer scale, for the nvfp4 formats outside token-scale mode
// (which needs no warning); left as it is otherwise. Accumulates over calls.
struct Nvfp4ScaleTally {
  unsigned long long tokens = 0;
  unsigned long long groups = 0;            // non-zero 16-dim groups
  unsigned long long subnormal_groups = 0;  // of those, amax_g / (6 s_l) < 2^-6 (in double, as the CPU)
  unsigned int max_abs_bits = 0;            // float32 bits of max |latent| (>= 0: ordered as the bits)
  unsigned int reserved = 0;
  Nvfp4ScaleCheck to_check() const;
};

// Encodes n tokens into `slots` of a device cache layer; one launch.
//   slots [n] i64 (device); entries < 0 are skipped (CUDA-graph padding); entries past
//         the layer's capacity are skipped and counted in *error_count when given.
//   latent [n, 512], rope [n, 64]: f32 or bf16 on the device. Non-finite inputs are
//         not checked on the device (the CPU writer rejects them).
//   scale_tally: device memory, or null (Nvfp4ScaleTally above).
Status write_cache(const CacheLayerView& layer, const TensorView& slots, const TensorView& latent,
                   const TensorView& rope, Fp8ScaleMode fp8_scales, void* stream, int* error_count = nullptr,
                   Nvfp4ScaleTally* scale_tally = nullptr);

// A layer's latent transform (include/mlakv/latent_transform.h, the mlakv recipe) on one
// GPU: the factors of its LatentTransformKernel (mu, the per-dim gains, the RoPE gains)
// uploaded once (one allocation, ~4.3 KB). The writer below applies it to every token as
// the CPU writer does - c' = H D (c - mu), k' = H_r k_pe, the same float32 operations in
// the same order, so the records are byte-identical - before the record format quantizes;
// the layer's outer_scale must be the transform's s_l (as for the CPU cache).
class DeviceLatentTransform {
 public:
  // Fails on a CUDA error (the message names it). The kernel's layer is validated already.
  static StatusOr<DeviceLatentTransform> upload(const LatentTransformKernel& kernel, int device = 0);
  DeviceLatentTransform(DeviceLatentTransform&& o) noexcept;
  DeviceLatentTransform& operator=(DeviceLatentTransform&& o) noexcept;
  DeviceLatentTransform(const DeviceLatentTransform&) = delete;
  DeviceLatentTransform& operator=(const DeviceLatentTransform&) = delete;
  ~DeviceLatentTransform();

  int device() const { return device_; }
  const float* mu() const { return data_; }                                        // [512]
  const float* gain() const { return data_ + kLatentDim; }                         // [512]
  const float* rope_gain() const { return rope_rotate_ ? data_ + 2 * kLatentDim : nullptr; }  // [64]
  bool rotate() const { return rotate_; }
  bool rope_rotate() const { return rope_rotate_; }
  float outer_scale() const { return outer_scale_; }  // the transform's s_l

 private:
  DeviceLatentTransform() = default;
  float* data_ = nullptr;
  int device_ = 0;
  bool rotate_ = false, rope_rotate_ = false;
  float outer_scale_ = 1.0f;
};

// write_cache with the layer's latent transform applied first (transform on the cache's
// GPU; the layer's outer_scale equal to transform.outer_scale() where the format has one).
Status write_cache(const CacheLayerView& layer, const TensorView& slots, const TensorView& latent,
                   const TensorView& rope, Fp8ScaleMode fp8_scales, const DeviceLatentTransform& transform,
                   void* stream, int* error_count = nullptr, Nvfp4ScaleTally* scale_tally = nullptr);

// ---- memory ------------------------------------------------------------------------------
// cudaMalloc-backed segments for CachingAllocator; a capacity models a smaller GPU.
std::unique_ptr<MemoryBacking> make_cuda_backing(int device = 0, std::optional<std::size_t> capacity_limit = {});

}  // namespace mlakv::cuda
