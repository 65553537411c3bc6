// The natural-arrangement many-row sm90 attention kernel (launch_nat.h; docs/design.md
// "Hopper kernels, natural arrangement"): the query rows are the wgmma M dimension, the KV
// tile is read by the tensor cores straight from shared memory as bf16, both as K^T
// (S = Q K^T) and as V (O = P V). bf16 records land in the tile by TMA as they are; the
// quantized formats' bytes are staged by TMA inside the tile's own column blocks and
// converted there in place by two converter warpgroups (below).
//
// (The quantized formats' sparse sets and dense e2m1 sets run the register-staged form of this
// kernel instead, kernel_nat_rs.cuh; kNatRs below says which.)
// One CTA = 64 query rows x one KV split of one request (rows i * H + h), 384 threads for
// bf16, 512 for the quantized formats:
//  - the quantized formats (Quant<F>): warps 8 + 4 k .. 11 + 4 k convert the tiles of
//    stage k, two threads per token (the first warp also walks the block table and issues
//    the boxes), each part in release order: wait for it to be empty, stage its codes and
//    scales, convert in place (convert_half, convert_rope), fence, arrive on its full
//    barrier (128 threads). (A 512-thread CTA compiles at a register target of 128, so its
//    P V wgmmas are m64n128k16 pairs: an m64n256k16 needs 158.);
//  - bf16: warps 8 and 9, the producers (warps 10 and 11 exit at once; setmaxnreg gives their
//    registers to the consumers): warp 8 + k loads the tiles of stage k (tiles t with
//    t % 2 == k) of a two-stage ring of 64-token tiles, walking the block table (one
//    lookup per lane for the boxes of the next tiles) and loading each tile with 2-D TMA
//    boxes (the cache viewed as [num_slots, 576] bf16, 128-byte swizzle, box 64 dims x
//    min(block_size, 64) rows; 9 column blocks of 8 KB per tile) in three parts, each
//    with its own full / empty mbarrier pair: the rope block (dims 512..575, read by the
//    scores only), the left V half (column blocks 0..3) and the right one (4..7). A part
//    is reloaded as soon as the warpgroup that read it last releases it. Boxes of invalid
//    pages are not loaded; the tile's 64-bit validity mask goes with the rope part.
//  - warpgroups 0 and 1, the consumers, in the "seesaw" schedule of two tiles a = 2j
//    (stage 0) and b = 2j + 1 (stage 1) per step (FlashMLA's published schedule, docs/
//    reference.md): warpgroup 0 holds O_L (output dims 0..255), warpgroup 1 O_R
//    (256..511), each 128 fp32 registers for all 64 rows. Warpgroup k computes the full
//    scores of the tile in stage k (36 wgmma m64n64k16: the rope block's 4 k-steps with
//    Q's rope block from registers, the 32 others with Q and K from shared memory) and
//    its softmax; the running maximum goes 0 -> 1 through shared memory:
//      [0] m0 = max(m, rowmax S_a), P_a = exp(S_a - m0), O_L = O_L e^(m - m0) + P_a V_aL
//      [1] m1 = max(m0, rowmax S_b), P_b = exp(S_b - m1), O_R = O_R e^(m - m1) + P_b V_bR
//      [0] P_a e^(m0 - m1) -> shared memory; O_L = O_L e^(m0 - m1) + P_b V_bL (P_b from
//          shared memory, where warpgroup 1 put it: Q's rope block, free once both
//          warpgroups hold it in registers)
//      [1] O_R += (P_a e^(m0 - m1)) V_aR
//    so each warpgroup's softmax runs while the other's wgmmas keep the tensor cores busy.
//    The maxima are lazy (kLazy): a row's reference moves only when a tile's maximum
//    passes it by more than 2^8, so the rescales of O and P_a are rare after the first
//    tiles.
//    The warpgroup that computed a tile's scores zeroes the V rows of its masked tokens
//    (NaN-poisoned slots may sit there: 0 * NaN would reach O) before either P V reads
//    them. Every cross-warpgroup hand-off is an mbarrier that all 128 threads of the
//    sending warpgroup arrive on (release) and the receivers wait on (acquire).
// Softmax rows live in the wgmma accumulator fragment (each row in the four threads of a
// quad), so the row max / sum are two shuffles. Nothing is in flight across steps (every
// accumulator is read after a wait that covers it: ptxas serializes every wgmma
// otherwise, C7514).
// Shared memory: Q 72 KB + P_a 8 KB + 2 stages x 72 KB + barriers and row data (one CTA
// per SM).
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: the map is made through the runtime's driver entry point)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#ifdef MLAKV_NAT_TRACE
#include <cstdio>
#include <cstring>
#endif

#include "cuda/common/cta_work.cuh"
#include "cuda/sm80/attention/mma.cuh"  // mlakv::cuda::ptx::smem_addr, pack_bf16x2
#include "cuda/sm90/attention/launch_nat.h"
#include "cuda/sm90/attention/ptx.cuh"
#include "cuda/sm90/attention/ptx_nat.cuh"
#include "cuda/sm90/attention/ptx_rows.cuh"
#include "mlakv/formats.h"
#include "mlakv/numerics.h"

