#include "mlakv/codec.h"

#include <fmt/format.h>

#include <cmath>
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
    } else {
      codec::encode_record(p.format, lat.data(), rop.data(), p.outer_scale, p.fp8_scales, rec);
    }
  }
  return Status::Ok();
}

namespace {

Status validate_record(KvFormat f, const uint8_t* rec, int64_t t) {
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
    if constexpr (F == KvFormat::kBf16) {
      return Status::Ok();
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
      namespace N = layout::nvfp4_ds_mla;
      MLAKV_RETURN_IF_ERROR(bad_e4m3(N::kScaleOffset, N::kNumGroups, "group scale"));
      if constexpr (F == KvFormat::kNvfp4DsMlaFp8Rope) {
        namespace R = layout::nvfp4_ds_mla_fp8rope;
        const float rs = codec::load_f32(rec + R::kRopeScaleOffset);
        if (!std::isfinite(rs) || rs < 0.0f) {
          return data_loss(fmt::format("record {}: rope scale is {} (must be finite and >= 0)", t, rs));
        }
        MLAKV_RETURN_IF_ERROR(bad_e4m3(R::kRopeOffset, kRopeDim, "rope"));
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
    MLAKV_RETURN_IF_ERROR(validate_record(p.format, rec, t));
    float* lat = latent.ptr<float>() + t * latent.stride(0);
    float* rop = rope.ptr<float>() + t * rope.stride(0);
    if (p.format == KvFormat::kBf16) {
      codec::decode_bf16_record(rec, p.latent_dim, p.rope_dim, lat, rop);
    } else {
      codec::decode_record(p.format, rec, p.outer_scale, lat, rop);
    }
  }
  return Status::Ok();
}

}  // namespace mlakv
