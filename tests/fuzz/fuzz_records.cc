// KV record decoding, every format (decode_records), and the encode -> decode round
// trip. Byte 0 picks the format (and the fp8 scale mode, an nvfp4 outer scale or the
// nvfp4 token-scale mode); the rest is either records to decode or float32 rows to encode.
// Invariants:
//  - decode accepts or fails with kDataLoss, never anything else;
//  - bf16: an accepted record decodes and re-encodes to the same bytes (bf16 -> f32 ->
//    bf16 is exact for every non-NaN value);
//  - encode of finite rows always succeeds and its records always decode to finite
//    values that keep the sign of x and the order of x inside each scale group, with
//    bf16 parts exactly round-to-nearest-even (check_rounding). (Re-encoding decoded
//    values is not a fixed point: power-of-two and 1/448 scale re-derivation can step
//    to a neighbouring scale.)
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "fuzz_common.h"
#include "mlakv/codec.h"
#include "mlakv/numerics.h"

using namespace mlakv;

namespace {

struct Rows {
  std::vector<float> lat, rope;
  int64_t n = 0;
};

Status decode(const CodecParams& p, const std::vector<uint8_t>& recs, int64_t n, Rows& out) {
  out.n = n;
  out.lat.assign(static_cast<std::size_t>(n) * kLatentDim, 0.0f);
  out.rope.assign(static_cast<std::size_t>(n) * kRopeDim, 0.0f);
  const int rb = *codec_record_bytes(p);
  return decode_records(p, TensorView::contiguous(recs.data(), DType::kU8, {n, rb}),
                        TensorView::contiguous(out.lat.data(), DType::kF32, {n, kLatentDim}),
                        TensorView::contiguous(out.rope.data(), DType::kF32, {n, kRopeDim}));
}

Status encode(const CodecParams& p, const Rows& in, std::vector<uint8_t>& recs) {
  const int rb = *codec_record_bytes(p);
  recs.assign(static_cast<std::size_t>(in.n) * rb, 0);
  return encode_records(p, TensorView::contiguous(in.lat.data(), DType::kF32, {in.n, kLatentDim}),
                        TensorView::contiguous(in.rope.data(), DType::kF32, {in.n, kRopeDim}),
                        TensorView::contiguous(recs.data(), DType::kU8, {in.n, rb}));
}

// Round to nearest under one shared scale is monotone and keeps signs: inside every
// scale group (fp8 tile of 128, nvfp4 group of 16, the 64 fp8 rope values) x_i <= x_j
// implies dec_i <= dec_j, and dec is 0 or has the sign of x. bf16 parts are exact
// round-to-nearest-even.
void check_group(const float* x, const float* dec, int count, const char* what) {
  for (int i = 0; i < count; ++i) {
    MLAKV_FUZZ_CHECK(dec[i] == 0.0f || (dec[i] > 0) == (x[i] > 0), what);
    for (int j = 0; j < count; ++j) {
      if (x[i] < x[j]) MLAKV_FUZZ_CHECK(dec[i] <= dec[j], what);
    }
  }
}

void check_bf16(const float* x, const float* dec, int count, const char* what) {
  for (int i = 0; i < count; ++i) MLAKV_FUZZ_CHECK(dec[i] == bf16_to_f32(f32_to_bf16(x[i])), what);
}

void check_rounding(KvFormat f, const Rows& x, const Rows& y, int64_t t) {
  const float* xl = x.lat.data() + t * kLatentDim;
  const float* yl = y.lat.data() + t * kLatentDim;
  const float* xr = x.rope.data() + t * kRopeDim;
  const float* yr = y.rope.data() + t * kRopeDim;
  switch (f) {
    case KvFormat::kBf16:
      check_bf16(xl, yl, kLatentDim, "bf16 latent");
      check_bf16(xr, yr, kRopeDim, "bf16 rope");
      return;
    case KvFormat::kF32:
      for (int i = 0; i < kLatentDim; ++i) MLAKV_FUZZ_CHECK(yl[i] == xl[i], "f32 latent");
      for (int i = 0; i < kRopeDim; ++i) MLAKV_FUZZ_CHECK(yr[i] == xr[i], "f32 rope");
      return;
    case KvFormat::kFp8DsMla:
      for (int k = 0; k < layout::fp8_ds_mla::kNumTiles; ++k) {
        const int d = k * layout::fp8_ds_mla::kTileDim;
        check_group(xl + d, yl + d, layout::fp8_ds_mla::kTileDim, "fp8 tile");
      }
      check_bf16(xr, yr, kRopeDim, "fp8_ds_mla rope");
      return;
    case KvFormat::kNvfp4DsMla:
    case KvFormat::kNvfp4DsMlaFp8Rope:
    case KvFormat::kNvfp4DsMlaInt8Rope:
      for (int g = 0; g < layout::nvfp4_ds_mla::kNumGroups; ++g) {
        const int d = g * layout::nvfp4_ds_mla::kGroupDim;
        check_group(xl + d, yl + d, layout::nvfp4_ds_mla::kGroupDim, "nvfp4 group");
      }
      if (f == KvFormat::kNvfp4DsMla) {
        check_bf16(xr, yr, kRopeDim, "nvfp4 rope");
      } else {
        check_group(xr, yr, kRopeDim, f == KvFormat::kNvfp4DsMlaFp8Rope ? "fp8 rope" : "int8 rope");
      }
      return;
  }
}

void check_finite(const Rows& r) {
  for (float v : r.lat) MLAKV_FUZZ_CHECK(std::isfinite(v), "latent");
  for (float v : r.rope) MLAKV_FUZZ_CHECK(std::isfinite(v), "rope");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  CodecParams p;
  p.format = static_cast<KvFormat>(data[0] % kNumKvFormats);
  p.fp8_scales = (data[0] & 0x10) ? Fp8ScaleMode::kExact : Fp8ScaleMode::kPow2;
  if (format_info(p.format).has_outer_scale && (data[0] & 0x40)) {
    p.token_scale = true;  // replaces the outer scale
  } else if (format_info(p.format).has_outer_scale && (data[0] & 0x20)) {
    p.outer_scale = 0.0625f;
  }
  // The nvfp4 scale search (an encoder option; not with the per-token scale mode).
  if (is_nvfp4_format(p.format) && !p.token_scale && (data[0] & 0x80)) p.nvfp4_scales = Nvfp4ScaleMode::kSearch;
  const int rb = *codec_record_bytes(p);
  const uint8_t* body = data + 1;
  const std::size_t len = size - 1;

  // 1. The bytes as records.
  {
    const int64_t n = static_cast<int64_t>(len / static_cast<std::size_t>(rb));
    std::vector<uint8_t> recs(body, body + static_cast<std::size_t>(n) * rb);
    Rows r;
    const Status st = decode(p, recs, n, r);
    MLAKV_FUZZ_CHECK(st.ok() || st.code() == StatusCode::kDataLoss, st.to_string());
    if (st.ok() && (p.format == KvFormat::kBf16 || p.format == KvFormat::kF32)) {
      bool nan = false;
      for (float v : r.lat) nan |= std::isnan(v);
      for (float v : r.rope) nan |= std::isnan(v);
      bool inf = false;
      for (float v : r.lat) inf |= std::isinf(v);
      for (float v : r.rope) inf |= std::isinf(v);
      if (!nan && !inf) {
        std::vector<uint8_t> again;
        MLAKV_FUZZ_CHECK(encode(p, r, again).ok(), "");
        MLAKV_FUZZ_CHECK(again == recs, "bf16 round trip");
      }
    }
  }
  // 2. The bytes as float32 rows [n, 576] (non-finite values zeroed, magnitudes capped
  //    so the fp8 scales stay finite).
  {
    const int64_t n = static_cast<int64_t>(len / (4 * kQkDim));
    if (n == 0) return 0;
    Rows x;
    x.n = n;
    x.lat.resize(static_cast<std::size_t>(n) * kLatentDim);
    x.rope.resize(static_cast<std::size_t>(n) * kRopeDim);
    for (int64_t t = 0; t < n; ++t) {
      for (int d = 0; d < kQkDim; ++d) {
        float v;
        std::memcpy(&v, body + (t * kQkDim + d) * 4, 4);
        if (!std::isfinite(v) || std::fabs(v) > 1e30f) v = 0.0f;
        (d < kLatentDim ? x.lat[static_cast<std::size_t>(t * kLatentDim + d)]
                        : x.rope[static_cast<std::size_t>(t * kRopeDim + d - kLatentDim)]) = v;
      }
    }
    std::vector<uint8_t> recs;
    const Status e = encode(p, x, recs);
    MLAKV_FUZZ_CHECK(e.ok(), e.to_string());
    Rows y;
    const Status d = decode(p, recs, n, y);
    MLAKV_FUZZ_CHECK(d.ok(), d.to_string());
    check_finite(y);
    for (int64_t t = 0; t < n; ++t) check_rounding(p.format, x, y, t);
  }
  return 0;
}