namespace mlakv::cuda::sm90 {
namespace {

namespace nat {

using kernels::AttentionParams;

constexpr int kRows = kNatRowsPerCta;               // 64 query rows per CTA
constexpr int kTile = kNatTokenTile;                // 64 tokens per tile
constexpr int kBlocks = kQkDim / 64;                // 9 column blocks of 64 dims (128 B) per row
constexpr int kBlockBytes = kTile * 128;            // 8 KB: one column block of a tile
constexpr int kStageBytes = kBlocks * kBlockBytes;  // 72 KB
constexpr int kQBlockBytes = kRows * 128;           // 8 KB: one column block of Q (or P)
constexpr int kQBytes = kBlocks * kQBlockBytes;     // 72 KB
constexpr int kStages = 2;
constexpr int kConsumerWarps = 8;
constexpr int kThreads = 32 * kConsumerWarps + 128;  // bf16: + the producer warpgroup
constexpr int kConsumerRegs = 232, kProducerRegs = 32;  // (232 - 168) x 256 <= (168 - 32) x 128: the increase never waits
// The quantized formats: + two converter warpgroups (one per stage), 512 threads launched
// at 128 registers; consumers 224, converters 32 ((224 - 128) x 256 <= (128 - 32) x 256).
constexpr int kConverterWarps = 8;
constexpr int kQuantThreads = 32 * (kConsumerWarps + kConverterWarps);
constexpr int kQuantConsumerRegs = 224, kConverterRegs = 32;
static_assert((kQuantConsumerRegs - 65536 / kQuantThreads) * 256 <= (65536 / kQuantThreads - kConverterRegs) * 32 * kConverterWarps,
              "the consumers' increase fits what the converters give back");
template <KvFormat F>
constexpr int kThreadsOf = F == KvFormat::kBf16 ? kThreads : kQuantThreads;
// The three parts of a stage, each with its own full / empty barrier pair.
constexpr int kPartRope = 0, kPartL = 1, kPartR = 2, kParts = 3;
// misc: full[3][2], empty[3][2], then m0_ready, s1_ready, p0_ready, p1_ready, l_ready
// (8 B each); vmask[2] (8 B each); the rows' m0, e^(m - m0), m1, e^(m0 - m1) (64 fp32
// each); the final row sums of both warpgroups (2 x 64 fp32).
// The quantized formats add staged[4][2] (a part's codes and scales landed, before conversion:
// the halves, and the rope of the 368-byte records; staged[6 + stage]: role 0's converters
// have read an e2m1 half's codes, 64 arrivals).
constexpr int kNumBars = 2 * kParts * kStages + 5 + 4 * kStages;
constexpr int kMiscBytes = 8 * kNumBars + 8 * kStages + 4 * 64 * 4 + 2 * 64 * 4;
constexpr int kSmemBytes = 1024 + kQBytes + kQBlockBytes + kStages * kStageBytes + kMiscBytes;  // + 1 KB for the 1024-B alignment
static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM");
static_assert(kTile == 64, "the validity mask and the fragments assume 64-token tiles");
constexpr float kLn2 = 0.6931471805599453f;
// The lazy maximum: a row's reference maximum moves only when a tile's exceeds it by more
// than kLazy (log2 units), so P <= 2^kLazy and O, l rescale only then (P / l and the LSE
// m + log2 l do not depend on which reference m is used).
constexpr float kLazy = 8.0f;
constexpr int kBarWg = 3, kBarAll = 5;  // named barriers: 3 + k = warpgroup k alone (128), 5 = both (after Q)
constexpr int kBarConv = 6;             // 6 + k: the 128 converters of stage k (quantized formats)

// Byte offset of (row r, element k) inside a block of 64-element (128-byte) rows of the
// 128-byte swizzled layout (what TMA writes with CU_TENSOR_MAP_SWIZZLE_128B into a 1024-B
// aligned block): 16-byte chunk k / 8 of row r moves to chunk (k / 8) ^ (r % 8).
__device__ __forceinline__ uint32_t sw128(int r, int k) {
  return static_cast<uint32_t>(r * 128 + ((((k >> 3) ^ r) & 7) << 4) + ((k & 7) << 1));
}

// The page-table lookup of the box starting at token position `pos` of request b: the
// box's first cache row, or -1 (page past the table or an invalid block id).
__device__ __forceinline__ int64_t box_row(const AttentionParams& p, int b, int64_t pos) {
  const int64_t page = pos / p.block_size;
  if (page >= p.bt_cols) return -1;
  const int32_t raw = p.block_table[b * p.bt_s0 + page * p.bt_s1];
  if (raw < 0 || raw >= p.num_blocks) return -1;
  return static_cast<int64_t>(raw) * p.block_size + pos % p.block_size;
}

#if MLAKV_SM90_DEVICE
// A producer warp's boxes of tile t (its u-th, stage t % 2) of request b's split [begin,
// end): lane x < n_box gets the cache row of the tile's x-th box of br rows (-1: not
// loaded), every lane the ballot of loaded boxes, lane 0 the tile's 64-bit mask of valid
// tokens. One block-table lookup per lane covers the boxes of tiles_per_lookup of this
// stage's tiles (looked_up: the lane's box of the current round).
struct TileBoxes {
  int32_t row;  // (a TMA row coordinate: nat_supports keeps slot ids below 2^31)
  uint32_t valid;
  uint64_t mask;
};
__device__ __forceinline__ TileBoxes tile_boxes(const AttentionParams& p, int b, int64_t begin, int64_t end, int t, int u,
                                                int lane, int br, int n_box, int tiles_per_lookup, int32_t& looked_up) {
  const int64_t pos0 = begin + static_cast<int64_t>(t) * kTile;
  const int ur = u % tiles_per_lookup;
  if (ur == 0) {
    const int64_t pos = pos0 + static_cast<int64_t>(lane / n_box) * 2 * kTile + static_cast<int64_t>(lane % n_box) * br;
    looked_up = pos < end ? static_cast<int32_t>(box_row(p, b, pos)) : -1;
  }
  const int32_t got = __shfl_sync(0xFFFFFFFFu, looked_up, ur * n_box + (lane < n_box ? lane : 0));
  TileBoxes r{lane < n_box ? got : -1, 0u, 0ull};
  r.valid = __ballot_sync(0xFFFFFFFFu, r.row >= 0);
  if (lane == 0) {
    const uint64_t box_bits = br == 64 ? ~0ull : ((1ull << br) - 1);
    for (int x = 0; x < n_box; ++x) {
      if ((r.valid >> x) & 1u) r.mask |= box_bits << (x * br);
    }
    const int64_t left = end - pos0;
    if (left < kTile) r.mask &= left <= 0 ? 0ull : ((1ull << left) - 1);
  }
  return r;
}
#endif  // MLAKV_SM90_DEVICE

// ---- the quantized formats (fp8_ds_mla, nvfp4_ds_mla): the converter warps ----
// The record parts a converter stages per tile half h (latent dims 256 h .. 256 h + 255):
// kRawBoxes boxes of 128 code bytes (2-D TMA, 128-byte swizzle) into the half's last
// kRawBoxes column blocks, and one 16-byte box of the record's scale field (no swizzle,
// row t at byte 16 t) into its first; the converter of token t turns its row into bf16 in
// place (see convert_half).
template <KvFormat F>
struct Quant;
template <>
struct Quant<KvFormat::kFp8DsMla> {
  static constexpr int kRecordBytes = layout::fp8_ds_mla::kRecordBytes;
  static constexpr int kRawBoxes = 2;                    // 256 e4m3 codes per half
  static constexpr int kRopeCol = layout::fp8_ds_mla::kRopeOffset;        // bf16 rope, 128 B
  static constexpr bool kRopeConvert = false;
  static constexpr int raw_col(int h, int j) { return layout::fp8_ds_mla::kLatentOffset + 256 * h + 128 * j; }
  static constexpr int raw_block(int j) { return 1 + 2 * j; }  // box j (scale tile 2 h + j) -> blocks 2 j, 2 j + 1
  static constexpr int kScaleCol = layout::fp8_ds_mla::kScaleOffset;      // 4 fp32 tile scales (16 B): half h reads 2 h, 2 h + 1
  static_assert(layout::fp8_ds_mla::kTileDim == 128 && layout::fp8_ds_mla::kNumTiles == 4 && layout::fp8_ds_mla::kRopeOffset % 16 == 0 && layout::fp8_ds_mla::kScaleOffset % 16 == 0,
                "two 128-dim scale tiles per half, 16-byte aligned parts");
};
template <>
struct Quant<KvFormat::kNvfp4DsMla> {
  static constexpr int kRecordBytes = layout::nvfp4_ds_mla::kRecordBytes;
  static constexpr int kRawBoxes = 1;                    // 256 e2m1 codes (128 B) per half
  static constexpr int kRopeCol = layout::nvfp4_ds_mla::kRopeOffset;        // bf16 rope, 128 B
  static constexpr bool kRopeConvert = false;
  static constexpr int raw_col(int h, int /*j*/) { return layout::nvfp4_ds_mla::kLatentOffset + 128 * h; }
  static constexpr int raw_block(int /*j*/) { return 3; }
  static constexpr int kScaleCol = layout::nvfp4_ds_mla::kScaleOffset;      // half h: the 16 group scales at + 16 h
  static_assert(layout::nvfp4_ds_mla::kGroupDim == 16 && layout::nvfp4_ds_mla::kNumGroups == 32 && layout::nvfp4_ds_mla::kRopeOffset % 16 == 0 && layout::nvfp4_ds_mla::kScaleOffset % 16 == 0,
                "16 groups of 16 dims per half, 16-byte aligned parts");
};

// nvfp4_ds_mla: the K / V tile holds e2m1 * sf * 2^-7 (exact in bf16); q's latent dims and
// the output carry s_l * kNvfp4QScale.
constexpr float kNvfp4QScale = 128.0f;

// The 368-byte records: nvfp4_ds_mla's latent bytes, an 8-bit rope (e4m3 or int8) times the
// record's fp32 rope scale. One 128-byte box from byte 240 holds the rope scale (box byte
// 48) and the 64 rope codes (box bytes 64 .. 127): staged in the rope block and converted
// there in place (convert_rope).
template <KvFormat F>
struct Quant368 {
  static constexpr int kRecordBytes = layout::nvfp4_ds_mla_fp8rope::kRecordBytes;
  static constexpr int kRawBoxes = 1;
  static constexpr int kRopeCol = layout::nvfp4_ds_mla_fp8rope::kRopeOffset - 64;  // 240
  static constexpr int kRopeScaleInBox = layout::nvfp4_ds_mla_fp8rope::kRopeScaleOffset - kRopeCol;  // 48
  static constexpr bool kRopeConvert = true;
  static constexpr int raw_col(int h, int /*j*/) { return layout::nvfp4_ds_mla::kLatentOffset + 128 * h; }
  static constexpr int raw_block(int /*j*/) { return 3; }
  static constexpr int kScaleCol = layout::nvfp4_ds_mla::kScaleOffset;
  static_assert(kRecordBytes == 368 && kRopeCol % 16 == 0 && kRopeScaleInBox == 48 && kRopeCol + 128 == kRecordBytes &&
                    layout::nvfp4_ds_mla_fp8rope::kLatentOffset == layout::nvfp4_ds_mla::kLatentOffset &&
                    layout::nvfp4_ds_mla_fp8rope::kScaleOffset == layout::nvfp4_ds_mla::kScaleOffset &&
                    layout::nvfp4_ds_mla_int8rope::kRopeOffset == layout::nvfp4_ds_mla_fp8rope::kRopeOffset,
                "the box from byte 240 ends at the record's end; the latent as nvfp4_ds_mla's");
};
template <>
struct Quant<KvFormat::kNvfp4DsMlaFp8Rope> : Quant368<KvFormat::kNvfp4DsMlaFp8Rope> {};
template <>
struct Quant<KvFormat::kNvfp4DsMlaInt8Rope> : Quant368<KvFormat::kNvfp4DsMlaInt8Rope> {};
// Whether the format's rope is converted by the converter warps (the 368-byte records).
template <KvFormat F>
constexpr bool rope_converted() {
  if constexpr (F == KvFormat::kBf16) return false;
  else return Quant<F>::kRopeConvert;
}
// The e2m1 latent formats (the tile holds e2m1 * sf * 2^-7; q and the output carry s_l * 2^7).
template <KvFormat F>
constexpr bool kNatE2m1 = F == KvFormat::kNvfp4DsMla || F == KvFormat::kNvfp4DsMlaFp8Rope || F == KvFormat::kNvfp4DsMlaInt8Rope;

#ifdef MLAKV_NAT_TRACE
// A measurement build only (-DMLAKV_NAT_TRACE): clock64 stamps of CTA (0, 0, 0)'s first
// kTraceTiles tiles, [tile][part][event]: 0 the part's load issued (or, sparse, its gathers
// started), 1 its bytes staged, 2 converted (converter thread 0 of the stage), 4 + wg its
// full barrier seen by warpgroup wg, 6 + wg released by wg. nat_launch prints them to
// stderr at a format's 12th launch (NATTRACE format sparse tile part event cycles;
// tools/nat_trace.py tabulates the chain).
constexpr int kTraceTiles = 32, kTraceEvents = 8, kTraceSlots = kTraceTiles * kParts * kTraceEvents;
__device__ unsigned long long g_nat_trace[kTraceSlots];
#endif
#if MLAKV_SM90_DEVICE
__device__ __forceinline__ float2 f16x2_to_f32x2(uint32_t x) {
  float lo, hi;
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, h;\n}\n" : "=f"(lo), "=f"(hi) : "r"(x));
  return make_float2(lo, hi);
}
// Four e4m3 codes (dim i in byte i) times the tile scale s as bf16 (2 words, dim 2i in the
// low half of word i): e4m3 -> f16 is exact, the product rounds to fp32 and then to bf16
// (RNE): bf16(e4m3 * s), the reference decode's value rounded as the bf16 emulation does.
__device__ __forceinline__ void e4m3x4_to_bf16(uint32_t w, float s, uint32_t& lo, uint32_t& hi) {
  const float2 a = f16x2_to_f32x2(ptx::e4m3x2_to_f16x2(w)), b = f16x2_to_f32x2(ptx::e4m3x2_hi_to_f16x2(w));
  lo = mlakv::cuda::ptx::pack_bf16x2(a.x * s, a.y * s);
  hi = mlakv::cuda::ptx::pack_bf16x2(b.x * s, b.y * s);
}
// Eight e2m1 codes (a word, dim i in nibble i) as bf16(e2m1 * sf * 2^-7), exactly, given
// sc = bf16x2(sf * 2^119, sf * 2^119): each pair of nibbles (J, J + 4) becomes a bf16x2 of
// e2m1 * 2^-126 (exact, ptx::e2m1_pair_bf16), times sc e2m1 * sf * 2^-7 (exact: 2 x 4
// significant bits, at least 2^-17; the subnormal input 2^-127 is multiplied as it is).
// Word J holds dims (J, J + 4): the e2m1 formats' tile keeps each 8-dim chunk's latent
// dims in the order 0, 4, 1, 5, 2, 6, 3, 7 (kE2m1Perm), q's latent dims are stored in that
// order too and the output is written back in dim order, so no repacking is needed. The
// outer scale s_l and the 2^7 are applied to q's latent dims and to the output instead
// (kNvfp4QScale).
__device__ __forceinline__ uint4 e2m1x8_to_bf16(uint32_t w, uint32_t sc) {
  return make_uint4(ptx::hmul2_bf16(ptx::e2m1_pair_bf16<0>(w), sc), ptx::hmul2_bf16(ptx::e2m1_pair_bf16<1>(w), sc),
                    ptx::hmul2_bf16(ptx::e2m1_pair_bf16<2>(w), sc), ptx::hmul2_bf16(ptx::e2m1_pair_bf16<3>(w), sc));
}

// Converts token t's latent half staged in the part at `pb` (4 column blocks, the 128-byte
// swizzled bf16 tile layout) in place, two converters per token (role r = 0, 1: the half's
// dims 128 r .. 128 r + 127, output blocks 2 r, 2 r + 1): the raw code boxes sit in the
// part's blocks Quant<F>::raw_block, the scale box's row t at pb + 16 t. Each reads its
// scales, waits for the stage's other converters to have read theirs (`bar`, 128 threads:
// the first outputs overwrite the scale box), then walks its code chunks in order; each
// output chunk lands only on code chunks of its own row that it has already read (fp8:
// box r in block 1 + 2 r, chunk x -> block 2 r + x / 4, chunks 2 (x % 4), + 1; e2m1: codes
// in block 3, chunk x -> block x / 2, chunks 4 (x % 2) ..; role 1's chunk 6 lands on role
// 0's codes, after role 0 has read them (the mbarrier `read_a`: role 0's 64 threads arrive
// once per e2m1 half, role 1 waits for the phase `read_a_phase`).
#ifndef MLAKV_NAT_FP8_BATCH
#define MLAKV_NAT_FP8_BATCH 2
#endif
// fp8 code chunks loaded together (1, 2 or 4): 2 in the converters' 32 registers (the e2m1
// converters load 2 at a time).
constexpr int kFp8ConvBatch = MLAKV_NAT_FP8_BATCH;
// Sixteen 8-bit rope codes (a 16-byte chunk: e4m3, or int8 for nvfp4_ds_mla_int8rope) times the
// rope scale rs as bf16, two 16-byte output chunks: bf16(code * rs), the reference decode
// rounded as the bf16 emulation does.
template <KvFormat F>
__device__ __forceinline__ void rope8x16_to_bf16(const uint4& v, float rs, uint4& lo, uint4& hi) {
  namespace gp = mlakv::cuda::ptx;
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float x[4];
    if constexpr (F == KvFormat::kNvfp4DsMlaInt8Rope) {
#pragma unroll
      for (int k = 0; k < 4; ++k) x[k] = static_cast<float>(static_cast<int32_t>(w[i] << (24 - 8 * k)) >> 24);
    } else {
      const float2 a = f16x2_to_f32x2(ptx::e4m3x2_to_f16x2(w[i])), b2 = f16x2_to_f32x2(ptx::e4m3x2_hi_to_f16x2(w[i]));
      x[0] = a.x, x[1] = a.y, x[2] = b2.x, x[3] = b2.y;
    }
    o[2 * i] = gp::pack_bf16x2(x[0] * rs, x[1] * rs);
    o[2 * i + 1] = gp::pack_bf16x2(x[2] * rs, x[3] * rs);
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}
// The 368-byte records: converts token t's 8-bit rope staged in the rope block at `rb` (one
// 128-byte box row from record byte 240, 128-byte swizzle) in place to 64 bf16, two
// converters per token: role r turns code chunks 4 + 2 r, 5 + 2 r (dims 32 r .. 32 r + 31)
// into output chunks 4 r .. 4 r + 3. Both read the scale (chunk 3) and their codes before
// the stage's barrier `bar` (128 threads): role 0's outputs overwrite the scale, role 1's
// role 0's codes. bf16(e4m3 * rs) or bf16(int8 * rs), the reference decode rounded as the
// bf16 emulation does.
template <KvFormat F>
__device__ __forceinline__ void convert_rope(uint8_t* rb, int t, int r, int bar) {
  const int sw = t & 7;
  uint8_t* row = rb + t * 128;
  auto chunk = [&](int c) __attribute__((always_inline)) { return row + ((c ^ sw) << 4); };
  const float rs = *reinterpret_cast<const float*>(chunk(Quant<F>::kRopeScaleInBox / 16) + Quant<F>::kRopeScaleInBox % 16);
  uint4 v[2];
#pragma unroll
  for (int q = 0; q < 2; ++q) v[q] = *reinterpret_cast<const uint4*>(chunk(4 + 2 * r + q));
  ptx::named_barrier(bar, 128);
#pragma unroll
  for (int q = 0; q < 2; ++q) {  // code chunk 4 + 2 r + q: dims 16 (2 r + q) .. + 15 -> output chunks 2 (2 r + q), + 1
    uint4 lo, hi;
    rope8x16_to_bf16<F>(v[q], rs, lo, hi);
    const int c = 2 * (2 * r + q);
    *reinterpret_cast<uint4*>(chunk(c)) = lo;
    *reinterpret_cast<uint4*>(chunk(c + 1)) = hi;
  }
}

template <KvFormat F>
__device__ __forceinline__ void convert_half(uint8_t* pb, int t, int r, int h, int bar, uint32_t read_a, uint32_t read_a_phase) {
  const int sw = t & 7;
  uint8_t* row = pb + t * 128;
  auto chunk = [&](int blk, int c) __attribute__((always_inline)) { return row + blk * kBlockBytes + ((c ^ sw) << 4); };
  if constexpr (F == KvFormat::kFp8DsMla) {
    // Role r: code box r (tile scale 2 h + r, staged in block 1 + 2 r) -> blocks 2 r, 2 r + 1.
    const float s = *reinterpret_cast<const float*>(pb + t * 16 + 8 * h + 4 * r);
    ptx::named_barrier(bar, 128);  // every converter of the stage has read its scale
    constexpr int kB = kFp8ConvBatch;
    static_assert(kB == 1 || kB == 2 || kB == 4);
    const int cb = Quant<F>::raw_block(r);
#pragma unroll
    for (int g = 0; g < 8 / kB; ++g) {
      uint4 v[kB];
#pragma unroll
      for (int i = 0; i < kB; ++i) v[i] = *reinterpret_cast<const uint4*>(chunk(cb, kB * g + i));
#pragma unroll
      for (int i = 0; i < kB; ++i) {
        uint32_t o[8];
        e4m3x4_to_bf16(v[i].x, s, o[0], o[1]);
        e4m3x4_to_bf16(v[i].y, s, o[2], o[3]);
        e4m3x4_to_bf16(v[i].z, s, o[4], o[5]);
        e4m3x4_to_bf16(v[i].w, s, o[6], o[7]);
        const int x = kB * g + i, blk = 2 * r + (x >> 2), c0 = 2 * (x & 3);
        *reinterpret_cast<uint4*>(chunk(blk, c0)) = make_uint4(o[0], o[1], o[2], o[3]);
        *reinterpret_cast<uint4*>(chunk(blk, c0 + 1)) = make_uint4(o[4], o[5], o[6], o[7]);
      }
    }
  } else {
    static_assert(kNatE2m1<F>);
    // Role r: code chunks 4 r .. 4 r + 3 of block 3 (groups 16 h + 8 r ..) -> blocks 2 r, 2 r + 1.
    const uint2 gsc = *reinterpret_cast<const uint2*>(pb + t * 16 + 8 * r);
    ptx::named_barrier(bar, 128);  // every converter of the stage has read its scales
    auto convert = [&](const uint4& v, int x) __attribute__((always_inline)) {  // code chunk x: dims 32 x .. 32 x + 31
      // (sf0, sf1) exactly in f16, then sf * 2^119 (at most 448 * 2^119 < 2^128) as bf16x2 pairs
      const uint32_t gw = (x & 2) ? gsc.y : gsc.x;
      const float2 sf = f16x2_to_f32x2((x & 1) ? ptx::e4m3x2_hi_to_f16x2(gw) : ptx::e4m3x2_to_f16x2(gw));
      const uint32_t sa = mlakv::cuda::ptx::pack_bf16x2(sf.x * 0x1p119f, sf.x * 0x1p119f);
      const uint32_t sb = mlakv::cuda::ptx::pack_bf16x2(sf.y * 0x1p119f, sf.y * 0x1p119f);
      const int blk = x >> 1, c0 = 4 * (x & 1);
      *reinterpret_cast<uint4*>(chunk(blk, c0 + 0)) = e2m1x8_to_bf16(v.x, sa);
      *reinterpret_cast<uint4*>(chunk(blk, c0 + 1)) = e2m1x8_to_bf16(v.y, sa);
      *reinterpret_cast<uint4*>(chunk(blk, c0 + 2)) = e2m1x8_to_bf16(v.z, sb);
      *reinterpret_cast<uint4*>(chunk(blk, c0 + 3)) = e2m1x8_to_bf16(v.w, sb);
    };
    // Chunk x's outputs land on block x / 2: role 0's on blocks 0, 1 (no codes), role 1's
    // chunk 7 on its own chunks 4..7 of block 3, chunk 6 on role 0's chunks 0..3 - after
    // role 0 has read them (read_a).
    if (r == 0) {
      uint4 a = *reinterpret_cast<const uint4*>(chunk(3, 0)), b = *reinterpret_cast<const uint4*>(chunk(3, 1));
      convert(a, 0);
      convert(b, 1);
      a = *reinterpret_cast<const uint4*>(chunk(3, 2)), b = *reinterpret_cast<const uint4*>(chunk(3, 3));
      ptx::mbar_arrive(read_a);
      convert(a, 2);
      convert(b, 3);
    } else {
      uint4 a = *reinterpret_cast<const uint4*>(chunk(3, 4)), b = *reinterpret_cast<const uint4*>(chunk(3, 5));
      convert(a, 4);
      convert(b, 5);
      a = *reinterpret_cast<const uint4*>(chunk(3, 6)), b = *reinterpret_cast<const uint4*>(chunk(3, 7));
      convert(b, 7);
      ptx::mbar_wait(read_a, read_a_phase);
      convert(a, 6);
    }
  }
}

// Q of the CTA's 64 rows into shared memory: bf16, swizzled K-major (kQBytes at qs);
// thread ctid (of 256) writes row ctid / 4's chunks ctid % 4 + 4 k. The e2m1 formats' latent
// dims carry s_l * 2^7 and each 8-dim chunk's dims in the tile's order (kE2m1Perm). Ends
// with the proxy fence; the caller's barrier publishes it.
template <KvFormat F>
__device__ __forceinline__ void load_q(const AttentionParams& p, const CtaWork& cw, int b, uint8_t* qs, int ctid) {
  namespace gp = mlakv::cuda::ptx;
  const int r = ctid >> 2, sub = ctid & 3;
  const bool ok = cw.row0 + r < cw.rows_req;
  const int rc = ok ? r : 0;
  const int64_t off = b * p.q_s0 + static_cast<int64_t>(cw.query(p, rc)) * p.q_s1 + static_cast<int64_t>(cw.head(p, rc)) * p.q_s2;
  // 16-byte loads where the row is 16-byte aligned (the usual contiguous q), else scalar
  // ones (any q stride).
  const uintptr_t qbase = reinterpret_cast<uintptr_t>(p.q);
  const bool vec = p.q_bf16 ? ((qbase + 2 * off) & 15) == 0 : ((qbase + 4 * off) & 15) == 0;
#pragma unroll 2
  for (int k = 0; k < kQkDim / 8 / 4; ++k) {
    const int ch = sub + 4 * k;  // 16-byte chunk: dims 8 ch .. 8 ch + 7
    const int64_t d0 = off + 8 * ch;
    // The e2m1 formats: the latent dims carry s_l * 2^7 (the K tile holds e2m1 * sf * 2^-7):
    // bf16(q * s_l * 2^7), from f32 q before its rounding, from bf16 q after it.
    const float ms = kNatE2m1<F> && ch < kLatentDim / 8 ? p.outer_scale * kNvfp4QScale : 1.0f;
    uint32_t v[4];
    if (vec && p.q_bf16) {
      const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.q) + d0);
      v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
    } else if (vec) {
      const float4 lo = *reinterpret_cast<const float4*>(static_cast<const float*>(p.q) + d0);
      const float4 hi = *reinterpret_cast<const float4*>(static_cast<const float*>(p.q) + d0 + 4);
      v[0] = gp::pack_bf16x2(lo.x * ms, lo.y * ms), v[1] = gp::pack_bf16x2(lo.z * ms, lo.w * ms);
      v[2] = gp::pack_bf16x2(hi.x * ms, hi.y * ms), v[3] = gp::pack_bf16x2(hi.z * ms, hi.w * ms);
    } else {
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int64_t d = d0 + 2 * x;
        if (p.q_bf16) {
          const uint16_t* q16 = static_cast<const uint16_t*>(p.q);
          v[x] = static_cast<uint32_t>(q16[d]) | (static_cast<uint32_t>(q16[d + 1]) << 16);
        } else {
          const float* q32 = static_cast<const float*>(p.q);
          v[x] = gp::pack_bf16x2(q32[d] * ms, q32[d + 1] * ms);
        }
      }
    }
    if constexpr (kNatE2m1<F>) {
      if (p.q_bf16 && ms != 1.0f) {
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          v[x] = gp::pack_bf16x2(__uint_as_float(v[x] << 16) * ms, __uint_as_float(v[x] & 0xFFFF0000u) * ms);
        }
      }
    }
    if constexpr (kNatE2m1<F>) {
      if (ch < kLatentDim / 8) {  // the e2m1 tile's dim order in a chunk: 0, 4, 1, 5, 2, 6, 3, 7
        const uint32_t v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3];
        v[0] = ptx::prmt(v0, v2, 0x5410), v[1] = ptx::prmt(v0, v2, 0x7632);
        v[2] = ptx::prmt(v1, v3, 0x5410), v[3] = ptx::prmt(v1, v3, 0x7632);
      }
    }
