// Encode / decode MLA KV records (formats.h, docs/formats.md) for n tokens at once.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mlakv/formats.h"
#include "mlakv/status.h"
#include "mlakv/tensor.h"

namespace mlakv {

// fp8_ds_mla tile scales: power-of-two (FlashMLA's writer, the default) or exact
// amax/448 (vLLM's writer). Readers accept any positive finite scale.
enum class Fp8ScaleMode : uint8_t { kPow2 = 0, kExact = 1 };

// nvfp4 group scale codes: an encoder's choice only (readers decode whatever scale byte
// they find, so records of either mode are read the same way, by every reader):
//   kRn      e4m3_rn(amax_g / 6), the fork's encoder (the default);
//   kSearch  per 16-dim group, the code among RN - 1, RN and RN + 1 whose reconstruction
//            sf * e2m1(y / sf) has the least squared error over the group's 16 values
//            (codec::nvfp4_search_scale_code in src/format/record_codec.h defines the error
//            exactly and the ties; docs/formats.md "nvfp4 scale search", docs/quality.md).
// kSearch applies to the nvfp4 formats with a static outer scale only: the per-token scale
// mode is the fork's encoder and stays RN (check_nvfp4_scales rejects the combination).
enum class Nvfp4ScaleMode : uint8_t { kRn = 0, kSearch = 1 };
// "rn", "search"
std::string_view nvfp4_scale_mode_name(Nvfp4ScaleMode m);
// kInvalidArgument naming `what` for anything but "rn" / "search".
StatusOr<Nvfp4ScaleMode> parse_nvfp4_scale_mode(std::string_view text, std::string_view what = "nvfp4_scales");

struct CodecParams {
  KvFormat format = KvFormat::kBf16;
  // The layer's NVFP4 outer scale s_l (nvfp4 formats only; must stay 1.0 otherwise):
  // the writer encodes latent / s_l, the reader multiplies s_l back. Never applied to rope.
  float outer_scale = 1.0f;
  Fp8ScaleMode fp8_scales = Fp8ScaleMode::kPow2;
  int latent_dim = kLatentDim;  // only bf16 accepts other geometries
  int rope_dim = kRopeDim;
  // The per-token scale mode (nvfp4 formats only, with outer_scale 1.0: it replaces s_l;
  // formats.h nvfp4_token_scale, docs/formats.md): the writer stores s_t = token_amax *
  // f32(1/2688) at [292, 296) and encodes latent / s_t; the reader multiplies by it.
  bool token_scale = false;
  // nvfp4 formats only, outside the per-token scale mode: how group scale codes are chosen.
  Nvfp4ScaleMode nvfp4_scales = Nvfp4ScaleMode::kRn;
};

// Validates the format/geometry/outer-scale/token-scale/nvfp4-scale combination; returns the record size.
StatusOr<int> codec_record_bytes(const CodecParams& p);
// The token-scale checks alone (the cache views use them too): OK when !token_scale, else
// the format must be an nvfp4 one and outer_scale 1.0. `name` prefixes the message.
Status check_token_scale(KvFormat format, bool token_scale, float outer_scale, std::string_view name);
// The nvfp4 scale-mode checks alone (the cache views use them too): OK for kRn, else the
// format must be an nvfp4 one and token_scale off. `name` prefixes the message.
Status check_nvfp4_scales(KvFormat format, Nvfp4ScaleMode mode, bool token_scale, std::string_view name);

// Encodes n tokens.
//   latent  [n, latent_dim] f32 or bf16, CPU, rows may be strided
//   rope    [n, rope_dim]   f32 or bf16 (same dtype as latent)
//   records [n, record_bytes] u8, CPU
// Fails, writing nothing, on a shape/dtype mismatch or a NaN/Inf input (the message
// names the token and dimension).
Status encode_records(const CodecParams& p, const TensorView& latent, const TensorView& rope,
                      const TensorView& records);

// Decodes n records into float32 latent [n, latent_dim] and rope [n, rope_dim].
// Fails (kDataLoss, names the token) on a record whose fp32 scale is not finite and
// positive (fp8 tile scales), not finite and >= 0 (fp8/int8 rope scale, token scale), whose e4m3 bytes
// hold NaN, or that decodes to a non-finite value (bf16 NaN/Inf, or an outer scale that
// overflows): records of another format or scale read as garbage, not silently.
// Outputs are unspecified on failure.
Status decode_records(const CodecParams& p, const TensorView& records, const TensorView& latent,
                      const TensorView& rope);

// ---- record files (formats.h layout::record_file, docs/formats.md "Record files") ----------
struct RecordFileInfo {
  CodecParams params;       // format, outer scale, fp8 scale mode and geometry the records were written with
  int64_t tokens = 0;
  int64_t data_offset = 0;  // where the records start
};
// The 64-byte header for `tokens` records written with `p` (validated as codec_record_bytes).
StatusOr<std::vector<uint8_t>> record_file_header(const CodecParams& p, int64_t tokens);
// True when `file` starts with the record-file magic.
bool is_record_file(std::span<const uint8_t> file);
// Parses and checks the header against the file: magic, version, known format, a record
// size that matches the format, a valid outer scale, and exactly `tokens` records after
// the header. Errors are kDataLoss naming `source` and the field.
StatusOr<RecordFileInfo> parse_record_file(std::span<const uint8_t> file, std::string_view source);

// ---- NVFP4 without a calibrated outer scale ------------------------------------------------
// nvfp4 group scales are e4m3 sf = amax_g(latent / s_l) / 6. On a layer whose latents are
// small (GLM-5.2's shallow layers: max |kv_c_normed| ~0.02) at s_l = 1.0 they fall below
// e4m3's smallest normal 2^-6, where they keep only 1-3 significant bits (docs/calibration.md).
struct Nvfp4ScaleCheck {
  int64_t tokens = 0;
  int64_t groups = 0;            // non-zero 16-dim groups seen
  int64_t subnormal_groups = 0;  // of those, amax_g / (6 s_l) < 2^-6
  double max_abs = 0;            // max |latent| seen, before s_l

  void add(const Nvfp4ScaleCheck& o);
  // More than half of the non-zero group scales are subnormal.
  bool degraded() const { return groups > 0 && 2 * subnormal_groups > groups; }
  // The calibrated s_l for what was seen: max_abs / 2688 (docs/calibration.md).
  double suggested_outer_scale() const;
};

// Counts latent [n, 512] (f32 or bf16, CPU) at outer scale s_l.
StatusOr<Nvfp4ScaleCheck> nvfp4_scale_check(const TensorView& latent, float outer_scale);
// "nvfp4_ds_mla at outer scale 1: 512 of 512 group scales (4 tokens) fell into e4m3
// subnormals (max |latent| 0.02); an outer scale s_l = 7.44e-06 (max_abs / 2688; `mlakv
// calibrate`, docs/calibration.md) fixes it". Empty when !c.degraded().
std::string nvfp4_scale_warning(KvFormat format, const Nvfp4ScaleCheck& c, float outer_scale);

}  // namespace mlakv
