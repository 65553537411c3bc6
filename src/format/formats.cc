#include <cstdint>
#include "mlakv/formats.h"

#include <array>

namespace mlakv {
namespace {

namespace L = layout;

constexpr RecordRegion kBf16Regions[] = {
    {L::bf16::kLatentOffset, 2 * kLatentDim, "512 x bf16 latent (kv_c_normed)"},
    {L::bf16::kRopeOffset, 2 * kRopeDim, "64 x bf16 rope (k_pe after rotary)"},
};
constexpr RecordRegion kF32Regions[] = {
    {L::f32::kLatentOffset, 4 * kLatentDim, "512 x f32 latent (kv_c_normed), unquantized"},
    {L::f32::kRopeOffset, 4 * kRopeDim, "64 x f32 rope (k_pe after rotary), unquantized"},
};
constexpr RecordRegion kFp8Regions[] = {
    {L::fp8_ds_mla::kLatentOffset, kLatentDim, "512 x fp8 e4m3fn latent, byte i = dim i"},
    {L::fp8_ds_mla::kScaleOffset, 4 * L::fp8_ds_mla::kNumTiles,
     "4 x fp32 tile scale, scale t multiplies dims [128t, 128t+128)"},
    {L::fp8_ds_mla::kRopeOffset, 2 * kRopeDim, "64 x bf16 rope, not quantized"},
};
constexpr RecordRegion kNvfp4Regions[] = {
    {L::nvfp4_ds_mla::kLatentOffset, L::nvfp4_ds_mla::kLatentBytes,
     "512 x e2m1 latent, two per byte, dim 2i in the low nibble; group g in bytes [8g, 8g+8)"},
    {L::nvfp4_ds_mla::kScaleOffset, L::nvfp4_ds_mla::kNumGroups,
     "32 x e4m3 group scale (16 dims each), byte 256+g"},
    {L::nvfp4_ds_mla::kPadOffset, L::nvfp4_ds_mla::kPadBytes,
     "zero (token-scale mode: fp32 s_t = token_amax * f32(1/2688) at [292, 296))"},
    {L::nvfp4_ds_mla::kRopeOffset, 2 * kRopeDim, "64 x bf16 rope (post-rotary, never scaled)"},
};
constexpr RecordRegion kNvfp4Fp8RopeRegions[] = {
    {L::nvfp4_ds_mla_fp8rope::kLatentOffset, L::nvfp4_ds_mla_fp8rope::kLatentBytes,
     "512 x e2m1 latent, as nvfp4_ds_mla"},
    {L::nvfp4_ds_mla_fp8rope::kScaleOffset, L::nvfp4_ds_mla_fp8rope::kNumGroups,
     "32 x e4m3 group scale, as nvfp4_ds_mla"},
    {L::nvfp4_ds_mla_fp8rope::kRopeScaleOffset, 4, "fp32 rope scale rs = amax_rope * f32(1/448)"},
    {L::nvfp4_ds_mla_fp8rope::kPadOffset, L::nvfp4_ds_mla_fp8rope::kPadBytes,
     "zero (token-scale mode: fp32 s_t at [292, 296), as the fork's VLLM_NVFP4_MLA_DYNAMIC_SCALE=1)"},
    {L::nvfp4_ds_mla_fp8rope::kRopeOffset, kRopeDim, "64 x e4m3 rope, e4m3_satfinite(v / rs)"},
};

constexpr RecordRegion kNvfp4Int8RopeRegions[] = {
    {L::nvfp4_ds_mla_int8rope::kLatentOffset, L::nvfp4_ds_mla_int8rope::kLatentBytes,
     "512 x e2m1 latent, as nvfp4_ds_mla"},
    {L::nvfp4_ds_mla_int8rope::kScaleOffset, L::nvfp4_ds_mla_int8rope::kNumGroups,
     "32 x e4m3 group scale, as nvfp4_ds_mla"},
    {L::nvfp4_ds_mla_int8rope::kRopeScaleOffset, 4, "fp32 rope scale rs = amax_rope * f32(1/127)"},
    {L::nvfp4_ds_mla_int8rope::kPadOffset, L::nvfp4_ds_mla_int8rope::kPadBytes,
     "zero (token-scale mode: fp32 s_t at [292, 296))"},
    {L::nvfp4_ds_mla_int8rope::kRopeOffset, kRopeDim,
     "64 x int8 rope, rne(v / rs) clamped to [-127, 127]; v = q * rs"},
};

constexpr std::array<FormatInfo, kNumKvFormats> kFormats = {{
    {KvFormat::kBf16, "bf16", L::bf16::kRecordBytes, false,
     "unquantized bf16 latent and rope", kBf16Regions, "auto (with a bf16 model) or bfloat16"},
    {KvFormat::kFp8DsMla, "fp8_ds_mla", L::fp8_ds_mla::kRecordBytes, false,
     "fp8 e4m3 latent with 4 fp32 tile scales, bf16 rope (FlashMLA / vLLM fp8_ds_mla)", kFp8Regions,
     "fp8_ds_mla (vLLM resolves fp8 to it on its sparse FlashMLA backends)"},
    {KvFormat::kNvfp4DsMla, "nvfp4_ds_mla", L::nvfp4_ds_mla::kRecordBytes, true,
     "e2m1 latent with 32 e4m3 group scales and a per-layer outer scale, bf16 rope", kNvfp4Regions,
     "nvfp4_ds_mla (local-inference-lab vLLM fork; scales file in VLLM_NVFP4_MLA_SCALES_FILE)"},
    {KvFormat::kNvfp4DsMlaFp8Rope, "nvfp4_ds_mla_fp8rope", L::nvfp4_ds_mla_fp8rope::kRecordBytes, true,
     "nvfp4_ds_mla latent with e4m3 rope and one fp32 rope scale", kNvfp4Fp8RopeRegions,
     "nvfp4_ds_mla with KV_FP8_ROPE=1 (local-inference-lab vLLM fork)"},
    {KvFormat::kF32, "f32", L::f32::kRecordBytes, false,
     "unquantized f32 latent and rope, for parity checks (CPU only)", kF32Regions,
     "none: vLLM's MLA backends keep 16-bit or quantized caches"},
    {KvFormat::kNvfp4DsMlaInt8Rope, "nvfp4_ds_mla_int8rope", L::nvfp4_ds_mla_int8rope::kRecordBytes, true,
     "nvfp4_ds_mla latent with int8 rope and one fp32 rope scale (mlakv's own)", kNvfp4Int8RopeRegions,
     "none: mlakv's own record (the fork reads only its e4m3-rope 368 B record)"},
}};

constexpr RecordRegion kIndexerRegions[] = {
    {0, L::indexer::kKeyDim, "128 x fp8 e4m3 key (rope dims [0, 64) first, then nope)"},
    {L::indexer::kKeyDim, 4, "fp32 key scale, max(amax, 1e-4) / 448 rounded up to a power of two"},
};
const IndexerRecordInfo kIndexer = {
    "dsa_indexer_key", L::indexer::kRecordBytes,
    "DSA lightning-indexer key cache, one per token per indexer layer; vLLM stores a block's keys first, "
    "then its scales",
    kIndexerRegions};

}  // namespace

const IndexerRecordInfo& indexer_record_info() { return kIndexer; }

static_assert([] {
  for (std::size_t i = 0; i < kFormats.size(); ++i) {
    if (static_cast<std::size_t>(kFormats[i].format) != i) return false;
  }
  return true;
}(), "kFormats is indexed by the KvFormat value");

const FormatInfo& format_info(KvFormat f) { return kFormats[static_cast<std::size_t>(f)]; }
std::span<const FormatInfo> all_formats() { return kFormats; }
std::string_view format_name(KvFormat f) { return format_info(f).name; }

std::optional<KvFormat> parse_format(std::string_view name) {
  for (const FormatInfo& fi : kFormats) {
    if (fi.name == name) return fi.format;
  }
  return std::nullopt;
}

int record_bytes(KvFormat f, int latent_dim, int rope_dim) {
  if (f == KvFormat::kBf16 || f == KvFormat::kF32) {
    // (2 or 4) * (L + R) in int64: L and R come from config.json (up to 2^30 each).
    const int64_t bytes = (f == KvFormat::kBf16 ? 2 : 4) * (int64_t{latent_dim} + rope_dim);
    return latent_dim < 0 || rope_dim < 0 || bytes > INT32_MAX ? -1 : static_cast<int>(bytes);
  }
  if (latent_dim != kLatentDim || rope_dim != kRopeDim) return -1;
  return format_info(f).record_bytes;
}

}  // namespace mlakv