#pragma unroll
    for (int x = 0; x < 4; ++x) v[x] = ok ? v[x] : 0u;
    *reinterpret_cast<uint4*>(qs + (ch >> 3) * kQBlockBytes + sw128(r, 8 * (ch & 7))) = make_uint4(v[0], v[1], v[2], v[3]);
  }
  ptx::fence_proxy_async();
}

// The row sums of a thread's two rows over its quad (the four threads holding a row).
__device__ __forceinline__ void quad_row_sums(const float (&in)[2], float (&out)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = in[h];
    l += __shfl_xor_sync(0xFFFFFFFFu, l, 1);
    l += __shfl_xor_sync(0xFFFFFFFFu, l, 2);
    out[h] = l;
  }
}

// Writes this thread's two rows (ra, rb) of a consumer warpgroup's O half (wg: dims 256 wg ..)
// as O / l, and their LSE m + log2 l (log2 domain) where write_lse; rows past the request are
// skipped. The e2m1 formats: V holds e2m1 * sf * 2^-7, so s_l * 2^7 comes back here, and the
// tile's columns 8 j + 2 c, 8 j + 2 c + 1 hold dims 8 j + c, 8 j + c + 4.
// row_sum(h, r): row r's sum l (read only for rows of the request).
template <KvFormat F, class RowSum>
__device__ __forceinline__ void store_rows(const AttentionParams& p, const CtaWork& cw, int b, int split, const float (&o)[128],
                                           RowSum&& row_sum, const float (&m)[2], int ra, int rb, int wg, int c, bool write_lse) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = h ? rb : ra;
    const float l = row_sum(h, r);
    if (cw.row0 + r >= cw.rows_req) continue;
    const bool is_empty = l == 0.0f;
    const float inv_l = is_empty ? 0.0f : (kNatE2m1<F> ? p.outer_scale * kNvfp4QScale : 1.0f) / l;
    const float lse = is_empty ? -INFINITY : (m[h] + log2f(l)) * kLn2;
    const int i = cw.query(p, r), hh = cw.head(p, r);
    float* dst = result_row(p, b, split, i, hh, lse, write_lse);
    dst += 256 * wg + 2 * c;
    if constexpr (kNatE2m1<F>) {
      float* d = dst - c;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        d[8 * j] = o[4 * j + 2 * h] * inv_l;
        d[8 * j + 4] = o[4 * j + 2 * h + 1] * inv_l;
      }
    } else if ((reinterpret_cast<uintptr_t>(dst) & 7) == 0) {
      // 8-byte stores: a quad writes whole 32-byte sectors.
#pragma unroll
      for (int j = 0; j < 32; ++j) *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * h] * inv_l, o[4 * j + 2 * h + 1] * inv_l);
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        dst[8 * j] = o[4 * j + 2 * h] * inv_l;
        dst[8 * j + 1] = o[4 * j + 2 * h + 1] * inv_l;
      }
    }
  }
}

