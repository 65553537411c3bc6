// SIMD cache writers for the model runner: the records of src/format/record_codec.h
// (the scalar spec), encoded with Highway and written straight into the paged cache's
// slots. Byte for byte what codec::encode_record writes (tests/model_record_writer_test.cc
// checks random and adversarial inputs against it).
//
// How each rounding is vectorized without changing a bit:
//   bf16   (u + 0x7FFF + lsb) >> 16, NaN -> 0x7FFF (the scalar's formula, per lane);
//   e4m3   |y| >= 2^-6: round the float32 mantissa to 3 bits (add 0x7FFFF + lsb, carry
//          into the exponent), code = (bits >> 20) - (120 << 3); |y| < 2^-6: the
//          subnormal quantum 2^-9 by (|y| + 2^14) - 2^14 (ulp of 2^14 is 2^-9, IEEE
//          round-to-nearest-even), code = that * 512; then min(code, 0x7E) (satfinite,
//          Inf included), sign bit 7; NaN -> 0x7F;
//   int8   hn::Round (half to even) of the clamped quotient, as the scalar's rint;
//   e2m1   the same with 1 mantissa bit: |y| >= 1: (bits + 0x1FFFFF + lsb) >> 22 - 252;
//          |y| < 1: (|y| + 2^22) - 2^22 in steps of 0.5, code = 2x; min(code, 7), sign bit
//          3; NaN -> 7;
//   scale search (Nvfp4ScaleMode::kSearch): each candidate's squared error with the spec's
//          float32 operations and its fixed summation tree (vectors added whole, then lanes);
//   divisions x / s are IEEE-exact in SIMD as in scalar code; the per-tile, per-group and
//   rope scales are computed by the scalar spec's own functions from SIMD max-reductions
//   (max is exact).
#pragma once

#include <cstdint>
#include <span>

#include "mlakv/cache.h"
#include "mlakv/formats.h"
#include "mlakv/latent_transform.h"
#include "mlakv/status.h"

namespace mlakv {
class ThreadPool;
}

namespace mlakv::model {

// One record of format `f` (L = 512, R = 64; bf16 takes latent_dim / rope_dim) from
// finite inputs; every byte of rec[record_bytes] is written, pads zero.
//   fp8_exact_scales: Fp8ScaleMode::kExact (vLLM) instead of kPow2 (FlashMLA).
//   token_scale: the nvfp4 per-token scale mode (callers validate: nvfp4 formats, s_l 1).
//   nvfp4_scales: the nvfp4 group-scale choice (codec::nvfp4_search_scale_code for kSearch;
//     ignored in token-scale mode and for other formats, as the scalar spec; callers validate
//     with check_nvfp4_scales).
void encode_record_simd(KvFormat f, const float* latent, int latent_dim, const float* rope, int rope_dim,
                        float outer_scale, bool fp8_exact_scales, uint8_t* rec, bool token_scale = false,
                        Nvfp4ScaleMode nvfp4_scales = Nvfp4ScaleMode::kRn);

// Encodes n tokens into `slots` of cache layer `layer` (slots < 0 skipped), threads over
// tokens. latent [n, latent_dim], rope [n, rope_dim] f32. Validates first and writes
// nothing on error: a slot past the cache, a non-finite input (named by token and dim),
// a bad layer. With `transform`, every token's latent and k_pe are transformed first
// (LatentTransformKernel::latent / rope, in a per-token buffer, then encoded), and a
// latent whose max |(c - mu) d| passes LatentTransformKernel::kMaxScaledInput (float32
// would overflow) is an error before anything is written. The cache's outer scale
// applies to the transformed latent.
Status write_cache_records(KvCache& cache, int layer, std::span<const int64_t> slots, const float* latent,
                           const float* rope, ThreadPool* pool, const LatentTransformKernel* transform = nullptr);

// The element codes alone (for exhaustive tests): e4m3 satfinite / e2m1 satfinite
// codes of y[0, n), one per byte (e2m1 in the low nibble).
void e4m3_codes_simd(const float* y, int64_t n, uint8_t* out);
void e2m1_codes_simd(const float* y, int64_t n, uint8_t* out);

}  // namespace mlakv::model
