// The record parts as the CUDA readers and writers address them. Every value is
// derived from include/mlakv/formats.h (the one home of the layout, docs/formats.md)
// and asserted against it, so no kernel spells a byte offset or size itself.
//
// Two splits of a record are named here:
//   - the reader's quarter (sm80 attention, sm80/attention/reader.cuh: four threads
//     dequantize one record; sm90 attention, sm90/attention/kernel.cuh: consumer warp
//     q reads quarter q): quarter q owns latent dims [128q, 128q+128) and rope dims
//     [16q, 16q+16);
//   - the writer's lane (smxx/cache_writer.cu): one warp encodes one record; lane l
//     owns latent dims [16l, 16l+16) and rope dims [2l, 2l+2).
// The static_asserts also pin what the kernels' vector accesses need: 16-byte
// records (cp.async chunks), 16-byte aligned rope parts (uint4), 8-byte latent
// groups (uint2), 4-byte aligned fp32 scales.
#pragma once

#include "mlakv/formats.h"

namespace mlakv::cuda::record {

// ---- per-format parts: byte [offset, offset + bytes) of each part -------------------
// kLatentBits / kRopeBits: bits per dimension of the codes. Scales: kScaleBytes each,
// one per kDimsPerScale latent dims (none for bf16). Pads are zero bytes.
template <KvFormat F>
struct Parts;

template <>
struct Parts<KvFormat::kBf16> {
  static constexpr int kLatentOffset = layout::bf16::kLatentOffset;
  static constexpr int kLatentBits = 16;
  static constexpr int kRopeOffset = layout::bf16::kRopeOffset;
  static constexpr int kRopeBits = 16;
  static constexpr int kRecordBytes = layout::bf16::kRecordBytes;
};

template <>
struct Parts<KvFormat::kFp8DsMla> {
  static constexpr int kLatentOffset = layout::fp8_ds_mla::kLatentOffset;
  static constexpr int kLatentBits = 8;  // e4m3
  static constexpr int kScaleOffset = layout::fp8_ds_mla::kScaleOffset;
  static constexpr int kScaleBytes = 4;  // fp32 tile scale
  static constexpr int kDimsPerScale = layout::fp8_ds_mla::kTileDim;
  static constexpr int kRopeOffset = layout::fp8_ds_mla::kRopeOffset;
  static constexpr int kRopeBits = 16;  // bf16
  static constexpr int kRecordBytes = layout::fp8_ds_mla::kRecordBytes;
};

template <>
struct Parts<KvFormat::kNvfp4DsMla> {
  static constexpr int kLatentOffset = layout::nvfp4_ds_mla::kLatentOffset;
  static constexpr int kLatentBits = 4;  // e2m1, even dim in the low nibble
  static constexpr int kScaleOffset = layout::nvfp4_ds_mla::kScaleOffset;
  static constexpr int kScaleBytes = 1;  // e4m3 group scale
  static constexpr int kDimsPerScale = layout::nvfp4_ds_mla::kGroupDim;
  static constexpr int kPadOffset = layout::nvfp4_ds_mla::kPadOffset;
  static constexpr int kPadBytes = layout::nvfp4_ds_mla::kPadBytes;
  static constexpr int kRopeOffset = layout::nvfp4_ds_mla::kRopeOffset;
  static constexpr int kRopeBits = 16;  // bf16
  static constexpr int kRecordBytes = layout::nvfp4_ds_mla::kRecordBytes;
};

template <>
struct Parts<KvFormat::kNvfp4DsMlaFp8Rope> {
  static constexpr int kLatentOffset = layout::nvfp4_ds_mla_fp8rope::kLatentOffset;
  static constexpr int kLatentBits = 4;
  static constexpr int kScaleOffset = layout::nvfp4_ds_mla_fp8rope::kScaleOffset;
  static constexpr int kScaleBytes = 1;
  static constexpr int kDimsPerScale = layout::nvfp4_ds_mla_fp8rope::kGroupDim;
  static constexpr int kRopeScaleOffset = layout::nvfp4_ds_mla_fp8rope::kRopeScaleOffset;
  static constexpr int kRopeScaleBytes = 4;  // fp32
  static constexpr int kPadOffset = layout::nvfp4_ds_mla_fp8rope::kPadOffset;
  static constexpr int kPadBytes = layout::nvfp4_ds_mla_fp8rope::kPadBytes;
  static constexpr int kRopeOffset = layout::nvfp4_ds_mla_fp8rope::kRopeOffset;
  static constexpr int kRopeBits = 8;  // e4m3
  static constexpr int kRecordBytes = layout::nvfp4_ds_mla_fp8rope::kRecordBytes;
};

// The int8-rope record: the fp8-rope record's parts, the rope codes int8 (kRopeInt8).
template <>
struct Parts<KvFormat::kNvfp4DsMlaInt8Rope> {
  static constexpr int kLatentOffset = layout::nvfp4_ds_mla_int8rope::kLatentOffset;
  static constexpr int kLatentBits = 4;
  static constexpr int kScaleOffset = layout::nvfp4_ds_mla_int8rope::kScaleOffset;
  static constexpr int kScaleBytes = 1;
  static constexpr int kDimsPerScale = layout::nvfp4_ds_mla_int8rope::kGroupDim;
  static constexpr int kRopeScaleOffset = layout::nvfp4_ds_mla_int8rope::kRopeScaleOffset;
  static constexpr int kRopeScaleBytes = 4;  // fp32
  static constexpr int kPadOffset = layout::nvfp4_ds_mla_int8rope::kPadOffset;
  static constexpr int kPadBytes = layout::nvfp4_ds_mla_int8rope::kPadBytes;
  static constexpr int kRopeOffset = layout::nvfp4_ds_mla_int8rope::kRopeOffset;
  static constexpr int kRopeBits = 8;  // int8
  static constexpr bool kRopeInt8 = true;
  static constexpr int kRecordBytes = layout::nvfp4_ds_mla_int8rope::kRecordBytes;
};

// The per-token scale s_t (nvfp4 formats in token-scale mode): fp32 inside the pad.
inline constexpr int kTokenScaleOffset = layout::nvfp4_token_scale::kOffset;

template <KvFormat F>
inline constexpr int kLatentBytes = kLatentDim * Parts<F>::kLatentBits / 8;
template <KvFormat F>
inline constexpr int kRopeBytes = kRopeDim * Parts<F>::kRopeBits / 8;
template <KvFormat F>
inline constexpr int kNumScales = kLatentDim / Parts<F>::kDimsPerScale;

// ---- the reader's quarter -----------------------------------------------------------------
inline constexpr int kQuarters = 4;
inline constexpr int kQuarterLatentDims = kLatentDim / kQuarters;  // 128
inline constexpr int kQuarterRopeDims = kRopeDim / kQuarters;      // 16

template <KvFormat F>
struct Quarter {
  using P = Parts<F>;
  // Quarter q's latent codes start at P::kLatentOffset + q * kLatentBytes.
  static constexpr int kLatentBytes = kQuarterLatentDims * P::kLatentBits / 8;
  // Quarter q's rope codes start at P::kRopeOffset + q * kRopeBytes.
  static constexpr int kRopeBytes = kQuarterRopeDims * P::kRopeBits / 8;
};

// Scaled formats: quarter q's scales are [q * kScales, (q + 1) * kScales).
template <KvFormat F>
struct QuarterScales {
  using P = Parts<F>;
  static constexpr int kScales = kQuarterLatentDims / P::kDimsPerScale;  // fp8: 1 tile; nvfp4: 8 groups
  static constexpr int kBytes = kScales * P::kScaleBytes;               // quarter q's scales at kScaleOffset + q * kBytes
  static constexpr int kGroupBytes = P::kDimsPerScale * P::kLatentBits / 8;  // latent bytes under one scale
};

// ---- the writer's lane --------------------------------------------------------------------
inline constexpr int kWriterLanes = 32;
inline constexpr int kLaneLatentDims = kLatentDim / kWriterLanes;  // 16
inline constexpr int kLaneRopeDims = kRopeDim / kWriterLanes;      // 2

template <KvFormat F>
struct Lane {
  using P = Parts<F>;
  // Lane l's latent codes start at P::kLatentOffset + l * kLatentBytes; its rope codes
  // at P::kRopeOffset + l * kRopeBytes.
  static constexpr int kLatentBytes = kLaneLatentDims * P::kLatentBits / 8;
  static constexpr int kRopeBytes = kLaneRopeDims * P::kRopeBits / 8;
};

// Scaled formats: the lanes that share one scale (fp8: 8 lanes per 128-dim tile; nvfp4:
// one lane per 16-dim group).
template <KvFormat F>
inline constexpr int kLanesPerScale = Parts<F>::kDimsPerScale / kLaneLatentDims;

// ---- checks against formats.h -------------------------------------------------------------
static_assert(kQuarterLatentDims * kQuarters == kLatentDim && kQuarterRopeDims * kQuarters == kRopeDim);
static_assert(kLaneLatentDims * kWriterLanes == kLatentDim && kLaneRopeDims * kWriterLanes == kRopeDim);

// Parts tile each record exactly, in layout order.
static_assert(Parts<KvFormat::kBf16>::kLatentOffset == 0);
static_assert(Parts<KvFormat::kBf16>::kLatentOffset + kLatentBytes<KvFormat::kBf16> == Parts<KvFormat::kBf16>::kRopeOffset);
static_assert(Parts<KvFormat::kBf16>::kRopeOffset + kRopeBytes<KvFormat::kBf16> == Parts<KvFormat::kBf16>::kRecordBytes);

static_assert(Parts<KvFormat::kFp8DsMla>::kLatentOffset == 0);
static_assert(Parts<KvFormat::kFp8DsMla>::kLatentOffset + kLatentBytes<KvFormat::kFp8DsMla> ==
              Parts<KvFormat::kFp8DsMla>::kScaleOffset);
static_assert(kNumScales<KvFormat::kFp8DsMla> == layout::fp8_ds_mla::kNumTiles);
static_assert(Parts<KvFormat::kFp8DsMla>::kScaleOffset +
                  kNumScales<KvFormat::kFp8DsMla> * Parts<KvFormat::kFp8DsMla>::kScaleBytes ==
              Parts<KvFormat::kFp8DsMla>::kRopeOffset);
static_assert(Parts<KvFormat::kFp8DsMla>::kRopeOffset + kRopeBytes<KvFormat::kFp8DsMla> ==
              Parts<KvFormat::kFp8DsMla>::kRecordBytes);

static_assert(Parts<KvFormat::kNvfp4DsMla>::kLatentOffset == 0);
static_assert(kLatentBytes<KvFormat::kNvfp4DsMla> == layout::nvfp4_ds_mla::kLatentBytes);
static_assert(Parts<KvFormat::kNvfp4DsMla>::kLatentOffset + kLatentBytes<KvFormat::kNvfp4DsMla> ==
              Parts<KvFormat::kNvfp4DsMla>::kScaleOffset);
static_assert(kNumScales<KvFormat::kNvfp4DsMla> == layout::nvfp4_ds_mla::kNumGroups);
static_assert(Parts<KvFormat::kNvfp4DsMla>::kScaleOffset +
                  kNumScales<KvFormat::kNvfp4DsMla> * Parts<KvFormat::kNvfp4DsMla>::kScaleBytes ==
              Parts<KvFormat::kNvfp4DsMla>::kPadOffset);
static_assert(Parts<KvFormat::kNvfp4DsMla>::kPadOffset + Parts<KvFormat::kNvfp4DsMla>::kPadBytes ==
              Parts<KvFormat::kNvfp4DsMla>::kRopeOffset);
static_assert(Parts<KvFormat::kNvfp4DsMla>::kRopeOffset + kRopeBytes<KvFormat::kNvfp4DsMla> ==
              Parts<KvFormat::kNvfp4DsMla>::kRecordBytes);

// The fp8-rope record shares bytes [0, 288) with nvfp4_ds_mla.
static_assert(Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kLatentOffset == Parts<KvFormat::kNvfp4DsMla>::kLatentOffset);
static_assert(Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kScaleOffset == Parts<KvFormat::kNvfp4DsMla>::kScaleOffset);
static_assert(Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kScaleOffset +
                  kNumScales<KvFormat::kNvfp4DsMlaFp8Rope> * Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kScaleBytes ==
              Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kRopeScaleOffset);
static_assert(Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kRopeScaleOffset + Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kRopeScaleBytes ==
              Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kPadOffset);
static_assert(Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kPadOffset + Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kPadBytes ==
              Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kRopeOffset);
static_assert(Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kRopeOffset + kRopeBytes<KvFormat::kNvfp4DsMlaFp8Rope> ==
              Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kRecordBytes);

// The int8-rope record shares every offset with the fp8-rope one.
static_assert(Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kLatentOffset == Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kLatentOffset);
static_assert(Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kScaleOffset == Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kScaleOffset);
static_assert(Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kScaleOffset +
                  kNumScales<KvFormat::kNvfp4DsMlaInt8Rope> * Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kScaleBytes ==
              Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kRopeScaleOffset);
static_assert(Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kRopeScaleOffset + Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kRopeScaleBytes ==
              Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kPadOffset);
static_assert(Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kPadOffset + Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kPadBytes ==
              Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kRopeOffset);
static_assert(Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kRopeOffset + kRopeBytes<KvFormat::kNvfp4DsMlaInt8Rope> ==
              Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kRecordBytes);
static_assert(Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kRecordBytes == Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kRecordBytes &&
              Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kRopeOffset == Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kRopeOffset);

// The token scale sits in the pad of every nvfp4 record, 4-aligned (one fp32 store).
static_assert(kTokenScaleOffset % 4 == 0);
static_assert(kTokenScaleOffset >= Parts<KvFormat::kNvfp4DsMla>::kPadOffset &&
              kTokenScaleOffset + 4 <= Parts<KvFormat::kNvfp4DsMla>::kPadOffset + Parts<KvFormat::kNvfp4DsMla>::kPadBytes);
static_assert(kTokenScaleOffset == Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kPadOffset &&
              kTokenScaleOffset == Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kPadOffset);

// What the kernels' accesses need.
template <KvFormat F>
constexpr bool aligned_for_kernels() {
  using P = Parts<F>;
  return P::kRecordBytes % 16 == 0 &&              // cp.async / uint4 chunks
         P::kRopeOffset % 16 == 0 &&               // reader: uint4 rope loads
         Quarter<F>::kRopeBytes % 16 == 0 &&       //   one or two uint4 per quarter
         Quarter<F>::kLatentBytes % 8 == 0 &&      //   uint2 latent loads
         Lane<F>::kLatentBytes % 8 == 0 &&         // writer: uint2 / uint4 latent stores
         Lane<F>::kRopeBytes % 2 == 0;             //   u16 / u32 rope stores
}
static_assert(aligned_for_kernels<KvFormat::kBf16>());
static_assert(aligned_for_kernels<KvFormat::kFp8DsMla>());
static_assert(aligned_for_kernels<KvFormat::kNvfp4DsMla>());
static_assert(aligned_for_kernels<KvFormat::kNvfp4DsMlaFp8Rope>());
static_assert(aligned_for_kernels<KvFormat::kNvfp4DsMlaInt8Rope>());
static_assert(Parts<KvFormat::kFp8DsMla>::kScaleOffset % 4 == 0);
static_assert(Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kRopeScaleOffset % 4 == 0);

// The reader's per-quarter shapes (sm80/attention/reader.cuh).
static_assert(QuarterScales<KvFormat::kFp8DsMla>::kScales == 1, "fp8: one tile scale per quarter");
static_assert(Quarter<KvFormat::kFp8DsMla>::kRopeBytes == 32, "fp8: two uint4 of bf16 rope per quarter");
static_assert(Quarter<KvFormat::kNvfp4DsMla>::kRopeBytes == 32, "nvfp4: two uint4 of bf16 rope per quarter");
static_assert(Quarter<KvFormat::kNvfp4DsMlaFp8Rope>::kRopeBytes == 16, "fp8 rope: one uint4 of e4m3 per quarter");
static_assert(Quarter<KvFormat::kNvfp4DsMlaInt8Rope>::kRopeBytes == 16, "int8 rope: one uint4 of int8 per quarter");
static_assert(QuarterScales<KvFormat::kNvfp4DsMlaInt8Rope>::kGroupBytes == 8);
static_assert(QuarterScales<KvFormat::kNvfp4DsMla>::kGroupBytes == 8, "nvfp4: one uint2 of nibbles per group");
static_assert(QuarterScales<KvFormat::kNvfp4DsMlaFp8Rope>::kGroupBytes == 8);

// The writer's per-lane shapes (smxx/cache_writer.cu).
static_assert(Lane<KvFormat::kFp8DsMla>::kLatentBytes == 16, "fp8 writer: one uint4 of codes per lane");
static_assert(kLanesPerScale<KvFormat::kFp8DsMla> == 8, "fp8 writer: 8 lanes share a tile's amax");
static_assert(kLanesPerScale<KvFormat::kNvfp4DsMla> == 1, "nvfp4 writer: lane l encodes group l");
static_assert(Lane<KvFormat::kNvfp4DsMla>::kLatentBytes == 8, "nvfp4 writer: one uint2 of nibbles per lane");
static_assert(Lane<KvFormat::kFp8DsMla>::kRopeBytes == 4 && Lane<KvFormat::kNvfp4DsMla>::kRopeBytes == 4,
              "bf16 rope: one u32 per lane");
static_assert(Lane<KvFormat::kNvfp4DsMlaFp8Rope>::kRopeBytes == 2, "e4m3 rope: one u16 per lane");
static_assert(Lane<KvFormat::kNvfp4DsMlaInt8Rope>::kRopeBytes == 2, "int8 rope: one u16 per lane");
static_assert(Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kPadBytes == 12 &&
                  Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kPadOffset % 4 == 0 &&
                  (Parts<KvFormat::kNvfp4DsMlaInt8Rope>::kPadOffset + 4) % 8 == 0,
              "int8-rope writer: the pad is one u32 and one uint2");
static_assert(Parts<KvFormat::kNvfp4DsMla>::kPadBytes == 16 && Parts<KvFormat::kNvfp4DsMla>::kPadOffset % 16 == 0,
              "nvfp4 writer: the pad is one uint4");
static_assert(Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kPadBytes == 12 &&
                  Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kPadOffset % 4 == 0 &&
                  (Parts<KvFormat::kNvfp4DsMlaFp8Rope>::kPadOffset + 4) % 8 == 0,
              "fp8-rope writer: the pad is one u32 and one uint2");

}  // namespace mlakv::cuda::record
