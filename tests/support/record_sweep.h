// Record sets that hold every code a record reader must decode, for checking fast
// readers (the CPU SIMD reader, the CUDA readers) code by code against the scalar
// codec (format/record_codec.h, the spec). Per format:
//   bf16                 every non-NaN bf16 code, in latent and rope dims;
//   fp8_ds_mla           every non-NaN e4m3 latent code under every tile scale of
//                        kSweepTileScales (two tiles per scale hold all 254 codes);
//                        every non-NaN bf16 rope code;
//   nvfp4_ds_mla         every e2m1 code under every non-NaN e4m3 group-scale code
//                        (each group holds all 16 codes, rotated by its index);
//                        every non-NaN bf16 rope code;
//   nvfp4_ds_mla_fp8rope the same latent; every non-NaN e4m3 rope code under every
//                        rope scale of kSweepRopeScales;
//   nvfp4_ds_mla_int8rope the same latent; every int8 rope code (-128 included) under
//                        every rope scale of kSweepRopeScales.
// The nvfp4 records also carry a token scale s_t of kSweepTokenScales at [292, 296)
// (read only in the token-scale mode; zero-padded readers ignore it otherwise).
// NaN codes (the cache's 0xFF poison) are excluded: readers need not agree on NaN
// payloads, and the attention never reads a poisoned slot. Header-only test support.
#pragma once

#include <cstdint>
#include <cstring>
#include <iterator>
#include <vector>

#include "mlakv/formats.h"

namespace mlakv::test {

inline constexpr int64_t kSweepRecords = 1024;  // >= 65282 bf16 rope codes / 64 per record

// fp8_ds_mla tile scales (finite, > 0): powers of two (FlashMLA's writer), exact
// amax/448 values (vLLM's), FLT_MIN (the exact mode's floor: products go subnormal),
// and large ones.
inline const float kSweepTileScales[] = {1.0f,    0.5f,     0x1p-9f,         0x1p-14f, 0.0123f,
                                         3.7e-3f, 448.0f,   1.17549435e-38f, 65504.0f, 0x1p100f};
// fp8 rope scales (finite, >= 0; 0 is what an all-zero rope encodes to).
inline const float kSweepRopeScales[] = {0.0f, 1.0f / 448.0f, 0.25f, 0.0178f, 3.0f, 1e-30f};
// nvfp4 token scales s_t (finite, >= 0: 0 is an all-zero token's; 1/2688 a token of amax 1;
// subnormal and large ones).
inline const float kSweepTokenScales[] = {0.0f, 1.0f / 2688.0f, 3.7e-7f, 1e-41f, 2.5f, 1e20f};
// nvfp4 outer scales s_l a layer may carry.
inline const float kSweepOuterScales[] = {1.0f, 0.75f, 0.3f, 1.0f / 2688.0f, 37.5f};

inline std::vector<uint8_t> non_nan_e4m3_codes() {
  std::vector<uint8_t> v;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) != 0x7F) v.push_back(static_cast<uint8_t>(c));
  }
  return v;  // 254
}

inline std::vector<uint16_t> non_nan_bf16_codes() {
  std::vector<uint16_t> v;
  for (int c = 0; c < 65536; ++c) {
    if ((c & 0x7F80) == 0x7F80 && (c & 0x7F) != 0) continue;
    v.push_back(static_cast<uint16_t>(c));
  }
  return v;  // 65282
}

