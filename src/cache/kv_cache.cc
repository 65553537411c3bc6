#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "mlakv/cache.h"

namespace mlakv {

Status check_cache_view(const CacheLayerView& c, std::string_view name) {
  if (c.num_blocks < 1 || c.block_size < 1) {
    return invalid_argument(fmt::format("{}: num_blocks ({}) and block_size ({}) must be >= 1", name, c.num_blocks,
                                        c.block_size));
  }
  if (c.data == nullptr) return invalid_argument(fmt::format("{}: null data pointer", name));
  if (static_cast<int>(c.format) >= kNumKvFormats) {
    return invalid_argument(fmt::format("{}: unknown format id {}", name, static_cast<int>(c.format)));
  }
  const int rb = record_bytes(c.format, c.latent_dim, c.rope_dim);
  if (rb < 0) {
    return invalid_argument(fmt::format("{}: format {} needs latent {} + rope {}, view has {} + {}", name,
                                        format_name(c.format), kLatentDim, kRopeDim, c.latent_dim, c.rope_dim));
  }
  if (c.record_bytes != rb) {
    return invalid_argument(
        fmt::format("{}: record_bytes {} does not match format {} ({} B)", name, c.record_bytes, format_name(c.format), rb));
  }
  if (!std::isfinite(c.outer_scale) || !(c.outer_scale > 0.0f)) {
    return invalid_argument(fmt::format("{}: outer_scale must be finite and > 0, got {}", name, c.outer_scale));
  }
  MLAKV_RETURN_IF_ERROR(check_token_scale(c.format, c.token_scale, c.outer_scale, name));
  MLAKV_RETURN_IF_ERROR(check_nvfp4_scales(c.format, c.nvfp4_scales, c.token_scale, name));
  if (c.format == KvFormat::kF32 && c.device.type == DeviceType::kCuda) {
    return unimplemented(fmt::format("{}: format f32 is a CPU parity-check format; the CUDA backend has no f32 "
                                     "kernels (use bf16 on the GPU)",
                                     name));
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<KvCache>> KvCache::create_cpu(const Config& config) {
  if (config.num_layers < 1) return invalid_argument(fmt::format("num_layers must be >= 1, got {}", config.num_layers));
  if (config.num_blocks < 1) return invalid_argument(fmt::format("num_blocks must be >= 1, got {}", config.num_blocks));
  if (config.block_size < 1) return invalid_argument(fmt::format("block_size must be >= 1, got {}", config.block_size));
  if (config.layers.size() != 1 && config.layers.size() != static_cast<std::size_t>(config.num_layers)) {
    return invalid_argument(fmt::format("layers: expected 1 or {} layer formats, got {}", config.num_layers,
                                        config.layers.size()));
  }
  std::unique_ptr<KvCache> c(new KvCache());
  c->config_ = config;
  for (int l = 0; l < config.num_layers; ++l) {
    const LayerFormat lf = config.layers.size() == 1 ? config.layers[0] : config.layers[static_cast<std::size_t>(l)];
    CodecParams p{lf.format, lf.outer_scale, config.fp8_scales, config.latent_dim, config.rope_dim, lf.token_scale,
                  lf.nvfp4_scales};
    auto rb = codec_record_bytes(p);
    if (!rb.ok()) return rb.status().with_context(fmt::format("layer {}", l));
    const double bytes = static_cast<double>(config.num_blocks) * config.block_size * *rb;
    if (bytes > static_cast<double>(std::numeric_limits<std::size_t>::max() / 2)) {
      return invalid_argument(fmt::format("layer {}: {} bytes is too large", l, bytes));
    }
    const std::size_t n = static_cast<std::size_t>(config.num_blocks) * static_cast<std::size_t>(config.block_size) *
                          static_cast<std::size_t>(*rb);
    std::unique_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[n]);
    if (!buf) return resource_exhausted(fmt::format("layer {}: cannot allocate {} bytes of cache", l, n));
    std::memset(buf.get(), 0, n);
    c->layers_.push_back(lf);
    c->record_bytes_.push_back(*rb);
    c->buffers_.push_back(std::move(buf));
  }
  c->scale_checks_.resize(c->layers_.size());
  c->warned_.assign(c->layers_.size(), false);
  return c;
}

StatusOr<CacheLayerView> KvCache::layer(int l) const {
  if (l < 0 || l >= num_layers()) return out_of_range(fmt::format("layer {} out of range [0, {})", l, num_layers()));
  CacheLayerView v;
  v.data = buffers_[static_cast<std::size_t>(l)].get();
  v.num_blocks = config_.num_blocks;
  v.block_size = config_.block_size;
  v.record_bytes = record_bytes_[static_cast<std::size_t>(l)];
  v.format = layers_[static_cast<std::size_t>(l)].format;
  v.outer_scale = layers_[static_cast<std::size_t>(l)].outer_scale;
  v.token_scale = layers_[static_cast<std::size_t>(l)].token_scale;
  v.nvfp4_scales = layers_[static_cast<std::size_t>(l)].nvfp4_scales;
  v.device = Device::cpu();
  v.latent_dim = config_.latent_dim;
  v.rope_dim = config_.rope_dim;
  return v;
}

std::size_t KvCache::bytes() const {
  std::size_t total = 0;
  for (int rb : record_bytes_) {
    total += static_cast<std::size_t>(config_.num_blocks) * static_cast<std::size_t>(config_.block_size) *
             static_cast<std::size_t>(rb);
  }
  return total;
}

Status write_cache_layer(const CacheLayerView& v, const TensorView& slots, const TensorView& latent,
                         const TensorView& rope, Fp8ScaleMode fp8_scales) {
  MLAKV_RETURN_IF_ERROR(check_cache_view(v, "cache layer"));
  if (v.device.type != DeviceType::kCpu) {
    return invalid_argument(fmt::format("cache layer: write_cache_layer writes host memory, got a {} layer "
                                        "(use cuda::write_cache)", device_name(v.device)));
  }
  MLAKV_RETURN_IF_ERROR(check_tensor(slots, "slots", {{DType::kI64, DType::kI32}, {-1}}, Device::cpu()));
  const int64_t n = slots.size(0);
  const int64_t cap = v.num_slots();
  auto slot_at = [&](int64_t i) -> int64_t {
    return slots.dtype == DType::kI64 ? slots.ptr<const int64_t>()[i * slots.stride(0)]
                                      : slots.ptr<const int32_t>()[i * slots.stride(0)];
  };
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = slot_at(i);
    if (s >= cap) return out_of_range(fmt::format("slot {} (token {}) is past the cache's {} slots", s, i, cap));
  }
  // Encode into a staging buffer through the checked codec (shape/dtype/finiteness
  // checks happen there), then scatter: a failure leaves the cache untouched.
  std::vector<uint8_t> staged(static_cast<std::size_t>(n) * static_cast<std::size_t>(v.record_bytes));
  CodecParams p{v.format, v.outer_scale, fp8_scales, v.latent_dim, v.rope_dim, v.token_scale, v.nvfp4_scales};
  MLAKV_RETURN_IF_ERROR(
      encode_records(p, latent, rope, TensorView::contiguous(staged.data(), DType::kU8, {n, v.record_bytes})));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = slot_at(i);
    if (s < 0) continue;
    std::memcpy(v.data + s * v.record_bytes, staged.data() + i * v.record_bytes, static_cast<std::size_t>(v.record_bytes));
  }
  return Status::Ok();
}

