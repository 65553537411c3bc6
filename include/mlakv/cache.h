// The paged latent KV cache.
//
//   BlockManager  which blocks belong to which sequence: a free list shared by all
//                 layers, reference counts, per-sequence block tables.
//   KvCache       the bytes: per layer one contiguous buffer
//                 [num_blocks, block_size, record_bytes] in the layer's record format
//                 (formats.h), the layout a GPU kernel reads as is.
//   PagedKvCache  both together, with append / fork / free / write.
//
// A slot id addresses one token of one block: slot = block * block_size + offset.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mlakv/codec.h"
#include "mlakv/formats.h"
#include "mlakv/status.h"
#include "mlakv/tensor.h"

namespace mlakv {

inline constexpr int kDefaultBlockSize = 64;

struct LayerFormat {
  KvFormat format = KvFormat::kBf16;
  float outer_scale = 1.0f;  // nvfp4 formats only (calibrated s_l); 1.0 otherwise
  // nvfp4 formats only, with outer_scale 1.0: the per-token scale mode (codec.h
  // CodecParams::token_scale; the fork's VLLM_NVFP4_MLA_DYNAMIC_SCALE=1).
  bool token_scale = false;
  // nvfp4 formats only, outside token-scale mode: how the writers choose group scale codes
  // (codec.h Nvfp4ScaleMode; the records read the same either way).
  Nvfp4ScaleMode nvfp4_scales = Nvfp4ScaleMode::kRn;
};

// One layer's cache as kernels read it. Records are record_bytes apart; block b's
// token o lives at data + (b * block_size + o) * record_bytes.
struct CacheLayerView {
  uint8_t* data = nullptr;
  int64_t num_blocks = 0;
  int block_size = 0;
  int record_bytes = 0;
  KvFormat format = KvFormat::kBf16;
  float outer_scale = 1.0f;
  Device device;
  int latent_dim = kLatentDim;
  int rope_dim = kRopeDim;
  bool token_scale = false;  // nvfp4 per-token scale mode (LayerFormat::token_scale)
  // The writers' nvfp4 group-scale choice (LayerFormat::nvfp4_scales; readers ignore it).
  Nvfp4ScaleMode nvfp4_scales = Nvfp4ScaleMode::kRn;

  int64_t num_slots() const { return num_blocks * block_size; }
  const uint8_t* record(int64_t slot) const { return data + slot * record_bytes; }
};

// Validates a view (sizes, format/geometry, outer scale, token-scale mode, nvfp4 scale mode);
// `name` prefixes messages.
Status check_cache_view(const CacheLayerView& c, std::string_view name);

// Encodes n tokens into `slots` of a host cache layer held anywhere (a KvCache's, or a
// caller's [num_blocks, block_size, record_bytes] u8 buffer, as a serving engine's
// kv_cache tensor; vLLM's concat_and_cache_mla semantics).
//   slots  [n] i64 or i32; entries < 0 are skipped (CUDA-graph padding)
//   latent [n, latent_dim], rope [n, rope_dim]: f32 or bf16, CPU
// A slot >= the layer's capacity, a non-finite input or a shape error fails the whole
// call before any byte is written.
Status write_cache_layer(const CacheLayerView& layer, const TensorView& slots, const TensorView& latent,
                         const TensorView& rope, Fp8ScaleMode fp8_scales = Fp8ScaleMode::kPow2);

using SeqId = int64_t;

class BlockManager {
 public:
  // Fails on num_blocks < 1, block_size < 1, or a slot count past int64.
  static StatusOr<BlockManager> create(int64_t num_blocks, int block_size = kDefaultBlockSize);

  SeqId add_sequence();
  // Reserves n more tokens for `seq`, filling its partial tail block first, and
  // returns their slot ids in order. All or nothing: when the free list cannot cover
  // the new blocks, returns resource_exhausted and changes nothing.
  StatusOr<std::vector<int64_t>> append(SeqId seq, int64_t n);
  // A new sequence sharing `parent`'s full blocks (reference counted). A partial tail
  // block is not shared: the child gets a fresh block, and `tail_copy` says which
  // block's contents must be copied (src, dst) - PagedKvCache does that copy.
  struct Fork {
    SeqId child = -1;
    bool has_tail_copy = false;
    int32_t tail_src = -1, tail_dst = -1;
  };
  StatusOr<Fork> fork(SeqId parent);
  // Drops the sequence's references; blocks whose count reaches zero return to the free list.
  Status free(SeqId seq);

