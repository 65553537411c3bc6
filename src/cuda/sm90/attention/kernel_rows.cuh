// The many-row sm90 attention kernel (launch_rows.h; docs/design.md "Hopper kernels, many
// rows"): v8's warpgroup design (kernel.cuh, attention_wg_kernel: the KV tile as the wgmma
// M dimension, K / V dequantized straight into A registers) widened from 16 to 64 query
// rows per CTA, for every sm90 record format (bf16 included).
//
// One CTA = 64 query rows x one KV split of one request (dense: rows i * H + h of the
// request; sparse: heads of one query), 12 warps (3 warpgroups; setmaxnreg moves registers
// from the producer warpgroup to the consumers):
//  - warp 8, the producer (warps 9..11 exit at once): kernel.cuh's produce() unchanged
//    (bulk copies of records into a ring of 32-token stages, validity masks, `full` /
//    `empty` mbarriers); a stage goes back once all 8 consumer warps released it;
//  - warps 0..7, two consumer warpgroups that share the 64 rows and split the dims. Per
//    consumer tile of 64 tokens (two stages), warpgroup k
//      scores  computes the partial S^T (64 tokens x 64 rows, wgmma m64n64k16) over its
//              half of the 576 score dims: bf16 k-steps 18k .. 18k+17; the quantized
//              formats latent chunks 4k .. 4k+3 and rope k-steps 32 + 2k, 33 + 2k. A = K
//              in registers (warp w: tokens 16w .. 16w+15), B = Q^T (one copy, 72 KB);
//      exchange sends the partials of the other warpgroup's 32 rows through shared memory
//              and adds the ones of its own rows (one 256-thread barrier);
//      softmax of its 32 rows over the 64 tokens (shuffles + one exchange of row maxima
//              between its warps), writes their P^T (f16; bf16 for bf16 records) and
//              their rescale factors (one 256-thread barrier);
//      P V     O^T (its 256 output dims x 64 rows: 4 m-blocks, 128 registers) += V^T P^T,
//              16 wgmma m64n64k16, A = V^T in registers.
//    A operands: the quantized formats dequantize with v8's helpers (wg_k_chunk, wg_rope,
//    wg_v_frags: the same exact f16 values, the same fp8 tile-scale and e2m1 scale
//    handling); bf16 records are loaded by ldmatrix (ldmatrix.trans for V^T) from the
//    padded stage rows (1168 B, conflict-free). fp8 folds each quarter's tile scale into
//    the one accumulator in place: acc = (acc / ts_q + dot_q) * ts_q (ts_q = 0, a
//    zero-filled token, is taken as 1; such tokens are masked anyway).
// Against v8 each record byte is read from HBM once per 64 rows instead of once per 16,
// each element is converted once per 64 rows, and the tensor cores run n64 instead of n16
// instructions. Both warpgroups run the same instruction stream (only addresses and
// selects depend on the warpgroup): ptxas serializes wgmma in warpgroup-dependent branches.
// One CTA per SM (227 KB of shared memory: Q^T, the P^T copies, the exchange, the ring).
// Earlier arrangements measured on the H200 (docs/perf.md, "rows"): each warpgroup owning
// 32 rows (m64n32k16; in lockstep or ping-pong at the tensor cores), up to 12% slower.
#pragma once

#include "cuda/sm90/attention/kernel.cuh"
#include "cuda/sm90/attention/launch_rows.h"
#include "cuda/sm90/attention/ptx_rows.cuh"