// Sparse sets: the slot of position pos of query i's top-k list (-1: past the split or an
// invalid index, which the tile's mask drops).
__device__ __forceinline__ int32_t sparse_slot(const AttentionParams& p, int b, int i, int64_t pos, int64_t end) {
  if (pos >= end) return -1;
  const int32_t raw = p.indices[b * p.ix_s0 + i * p.ix_s1 + pos * p.ix_s2];
  return raw >= 0 && raw < p.num_slots ? raw : -1;
}

// One 16-byte gather with cp.async's L2::128B prefetch-size hint: a record's rows are
// 128-byte runs that start 16-byte aligned, so the hint has L2 fetch the whole line on the
// first chunk's miss (1.5-3% faster sparse steps than without it, 256B no better: docs/perf.md,
// tenth session).
__device__ __forceinline__ void gather_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
// A sparse set's rope block: a bf16 one (no conversion) is signalled by its copies'
// completion instead of a wait by its converters (kSparseRopeAsync); an 8-bit one (the
// 368-byte records) is converted after the next part's gathers are issued (kSparseRopeLate).
// Each 1-2% faster than waiting for the rope's copies first (docs/perf.md, tenth session).
template <KvFormat F>
constexpr bool kSparseRopeAsync = F != KvFormat::kBf16 && !rope_converted<F>();
template <KvFormat F>
constexpr bool kSparseRopeLate = F != KvFormat::kBf16 && rope_converted<F>();
// Sparse sets have no pages for TMA boxes: each converter gathers its share of its token
// t's bytes of `part` (slot: -1 for none) with 16-byte cp.async copies to where the dense
// path's boxes put them (the 128-byte swizzle for the code and rope rows, the scale field
// unswizzled at byte 16 t of the half's first block), so the conversions are the dense
// ones. Role r copies fp8 code box r, the e2m1 code chunks 4 r .. 4 r + 3 and the rope
// box's chunks 4 r .. 4 r + 3; role 0 the scale field. (Coalesced lanes - consecutive lanes
// on consecutive chunks of one record -, L2 prefetches a tile ahead and the next part's
// gathers issued early were each slower: docs/perf.md, ninth session.)
template <KvFormat F>
__device__ __forceinline__ void sparse_gather(const uint8_t* cache, int32_t slot, uint8_t* stage, int part, int t, int r) {
  using Q = Quant<F>;
  namespace gp = mlakv::cuda::ptx;
  if (slot < 0) return;
  const uint8_t* rec = cache + static_cast<int64_t>(slot) * Q::kRecordBytes;
  const int sw = t & 7;
  // m chunks c0 .. c0 + m - 1 of the row at byte `col` of the record into row t at `dst`.
  auto copy_row = [&](uint8_t* dst, int col, int c0, int m) __attribute__((always_inline)) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (i < m) gather_16(gp::smem_addr(dst + t * 128 + (((c0 + i) ^ sw) << 4)), rec + col + 16 * (c0 + i));
    }
  };
  if (part == kPartRope) {
    copy_row(stage + 8 * kBlockBytes, Q::kRopeCol, 4 * r, 4);
    return;
  }
  const int h = part - kPartL;
  uint8_t* pb = stage + 4 * h * kBlockBytes;
  if constexpr (F == KvFormat::kFp8DsMla) {
    copy_row(pb + Q::raw_block(r) * kBlockBytes, Q::raw_col(h, r), 0, 8);
  } else {
    copy_row(pb + Q::raw_block(0) * kBlockBytes, Q::raw_col(h, 0), 4 * r, 4);
  }
  if (r == 0) gather_16(gp::smem_addr(pb + t * 16), rec + Q::kScaleCol + (F == KvFormat::kFp8DsMla ? 0 : 16 * h));
}
#endif  // MLAKV_SM90_DEVICE

}  // namespace nat

