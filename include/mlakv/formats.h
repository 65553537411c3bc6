// The MLA KV record formats: one record = one token of one layer.
// This header is the single home of every record size and byte offset; CPU codecs,
// the paged cache and the CUDA kernels all read them from here. The prose byte
// tables are in docs/formats.md (keep the two in step; tests/formats_test.cc checks
// that every region tiles its record exactly).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "mlakv/numerics.h"

namespace mlakv {

enum class KvFormat : uint8_t {
  kBf16 = 0,              // "bf16"                 1152 B
  kFp8DsMla = 1,          // "fp8_ds_mla"           656 B, FlashMLA V3.2 byte-compatible
  kNvfp4DsMla = 2,        // "nvfp4_ds_mla"         432 B
  kNvfp4DsMlaFp8Rope = 3, // "nvfp4_ds_mla_fp8rope" 368 B
  kF32 = 4,               // "f32"                  2304 B, unquantized: parity checks (CPU only)
  kNvfp4DsMlaInt8Rope = 5,  // "nvfp4_ds_mla_int8rope" 368 B, mlakv's own: int8 rope in the fp8-rope layout
};
inline constexpr int kNumKvFormats = 6;

// MLA latent geometry the compressed records are defined for (DeepSeek/Kimi/GLM).
inline constexpr int kLatentDim = 512;  // kv_lora_rank L
inline constexpr int kRopeDim = 64;     // qk_rope_head_dim R
inline constexpr int kQkDim = kLatentDim + kRopeDim;  // 576: attention "K" width

namespace layout {

// bf16: [0,1024) 512 bf16 latent, [1024,1152) 64 bf16 rope. (Any geometry: 2*(L+R) B.)
namespace bf16 {
inline constexpr int kLatentOffset = 0;
inline constexpr int kRopeOffset = kLatentOffset + 2 * kLatentDim;  // 1024
inline constexpr int kRecordBytes = kRopeOffset + 2 * kRopeDim;     // 1152
static_assert(kRecordBytes == 1152);
}  // namespace bf16

// f32: [0,2048) 512 f32 latent, [2048,2304) 64 f32 rope: the values as computed, for
// parity checks against an unquantized reference. (Any geometry: 4*(L+R) B.) CPU only:
// the CUDA backend refuses it (kUnimplemented).
namespace f32 {
inline constexpr int kLatentOffset = 0;
inline constexpr int kRopeOffset = kLatentOffset + 4 * kLatentDim;  // 2048
inline constexpr int kRecordBytes = kRopeOffset + 4 * kRopeDim;     // 2304
static_assert(kRecordBytes == 2304);
}  // namespace f32

// fp8_ds_mla (FlashMLA "FP8 with scale"): 512 e4m3 latent, 4 fp32 tile scales, 64 bf16 rope.
namespace fp8_ds_mla {
inline constexpr int kTileDim = 128;                         // dims per scale
inline constexpr int kNumTiles = kLatentDim / kTileDim;      // 4
inline constexpr int kLatentOffset = 0;                      // byte i = dim i
inline constexpr int kScaleOffset = kLatentOffset + kLatentDim;          // 512
inline constexpr int kRopeOffset = kScaleOffset + 4 * kNumTiles;         // 528
inline constexpr int kRecordBytes = kRopeOffset + 2 * kRopeDim;          // 656
inline constexpr float kMinScaleRatio = 1e-4f;  // FlashMLA: s = 2^ceil(log2(max(amax/448, 1e-4)))
static_assert(kRecordBytes == 656);
}  // namespace fp8_ds_mla

// nvfp4_ds_mla: 512 e2m1 latent (two per byte, even dim in the low nibble), 32 e4m3
// group scales (16 dims each), 16 zero bytes, 64 bf16 rope.
namespace nvfp4_ds_mla {
inline constexpr int kGroupDim = 16;
inline constexpr int kNumGroups = kLatentDim / kGroupDim;          // 32
inline constexpr int kLatentOffset = 0;
inline constexpr int kLatentBytes = kLatentDim / 2;                // 256
inline constexpr int kScaleOffset = kLatentOffset + kLatentBytes;  // 256
inline constexpr int kPadOffset = kScaleOffset + kNumGroups;       // 288
inline constexpr int kPadBytes = 16;
inline constexpr int kRopeOffset = kPadOffset + kPadBytes;         // 304
inline constexpr int kRecordBytes = kRopeOffset + 2 * kRopeDim;    // 432
// Per-token scale mode (nvfp4_token_scale below): fp32 s_t inside the pad.
inline constexpr int kTokenScaleOffset = 292;
static_assert(kRecordBytes == 432);
static_assert(kTokenScaleOffset >= kPadOffset && kTokenScaleOffset + 4 <= kPadOffset + kPadBytes);
static_assert(kGroupDim / 2 == 8, "group g occupies latent bytes [8g, 8g+8)");
}  // namespace nvfp4_ds_mla

// nvfp4_ds_mla_fp8rope: bytes [0,288) as nvfp4_ds_mla, fp32 rope scale, 12 zero
// bytes, 64 e4m3 rope.
namespace nvfp4_ds_mla_fp8rope {
inline constexpr int kGroupDim = nvfp4_ds_mla::kGroupDim;
inline constexpr int kNumGroups = nvfp4_ds_mla::kNumGroups;
inline constexpr int kLatentOffset = nvfp4_ds_mla::kLatentOffset;
inline constexpr int kLatentBytes = nvfp4_ds_mla::kLatentBytes;
inline constexpr int kScaleOffset = nvfp4_ds_mla::kScaleOffset;   // 256
inline constexpr int kRopeScaleOffset = nvfp4_ds_mla::kPadOffset;  // 288
inline constexpr int kPadOffset = kRopeScaleOffset + 4;            // 292
inline constexpr int kPadBytes = 12;
inline constexpr int kRopeOffset = kPadOffset + kPadBytes;         // 304
inline constexpr int kRecordBytes = kRopeOffset + kRopeDim;        // 368
inline constexpr float kRopeScaleFactor = 1.0f / kE4m3Max;         // rs = amax * f32(1/448)
inline constexpr int kTokenScaleOffset = kPadOffset;               // 292: s_t in token-scale mode
static_assert(kRecordBytes == 368);
}  // namespace nvfp4_ds_mla_fp8rope

// nvfp4_ds_mla_int8rope (mlakv's own, docs/formats.md): the fp8-rope record's bytes with
// the rope as int8: [0,288) as nvfp4_ds_mla, fp32 rope scale rs = amax_rope * f32(1/127),
// 12 zero bytes (or the token scale), 64 x int8 rope q = rne(v / rs) clamped to [-127, 127].
namespace nvfp4_ds_mla_int8rope {
// The same byte layout as nvfp4_ds_mla_fp8rope (its offsets, sizes and s_t slot); only the
// rope's codes and their scale factor differ (declared here, so they win qualified lookup).
using namespace nvfp4_ds_mla_fp8rope;
inline constexpr int kInt8Max = 127;  // codes -127..127 (-128 never written)
// rs = amax * f32(1/127): the double 1/127 rounded once to float, as the fork spells 1/448.
inline constexpr float kRopeScaleFactor = static_cast<float>(1.0 / 127.0);
static_assert(kRecordBytes == 368 && kRopeOffset == 304 && kRopeScaleOffset == 288);
}  // namespace nvfp4_ds_mla_int8rope

// The per-token scale mode of the nvfp4 formats (the local-inference-lab fork's
// VLLM_NVFP4_MLA_DYNAMIC_SCALE=1, vLLM PR #189 / b12x PR #86; docs/formats.md): the
// writer stores s_t = token_amax * f32(1/2688) (token_amax = max |latent| over the 512
// dims) as fp32 at [292, 296) and encodes latent / s_t with the ordinary nvfp4 recipe;
// the reader multiplies by s_t from the record instead of the layer's s_l (the two do
// not combine: the mode replaces the outer scale). An all-zero latent stores s_t = 0 and
// zero codes. The fork ships it on the 368 B record; mlakv also allows it on
// nvfp4_ds_mla (432 B) and nvfp4_ds_mla_int8rope, at the same offset.
namespace nvfp4_token_scale {
inline constexpr int kOffset = 292;
inline constexpr float kFactor = static_cast<float>(1.0 / 2688.0);  // f32(1/(6*448)), the fork's constant
static_assert(kOffset == nvfp4_ds_mla::kTokenScaleOffset && kOffset == nvfp4_ds_mla_fp8rope::kTokenScaleOffset &&
              kOffset == nvfp4_ds_mla_int8rope::kTokenScaleOffset);
static_assert(kOffset % 4 == 0);
}  // namespace nvfp4_token_scale

// DSA indexer key cache (DeepSeek-V3.2, GLM-5): 128 fp8 + one fp32 scale per token
// per indexer layer; vLLM stores a block's keys first, then its scales.
namespace indexer {
inline constexpr int kKeyDim = 128;
inline constexpr int kRecordBytes = kKeyDim + 4;  // 132
static_assert(kRecordBytes == 132);
}  // namespace indexer

// NVFP4 outer scale: s_l = max_abs_l / (6 * 448).
inline constexpr double kOuterScaleDenominator = 2688.0;
static_assert(kOuterScaleDenominator == 6.0 * 448.0);

// mlakv record file (`mlakv codec encode`, docs/formats.md "Record files"): a 64-byte
// little-endian header, then `tokens` records of `record_bytes` each.
namespace record_file {
inline constexpr char kMagic[8] = {'M', 'L', 'A', 'K', 'V', 'R', 'E', 'C'};
inline constexpr uint32_t kVersion = 1;
inline constexpr int kMagicOffset = 0;         // 8 B "MLAKVREC"
inline constexpr int kVersionOffset = 8;       // u32 version (1)
inline constexpr int kHeaderBytesOffset = 12;  // u32 header size = data offset (64)
inline constexpr int kFormatOffset = 16;       // u32 KvFormat id
inline constexpr int kRecordBytesOffset = 20;  // u32 record size
inline constexpr int kOuterScaleOffset = 24;   // f32 outer scale s_l (1.0 without one)
inline constexpr int kFp8ScalesOffset = 28;    // u32 fp8 tile-scale mode (0 pow2, 1 exact)
inline constexpr int kTokensOffset = 32;       // u64 token count
inline constexpr int kLatentDimOffset = 40;    // u32 latent dim (512)
inline constexpr int kRopeDimOffset = 44;      // u32 rope dim (64)
inline constexpr int kFlagsOffset = 48;        // u32 flags: bit 0 = nvfp4 token-scale mode,
                                               // bit 1 = nvfp4 scale search (written so; readers ignore it)
inline constexpr uint32_t kFlagTokenScale = 1u;
inline constexpr uint32_t kFlagNvfp4ScaleSearch = 2u;
inline constexpr int kPadOffset = 52;          // 12 zero bytes
inline constexpr int kHeaderBytes = 64;
}  // namespace record_file

}  // namespace layout

// ---- the format switch -----------------------------------------------------------------
// The one switch over KvFormat outside src/cuda (whose common/dispatch_format.h is the
// same thing for the kernels): visit_format calls fn(FormatTag<F>{}) with the
// compile-time F equal to the run-time f. Code per format then reads
// `if constexpr (decltype(tag)::value == KvFormat::k...)` or overloads on the tag, and a
// kernel can be instantiated per format by hoisting the visit out of its loop. Host and
// device. A value outside the enum (callers validate formats first, so: memory
// corruption) calls nothing; the returning form then gives `fallback`.
//   visit_format(f, [&](auto tag) { encode<decltype(tag)::value>(...); });
//   return visit_format(f, Status::Ok(), [&](auto tag) -> Status { ... });
template <KvFormat F>
struct FormatTag {
  static constexpr KvFormat value = F;
};

static_assert(kNumKvFormats == 6, "visit_format: add a case for the new KvFormat");

template <class Fn>
MLAKV_HD constexpr void visit_format(KvFormat f, Fn&& fn) {
  switch (f) {
    case KvFormat::kBf16: fn(FormatTag<KvFormat::kBf16>{}); return;
    case KvFormat::kFp8DsMla: fn(FormatTag<KvFormat::kFp8DsMla>{}); return;
    case KvFormat::kNvfp4DsMla: fn(FormatTag<KvFormat::kNvfp4DsMla>{}); return;
    case KvFormat::kNvfp4DsMlaFp8Rope: fn(FormatTag<KvFormat::kNvfp4DsMlaFp8Rope>{}); return;
    case KvFormat::kF32: fn(FormatTag<KvFormat::kF32>{}); return;
    case KvFormat::kNvfp4DsMlaInt8Rope: fn(FormatTag<KvFormat::kNvfp4DsMlaInt8Rope>{}); return;
  }
}

template <class R, class Fn>
MLAKV_HD constexpr R visit_format(KvFormat f, R fallback, Fn&& fn) {
  switch (f) {
    case KvFormat::kBf16: return fn(FormatTag<KvFormat::kBf16>{});
    case KvFormat::kFp8DsMla: return fn(FormatTag<KvFormat::kFp8DsMla>{});
    case KvFormat::kNvfp4DsMla: return fn(FormatTag<KvFormat::kNvfp4DsMla>{});
    case KvFormat::kNvfp4DsMlaFp8Rope: return fn(FormatTag<KvFormat::kNvfp4DsMlaFp8Rope>{});
    case KvFormat::kF32: return fn(FormatTag<KvFormat::kF32>{});
    case KvFormat::kNvfp4DsMlaInt8Rope: return fn(FormatTag<KvFormat::kNvfp4DsMlaInt8Rope>{});
  }
  return fallback;
}

// The three nvfp4 records (e2m1 latent + e4m3 group scales in bytes [0, 288)): the formats
// that take an outer scale s_l or the per-token scale mode.
MLAKV_HD constexpr bool is_nvfp4_format(KvFormat f) {
  return f == KvFormat::kNvfp4DsMla || f == KvFormat::kNvfp4DsMlaFp8Rope || f == KvFormat::kNvfp4DsMlaInt8Rope;
}

// One contiguous byte region of a record, for docs, `mlakv formats` and tests.
struct RecordRegion {
  int offset;
  int bytes;
  std::string_view what;  // "512 x fp8 e4m3fn latent, byte i = dim i"
};

struct FormatInfo {
  KvFormat format;
  std::string_view name;         // CLI / JSON / scale-file name
  int record_bytes;              // at L=512, R=64
  bool has_outer_scale;          // the nvfp4 formats take a per-layer s_l (or the per-token scale mode)
  std::string_view summary;
  std::span<const RecordRegion> regions;  // tiles [0, record_bytes) in order
  // How vLLM (or the local-inference-lab fork) is told to use this record:
  // `--kv-cache-dtype <this>` (docs/reference.md section 3).
  std::string_view vllm_kv_cache_dtype;
};

// The DSA indexer key record (DeepSeek-V3.2, GLM-5): not a KvFormat, it sits beside the
// MLA record on each indexer layer (`mlakv plan` counts it).
struct IndexerRecordInfo {
  std::string_view name;
  int record_bytes;
  std::string_view summary;
  std::span<const RecordRegion> regions;
};
const IndexerRecordInfo& indexer_record_info();

const FormatInfo& format_info(KvFormat f);
std::span<const FormatInfo> all_formats();
std::optional<KvFormat> parse_format(std::string_view name);
std::string_view format_name(KvFormat f);
// Record size for a geometry; only bf16 and f32 support latent/rope dims other than 512/64
// (returns -1 for the others, and for a bf16/f32 geometry whose size overflows int or has
// a negative dim; see codec.h for the Status-returning check).
int record_bytes(KvFormat f, int latent_dim = kLatentDim, int rope_dim = kRopeDim);

}  // namespace mlakv
