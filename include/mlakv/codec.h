// Encode / decode MLA KV records (formats.h, docs/formats.md) for n tokens at once.
#pragma once

#include <cstdint>

#include "mlakv/formats.h"
#include "mlakv/status.h"
#include "mlakv/tensor.h"

namespace mlakv {

// fp8_ds_mla tile scales: power-of-two (FlashMLA's writer, the default) or exact
// amax/448 (vLLM's writer). Readers accept any positive finite scale.
enum class Fp8ScaleMode : uint8_t { kPow2 = 0, kExact = 1 };

struct CodecParams {
  KvFormat format = KvFormat::kBf16;
  // The layer's NVFP4 outer scale s_l (nvfp4 formats only; must stay 1.0 otherwise):
  // the writer encodes latent / s_l, the reader multiplies s_l back. Never applied to rope.
  float outer_scale = 1.0f;
  Fp8ScaleMode fp8_scales = Fp8ScaleMode::kPow2;
  int latent_dim = kLatentDim;  // only bf16 accepts other geometries
  int rope_dim = kRopeDim;
};

// Validates the format/geometry/outer-scale combination; returns the record size.
StatusOr<int> codec_record_bytes(const CodecParams& p);

// Encodes n tokens.
//   latent  [n, latent_dim] f32 or bf16, CPU, rows may be strided
//   rope    [n, rope_dim]   f32 or bf16 (same dtype as latent)
//   records [n, record_bytes] u8, CPU
// Fails, writing nothing, on a shape/dtype mismatch or a NaN/Inf input (the message
// names the token and dimension).
Status encode_records(const CodecParams& p, const TensorView& latent, const TensorView& rope,
                      const TensorView& records);

// Decodes n records into float32 latent [n, latent_dim] and rope [n, rope_dim].
// Fails (names the token) on a record whose fp32 scale is not finite and positive
// (fp8 tile scales), not finite and >= 0 (fp8 rope scale), or whose e4m3 bytes
// hold NaN. Outputs are unspecified on failure.
Status decode_records(const CodecParams& p, const TensorView& records, const TensorView& latent,
                      const TensorView& rope);

}  // namespace mlakv