// F = bf16: tmap is the cache as [num_slots, 576] bf16 (box 64 dims, 128-byte swizzle) and
// tmap16 unused. The quantized formats (Quant<F>): tmap is the cache as [num_slots,
// record_bytes] bytes with boxes of 128 bytes (128-byte swizzle: the rope and the code
// boxes), tmap16 the same bytes with boxes of 16 (no swizzle: the scale field).
template <KvFormat F, bool kSparse = false>
__global__ void __launch_bounds__(nat::kThreadsOf<F>, 1)
    attention_nat_kernel(const __grid_constant__ kernels::AttentionParams p, const __grid_constant__ CUtensorMap tmap,
                         const __grid_constant__ CUtensorMap tmap16) {
#if MLAKV_SM90_DEVICE
  using namespace nat;
  namespace gp = mlakv::cuda::ptx;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // The swizzled blocks need 1024-byte alignment.
  uint8_t* smem = smem_raw + ((1024 - (gp::smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* qs = smem;
  uint8_t* p0s = qs + kQBytes;               // P_a e^(m0 - m1), written by warpgroup 0
  uint8_t* p1s = qs + 8 * kQBlockBytes;      // P_b, written by warpgroup 1 (Q's rope block)
  uint8_t* ring = p0s + kQBlockBytes;
  uint8_t* misc = ring + kStages * kStageBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(misc);  // full[part * 2 + stage]
  uint64_t* empty = full + kParts * kStages;
  uint64_t* m0_ready = empty + kParts * kStages;  // [0] -> [1]: m0, e^(m - m0) of step j
  uint64_t* s1_ready = m0_ready + 1;              // [1] -> [0]: m1, e^(m0 - m1)
  uint64_t* p0_ready = s1_ready + 1;              // [0] -> [1]: P_a in p0s
  uint64_t* p1_ready = p0_ready + 1;              // [1] -> [0]: P_b in p1s
  uint64_t* l_ready = p1_ready + 1;               // both: the final row sums
  uint64_t* vmask = l_ready + 1;                  // vmask[stage]: the tile's valid tokens
  float* sm0 = reinterpret_cast<float*>(vmask + kStages);
  float* ss0 = sm0 + 64;
  float* sm1 = ss0 + 64;
  float* ss1 = sm1 + 64;
  float* sl = ss1 + 64;  // sl[wg * 64 + row]
  uint64_t* staged = reinterpret_cast<uint64_t*>(sl + 2 * 64);  // staged[(part - 1) * 2 + stage]; staged[4 + stage]: the rope
  constexpr bool kQuant = F != KvFormat::kBf16;
  constexpr bool kRopeConv = rope_converted<F>();

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int split = blockIdx.z;
#ifdef MLAKV_NAT_TRACE
  const bool tracer = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
  auto tr = [&](bool who, int t, int part, int ev) __attribute__((always_inline)) {
    if (who && tracer && t < kTraceTiles) g_nat_trace[(t * kParts + part) * kTraceEvents + ev] = clock64();
  };
#else
  auto tr = [](bool, int, int, int) __attribute__((always_inline)) {};
#endif
  const CtaWork cw = cta_work<kRows, kTile, kTile>(p);
  const int b = cw.b;
  const int64_t begin = cw.begin, end = cw.end;
  const int n_tiles = cw.n_tiles;
  const int n_steps = (n_tiles + 1) / 2;  // two tiles per step; an odd count's last b tile is empty

  if (tid == 0) {
    for (int i = 0; i < kParts * kStages; ++i) {
      // A converted part (the quantized formats' V halves, the 368-byte ropes) is full when
      // the stage's 128 converters arrive.
      // So is a sparse set's rope block: its 128 converters gather it (sparse_gather); a
      // bf16 one counts their copies' completions and the two vmask writers' arrivals (130).
      ptx::mbar_init(gp::smem_addr(&full[i]), (kQuant && i >= kPartL * kStages) || ((kRopeConv || kSparse) && i < kStages)
                                                   ? (kSparse && kSparseRopeAsync<F> && i < kStages ? 130 : 128)
                                                   : 1);
      ptx::mbar_init(gp::smem_addr(&empty[i]), 128);
    }
    for (int i = 0; i < 3 * kStages; ++i) ptx::mbar_init(gp::smem_addr(&staged[i]), 1);
    for (int i = 3 * kStages; i < 4 * kStages; ++i) ptx::mbar_init(gp::smem_addr(&staged[i]), 64);
    for (uint64_t* bar = m0_ready; bar != l_ready; ++bar) ptx::mbar_init(gp::smem_addr(bar), 128);
    ptx::mbar_init(gp::smem_addr(l_ready), 256);
    ptx::mbar_init_fence();
  }
  __syncthreads();

  if constexpr (kQuant) {
    if (warp >= kConsumerWarps) {
      ptx::setmaxnreg_dec<kConverterRegs>();
      // ---- stage k's four converter warps 8 + 4 k .. 11 + 4 k: the first also walks the
      // block table and issues the TMA boxes; thread ct converts part ct / 64 of token ct % 64
      // of each tile half (and rope) ----
      using Q = Quant<F>;
      const int k = (warp - kConsumerWarps) >> 2, ct = ((warp - kConsumerWarps) & 3) * 32 + lane;
      const int tok = ct & 63, role = ct >> 6;
      const bool issuer = ((warp - kConsumerWarps) & 3) == 0;
      const int br = p.block_size < kTile ? p.block_size : kTile;
      const int n_box = kTile / br;
      const int tiles_per_lookup = 32 / n_box;
      if (issuer && lane == 0 && !kSparse) {
        ptx::prefetch_tensormap(&tmap);
        ptx::prefetch_tensormap(&tmap16);
      }
      int32_t looked_up = -1;
      uint8_t* stage = ring + k * kStageBytes;
      // Sparse sets: this thread's token of the stage's next tile, looked up a tile ahead.
      int32_t next_slot = kSparse ? sparse_slot(p, b, cw.i_fixed, begin + static_cast<int64_t>(k) * kTile + tok, end) : -1;
      for (int u = 0; 2 * u + k < 2 * n_steps; ++u) {
        const int t = 2 * u + k;
        TileBoxes tb{-1, 0u, 0ull};
        int32_t slot = -1;
        if constexpr (kSparse) {
          slot = next_slot;
          next_slot = sparse_slot(p, b, cw.i_fixed, begin + static_cast<int64_t>(t + 2) * kTile + tok, end);
        } else if (issuer) {
          tb = tile_boxes(p, b, begin, end, t, u, lane, br, n_box, tiles_per_lookup, looked_up);
        }
        const int32_t row = tb.row;
        const uint32_t valid = tb.valid;
#pragma unroll 1
        for (int o = 0; o < 3; ++o) {
          // The parts in the order they are released: the rope block, then the half of the
          // warpgroup that computed the scores (its P V comes first), then the other.
          const int part = o == 0 ? kPartRope : ((o == 1) == (k == 0) ? kPartL : kPartR);
          if constexpr (kSparse) {
            // Every converter gathers its share of its token's bytes (sparse_gather), waits
            // for its copies, and the stage's 128 meet before reading each other's.
            if (u >= 1) ptx::mbar_wait(gp::smem_addr(&empty[part * kStages + k]), (u - 1) & 1);
            tr(ct == 0, t, part, 0);
            if (part == kPartRope) {
              const uint32_t vb = __ballot_sync(0xFFFFFFFFu, slot >= 0);
              if (role == 0 && lane == 0) reinterpret_cast<uint32_t*>(&vmask[k])[tok >> 5] = vb;
            }
            sparse_gather<F>(p.cache, slot, stage, part, tok, role);
            if constexpr (kSparseRopeAsync<F>) {
              if (part == kPartRope) {
                // A bf16 rope needs no conversion: the copies arrive on the stage's full
                // barrier when they land (cp.async.mbarrier.arrive.noinc; the two vmask
                // writers arrive as well, after their store), so the converter goes on to the
                // next part's release without waiting for them.
                const uint32_t bar = gp::smem_addr(&full[kPartRope * kStages + k]);
                if (role == 0 && lane == 0) ptx::mbar_arrive(bar);
                asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
                continue;
              }
            }
            if constexpr (kSparseRopeLate<F>) {
              // An 8-bit rope (converted): its copies form one commit group, the next part's
              // another; the rope is converted once its group has landed, after the next
              // part's gathers are issued, so that part's copies are not held up behind the
              // rope's (the consumers need all three parts for the next scores anyway).
              asm volatile("cp.async.commit_group;\n" ::: "memory");
              if (part == kPartRope) continue;
              if (o == 1) {
                asm volatile("cp.async.wait_group 1;\n" ::: "memory");
                ptx::named_barrier(kBarConv + k, 128);
                convert_rope<F>(stage + 8 * kBlockBytes, tok, role, kBarConv + k);
                ptx::fence_proxy_async();
                ptx::mbar_arrive(gp::smem_addr(&full[kPartRope * kStages + k]));
              }
            }
            gp::cp_async_wait_all();  // (a V half: the rope continued above)
            ptx::named_barrier(kBarConv + k, 128);
            tr(ct == 0, t, part, 1);
          } else if (issuer) {
            if (u >= 1) ptx::mbar_wait(gp::smem_addr(&empty[part * kStages + k]), (u - 1) & 1);
            tr(ct == 0, t, part, 0);
            if (part == kPartRope) {
              // bf16 ropes land as they are used; an 8-bit rope is staged for the converters
              const uint32_t bar = gp::smem_addr(kRopeConv ? &staged[2 * kStages + k] : &full[kPartRope * kStages + k]);
              if (lane == 0) {
                vmask[k] = tb.mask;
                ptx::mbar_arrive_expect_tx(bar, static_cast<uint32_t>(__popc(valid)) * br * 128);
              }
              __syncwarp();
              if (row >= 0) {
                ptx::tma_load_2d(gp::smem_addr(stage + 8 * kBlockBytes + lane * br * 128), &tmap, Q::kRopeCol,
                                 static_cast<int>(row), bar);
              }
            } else {
              const int h = part - kPartL;
              const uint32_t bar = gp::smem_addr(&staged[h * kStages + k]);
              uint8_t* pb = stage + 4 * h * kBlockBytes;
              if (lane == 0) ptx::mbar_arrive_expect_tx(bar, static_cast<uint32_t>(__popc(valid)) * br * (Q::kRawBoxes * 128 + 16));
              __syncwarp();
              if (row >= 0) {
#pragma unroll
                for (int j = 0; j < Q::kRawBoxes; ++j) {
                  ptx::tma_load_2d(gp::smem_addr(pb + Q::raw_block(j) * kBlockBytes + lane * br * 128), &tmap,
                                   Q::raw_col(h, j), static_cast<int>(row), bar);
                }
                ptx::tma_load_2d(gp::smem_addr(pb + lane * br * 16), &tmap16, Q::kScaleCol + (F == KvFormat::kFp8DsMla ? 0 : 16 * h),
                                 static_cast<int>(row), bar);
              }
            }
          }
          if (kRopeConv && part == kPartRope) {
            if (!kSparse) ptx::mbar_wait(gp::smem_addr(&staged[2 * kStages + k]), u & 1);
            if constexpr (kRopeConv) convert_rope<F>(stage + 8 * kBlockBytes, tok, role, kBarConv + k);
            ptx::fence_proxy_async();
            ptx::mbar_arrive(gp::smem_addr(&full[kPartRope * kStages + k]));
          }
          if (part != kPartRope) {
            const int h = part - kPartL;
            if (!kSparse) ptx::mbar_wait(gp::smem_addr(&staged[h * kStages + k]), u & 1);
            tr(!kSparse && ct == 0, t, part, 1);
#ifndef MLAKV_NAT_ABLATE_CONVERT
            // read_a completes once per converted half: this crew's (2 u + o - 1)-th.
            convert_half<F>(stage + 4 * h * kBlockBytes, tok, role, h, kBarConv + k, gp::smem_addr(&staged[3 * kStages + k]),
                            static_cast<uint32_t>(o - 1));
#endif
            tr(ct == 0, t, part, 2);
            ptx::fence_proxy_async();
            ptx::mbar_arrive(gp::smem_addr(&full[part * kStages + k]));
          }
        }
      }
      return;
    }
  } else if (warp >= kConsumerWarps) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (warp >= kConsumerWarps + kStages) return;
    // ---- producer of stage k: one lane per box of the tile ----
    const int k = warp - kConsumerWarps;
    const int br = p.block_size < kTile ? p.block_size : kTile;  // box rows (launch_nat.h: 8, 16, 32 or 64)
    const int n_box = kTile / br;                                // boxes per tile: 8, 4, 2 or 1
    const int tiles_per_lookup = 32 / n_box;                     // this stage's tiles one lookup round covers
    if (lane == 0) ptx::prefetch_tensormap(&tmap);
    // The parts in the order they are released: the rope block after the scores, then the
    // V half of the warpgroup that computed the scores (its P V comes first).
    const int order[3] = {kPartRope, k == 0 ? kPartL : kPartR, k == 0 ? kPartR : kPartL};
    int32_t looked_up = -1;  // this lane's box of the current lookup round

    for (int u = 0; 2 * u + k < 2 * n_steps; ++u) {
      const int t = 2 * u + k;
      const TileBoxes tb = tile_boxes(p, b, begin, end, t, u, lane, br, n_box, tiles_per_lookup, looked_up);
      const int32_t row = tb.row;
      const uint32_t valid = tb.valid;
      const uint64_t mask = tb.mask;
      const uint32_t dst = gp::smem_addr(ring + k * kStageBytes + lane * br * 128);
#pragma unroll
      for (int o = 0; o < 3; ++o) {
        const int part = order[o];
        if (u >= 1) ptx::mbar_wait(gp::smem_addr(&empty[part * kStages + k]), (u - 1) & 1);
        const uint32_t bar = gp::smem_addr(&full[part * kStages + k]);
        const int nb = part == kPartRope ? 1 : 4;
        const int blk0 = part == kPartRope ? 8 : (part == kPartL ? 0 : 4);
        if (lane == 0) {
          if (part == kPartRope) vmask[k] = mask;
          ptx::mbar_arrive_expect_tx(bar, static_cast<uint32_t>(__popc(valid)) * nb * br * 128);
        }
        __syncwarp();
        if (row >= 0) {
          for (int x = 0; x < nb; ++x) {
            ptx::tma_load_2d(dst + (blk0 + x) * kBlockBytes, &tmap, 64 * (blk0 + x), static_cast<int>(row), bar);
          }
        }
      }
    }
    return;
  }
  ptx::setmaxnreg_inc<kQuant ? kQuantConsumerRegs : kConsumerRegs>();

  // wg through a shuffle from lane 0: ptxas then knows it is warp-uniform and keeps the
  // descriptors built from it in uniform registers (no per-wgmma R2UR).
  const int wg = __shfl_sync(0xFFFFFFFFu, warp >> 2, 0), w = warp & 3, ctid = tid & 255, g = lane >> 2, c = lane & 3;
  const bool lead = (tid & 127) == 0;  // the trace's thread of each warpgroup
  load_q<F>(p, cw, b, qs, ctid);
  ptx::named_barrier(kBarAll, 256);

  const int r0 = 16 * w + g;  // this thread's rows: r0, r0 + 8
  // Q's rope block as the A fragments of the rope k-steps (its shared memory then holds P_b).
  uint32_t rq[4][4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      rq[kk][q] = *reinterpret_cast<const uint32_t*>(qs + 8 * kQBlockBytes + sw128(r0 + 8 * (q & 1), 16 * kk + 8 * (q >> 1) + 2 * c));
    }
  }

  const uint32_t q_addr = gp::smem_addr(qs), ring_addr = gp::smem_addr(ring);
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  ptx::wg_hold128(o);  // opaque zeros: constant-folded ones make ptxas serialize the P V wgmma (C7515)
  float s[32];
  uint32_t pa[4][4];  // P of this warpgroup's tile (A fragments of the four k-steps)
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const int32_t vis0 = cw.visible(p, r0), vis1 = cw.visible(p, r0 + 8);
  const uint32_t my_ring = ring_addr + wg * kStageBytes;  // the stage whose scores this warpgroup computes
  uint64_t tmask = 0;                                      // the validity mask of the tile whose scores are in s

  // The scores of this warpgroup's u-th tile (stage wg): the rope k-steps (Q from
  // registers), then the V half this warpgroup reads first (blocks 4 wg ..), then the
  // other; `real` false: a discarded repeat over the stage's current bytes, so every step
  // issues the same wgmma (no barrier wait, nothing released).
  const int blk_a = 4 * wg, blk_b = 4 - 4 * wg;
  const uint64_t dqa = ptx::desc_sw128(q_addr + blk_a * kQBlockBytes, 16, 1024), dqb = ptx::desc_sw128(q_addr + blk_b * kQBlockBytes, 16, 1024);
  const uint64_t dka = ptx::desc_sw128(my_ring + blk_a * kBlockBytes, 16, 1024), dkb = ptx::desc_sw128(my_ring + blk_b * kBlockBytes, 16, 1024);
  const uint64_t dkr = ptx::desc_sw128(my_ring + 8 * kBlockBytes, 16, 1024);
  const int part_a = wg == 0 ? kPartL : kPartR, part_b = wg == 0 ? kPartR : kPartL;
  // In two commit groups: the rope block and the first V half, then the second half
  // (released last by the other warpgroup).
  auto scores_first = [&](int u, bool real) __attribute__((always_inline)) {
    if (real) {
      ptx::mbar_wait(gp::smem_addr(&full[kPartRope * kStages + wg]), u & 1);
      tr(lead, 2 * u + wg, kPartRope, 4 + wg);
      // A rope gathered by cp.async and signalled by its completion (kSparseRopeAsync):
      // the generic-proxy copies are ordered before this warpgroup's wgmma reads here.
      if constexpr (kSparse && kSparseRopeAsync<F>) ptx::fence_proxy_async();
      tmask = vmask[wg];
    }
    ptx::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) ptx::wgmma_n64_bf16_rs(s, rq[kk], dkr + ((kk * 32) >> 4), kk > 0);
    if (real) {
      ptx::mbar_wait(gp::smem_addr(&full[part_a * kStages + wg]), u & 1);
      tr(lead, 2 * u + wg, part_a, 4 + wg);
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      // Descriptor + (byte offset >> 4): the start-address field (addr >> 4, 14 bits) never carries.
      const uint32_t qo = ((i >> 2) * kQBlockBytes + (i & 3) * 32) >> 4, ko = ((i >> 2) * kBlockBytes + (i & 3) * 32) >> 4;
      ptx::wgmma_n64_bf16_ss(s, dqa + qo, dka + ko, 1);
    }
    ptx::wg_commit();
  };
  auto scores_second = [&](int u, bool real) __attribute__((always_inline)) {
    if (real) {
      ptx::mbar_wait(gp::smem_addr(&full[part_b * kStages + wg]), u & 1);
      tr(lead, 2 * u + wg, part_b, 4 + wg);
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t qo = ((i >> 2) * kQBlockBytes + (i & 3) * 32) >> 4, ko = ((i >> 2) * kBlockBytes + (i & 3) * 32) >> 4;
      ptx::wgmma_n64_bf16_ss(s, dqb + qo, dkb + ko, 1);
    }
    ptx::wg_commit();
  };
  // The tile of step j whose scores are in s: the V rows of its masked tokens zeroed (both
  // halves: nobody reads them before this warpgroup's hand-off); returns whether the warp
  // sees every score of the tile (the common case: no masking code runs), else sets okb
  // (bit i: score s[i] counts).
  uint32_t okb = ~0u;
  auto mask_tile = [&](int t) __attribute__((always_inline)) {
    const int64_t pos0 = begin + static_cast<int64_t>(t) * kTile;
    const bool whole = tmask == ~0ull && vis0 - pos0 >= kTile && vis1 - pos0 >= kTile;
    if (tmask != ~0ull) {
      uint8_t* stage = ring + wg * kStageBytes;
      for (int i = ctid & 127; i < kTile * 8 * 8; i += 128) {
        const int k = i >> 6, blk = (i >> 3) & 7, ch = i & 7;
        if (!((tmask >> k) & 1ull)) *reinterpret_cast<uint4*>(stage + blk * kBlockBytes + k * 128 + ch * 16) = make_uint4(0, 0, 0, 0);
      }
      ptx::fence_proxy_async();
      ptx::named_barrier(kBarWg + wg, 128);
    }
    const bool all_whole = __all_sync(0xFFFFFFFFu, whole);
    if (!all_whole) {
      okb = 0;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int k = 8 * (i >> 2) + 2 * c + (i & 1);
        const bool ok = ((tmask >> k) & 1ull) && k < (((i >> 1) & 1) ? vis1 : vis0) - pos0;
        okb |= static_cast<uint32_t>(ok) << i;
      }
    }
    return all_whole;
  };
  // Score i, or -inf where masked (kMasked: the warp's tile is not whole).
  auto score = [&](auto masked, int i) __attribute__((always_inline)) {
    if constexpr (decltype(masked)::value) return ((okb >> i) & 1u) ? s[i] : -INFINITY;
    else return s[i];
  };
  // The row maxima of the (unmasked) scores, log2 domain (scale_log2 > 0 keeps the order).
  auto row_max = [&](auto masked, float (&mx)[2]) __attribute__((always_inline)) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = fmaxf(score(masked, 4 * j + 2 * h), score(masked, 4 * j + 2 * h + 1));
      const float m = fmaxf(fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3])), fmaxf(fmaxf(v[4], v[5]), fmaxf(v[6], v[7])));
      float x = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
      x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 2));
      mx[h] = x * p.scale_log2;
    }
  };
  // P = exp2(s scale_log2 - m) (0 where masked) as bf16 A fragments into out; the row sums
  // of the unrounded P when `sum` is given.
  auto exp_pack = [&](auto masked, const float (&m)[2], uint32_t (&out)[4][4], float* sum) __attribute__((always_inline)) {
    const float neg_m[2] = {m[0] == -INFINITY ? 0.0f : -m[0], m[1] == -INFINITY ? 0.0f : -m[1]};
    float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float e0 = ptx::ex2_ftz(fmaf(score(masked, 4 * j + 2 * h), p.scale_log2, neg_m[h]));
        const float e1 = ptx::ex2_ftz(fmaf(score(masked, 4 * j + 2 * h + 1), p.scale_log2, neg_m[h]));
        acc[h][j & 1] += e0 + e1;
        out[j >> 1][2 * (j & 1) + h] = gp::pack_bf16x2(e0, e1);
      }
    }
    if (sum != nullptr) sum[0] = acc[0][0] + acc[0][1], sum[1] = acc[1][0] + acc[1][1];
  };
  auto softmax_max = [&](bool all_whole, float (&mx)[2]) __attribute__((always_inline)) {
    if (all_whole) row_max(std::false_type{}, mx);
    else row_max(std::true_type{}, mx);
  };
  auto softmax_exp = [&](bool all_whole, const float (&m)[2], uint32_t (&out)[4][4], float* sum) __attribute__((always_inline)) {
    if (all_whole) exp_pack(std::false_type{}, m, out, sum);
    else exp_pack(std::true_type{}, m, out, sum);
  };
  // P (A fragments) -> a 64 x 64 K-major swizzled block, as the A operand of an SS wgmma.
  auto store_p = [&](uint8_t* dst, const uint32_t (&v)[4][4]) __attribute__((always_inline)) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        *reinterpret_cast<uint32_t*>(dst + sw128(r0 + 8 * (q & 1), 16 * kk + 8 * (q >> 1) + 2 * c)) = v[kk][q];
      }
    }
    ptx::fence_proxy_async();
  };
  auto scale_o = [&](float a0, float a1) __attribute__((always_inline)) {
    if (__any_sync(0xFFFFFFFFu, a0 != 1.0f || a1 != 1.0f)) {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j] *= a0, o[4 * j + 1] *= a0;
        o[4 * j + 2] *= a1, o[4 * j + 3] *= a1;
      }
    }
  };
  // V of this warpgroup's 256 dims in stage st: column blocks 4 wg .. 4 wg + 3 (lbo 8 KB),
  // k-step kk = tokens 16 kk .. (2 KB).
  const uint64_t dv0 = ptx::desc_sw128(ring_addr + 4 * wg * kBlockBytes, kBlockBytes, 1024);
  const uint64_t dv1 = ptx::desc_sw128(ring_addr + kStageBytes + 4 * wg * kBlockBytes, kBlockBytes, 1024);
  const uint64_t dp0 = ptx::desc_sw128(gp::smem_addr(p0s), 16, 1024), dp1 = ptx::desc_sw128(gp::smem_addr(p1s), 16, 1024);
  const int ra = r0, rb = r0 + 8;

  // The lazy maximum of a row: the reference m_ref moves to the tile's maximum mx only when
  // mx passes it by more than kLazy; a = e^(m_ref - m) rescales what was relative to m_ref.
  auto lazy_max = [](float mx, float m_ref, float& m, float& a) __attribute__((always_inline)) {
    m = mx > m_ref + kLazy ? mx : m_ref;
    a = m == m_ref ? 1.0f : exp2f(m_ref - m);
  };
  // This thread's two rows' maxima and rescale factors to the other warpgroup (one thread
  // of each quad writes them; all 128 arrive).
  auto publish = [&](float* sm, float* ss, const float (&m)[2], const float (&a)[2], uint64_t* bar) __attribute__((always_inline)) {
    if (c == 0) {
      sm[ra] = m[0], ss[ra] = a[0];
      sm[rb] = m[1], ss[rb] = a[1];
    }
    ptx::mbar_arrive(gp::smem_addr(bar));
  };
  // O += P V over this warpgroup's V half of the other warpgroup's tile, P from shared memory
  // (the other warpgroup's hand-off `ready`; `full`: that tile's V half landed).
  // O += P V for one k16 step: one m64n256k16 (bf16: 384 threads), or two m64n128k16 over
  // the half's column blocks 0, 1 and 2, 3 (the quantized formats' 512-thread CTAs).
  auto pv_ss = [&](uint64_t da, uint64_t db) __attribute__((always_inline)) {
    if constexpr (kQuant) {
      ptx::wgmma_n128_bf16_ss(o, da, db, 1);
      ptx::wgmma_n128_bf16_ss(o + 64, da, db + ((2 * kBlockBytes) >> 4), 1);
    } else {
      ptx::wgmma_n256_bf16_ss(o, da, db, 1);
    }
  };
  auto pv_rs = [&](const uint32_t (&a)[4], uint64_t db) __attribute__((always_inline)) {
    if constexpr (kQuant) {
      ptx::wgmma_n128_bf16_rs(o, a, db, 1);
      ptx::wgmma_n128_bf16_rs(o + 64, a, db + ((2 * kBlockBytes) >> 4), 1);
    } else {
      ptx::wgmma_n256_bf16_rs(o, a, db, 1);
    }
  };
  auto pv_other = [&](uint64_t* ready, uint64_t* full_half, uint32_t ph, uint64_t dp, uint64_t dv) __attribute__((always_inline)) {
    ptx::mbar_wait(gp::smem_addr(ready), ph);
    ptx::mbar_wait(gp::smem_addr(full_half), ph);
    ptx::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) pv_ss(dp + ((kk * 32) >> 4), dv + ((kk * 2048) >> 4));
    ptx::wg_commit();
  };
  if (n_steps > 0) {
    scores_first(0, true);
    scores_second(0, true);
    ptx::wg_wait<0>();
    ptx::wg_hold32(s);
    ptx::mbar_arrive(gp::smem_addr(&empty[kPartRope * kStages + wg]));
    tr(lead, wg, kPartRope, 6 + wg);
  }
  for (int j = 0; j < n_steps; ++j) {
    const bool more = j + 1 < n_steps;
    const uint32_t ph = j & 1;
    float mx[2], sum[2];
    if (wg == 0) {
      // ---- warpgroup 0: tile a = 2 j (stage 0) ----
      const bool all_whole = mask_tile(2 * j);
      softmax_max(all_whole, mx);
      float m0[2], a0[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) lazy_max(mx[h], m_run[h], m0[h], a0[h]);
      publish(sm0, ss0, m0, a0, m0_ready);
      softmax_exp(all_whole, m0, pa, sum);
      l_run[0] = l_run[0] * a0[0] + sum[0];
      l_run[1] = l_run[1] * a0[1] + sum[1];
      scale_o(a0[0], a0[1]);
      ptx::wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) pv_rs(pa[kk], dv0 + ((kk * 2048) >> 4));
      ptx::wg_commit();
      // m1 and e^(m0 - m1) from warpgroup 1; P_a rescaled to m1 for its O_R.
      ptx::mbar_wait(gp::smem_addr(s1_ready), ph);
      const float a1[2] = {ss1[ra], ss1[rb]};
      m_run[0] = sm1[ra], m_run[1] = sm1[rb];
      if (__any_sync(0xFFFFFFFFu, a1[0] != 1.0f || a1[1] != 1.0f)) {
        // P_a against m1 straight from the scores (one bf16 rounding, as P_b's).
        uint32_t ps[4][4];
        softmax_exp(all_whole, m_run, ps, nullptr);
        store_p(p0s, ps);
      } else {
        store_p(p0s, pa);
      }
      ptx::mbar_arrive(gp::smem_addr(p0_ready));
      l_run[0] *= a1[0], l_run[1] *= a1[1];
      ptx::wg_wait<0>();
      ptx::wg_hold128(o);
      ptx::mbar_arrive(gp::smem_addr(&empty[kPartL * kStages + 0]));  // V_aL read
      tr(lead, 2 * j, kPartL, 6);
      scale_o(a1[0], a1[1]);
      // O_L += P_b V_bL (P_b from warpgroup 1, in shared memory).
      pv_other(p1_ready, &full[kPartL * kStages + 1], ph, dp1, dv1);
      tr(lead, 2 * j + 1, kPartL, 4);
    } else {
      // ---- warpgroup 1: tile b = 2 j + 1 (stage 1; empty past an odd count) ----
      const bool all_whole = mask_tile(2 * j + 1);
      softmax_max(all_whole, mx);
      ptx::mbar_wait(gp::smem_addr(m0_ready), ph);
      float m1[2], a1[2], a01[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = h ? rb : ra;
        lazy_max(mx[h], sm0[r], m1[h], a1[h]);
        a01[h] = ss0[r] * a1[h];
      }
      publish(sm1, ss1, m1, a1, s1_ready);
      softmax_exp(all_whole, m1, pa, sum);
      l_run[0] = l_run[0] * a01[0] + sum[0];
      l_run[1] = l_run[1] * a01[1] + sum[1];
      m_run[0] = m1[0], m_run[1] = m1[1];
      scale_o(a01[0], a01[1]);
      ptx::wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) pv_rs(pa[kk], dv1 + ((kk * 2048) >> 4));
      ptx::wg_commit();
      store_p(p1s, pa);
      ptx::mbar_arrive(gp::smem_addr(p1_ready));
      // O_R += (P_a e^(m0 - m1)) V_aR.
      pv_other(p0_ready, &full[kPartR * kStages + 0], ph, dp0, dv0);
      tr(lead, 2 * j, kPartR, 5);
      ptx::wg_wait<1>();
      ptx::mbar_arrive(gp::smem_addr(&empty[kPartR * kStages + 1]));  // V_bR read
      tr(lead, 2 * j + 1, kPartR, 7);
      ptx::wg_wait<0>();
      ptx::wg_hold128(o);
      ptx::mbar_arrive(gp::smem_addr(&empty[kPartR * kStages + 0]));  // V_aR read: warpgroup 0's next scores wait for it
      tr(lead, 2 * j, kPartR, 7);
    }
    // The next tile's scores (or a discarded repeat over the stage's current bytes).
    // Warpgroup 0's P_b V_bL completes behind the first group, and V_bL goes back before
    // the second group waits for V_aR (which warpgroup 1 released above), so neither
    // warpgroup waits for a release the other makes after its own wait.
    scores_first(j + 1, more);
    ptx::wg_wait<1>();
    if (wg == 0) {
      ptx::mbar_arrive(gp::smem_addr(&empty[kPartL * kStages + 1]));
      tr(lead, 2 * j + 1, kPartL, 6);
    }
    scores_second(j + 1, more);
    ptx::wg_wait<0>();
    ptx::wg_hold128(o);
    ptx::wg_hold32(s);
    if (more) {
      ptx::mbar_arrive(gp::smem_addr(&empty[kPartRope * kStages + wg]));  // its rope block
      tr(lead, 2 * (j + 1) + wg, kPartRope, 6 + wg);
    }
  }
  // ---- finalize: both warpgroups hold O at the same maximum (m1 of the last step) ----
  float lq[2];
  quad_row_sums(l_run, lq);
  if (c == 0) sl[wg * 64 + ra] = lq[0], sl[wg * 64 + rb] = lq[1];
  ptx::mbar_arrive(gp::smem_addr(l_ready));
  ptx::mbar_wait(gp::smem_addr(l_ready), 0);
  store_rows<F>(
      p, cw, b, split, o, [&](int, int r) __attribute__((always_inline)) { return sl[r] + sl[64 + r]; }, m_run, ra, rb, wg, c,
      wg == 0 && c == 0);