namespace mlakv::cuda::sm90 {
namespace {

constexpr int kRR = kRowsPerCta;                 // 64 rows per CTA
constexpr int kRW = 32;                          // softmax rows per consumer warpgroup
constexpr int kRowWgs = kRR / kRW;               // 2 consumer warpgroups
constexpr int kRowsConsumerWarps = 4 * kRowWgs;  // 8
// + a producer warpgroup (warp 8 produces, 9..11 exit): setmaxnreg works per warpgroup,
// and 9 warps would cap every thread at 168 registers (3 warps on one SM sub-partition).
constexpr int kRowsThreads = 32 * kRowsConsumerWarps + 128;
// 2 x 240 + 24 = 3 x 168 per sub-partition (what the launch holds); the producer's
// produce() fits in 24 unspilled, and 240 against 232 takes fp8's spills from 88 to 40 B
// (1.5-2% faster, docs/perf.md "rows2").
constexpr int kRowsConsumerRegs = 240, kRowsProducerRegs = 24;
constexpr int kRowsSmem = 227 * 1024;                            // one CTA per SM (the opt-in maximum)
template <KvFormat F>
constexpr int rows_pt_copies() {
  return F == KvFormat::kFp8DsMla ? 4 : 1;  // fp8: one P^T copy per 128-dim tile scale (as v8)
}

// Head dim that k index kk of score k-step ks means in Q^T: bf16 in natural order (the
// ldmatrix A fragments), the quantized formats in v8's order (wg_qdim).
template <KvFormat F>
__host__ __device__ constexpr int rows_qdim(int ks, int kk) {
  if constexpr (F == KvFormat::kBf16) return 16 * ks + kk;
  return wg_qdim<F, false>(ks, kk);  // wg_k_chunk's register order (not v9's V tile)
}

constexpr int kSdQtStep = 2048;                      // one k-step of B: 64 rows x 16 k
constexpr int kSdQtBytes = kWgKSteps * kSdQtStep;    // Q^T of the CTA
constexpr int kSdPtBytes = (kWgTile / 16) * kSdQtStep;  // one P^T copy
constexpr int kSdXBytes = 128 * 16 * 4;              // one warpgroup's outgoing partial scores
constexpr int kSdRedFloats = 4 * kRW + 16;           // per warpgroup: [4 warps][32 rows] + [4 warps][4 scales]
constexpr int kSdMiscBytes = 2 * 8 * kMaxStages + 4 * kMaxStages + 4 * kRR * 5;  // + vis, sc, alpha, l, m
template <KvFormat F>
constexpr int sd_fixed_bytes() {
  return kSdQtBytes + rows_pt_copies<F>() * kSdPtBytes + kRowWgs * (kSdXBytes + 4 * kSdRedFloats) +
         ((kSdMiscBytes + 127) & ~127);
}
template <KvFormat F>
constexpr int sd_stages() {
  const int n = (kRowsSmem - sd_fixed_bytes<F>()) / (kT * Fmt<F>::kStride);
  return n < kMaxStages ? n : kMaxStages;
}
template <KvFormat F>
constexpr std::size_t sd_smem_bytes() {
  return static_cast<std::size_t>(sd_stages<F>()) * kT * Fmt<F>::kStride + sd_fixed_bytes<F>();
}
static_assert(sd_stages<KvFormat::kBf16>() >= 2 && sd_stages<KvFormat::kFp8DsMla>() >= 2 &&
              sd_stages<KvFormat::kNvfp4DsMla>() >= 2 && sd_stages<KvFormat::kNvfp4DsMlaFp8Rope>() >= 2 &&
              sd_stages<KvFormat::kNvfp4DsMlaInt8Rope>() >= 2);
static_assert(sd_smem_bytes<KvFormat::kBf16>() <= kRowsSmem && sd_smem_bytes<KvFormat::kFp8DsMla>() <= kRowsSmem);
static_assert(kRowsTokenTile == kWgTile, "split chunks are rounded to the consumer tile (launch_rows.h)");

template <KvFormat F>
__global__ void __launch_bounds__(kRowsThreads, 1) attention_rows_kernel(const __grid_constant__ AttentionParams p) {
#if MLAKV_SM90_DEVICE
  constexpr int S = sd_stages<F>();
  constexpr int kS = Fmt<F>::kStride;
  constexpr int kCopies = rows_pt_copies<F>();
  constexpr bool kFp8 = F == KvFormat::kFp8DsMla;
  constexpr bool kBf = F == KvFormat::kBf16;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* ring = smem;
  uint8_t* qt = smem + static_cast<std::size_t>(S) * kT * kS;
  uint8_t* pt = qt + kSdQtBytes;
  uint8_t* xbuf = pt + kCopies * kSdPtBytes;  // [warpgroup][4 warps][4 float4][32 lanes]
  float* red_all = reinterpret_cast<float*>(xbuf + kRowWgs * kSdXBytes);
  uint8_t* misc = reinterpret_cast<uint8_t*>(red_all + kRowWgs * kSdRedFloats);
  uint64_t* full = reinterpret_cast<uint64_t*>(misc);
  uint64_t* empty = full + kMaxStages;
  uint32_t* vmask = reinterpret_cast<uint32_t*>(empty + kMaxStages);
  int32_t* row_vis = reinterpret_cast<int32_t*>(vmask + kMaxStages);
  float* row_sc = reinterpret_cast<float*>(row_vis + kRR);
  float* row_alpha = row_sc + kRR;
  float* fin_l = row_alpha + kRR;
  float* fin_m = fin_l + kRR;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int split = blockIdx.z;
  const CtaWork cw = cta_work<kRR, kWgTile, kWgTile>(p);  // cuda/common/cta_work.cuh
  const int b = cw.b, i_fixed = cw.i_fixed, rows_req = cw.rows_req, row0 = cw.row0;
  const int64_t begin = cw.begin, end = cw.end;
  const int n_tiles = cw.n_tiles;
  auto row_query = [&](int r) { return cw.query(p, r); };
  auto row_head = [&](int r) { return cw.head(p, r); };

  init_ring<S, kRR>(p, cw, full, empty, kRowsConsumerWarps, row_vis, tid);

  if (warp >= kRowsConsumerWarps) {
    ptx::setmaxnreg_dec<kRowsProducerRegs>();
    if (warp == kRowsConsumerWarps) produce<F, S, kS>(p, b, i_fixed, begin, end, 2 * n_tiles, ring, full, empty, vmask, lane);
    return;
  }
  ptx::setmaxnreg_inc<kRowsConsumerRegs>();

  const int wg = warp >> 2, w = warp & 3, ctid = tid & 255, g = lane >> 2, c = lane & 3;
  const int bar = 1 + wg;           // the warpgroup's named barrier
  constexpr int kBarAll = 5;        // both consumer warpgroups (256 threads)
  const int wrow0 = kRW * wg;       // the rows whose softmax this warpgroup runs
  float* red = red_all + wg * kSdRedFloats;
  // ---- Q^T of the 64 rows: row n = ctid / 4, its 4 threads split each k-step ----
  {
    const int n = ctid >> 2, sub = ctid & 3, r = n;
    const bool ok = row0 + r < rows_req;
    const int rc = ok ? r : 0;
    const int64_t off = b * p.q_s0 + static_cast<int64_t>(row_query(rc)) * p.q_s1 +
                        static_cast<int64_t>(row_head(rc)) * p.q_s2;
    auto q_at = [&](int d) -> float {
      float v = p.q_bf16 ? bf16_to_f32(static_cast<const uint16_t*>(p.q)[off + d]) : static_cast<const float*>(p.q)[off + d];
      return ok ? v : 0.0f;
    };
    const float lat_base = is_nvfp4(F) ? p.outer_scale * 128.0f : 1.0f;
    int e = 0;
    if constexpr (!kBf) {
      float amax = 0.0f;
#pragma unroll 8
      for (int k = 0; k < kQkDim / 4; ++k) {
        const int d = sub + 4 * k;
        amax = fmaxf(amax, fabsf(q_at(d) * (d < kLatentDim ? lat_base : 1.0f)));
      }
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
      if (amax > 0.0f && amax <= 3.4e38f) {
        int ex;
        (void)frexpf(amax, &ex);
        e = std::clamp(15 - ex, -100, 100);
      }
    }
    if (sub == 0) row_sc[r] = ldexpf(p.scale_log2, -e);
    const float mlat = ldexpf(lat_base, e), mrope = ldexpf(1.0f, e);
#pragma unroll 4
    for (int ks = 0; ks < kWgKSteps; ++ks) {
#pragma unroll
      for (int pr = 0; pr < 2; ++pr) {
        const int kk = 4 * sub + 2 * pr;
        const int d0 = rows_qdim<F>(ks, kk), d1 = rows_qdim<F>(ks, kk + 1);
        uint32_t v;
        if constexpr (kBf) {
          v = mlakv::cuda::ptx::pack_bf16x2(q_at(d0), q_at(d1));
        } else {
          if (ks < 32) {
            v = ptx::pack_f16x2(q_at(d0) * mlat, q_at(d1) * mlat);
          } else if constexpr (f16_rope(F)) {
            v = ptx::pack_f16x2(q_at(d0) * mrope, q_at(d1) * mrope);
          } else {
            v = mlakv::cuda::ptx::pack_bf16x2(q_at(d0) * mrope, q_at(d1) * mrope);
          }
        }
        *reinterpret_cast<uint32_t*>(qt + kSdQtStep * ks + wg_b_offset(n, kk)) = v;
      }
    }
    ptx::fence_proxy_async();
  }
  ptx::named_barrier(kBarAll, 256);

  const uint32_t pt_addr = mlakv::cuda::ptx::smem_addr(pt);
  const uint32_t q_lo = ptx::desc_lo(mlakv::cuda::ptx::smem_addr(qt), 128), p_lo = ptx::desc_lo(pt_addr, 128);
  const uint32_t b_hi = ptx::desc_hi(256);
  const int wg_g = 8 * w + g;

  float o[4][32];  // O^T: m-block 4 wg + mb (64 dims) x 64 rows
#pragma unroll
  for (int mb = 0; mb < 4; ++mb) {
#pragma unroll
    for (int i = 0; i < 32; ++i) o[mb][i] = 0.0f;
  }
  float m_run[4][2], l_run[4][2];  // the warpgroup's 32 softmax rows
#pragma unroll
  for (int j = 0; j < 4; ++j) m_run[j][0] = m_run[j][1] = -INFINITY, l_run[j][0] = l_run[j][1] = 0.0f;
  float sig[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  using P = record::Parts<F>;
  float4* xmine = reinterpret_cast<float4*>(xbuf + wg * kSdXBytes) + w * 128 + lane;
  const float4* xother = reinterpret_cast<const float4*>(xbuf + (1 - wg) * kSdXBytes) + w * 128 + lane;

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int pt0 = 2 * tile, pt1 = 2 * tile + 1;
    const int st0 = pt0 % S, st1 = pt1 % S;
    ptx::mbar_wait(mlakv::cuda::ptx::smem_addr(&full[st0]), (pt0 / S) & 1);
    ptx::mbar_wait(mlakv::cuda::ptx::smem_addr(&full[st1]), (pt1 / S) & 1);
    const uint8_t* stage0 = ring + st0 * kT * kS;
    const uint8_t* stage1 = ring + st1 * kT * kS;
    const uint8_t* mystage = (w >> 1) ? stage1 : stage0;
    const int tl = 16 * (w & 1) + g;
    const uint8_t* rg = mystage + tl * kS;
    const uint8_t* rg8 = rg + 8 * kS;
    auto ts = [&](int q, int h) -> float {
      if constexpr (kFp8) return ldsf((h ? rg8 : rg) + P::kScaleOffset + 4 * q);
      else return 1.0f;
    };
    // ---- partial scores of this warp's 16 tokens x the 64 rows over the warpgroup's dims ----
    // (Both warpgroups run the same instruction stream, only addresses differ: wgmma in a
    // warpgroup-dependent branch is serialized by ptxas.)
    float acc[32];
    if constexpr (kBf) {
      // k-steps 18 wg .. 18 wg + 17: four groups of 4, one of 2
      const uint8_t* arow = mystage + (16 * (w & 1) + (lane & 15)) * kS + (lane >> 4) * 16 + 32 * 18 * wg;
      const uint32_t qw = q_lo + 128 * 18 * wg;
#pragma unroll
      for (int ch = 0; ch < 5; ++ch) {
        const int nk = ch < 4 ? 4 : 2;
        uint32_t a[4][4];
#pragma unroll
        for (int j = 0; j < nk; ++j) mlakv::cuda::ptx::ldmatrix_x4(a[j], mlakv::cuda::ptx::smem_addr(arow + 32 * (4 * ch + j)));
        ptx::wg_fence();
#pragma unroll
        for (int j = 0; j < nk; ++j) ptx::wgmma_n64_bf16(acc, a[j], qw + 128 * (4 * ch + j), b_hi, (ch == 0 && j == 0) ? 0 : 1);
        ptx::wg_commit();
        ptx::wg_wait<1>();
      }
    } else {
      // Rope k-steps 32 + 2 wg, 33 + 2 wg first: bf16 rope adds unscaled; e4m3 rope is
      // scaled per token by the record's rope scale before the latent chunks add on.
      {
        uint32_t a[4][4], ar[2][4];
        wg_rope<F>(rg, rg8, c, a);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
          for (int x = 0; x < 4; ++x) ar[jj][x] = wg ? a[2 + jj][x] : a[jj][x];
        }
        ptx::wg_fence();
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const uint32_t d = q_lo + 128 * (32 + 2 * wg + jj);
          if constexpr (f16_rope(F)) ptx::wgmma_n64_f16(acc, ar[jj], d, b_hi, jj == 0 ? 0 : 1);
          else ptx::wgmma_n64_bf16(acc, ar[jj], d, b_hi, jj == 0 ? 0 : 1);
        }
        ptx::wg_commit();
        if constexpr (f16_rope(F)) {
          ptx::wg_wait<0>();
          ptx::wg_hold32(acc);
          const float rs0 = ldsf(rg + P::kRopeScaleOffset), rs1 = ldsf(rg8 + P::kRopeScaleOffset);
#pragma unroll
          for (int i = 0; i < 32; ++i) acc[i] *= ((i >> 1) & 1) ? rs1 : rs0;
        }
      }
      const int kc0 = 4 * wg;  // latent chunks kc0 .. kc0 + 3 (fp8: quarters 2 wg, 2 wg + 1)
#pragma unroll
      for (int kq = 0; kq < 4; ++kq) {
        const int kc = kc0 + kq;
        if constexpr (kFp8) {
          if ((kq & 1) == 0) {  // quarter kc / 2 starts: acc /= its tile scale
            ptx::wg_wait<0>();
            ptx::wg_hold32(acc);
            const float t0 = ts(kc >> 1, 0), t1 = ts(kc >> 1, 1);
            const float i0 = t0 != 0.0f ? 1.0f / t0 : 1.0f, i1 = t1 != 0.0f ? 1.0f / t1 : 1.0f;
#pragma unroll
            for (int i = 0; i < 32; ++i) acc[i] *= ((i >> 1) & 1) ? i1 : i0;
          }
        }
        uint32_t a[4][4];
        wg_k_chunk<F>(rg, rg8, kc, c, a);
        ptx::wg_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) ptx::wgmma_n64_f16(acc, a[j], q_lo + 128 * (4 * kc + j), b_hi, 1);
        ptx::wg_commit();
        if constexpr (kFp8) {
          if (kq & 1) {  // quarter done: acc *= its tile scale
            ptx::wg_wait<0>();
            ptx::wg_hold32(acc);
            const float t0 = ts(kc >> 1, 0), t1 = ts(kc >> 1, 1);
            const float s0 = t0 != 0.0f ? t0 : 1.0f, s1 = t1 != 0.0f ? t1 : 1.0f;
#pragma unroll
            for (int i = 0; i < 32; ++i) acc[i] *= ((i >> 1) & 1) ? s1 : s0;
          } else {
            ptx::wg_wait<1>();
          }
        } else {
          ptx::wg_wait<1>();
        }
      }
    }
    ptx::wg_wait<0>();
    ptx::wg_hold32(acc);
    // ---- exchange: the other warpgroup's rows go out, this one's partials come in ----
#pragma unroll
    for (int v = 0; v < 4; ++v) {  // rows of j = 4 (1 - wg) + v
      const int jl = 4 * v, jh = 4 * (4 + v);
      xmine[32 * v] = wg ? make_float4(acc[jl], acc[jl + 1], acc[jl + 2], acc[jl + 3])
                         : make_float4(acc[jh], acc[jh + 1], acc[jh + 2], acc[jh + 3]);
    }
    ptx::named_barrier(kBarAll, 256);
    float s[16];  // s[4v + 2h + e]: token g + 8h, row wrow0 + 8v + 2c + e
#pragma unroll
    for (int v = 0; v < 4; ++v) {  // rows of j = 4 wg + v
      const float4 x = xother[32 * v];
      const int jl = 4 * v, jh = 4 * (4 + v);
      s[4 * v] = (wg ? acc[jh] : acc[jl]) + x.x;
      s[4 * v + 1] = (wg ? acc[jh + 1] : acc[jl + 1]) + x.y;
      s[4 * v + 2] = (wg ? acc[jh + 2] : acc[jl + 2]) + x.z;
      s[4 * v + 3] = (wg ? acc[jh + 3] : acc[jl + 3]) + x.w;
    }