Status KvCache::write(int l, const TensorView& slots, const TensorView& latent, const TensorView& rope) {
  MLAKV_ASSIGN_OR_RETURN(CacheLayerView v, layer(l));
  MLAKV_RETURN_IF_ERROR(
      write_cache_layer(v, slots, latent, rope, config_.fp8_scales).with_context(fmt::format("layer {}", l)));
  const std::size_t li = static_cast<std::size_t>(l);
  // (The token-scale mode needs no warning: it puts every token's largest group scale at
  // the top of the e4m3 range.)
  if (config_.on_warning && format_info(v.format).has_outer_scale && !v.token_scale && !warned_[li]) {
    MLAKV_ASSIGN_OR_RETURN(Nvfp4ScaleCheck c, nvfp4_scale_check(latent, v.outer_scale));
    scale_checks_[li].add(c);
    if (scale_checks_[li].degraded()) {
      warned_[li] = true;
      config_.on_warning(l, nvfp4_scale_warning(v.format, scale_checks_[li], v.outer_scale));
    }
  }
  return Status::Ok();
}

Status KvCache::copy_block(int32_t src, int32_t dst) {
  if (src < 0 || src >= config_.num_blocks || dst < 0 || dst >= config_.num_blocks) {
    return out_of_range(fmt::format("copy_block: blocks {} -> {} outside [0, {})", src, dst, config_.num_blocks));
  }
  for (std::size_t l = 0; l < buffers_.size(); ++l) {
    const std::size_t bb = static_cast<std::size_t>(config_.block_size) * static_cast<std::size_t>(record_bytes_[l]);
    std::memmove(buffers_[l].get() + static_cast<std::size_t>(dst) * bb, buffers_[l].get() + static_cast<std::size_t>(src) * bb, bb);
  }
  return Status::Ok();
}

void KvCache::fill(uint8_t byte) {
  for (std::size_t l = 0; l < buffers_.size(); ++l) {
    std::memset(buffers_[l].get(), byte,
                static_cast<std::size_t>(config_.num_blocks) * static_cast<std::size_t>(config_.block_size) *
                    static_cast<std::size_t>(record_bytes_[l]));
  }
}

StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::create_cpu(const KvCache::Config& config) {
  MLAKV_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> storage, KvCache::create_cpu(config));
  MLAKV_ASSIGN_OR_RETURN(BlockManager blocks, BlockManager::create(config.num_blocks, config.block_size));
  return std::unique_ptr<PagedKvCache>(new PagedKvCache(std::move(blocks), std::move(storage)));
}

StatusOr<SeqId> PagedKvCache::fork(SeqId parent) {
  MLAKV_ASSIGN_OR_RETURN(BlockManager::Fork f, blocks_.fork(parent));
  if (f.has_tail_copy) MLAKV_RETURN_IF_ERROR(storage_->copy_block(f.tail_src, f.tail_dst));
  return f.child;
}

Status PagedKvCache::write(int layer, std::span<const int64_t> slots, const TensorView& latent, const TensorView& rope) {
  return storage_->write(layer, TensorView::contiguous(slots.data(), DType::kI64, {static_cast<int64_t>(slots.size())}),
                         latent, rope);
}

}  // namespace mlakv