#endif  // MLAKV_SM90_DEVICE
}

}  // namespace
}  // namespace mlakv::cuda::sm90

#include "cuda/sm90/attention/kernel_nat_rs.cuh"

namespace mlakv::cuda::sm90 {
namespace {

// ---- host side (instantiations/nat_<format>.cu) ----

// Whether format F's dense (kSparse false) or sparse sets run the register-staged kernel
// (kernel_nat_rs.cuh) instead of the in-place converters: where it measured faster
// (docs/perf.md, twelfth session) - every sparse set, the dense e2m1 formats; fp8_ds_mla's
// dense sets keep the in-place converters (their 656-byte records' loads cost the
// register-staged form 3-5%). MLAKV_NAT_RS=0 (never) and 2 (always) build measurement variants.
#ifndef MLAKV_NAT_RS
#define MLAKV_NAT_RS 1
#endif
template <KvFormat F, bool kSparse>
constexpr bool kNatRs = F != KvFormat::kBf16 &&
                        (MLAKV_NAT_RS == 2 || (MLAKV_NAT_RS == 1 && (kSparse || F != KvFormat::kFp8DsMla)));

// cuTensorMapEncodeTiled from the driver the runtime loaded (null where it has none).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

template <KvFormat F>
constexpr int nat_record_bytes() {
  if constexpr (F == KvFormat::kBf16) return kQkDim * 2;
  else return nat::Quant<F>::kRecordBytes;
}

template <KvFormat F>
int nat_configure() {
  // The kernels this format launches: the dense one, and for the quantized formats the sparse one.
  // (if constexpr throughout: a kernel the format never launches is not instantiated.)
  auto set = [](auto kernel, int bytes) { return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes); };
  cudaError_t e = cudaSuccess;
  if constexpr (kNatRs<F, false>) e = set(attention_nat_rs_kernel<F, false>, nat::kRsSmemBytes);
  else e = set(attention_nat_kernel<F, false>, nat::kSmemBytes);
  if constexpr (F != KvFormat::kBf16) {
    if (e == cudaSuccess) {
      if constexpr (kNatRs<F, true>) e = set(attention_nat_rs_kernel<F, true>, nat::kRsSmemBytes);
      else e = set(attention_nat_kernel<F, true>, nat::kSmemBytes);
    }
  }
  return static_cast<int>(e);
}

template <KvFormat F>
int nat_ctas_per_sm() {
  if (nat_configure<F>() != 0) return 0;
  int n = 0;
  cudaError_t e = cudaSuccess;
  if constexpr (kNatRs<F, false>) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_nat_rs_kernel<F, false>, nat::kRsThreads, nat::kRsSmemBytes);
  else e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_nat_kernel<F>, nat::kThreadsOf<F>, nat::kSmemBytes);
  return e == cudaSuccess ? n : 0;
}