    const uint32_t mask = vmask[(w >> 1) ? st1 : st0];
    const int64_t tb = begin + static_cast<int64_t>(tile) * kWgTile + 16 * w + g;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int j = i >> 2, h = (i >> 1) & 1, e = i & 1;
      const int r = wrow0 + 8 * j + 2 * c + e;
      const bool ok = ((mask >> (tl + 8 * h)) & 1u) && tb + 8 * h < row_vis[r];
      s[i] = ok ? s[i] * row_sc[r] : -INFINITY;
    }
    float mx[4][2];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = fmaxf(s[4 * j + e], s[4 * j + 2 + e]);
        v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 4));
        v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 8));
        v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 16));
        mx[j][e] = v;
      }
    }
    float tsm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (kFp8) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float v = fmaxf(ts(q, 0), ts(q, 1));
        v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 4));
        v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 8));
        v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 16));
        tsm[q] = v;
      }
    }
    if (g == 0) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) red[w * kRW + 8 * j + 2 * c + e] = mx[j][e];
      }
      if (kFp8 && c == 0) {
#pragma unroll
        for (int q = 0; q < 4; ++q) red[4 * kRW + 4 * w + q] = tsm[q];
      }
    }
    ptx::named_barrier(bar, 128);
    float alpha[4][2];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 8 * j + 2 * c + e;
        const float mt = fmaxf(fmaxf(red[r], red[kRW + r]), fmaxf(red[2 * kRW + r], red[3 * kRW + r]));
        const float m_new = fmaxf(m_run[j][e], mt);
        alpha[j][e] = m_run[j][e] == -INFINITY ? 0.0f : exp2f(m_run[j][e] - m_new);
        m_run[j][e] = m_new;
      }
    }
    float ratio[4] = {1.0f, 1.0f, 1.0f, 1.0f}, inv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (kFp8) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float* rs = red + 4 * kRW + q;
        const float sm = fmaxf(fmaxf(rs[0], rs[4]), fmaxf(rs[8], rs[12]));
        if (sm > sig[q]) {
          ratio[q] = sig[q] / sm;
          sig[q] = sm;
        }
        inv[q] = sig[q] > 0.0f ? 1.0f / sig[q] : 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int j = i >> 2, e = i & 1;
      s[i] = m_run[j][e] == -INFINITY ? 0.0f : exp2f(s[i] - m_run[j][e]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) l_run[j][e] = l_run[j][e] * alpha[j][e] + s[4 * j + e] + s[4 * j + 2 + e];
    }
    if (w == 0 && g == 0) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) row_alpha[wrow0 + 8 * j + 2 * c + e] = alpha[j][e];
      }
    }
    auto pk = [](float lo, float hi) {
      if constexpr (kBf) return mlakv::cuda::ptx::pack_bf16x2(lo, hi);
      else return ptx::pack_f16x2(lo, hi);
    };
