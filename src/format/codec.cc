#include "mlakv/codec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "format/record_codec.h"

namespace mlakv {
namespace {

// Reads row `t` of a [n, d] f32/bf16 tensor into dst as float32.
void load_row(const TensorView& x, int64_t t, int d, float* dst) {
  if (x.dtype == DType::kF32) {
    const float* src = x.ptr<const float>() + t * x.stride(0);
    for (int i = 0; i < d; ++i) dst[i] = src[i];
  } else {
    const uint16_t* src = x.ptr<const uint16_t>() + t * x.stride(0);
    for (int i = 0; i < d; ++i) dst[i] = bf16_to_f32(src[i]);
  }
}

Status check_finite_rows(const TensorView& x, std::string_view name, int d) {
  std::vector<float> row(static_cast<std::size_t>(d));
  for (int64_t t = 0; t < x.size(0); ++t) {
    load_row(x, t, d, row.data());
    for (int i = 0; i < d; ++i) {
      if (!std::isfinite(row[static_cast<std::size_t>(i)])) {
        return invalid_argument(fmt::format("{}: token {} dimension {} is {} (inputs must be finite)", name, t,
                                            i, row[static_cast<std::size_t>(i)]));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status check_token_scale(KvFormat format, bool token_scale, float outer_scale, std::string_view name) {
  if (!token_scale) return Status::Ok();
  if (!is_nvfp4_format(format)) {
    return invalid_argument(fmt::format(
        "{}: token_scale is a mode of the nvfp4 formats (nvfp4_ds_mla, nvfp4_ds_mla_fp8rope, nvfp4_ds_mla_int8rope), "
        "not of {}",
        name, format_name(format)));
  }
  if (outer_scale != 1.0f) {
    return invalid_argument(fmt::format(
        "{}: token_scale replaces the outer scale (as the fork refuses VLLM_NVFP4_MLA_DYNAMIC_SCALE with a scales "
        "file); got outer_scale {}, expected 1",
        name, outer_scale));
  }
  return Status::Ok();
}

std::string_view nvfp4_scale_mode_name(Nvfp4ScaleMode m) {
  switch (m) {
    case Nvfp4ScaleMode::kRn: return "rn";
    case Nvfp4ScaleMode::kSearch: return "search";
  }
  return "?";
}

StatusOr<Nvfp4ScaleMode> parse_nvfp4_scale_mode(std::string_view text, std::string_view what) {
  if (text == "rn") return Nvfp4ScaleMode::kRn;
  if (text == "search") return Nvfp4ScaleMode::kSearch;
  return invalid_argument(fmt::format("{}: expected \"rn\" or \"search\", got \"{}\"", what, text));
}

Status check_nvfp4_scales(KvFormat format, Nvfp4ScaleMode mode, bool token_scale, std::string_view name) {
  if (mode == Nvfp4ScaleMode::kRn) return Status::Ok();
  if (mode != Nvfp4ScaleMode::kSearch) {
    return invalid_argument(fmt::format("{}: unknown nvfp4 scale mode {}", name, static_cast<int>(mode)));
  }
  if (!is_nvfp4_format(format)) {
    return invalid_argument(fmt::format(
        "{}: nvfp4_scales search is an encoder option of the nvfp4 formats (nvfp4_ds_mla, nvfp4_ds_mla_fp8rope, "
        "nvfp4_ds_mla_int8rope), not of {}",
        name, format_name(format)));
  }
  if (token_scale) {
    return invalid_argument(fmt::format(
        "{}: nvfp4_scales search does not apply to the per-token scale mode (that mode is the fork's encoder, its "
        "group scales stay round-to-nearest); use a static outer scale, or nvfp4_scales rn",
        name));
  }
  return Status::Ok();
}

StatusOr<int> codec_record_bytes(const CodecParams& p) {
  if (static_cast<int>(p.format) >= kNumKvFormats) {
    return invalid_argument(fmt::format("format: unknown format id {}", static_cast<int>(p.format)));
  }
  if (p.latent_dim <= 0 || p.rope_dim < 0) {
    return invalid_argument(fmt::format("geometry: latent_dim {} and rope_dim {} must be positive",
                                        p.latent_dim, p.rope_dim));
  }
  const int bytes = record_bytes(p.format, p.latent_dim, p.rope_dim);
  if (bytes < 0) {
    return invalid_argument(fmt::format(
        "format {} is defined only for latent_dim {} + rope_dim {}, got {} + {} (use bf16 for other geometries)",
        format_name(p.format), kLatentDim, kRopeDim, p.latent_dim, p.rope_dim));
  }
  if (!std::isfinite(p.outer_scale) || !(p.outer_scale > 0.0f)) {
    return invalid_argument(fmt::format("outer_scale must be finite and > 0, got {}", p.outer_scale));
  }
  if (!format_info(p.format).has_outer_scale && p.outer_scale != 1.0f) {
    return invalid_argument(fmt::format("outer_scale {} given for format {}, which has no outer scale",
                                        p.outer_scale, format_name(p.format)));
  }
  MLAKV_RETURN_IF_ERROR(check_token_scale(p.format, p.token_scale, p.outer_scale, "codec"));
  MLAKV_RETURN_IF_ERROR(check_nvfp4_scales(p.format, p.nvfp4_scales, p.token_scale, "codec"));
  return bytes;
}

Status encode_records(const CodecParams& p, const TensorView& latent, const TensorView& rope,
                      const TensorView& records) {
  MLAKV_ASSIGN_OR_RETURN(const int rb, codec_record_bytes(p));
  const int64_t n = latent.ndim == 2 ? latent.size(0) : -1;
  MLAKV_RETURN_IF_ERROR(check_tensor(latent, "latent", {{DType::kF32, DType::kBF16}, {-1, p.latent_dim}},
                                     Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_tensor(rope, "rope", {{latent.dtype}, {n, p.rope_dim}}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_tensor(records, "records", {{DType::kU8}, {n, rb}}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_finite_rows(latent, "latent", p.latent_dim));
  MLAKV_RETURN_IF_ERROR(check_finite_rows(rope, "rope", p.rope_dim));

  std::vector<float> lat(static_cast<std::size_t>(p.latent_dim)), rop(static_cast<std::size_t>(p.rope_dim));
  for (int64_t t = 0; t < n; ++t) {
    load_row(latent, t, p.latent_dim, lat.data());
    load_row(rope, t, p.rope_dim, rop.data());
    uint8_t* rec = records.ptr<uint8_t>() + t * records.stride(0);
    if (p.format == KvFormat::kBf16) {
      codec::encode_bf16_record(lat.data(), p.latent_dim, rop.data(), p.rope_dim, rec);
    } else if (p.format == KvFormat::kF32) {
      codec::encode_f32_record(lat.data(), p.latent_dim, rop.data(), p.rope_dim, rec);
    } else {
      codec::encode_record(p.format, lat.data(), rop.data(), p.outer_scale, p.fp8_scales, rec, p.token_scale,
                           p.nvfp4_scales);
    }
  }
  return Status::Ok();
}

namespace {

Status validate_record(KvFormat f, const uint8_t* rec, int64_t t, bool token_scale) {
  auto bad_e4m3 = [&](int begin, int count, std::string_view what) -> Status {
    for (int i = 0; i < count; ++i) {
      if ((rec[begin + i] & 0x7Fu) == kE4m3NaN) {
        return data_loss(fmt::format("record {}: {} byte {} (offset {}) is an e4m3 NaN", t, what, i, begin + i));
      }
    }
    return Status::Ok();
  };
  return visit_format(f, Status::Ok(), [&](auto tag) -> Status {
    constexpr KvFormat F = decltype(tag)::value;
    if constexpr (F == KvFormat::kBf16 || F == KvFormat::kF32) {
      return Status::Ok();  // non-finite values are caught after decoding
    } else if constexpr (F == KvFormat::kFp8DsMla) {
      namespace L8 = layout::fp8_ds_mla;
      for (int k = 0; k < L8::kNumTiles; ++k) {
        const float s = codec::load_f32(rec + L8::kScaleOffset + 4 * k);
        if (!std::isfinite(s) || !(s > 0.0f)) {
          return data_loss(fmt::format("record {}: tile {} scale is {} (must be finite and > 0)", t, k, s));
        }
      }
      return bad_e4m3(L8::kLatentOffset, kLatentDim, "latent");
    } else {
      static_assert(is_nvfp4_format(F));
      namespace N = layout::nvfp4_ds_mla;
      MLAKV_RETURN_IF_ERROR(bad_e4m3(N::kScaleOffset, N::kNumGroups, "group scale"));
      if (token_scale) {
        const float st = codec::load_f32(rec + layout::nvfp4_token_scale::kOffset);
        if (!std::isfinite(st) || st < 0.0f) {
          return data_loss(fmt::format("record {}: token scale s_t is {} (must be finite and >= 0)", t, st));
        }
      }
      auto rope_scale = [&](int offset) -> Status {
        const float rs = codec::load_f32(rec + offset);
        if (!std::isfinite(rs) || rs < 0.0f) {
          return data_loss(fmt::format("record {}: rope scale is {} (must be finite and >= 0)", t, rs));
        }
        return Status::Ok();
      };
      if constexpr (F == KvFormat::kNvfp4DsMlaFp8Rope) {
        namespace R = layout::nvfp4_ds_mla_fp8rope;
        MLAKV_RETURN_IF_ERROR(rope_scale(R::kRopeScaleOffset));
        MLAKV_RETURN_IF_ERROR(bad_e4m3(R::kRopeOffset, kRopeDim, "rope"));
      } else if constexpr (F == KvFormat::kNvfp4DsMlaInt8Rope) {
        MLAKV_RETURN_IF_ERROR(rope_scale(layout::nvfp4_ds_mla_int8rope::kRopeScaleOffset));
        // every int8 byte decodes (-128 is never written but reads as -128 * rs)
      } else {
        static_assert(F == KvFormat::kNvfp4DsMla);
      }
      return Status::Ok();
    }
  });
}

}  // namespace

Status decode_records(const CodecParams& p, const TensorView& records, const TensorView& latent,
                      const TensorView& rope) {
  MLAKV_ASSIGN_OR_RETURN(const int rb, codec_record_bytes(p));
  const int64_t n = records.ndim == 2 ? records.size(0) : -1;
  MLAKV_RETURN_IF_ERROR(check_tensor(records, "records", {{DType::kU8}, {-1, rb}}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_tensor(latent, "latent", {{DType::kF32}, {n, p.latent_dim}}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_tensor(rope, "rope", {{DType::kF32}, {n, p.rope_dim}}, Device::cpu()));
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* rec = records.ptr<const uint8_t>() + t * records.stride(0);
    MLAKV_RETURN_IF_ERROR(validate_record(p.format, rec, t, p.token_scale));
    float* lat = latent.ptr<float>() + t * latent.stride(0);
    float* rop = rope.ptr<float>() + t * rope.stride(0);
    if (p.format == KvFormat::kBf16) {
      codec::decode_bf16_record(rec, p.latent_dim, p.rope_dim, lat, rop);
    } else if (p.format == KvFormat::kF32) {
      codec::decode_f32_record(rec, p.latent_dim, p.rope_dim, lat, rop);
    } else {
      codec::decode_record(p.format, rec, p.outer_scale, lat, rop, p.token_scale);
    }
    for (int d = 0; d < p.latent_dim + p.rope_dim; ++d) {
      const float v = d < p.latent_dim ? lat[d] : rop[d - p.latent_dim];
      if (!std::isfinite(v)) {
        return data_loss(fmt::format(
            "record {}: {} dimension {} decodes to {} (records of another format, or a wrong outer scale?)", t,
            d < p.latent_dim ? "latent" : "rope", d < p.latent_dim ? d : d - p.latent_dim, v));
      }
    }
  }
  return Status::Ok();
}

void Nvfp4ScaleCheck::add(const Nvfp4ScaleCheck& o) {
  tokens += o.tokens;
  groups += o.groups;
  subnormal_groups += o.subnormal_groups;
  max_abs = std::max(max_abs, o.max_abs);
}

double Nvfp4ScaleCheck::suggested_outer_scale() const { return max_abs / layout::kOuterScaleDenominator; }

StatusOr<Nvfp4ScaleCheck> nvfp4_scale_check(const TensorView& latent, float outer_scale) {
  MLAKV_RETURN_IF_ERROR(check_tensor(latent, "latent", {{DType::kF32, DType::kBF16}, {-1, kLatentDim}},
                                     Device::cpu()));
  if (!std::isfinite(outer_scale) || !(outer_scale > 0.0f)) {
    return invalid_argument(fmt::format("outer_scale must be finite and > 0, got {}", outer_scale));
  }
  namespace N = layout::nvfp4_ds_mla;
  constexpr double kMinNormal = 0.015625;  // e4m3: 2^-6
  Nvfp4ScaleCheck c;
  std::vector<float> row(kLatentDim);
  for (int64_t t = 0; t < latent.size(0); ++t) {
    load_row(latent, t, kLatentDim, row.data());
    for (int g = 0; g < N::kNumGroups; ++g) {
      double amax = 0;
      for (int i = 0; i < N::kGroupDim; ++i) amax = std::max(amax, std::fabs(static_cast<double>(row[static_cast<std::size_t>(g * N::kGroupDim + i)])));
      c.max_abs = std::max(c.max_abs, amax);
      if (amax == 0) continue;
      ++c.groups;
      if (amax / outer_scale / 6.0 < kMinNormal) ++c.subnormal_groups;
    }
    ++c.tokens;
  }
  return c;
}

std::string nvfp4_scale_warning(KvFormat format, const Nvfp4ScaleCheck& c, float outer_scale) {
  if (!c.degraded()) return {};
  return fmt::format(
      "{} at outer scale {}: {} of {} group scales ({} tokens) fell into e4m3 subnormals (max |latent| {:.4g}); "
      "an outer scale s_l = {:.6g} (max_abs / 2688; `mlakv calibrate`, docs/calibration.md) fixes it",
      format_name(format), outer_scale, c.subnormal_groups, c.groups, c.tokens, c.max_abs,
      c.suggested_outer_scale());
}

}  // namespace mlakv

namespace mlakv {
namespace {

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

StatusOr<std::vector<uint8_t>> record_file_header(const CodecParams& p, int64_t tokens) {
  namespace R = layout::record_file;
  MLAKV_ASSIGN_OR_RETURN(const int rb, codec_record_bytes(p));
  if (tokens < 0) return invalid_argument(fmt::format("record file: tokens must be >= 0, got {}", tokens));
  std::vector<uint8_t> h(R::kHeaderBytes, 0);
  std::memcpy(h.data() + R::kMagicOffset, R::kMagic, sizeof(R::kMagic));
  put_u32(h.data() + R::kVersionOffset, R::kVersion);
  put_u32(h.data() + R::kHeaderBytesOffset, R::kHeaderBytes);
  put_u32(h.data() + R::kFormatOffset, static_cast<uint32_t>(p.format));
  put_u32(h.data() + R::kRecordBytesOffset, static_cast<uint32_t>(rb));
  put_u32(h.data() + R::kOuterScaleOffset, f32_bits(p.outer_scale));
  put_u32(h.data() + R::kFp8ScalesOffset, static_cast<uint32_t>(p.fp8_scales));
  put_u64(h.data() + R::kTokensOffset, static_cast<uint64_t>(tokens));
  put_u32(h.data() + R::kLatentDimOffset, static_cast<uint32_t>(p.latent_dim));
  put_u32(h.data() + R::kRopeDimOffset, static_cast<uint32_t>(p.rope_dim));
  put_u32(h.data() + R::kFlagsOffset, (p.token_scale ? R::kFlagTokenScale : 0u) |
                                          (p.nvfp4_scales == Nvfp4ScaleMode::kSearch ? R::kFlagNvfp4ScaleSearch : 0u));
  return h;
}

bool is_record_file(std::span<const uint8_t> file) {
  namespace R = layout::record_file;
  return file.size() >= sizeof(R::kMagic) && std::memcmp(file.data(), R::kMagic, sizeof(R::kMagic)) == 0;
}

StatusOr<RecordFileInfo> parse_record_file(std::span<const uint8_t> file, std::string_view source) {
  namespace R = layout::record_file;
  if (!is_record_file(file)) return data_loss(fmt::format("{}: not an mlakv record file (no MLAKVREC magic)", source));
  if (file.size() < static_cast<std::size_t>(R::kHeaderBytes)) {
    return data_loss(fmt::format("{}: {} B is shorter than the {} B record-file header", source, file.size(),
                                 R::kHeaderBytes));
  }
  const uint8_t* h = file.data();
  const uint32_t version = get_u32(h + R::kVersionOffset);
  if (version != R::kVersion) {
    return data_loss(fmt::format("{}: record-file version {} (this mlakv reads version {})", source, version,
                                 R::kVersion));
  }
  const uint32_t header = get_u32(h + R::kHeaderBytesOffset);
  if (header != static_cast<uint32_t>(R::kHeaderBytes)) {
    return data_loss(fmt::format("{}: header size {} (version 1 has {})", source, header, R::kHeaderBytes));
  }
  const uint32_t fid = get_u32(h + R::kFormatOffset);
  if (fid >= static_cast<uint32_t>(kNumKvFormats)) {
    return data_loss(fmt::format("{}: header field 'format' is {}, not a known format id", source, fid));
  }
  RecordFileInfo info;
  info.params.format = static_cast<KvFormat>(fid);
  info.params.outer_scale = f32_from_bits(get_u32(h + R::kOuterScaleOffset));
  const uint32_t mode = get_u32(h + R::kFp8ScalesOffset);
  if (mode > 1) return data_loss(fmt::format("{}: header field 'fp8_scales' is {} (0 or 1)", source, mode));
  info.params.fp8_scales = static_cast<Fp8ScaleMode>(mode);
  info.params.latent_dim = static_cast<int>(get_u32(h + R::kLatentDimOffset));
  info.params.rope_dim = static_cast<int>(get_u32(h + R::kRopeDimOffset));
  const uint32_t flags = get_u32(h + R::kFlagsOffset);
  if ((flags & ~(R::kFlagTokenScale | R::kFlagNvfp4ScaleSearch)) != 0) {
    return data_loss(fmt::format(
        "{}: header field 'flags' is {:#x} (known: bit 0, token-scale mode; bit 1, nvfp4 scale search)", source, flags));
  }
  info.params.token_scale = (flags & R::kFlagTokenScale) != 0;
  info.params.nvfp4_scales = (flags & R::kFlagNvfp4ScaleSearch) != 0 ? Nvfp4ScaleMode::kSearch : Nvfp4ScaleMode::kRn;
  StatusOr<int> rb = codec_record_bytes(info.params);
  if (!rb.ok()) return data_loss(fmt::format("{}: header: {}", source, rb.status().message()));
  const uint32_t stored_rb = get_u32(h + R::kRecordBytesOffset);
  if (stored_rb != static_cast<uint32_t>(*rb)) {
    return data_loss(fmt::format("{}: header says {} B records, but {} records are {} B", source, stored_rb,
                                 format_name(info.params.format), *rb));
  }
  const uint64_t tokens = get_u64(h + R::kTokensOffset);
  const uint64_t body = file.size() - static_cast<std::size_t>(R::kHeaderBytes);
  if (tokens > body / static_cast<uint64_t>(*rb) || tokens * static_cast<uint64_t>(*rb) != body) {
    return data_loss(fmt::format("{}: header says {} tokens of {} B, but {} B of records follow it", source, tokens,
                                 *rb, body));
  }
  info.tokens = static_cast<int64_t>(tokens);
  info.data_offset = R::kHeaderBytes;
  return info;
}

}  // namespace mlakv