// The launch's error; a -DMLAKV_NAT_TRACE build also prints the trace of the format's 12th
// launch (one instantiation file per format, so one counter each) and clears it.
template <KvFormat F>
int nat_launched(const kernels::AttentionParams& kp) {
  const cudaError_t err = cudaGetLastError();
#ifdef MLAKV_NAT_TRACE
  static int launches = 0;
  if (err == cudaSuccess && ++launches == 12) {
    unsigned long long h[nat::kTraceSlots];
    cudaDeviceSynchronize();
    cudaMemcpyFromSymbol(h, nat::g_nat_trace, sizeof h);
    unsigned long long t0 = ~0ull;
    for (unsigned long long v : h) t0 = v != 0 && v < t0 ? v : t0;
    for (int i = 0; i < nat::kTraceSlots; ++i) {
      if (h[i] == 0) continue;
      const int tile = i / (nat::kParts * nat::kTraceEvents), part = (i / nat::kTraceEvents) % nat::kParts;
      std::fprintf(stderr, "NATTRACE %d %d %d %d %d %llu\n", static_cast<int>(F), kp.sparse ? 1 : 0, tile, part,
                   i % nat::kTraceEvents, h[i] - t0);
    }
    std::memset(h, 0, sizeof h);
    cudaMemcpyToSymbol(nat::g_nat_trace, h, sizeof h);
  }
#else
  (void)kp;
#endif
  return static_cast<int>(err);
}