// kSweepRecords records of format f, back to back ([kSweepRecords, record_bytes(f)]).
inline std::vector<uint8_t> sweep_records(KvFormat f) {
  const int rb = record_bytes(f);
  std::vector<uint8_t> out(static_cast<std::size_t>(kSweepRecords) * rb, 0);
  const auto e4m3 = non_nan_e4m3_codes();
  const auto bf16 = non_nan_bf16_codes();
  const std::size_t ne = e4m3.size(), nb = bf16.size();
  auto put_u16 = [](uint8_t* p, uint16_t v) {
    p[0] = static_cast<uint8_t>(v & 0xFF);
    p[1] = static_cast<uint8_t>(v >> 8);
  };
  auto put_f32 = [](uint8_t* p, float v) { std::memcpy(p, &v, 4); };
  for (int64_t r = 0; r < kSweepRecords; ++r) {
    uint8_t* rec = out.data() + r * rb;
    const std::size_t ur = static_cast<std::size_t>(r);
    switch (f) {
      case KvFormat::kBf16:
        for (int i = 0; i < kQkDim; ++i) put_u16(rec + 2 * i, bf16[(ur * kQkDim + static_cast<std::size_t>(i)) % nb]);
        break;
      case KvFormat::kF32:  // every finite bf16 value, widened (f32 stores any float; these span its range)
        for (int i = 0; i < kQkDim; ++i) {
          put_u16(rec + 4 * i, 0);
          put_u16(rec + 4 * i + 2, bf16[(ur * kQkDim + static_cast<std::size_t>(i)) % nb]);
        }
        break;
      case KvFormat::kFp8DsMla: {
        namespace F = layout::fp8_ds_mla;
        constexpr std::size_t kScales = sizeof(kSweepTileScales) / sizeof(float);
        for (int t = 0; t < F::kNumTiles; ++t) {
          const std::size_t tile = ur * F::kNumTiles + static_cast<std::size_t>(t);
          put_f32(rec + F::kScaleOffset + 4 * t, kSweepTileScales[(tile / 2) % kScales]);
          for (int j = 0; j < F::kTileDim; ++j) {
            rec[F::kLatentOffset + t * F::kTileDim + j] = e4m3[((tile % 2) * F::kTileDim + static_cast<std::size_t>(j)) % ne];
          }
        }
        for (int i = 0; i < kRopeDim; ++i) {
          put_u16(rec + F::kRopeOffset + 2 * i, bf16[(ur * kRopeDim + static_cast<std::size_t>(i)) % nb]);
        }
        break;
      }
      case KvFormat::kNvfp4DsMla:
      case KvFormat::kNvfp4DsMlaFp8Rope:
      case KvFormat::kNvfp4DsMlaInt8Rope: {
        namespace N = layout::nvfp4_ds_mla;
        constexpr std::size_t kTokenScales = sizeof(kSweepTokenScales) / sizeof(float);
        put_f32(rec + layout::nvfp4_token_scale::kOffset, kSweepTokenScales[ur % kTokenScales]);
        for (int g = 0; g < N::kNumGroups; ++g) {
          const std::size_t group = ur * N::kNumGroups + static_cast<std::size_t>(g);
          rec[N::kScaleOffset + g] = e4m3[group % ne];
          for (int i = 0; i < N::kGroupDim; i += 2) {
            const int lo = static_cast<int>((static_cast<std::size_t>(i) + group) % 16);
            const int hi = static_cast<int>((static_cast<std::size_t>(i) + 1 + group) % 16);
            rec[N::kLatentOffset + (g * N::kGroupDim + i) / 2] = static_cast<uint8_t>(lo | (hi << 4));
          }
        }
        if (f == KvFormat::kNvfp4DsMla) {
          for (int i = 0; i < kRopeDim; ++i) {
            put_u16(rec + N::kRopeOffset + 2 * i, bf16[(ur * kRopeDim + static_cast<std::size_t>(i)) % nb]);
          }
        } else if (f == KvFormat::kNvfp4DsMlaFp8Rope) {
          namespace R = layout::nvfp4_ds_mla_fp8rope;
          constexpr std::size_t kScales = sizeof(kSweepRopeScales) / sizeof(float);
          put_f32(rec + R::kRopeScaleOffset, kSweepRopeScales[(ur / 4) % kScales]);
          for (int i = 0; i < kRopeDim; ++i) {
            rec[R::kRopeOffset + i] = e4m3[((ur % 4) * kRopeDim + static_cast<std::size_t>(i)) % ne];
          }
        } else {
          namespace R = layout::nvfp4_ds_mla_int8rope;
          constexpr std::size_t kScales = sizeof(kSweepRopeScales) / sizeof(float);
          put_f32(rec + R::kRopeScaleOffset, kSweepRopeScales[(ur / 4) % kScales]);
          for (int i = 0; i < kRopeDim; ++i) {  // 4 records: all 256 int8 codes
            rec[R::kRopeOffset + i] = static_cast<uint8_t>(((ur % 4) * kRopeDim + static_cast<std::size_t>(i)) % 256);
          }
        }
        break;
      }
    }
  }
  return out;
}

// The outer scales to sweep for format f (nvfp4 only; 1 otherwise).
inline std::vector<float> sweep_outer_scales(KvFormat f) {
  if (!format_info(f).has_outer_scale) return {1.0f};
  return std::vector<float>(std::begin(kSweepOuterScales), std::end(kSweepOuterScales));
}

}  // namespace mlakv::test