#pragma unroll
    for (int q = 0; q < kCopies; ++q) {
      float f0 = 1.0f, f1 = 1.0f;
      if constexpr (kFp8) {
        f0 = ts(q, 0) * inv[q];
        f1 = ts(q, 1) * inv[q];
      }
#pragma unroll
      for (int jh = 0; jh < 2; ++jh) {
        const float* x = s + 8 * jh;
        ptx::stmatrix_x4_trans(pt_addr + q * kSdPtBytes + kSdQtStep * w + 1024 * wg + 512 * jh + 16 * lane,
                               pk(x[0] * f0, x[1] * f0), pk(x[2] * f1, x[3] * f1), pk(x[4] * f0, x[5] * f0),
                               pk(x[6] * f1, x[7] * f1));
      }
    }
    ptx::fence_proxy_async();
    ptx::named_barrier(kBarAll, 256);

    // ---- O rescale with every row's factor ----
    {
      float fa[8][2];
      bool change = false;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          fa[j][e] = row_alpha[8 * j + 2 * c + e];
          change = change || fa[j][e] != 1.0f;
        }
      }
      const float r0 = wg ? ratio[2] : ratio[0], r1 = wg ? ratio[3] : ratio[1];  // this warpgroup's quarters
      if constexpr (kFp8) change = change || r0 != 1.0f || r1 != 1.0f;
      if (__any_sync(0xFFFFFFFFu, change)) {
#pragma unroll
        for (int mb = 0; mb < 4; ++mb) {
#pragma unroll
          for (int i = 0; i < 32; ++i) o[mb][i] *= fa[i >> 2][i & 1] * (kFp8 ? ((mb >> 1) ? r1 : r0) : 1.0f);
        }
      }
    }
    // ---- O^T += V^T P^T over this warpgroup's 4 m-blocks: one group per k-step ----
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint8_t* kst = (kk >> 1) ? stage1 : stage0;
      uint32_t a[4][4];
      if constexpr (kBf) {
        const uint8_t* vrow = kst + (16 * (kk & 1) + (lane & 7) + ((lane >> 4) & 1) * 8) * kS + ((lane >> 3) & 1) * 16;
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int mb = 4 * wg + m;
          mlakv::cuda::ptx::ldmatrix_x4_trans(a[m], mlakv::cuda::ptx::smem_addr(vrow + 2 * (64 * mb + 16 * w)));
        }
      } else {
        const uint8_t* base = kst + (16 * (kk & 1) + 2 * c) * kS;
        wg_v_frags<F>(base, base + kS, base + 8 * kS, base + 9 * kS, wg_g, wg, a);
      }
      ptx::wg_fence();
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int q = kFp8 ? ((4 * wg + m) >> 1) : 0;
        const uint32_t d = p_lo + (q * kSdPtBytes + kSdQtStep * kk) / 16;
        if constexpr (kBf) ptx::wgmma_n64_bf16(o[m], a[m], d, b_hi, 1);
        else ptx::wgmma_n64_f16(o[m], a[m], d, b_hi, 1);
      }
      ptx::wg_commit();
      if (kk < 3) ptx::wg_wait<1>();
    }
    __syncwarp();
    if (lane == 0) {
      ptx::mbar_arrive(mlakv::cuda::ptx::smem_addr(&empty[st0]));
      ptx::mbar_arrive(mlakv::cuda::ptx::smem_addr(&empty[st1]));
    }
    ptx::wg_wait<0>();