// Encodes the cache's tensor maps (kernel comment; a sparse set gathers with cp.async and
// takes none) and launches on grid (row_blocks, B or B * s_q when sparse, num_splits).
template <KvFormat F>
int nat_launch(const kernels::AttentionParams& kp, int row_blocks, void* stream) {
  if (kp.token_scale || !nat_supports(F, kp.block_size, kp.num_slots, kp.sparse) || kp.record_bytes != nat_record_bytes<F>()) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(kp.sparse ? kp.B * kp.s_q : kp.B),
                  static_cast<unsigned>(kp.num_splits));
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  // The register-staged kernel takes no tensor maps.
  if constexpr (kNatRs<F, true>) {
    if (kp.sparse) {
      attention_nat_rs_kernel<F, true><<<grid, nat::kRsThreads, nat::kRsSmemBytes, st>>>(kp);
      return nat_launched<F>(kp);
    }
  }
  if constexpr (kNatRs<F, false>) {
    if (!kp.sparse) {
      attention_nat_rs_kernel<F, false><<<grid, nat::kRsThreads, nat::kRsSmemBytes, st>>>(kp);
      return nat_launched<F>(kp);
    }
  }
  if constexpr (kNatRs<F, false> && kNatRs<F, true>) {
    return static_cast<int>(cudaErrorInvalidValue);  // (unreachable: both sets launched above)
  } else {
    CUtensorMap map{}, map16{};
    CUresult r = CUDA_SUCCESS;
    const PFN_cuTensorMapEncodeTiled_v12000 encode = kp.sparse ? nullptr : tensor_map_encoder();
    if (!kp.sparse && encode == nullptr) return static_cast<int>(cudaErrorNotSupported);
    const cuuint32_t rows = static_cast<cuuint32_t>(std::min(kp.block_size, nat::kTile));
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kp.record_bytes)};
    const cuuint32_t elem[2] = {1, 1};
    if (kp.sparse) {
      // no tensor maps
    } else if constexpr (F == KvFormat::kBf16) {
      // The cache as a [num_slots, 576] bf16 matrix (rows record_bytes apart); boxes of 64
      // dims (128 B, the swizzle span) x min(block_size, 64) slots.
      const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kQkDim), static_cast<cuuint64_t>(kp.num_slots)};
      const cuuint32_t box[2] = {64, rows};
      r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint8_t*>(kp.cache), dims, strides, box, elem,
                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      map16 = map;  // unused
    } else {
      // The cache as a [num_slots, record_bytes] byte matrix: boxes of 128 bytes (128-byte
      // swizzle: code and rope boxes) and of 16 bytes (the scale field), x min(block_size, 64) slots.
      const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kp.record_bytes), static_cast<cuuint64_t>(kp.num_slots)};
      const cuuint32_t box[2] = {128, rows}, box16[2] = {16, rows};
      r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(kp.cache), dims, strides, box, elem,
                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      if (r == CUDA_SUCCESS) {
        r = encode(&map16, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(kp.cache), dims, strides, box16, elem,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      }
    }
    if (r != CUDA_SUCCESS) return static_cast<int>(cudaErrorInvalidValue);
    if constexpr (F != KvFormat::kBf16 && !kNatRs<F, true>) {
      if (kp.sparse) {
        attention_nat_kernel<F, true><<<grid, nat::kThreadsOf<F>, nat::kSmemBytes, st>>>(kp, map, map16);
        return nat_launched<F>(kp);
      }
    }
    attention_nat_kernel<F><<<grid, nat::kThreadsOf<F>, nat::kSmemBytes, st>>>(kp, map, map16);
    return nat_launched<F>(kp);
  }
}

}  // namespace

// The path table's per-format entries (launch_nat.h), one instantiation file per format.
#define MLAKV_NAT_DEFINE(F)                                                                     \
  template <>                                                                                   \
  int configure_attention_nat_for<F>(int /*record_bytes*/) {                                    \
    return nat_configure<F>();                                                                  \
  }                                                                                             \
  template <>                                                                                   \
  int attention_nat_ctas_per_sm_for<F>(int /*record_bytes*/) {                                  \
    return nat_ctas_per_sm<F>();                                                                \
  }                                                                                             \
  template <>                                                                                   \
  int launch_attention_nat_for<F>(const kernels::AttentionParams& kp, int row_blocks, void* stream) { \
    return nat_launch<F>(kp, row_blocks, stream);                                               \
  }
}  // namespace mlakv::cuda::sm90