  StatusOr<int64_t> length(SeqId seq) const;
  StatusOr<std::span<const int32_t>> block_table(SeqId seq) const;
  // Dense [seqs.size(), max_blocks] i32 block table (unused entries -1) and seqlens.
  Status fill_tables(std::span<const SeqId> seqs, std::vector<int32_t>& table, int64_t& max_blocks,
                     std::vector<int32_t>& seqlens) const;

  int64_t num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  int64_t num_free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int ref_count(int32_t block) const;
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int64_t length = 0;
  };
  BlockManager(int64_t num_blocks, int block_size);
  StatusOr<const Sequence*> find(SeqId seq) const;

  int64_t num_blocks_;
  int block_size_;
  std::vector<int32_t> free_;      // LIFO free list
  std::vector<int32_t> refcount_;  // per block
  std::unordered_map<SeqId, Sequence> seqs_;
  SeqId next_id_ = 0;
};

class KvCache {
 public:
  struct Config {
    int num_layers = 1;
    int64_t num_blocks = 0;
    int block_size = kDefaultBlockSize;
    // One entry per layer, or a single entry applied to every layer.
    std::vector<LayerFormat> layers = {LayerFormat{}};
    Fp8ScaleMode fp8_scales = Fp8ScaleMode::kPow2;
    int latent_dim = kLatentDim;  // only bf16 accepts other geometries
    int rope_dim = kRopeDim;
    // Quality warnings from write(), at most one per layer (e.g. an nvfp4 layer whose
    // group scales fall into e4m3 subnormals for want of an outer scale: codec.h
    // nvfp4_scale_warning). Unset: no checks are made.
    std::function<void(int layer, const std::string& message)> on_warning;
  };

  // Allocates the per-layer buffers in host memory (zero-filled).
  static StatusOr<std::unique_ptr<KvCache>> create_cpu(const Config& config);

  int num_layers() const { return static_cast<int>(layers_.size()); }
  const Config& config() const { return config_; }
  StatusOr<CacheLayerView> layer(int l) const;
  std::size_t bytes() const;  // all layers

  // Encodes n tokens into `slots` of layer l.
  //   slots  [n] i64 or i32; entries < 0 are skipped (CUDA-graph padding)
  //   latent [n, latent_dim], rope [n, rope_dim]: f32 or bf16, CPU
  // A slot >= the cache's capacity, a non-finite input or a shape error fails the
  // whole call before any byte is written.
  Status write(int l, const TensorView& slots, const TensorView& latent, const TensorView& rope);
  // Copies block src to block dst in every layer.
  Status copy_block(int32_t src, int32_t dst);
  // Fills every byte of every layer with `byte` (tests poison unused slots with 0xFF,
  // which decodes to NaN in every format's latent).
  void fill(uint8_t byte);

 private:
  KvCache() = default;
  Config config_;
  std::vector<LayerFormat> layers_;
  std::vector<int> record_bytes_;
  std::vector<std::unique_ptr<uint8_t[]>> buffers_;
  std::vector<Nvfp4ScaleCheck> scale_checks_;  // per layer, while on_warning is set
  std::vector<bool> warned_;
};

class PagedKvCache {
 public:
  static StatusOr<std::unique_ptr<PagedKvCache>> create_cpu(const KvCache::Config& config);

  BlockManager& blocks() { return blocks_; }
  const BlockManager& blocks() const { return blocks_; }
  KvCache& storage() { return *storage_; }
  const KvCache& storage() const { return *storage_; }

  SeqId add_sequence() { return blocks_.add_sequence(); }
  StatusOr<std::vector<int64_t>> append(SeqId seq, int64_t n) { return blocks_.append(seq, n); }
  // Fork that also copies the partial tail block's records in every layer.
  StatusOr<SeqId> fork(SeqId parent);
  Status free(SeqId seq) { return blocks_.free(seq); }
  Status write(int layer, std::span<const int64_t> slots, const TensorView& latent, const TensorView& rope);

 private:
  PagedKvCache(BlockManager b, std::unique_ptr<KvCache> s) : blocks_(std::move(b)), storage_(std::move(s)) {}
  BlockManager blocks_;
  std::unique_ptr<KvCache> storage_;
};

}  // namespace mlakv