#pragma unroll
    for (int mb = 0; mb < 4; ++mb) ptx::wg_hold32(o[mb]);
  }

  // ---- finalize: l and m of the warpgroup's rows to shared memory, then every row's output dims ----
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v = l_run[j][e];
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 4);
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 8);
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 16);
      l_run[j][e] = v;
    }
  }
  ptx::named_barrier(bar, 128);
  if (g == 0) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) red[w * kRW + 8 * j + 2 * c + e] = l_run[j][e];
    }
  }
  ptx::named_barrier(bar, 128);
  if (w == 0 && g == 0) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int rw = 8 * j + 2 * c + e;
        fin_l[wrow0 + rw] = red[rw] + red[kRW + rw] + red[2 * kRW + rw] + red[3 * kRW + rw];
        fin_m[wrow0 + rw] = m_run[j][e];
      }
    }
  }
  ptx::named_barrier(kBarAll, 256);
  const float post_nv = is_nvfp4(F) ? p.outer_scale * 128.0f : 1.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = 8 * j + 2 * c + e;
      if (row0 + r >= rows_req) continue;
      const float l = fin_l[r];
      const bool is_empty = l == 0.0f;
      const float inv_l = is_empty ? 0.0f : 1.0f / l;
      const int i = row_query(r), h = row_head(r);
      const bool lse_here = w == 0 && g == 0 && (r >> 5) == wg;
      const float lse = is_empty ? -INFINITY : (fin_m[r] + log2f(l)) * kLn2;
      float* dst = result_row(p, b, split, i, h, lse, lse_here);
      if constexpr (kBf) {
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int mb = 4 * wg + m;
          dst[64 * mb + 16 * w + g] = o[m][4 * j + e] * inv_l;
          dst[64 * mb + 16 * w + g + 8] = o[m][4 * j + 2 + e] * inv_l;
        }
      } else if constexpr (kFp8) {
#pragma unroll
        for (int qq = 0; qq < 2; ++qq) {
          const int q = 2 * wg + qq;
          const float sc = inv_l * (wg ? (qq ? sig[3] : sig[2]) : (qq ? sig[1] : sig[0]));
          *reinterpret_cast<float4*>(dst + 128 * q + 4 * wg_g) =
              make_float4(o[2 * qq][4 * j + e] * sc, o[2 * qq][4 * j + 2 + e] * sc, o[2 * qq + 1][4 * j + e] * sc,
                          o[2 * qq + 1][4 * j + 2 + e] * sc);
        }
      } else {
        const float sc = inv_l * post_nv;
#pragma unroll
        for (int mm = 0; mm < 2; ++mm) {
          const int mq = 2 * wg + mm;
          *reinterpret_cast<float4*>(dst + 16 * wg_g + 4 * mq) =
              make_float4(o[2 * mm][4 * j + e] * sc, o[2 * mm][4 * j + 2 + e] * sc, o[2 * mm + 1][4 * j + e] * sc,
                          o[2 * mm + 1][4 * j + 2 + e] * sc);
        }
      }
    }
  }
#endif  // MLAKV_SM90_DEVICE
}

}  // namespace

template <KvFormat F>
int configure_rows(int /*record_bytes*/) {
  return static_cast<int>(cudaFuncSetAttribute(attention_rows_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(sd_smem_bytes<F>())));
}

template <KvFormat F>
int ctas_per_sm_rows(int record_bytes) {
  if (configure_rows<F>(record_bytes) != 0) return 0;
  int n = 0;
  const cudaError_t e =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_rows_kernel<F>, kRowsThreads, sd_smem_bytes<F>());
  return e == cudaSuccess ? n : 0;
}

template <KvFormat F>
int launch_rows(const kernels::AttentionParams& kp, int row_blocks, void* stream) {
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(kp.sparse ? kp.B * kp.s_q : kp.B),
                  static_cast<unsigned>(kp.num_splits));
  attention_rows_kernel<F><<<grid, kRowsThreads, sd_smem_bytes<F>(), static_cast<cudaStream_t>(stream)>>>(kp);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mlakv::cuda::sm90
