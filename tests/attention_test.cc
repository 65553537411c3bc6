// CPU attention: the optimized float32 path against the float64 reference on the same
// records, over adversarial cache layouts (shuffled block tables, ragged and empty
// requests, odd block sizes, unused slots poisoned with NaN), causal multi-token
// queries, split counts, sparse indices with invalid entries, the merge of partials,
// a 16K-token needle in every format, and the argument errors.
//
// Tolerance (derived, per output row): float32 scores carry |ds| <= d = 578 u scale
// max_t sum_k |q_k K_tk| (576-term FMA dot + the pre-scaling of q; u = 2^-24). Softmax
// weights then move by at most a factor e^(+-2d), so a convex combination of values
// bounded by vmax moves by <= 2 (e^(2d) - 1) vmax; the float32 sums over n tokens
// (weights, P V, the denominator) and the split merges add (2n + 8 + 4 S) u vmax.
// lse moves by <= d + (n + 8 + 4 S) u + 2 u |lse|.
// Those worst-case bounds are loose at large n, so a second check compares with the
// error of a naive float32 implementation (sequential sums, std::exp) on the same
// inputs: the optimized path may be at most 4x worse than it, anywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "format/record_codec.h"
#include "mlakv/attention.h"
#include "mlakv/thread_pool.h"
#include "support/attention_case.h"

namespace mlakv {
namespace {

using test::Case;
using test::Built;
using test::build;
using test::token_set;
using test::decoded;
using test::describe;

constexpr double kU = 1.0 / (1 << 24);
const KvFormat kAllFormats[] = {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla,
                                KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kNvfp4DsMlaInt8Rope};




// Naive float32 attention: the yardstick for same-precision error.
void naive_f32(const Built& t, std::vector<float>& o, std::vector<float>& lse) {
  const Case& c = t.c;
  const int B = static_cast<int>(c.seqlens.size());
  o.assign(static_cast<std::size_t>(B * c.s_q * c.heads * kLatentDim), 0.0f);
  lse.assign(static_cast<std::size_t>(B * c.s_q * c.heads), -INFINITY);
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < c.s_q; ++i) {
      const auto slots = token_set(t, b, i);
      std::vector<std::vector<float>> keys;
      for (int64_t s : slots) keys.push_back(decoded(t.view, s));
      for (int h = 0; h < c.heads; ++h) {
        const std::size_t row = static_cast<std::size_t>((b * c.s_q + i) * c.heads + h);
        if (keys.empty()) continue;
        const float* qr = t.q.data() + row * kQkDim;
        std::vector<float> sc;
        float mx = -INFINITY;
        for (const auto& k : keys) {
          float dot = 0;
          for (int d = 0; d < kQkDim; ++d) dot += qr[d] * k[static_cast<std::size_t>(d)];
          sc.push_back(dot * 0.1352f);
          mx = std::max(mx, sc.back());
        }
        float sum = 0;
        float* orow = o.data() + row * kLatentDim;
        for (std::size_t k = 0; k < keys.size(); ++k) {
          const float w = std::exp(sc[k] - mx);
          sum += w;
          for (int d = 0; d < kLatentDim; ++d) orow[d] += w * keys[k][static_cast<std::size_t>(d)];
        }
        for (int d = 0; d < kLatentDim; ++d) orow[d] /= sum;
        lse[row] = mx + std::log(sum);
      }
    }
  }
}

// Checks `got` against `ref` with the derived tolerance of the header comment.
void expect_close(Built& t, const std::vector<float>& ref_o, const std::vector<float>& ref_lse,
                  const std::vector<float>& got_o, const std::vector<float>& got_lse, const std::string& what) {
  const Case& c = t.c;
  const int B = static_cast<int>(c.seqlens.size());
  const double scale = 0.1352;
  std::vector<float> nv_o, nv_l;
  naive_f32(t, nv_o, nv_l);
  double naive_o = 0, naive_l = 0, got_eo = 0, got_el = 0, omax = 0;
  for (std::size_t r = 0; r < ref_lse.size(); ++r) {
    if (std::isinf(ref_lse[r])) continue;
    naive_l = std::max(naive_l, std::fabs(static_cast<double>(nv_l[r]) - ref_lse[r]));
    got_el = std::max(got_el, std::fabs(static_cast<double>(got_lse[r]) - ref_lse[r]));
    for (int d = 0; d < kLatentDim; ++d) {
      const std::size_t k = r * kLatentDim + static_cast<std::size_t>(d);
      naive_o = std::max(naive_o, std::fabs(static_cast<double>(nv_o[k]) - ref_o[k]));
      got_eo = std::max(got_eo, std::fabs(static_cast<double>(got_o[k]) - ref_o[k]));
      omax = std::max(omax, std::fabs(static_cast<double>(ref_o[k])));
    }
  }
  EXPECT_LE(got_eo, 4 * naive_o + 8 * kU * omax) << what << ": out error vs a naive float32 implementation's";
  EXPECT_LE(got_el, 4 * naive_l + 1e-6) << what << ": lse error vs a naive float32 implementation's";
  for (int b = 0; b < B; ++b) {
    const auto& slots = t.written[static_cast<std::size_t>(b)];
    std::vector<std::vector<float>> keys;
    double vmax = 0;
    for (int64_t s : slots) {
      keys.push_back(decoded(t.view, s));
      for (int d = 0; d < kLatentDim; ++d) vmax = std::max(vmax, std::fabs(static_cast<double>(keys.back()[static_cast<std::size_t>(d)])));
    }
    const double n = static_cast<double>(slots.size());
    for (int i = 0; i < c.s_q; ++i) {
      for (int h = 0; h < c.heads; ++h) {
        const std::size_t row = static_cast<std::size_t>((b * c.s_q + i) * c.heads + h);
        const float* qr = t.q.data() + row * kQkDim;
        double dmax = 0;
        for (const auto& k : keys) {
          double sabs = 0;
          for (int d = 0; d < kQkDim; ++d) sabs += std::fabs(static_cast<double>(qr[d]) * k[static_cast<std::size_t>(d)]);
          dmax = std::max(dmax, 578.0 * kU * scale * sabs);
        }
        const double tol_o = 2.0 * std::expm1(2.0 * dmax) * vmax + (2.0 * n + 8 + 4.0 * c.splits) * kU * vmax + 1e-30;
        const float rl = ref_lse[row], gl = got_lse[row];
        ASSERT_FALSE(std::isnan(gl)) << what << ": lse NaN at row " << row;
        if (std::isinf(rl)) {
          ASSERT_EQ(gl, rl) << what << ": empty query row " << row;
        } else {
          const double tol_l = dmax + (n + 8 + 4.0 * c.splits) * kU + 2 * kU * std::fabs(rl);
          ASSERT_LE(std::fabs(static_cast<double>(gl) - rl), tol_l) << what << ": lse row " << row;
        }
        for (int d = 0; d < kLatentDim; ++d) {
          const float go = got_o[row * kLatentDim + static_cast<std::size_t>(d)];
          const float ro = ref_o[row * kLatentDim + static_cast<std::size_t>(d)];
          ASSERT_TRUE(std::isfinite(go)) << what << ": out not finite at row " << row << " dim " << d;
          ASSERT_LE(std::fabs(static_cast<double>(go) - ro), tol_o)
              << what << ": out row " << row << " (b " << b << " i " << i << " h " << h << ") dim " << d;
        }
      }
    }
  }
}


void run_case(const Case& c, ThreadPool* pool) {
  Built t = build(c);
  std::vector<float> ro, rl, go, gl;
  auto pr = t.params(ro, rl);
  Status st = mla_attention_reference(pr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto pg = t.params(go, gl);
  st = mla_attention_cpu(pg, {pool});
  ASSERT_TRUE(st.ok()) << st.to_string();
  expect_close(t, ro, rl, go, gl, describe(c));
}

class AttentionTest : public ::testing::Test {
 protected:
  ThreadPool pool_{2};
};

TEST_F(AttentionTest, EveryFormatEveryBlockSizeRaggedAndEmptyRequests) {
  for (KvFormat f : kAllFormats) {
    for (int bs : {1, 16, 64, 33}) {
      Case c;
      c.format = f;
      c.block_size = bs;
      c.seqlens = {0, 131, 1, 200};  // zero-length, ragged, single-token
      c.outer_scale = format_info(f).has_outer_scale ? 0.6f : 1.0f;
      c.seed = static_cast<uint32_t>(bs * 7 + static_cast<int>(f));
      run_case(c, &pool_);
    }
  }
}

// The nvfp4 per-token scale mode: the readers take s_t from each record.
TEST_F(AttentionTest, TokenScaleModeOnEveryNvfp4Format) {
  for (KvFormat f : {KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kNvfp4DsMlaInt8Rope}) {
    for (bool sparse : {false, true}) {
      Case c;
      c.format = f;
      c.token_scale = true;
      c.block_size = 16;
      c.seqlens = {0, 131, 1, 70};
      c.sparse = sparse;
      c.topk = sparse ? 40 : 0;
      c.splits = 2;
      c.seed = 31 + static_cast<uint32_t>(f);
      run_case(c, &pool_);
    }
  }
}

TEST_F(AttentionTest, HeadCounts) {
  for (int heads : {1, 3, 16, 128}) {
    Case c;
    c.format = KvFormat::kFp8DsMla;
    c.heads = heads;
    c.seqlens = {97, 64};
    c.seed = static_cast<uint32_t>(heads);
    run_case(c, &pool_);
  }
}

TEST_F(AttentionTest, CausalMultiTokenQueriesAndChunkedPrefill) {
  for (KvFormat f : kAllFormats) {
    Case mtp;  // speculative decode: 3 new tokens per request
    mtp.format = f;
    mtp.s_q = 3;
    mtp.seqlens = {50, 3, 2};  // the last request has fewer tokens than queries
    run_case(mtp, &pool_);
    Case prefill;  // a 40-token chunk over a 70-token prefix: read-after-write
    prefill.format = f;
    prefill.s_q = 40;
    prefill.heads = 4;
    prefill.seqlens = {110};
    prefill.block_size = 64;
    run_case(prefill, &pool_);
    Case full = mtp;  // non-causal: every query sees all tokens
    full.causal = false;
    run_case(full, &pool_);
  }
}

TEST_F(AttentionTest, SplitCountsAgree) {
  for (KvFormat f : kAllFormats) {
    for (int splits : {1, 2, 3, 7, 64}) {  // 64 > tokens in the short request: empty partials
      Case c;
      c.format = f;
      c.splits = splits;
      c.s_q = 2;
      c.seqlens = {300, 20};
      run_case(c, &pool_);
    }
  }
}

// Scores that rise from tile to tile (record magnitudes x 1 + 1.5 * tile): the running
// maximum moves at every tile and the partial results rescale, in one pass and over splits.
TEST_F(AttentionTest, RisingScoresMoveTheRunningMaximum) {
  for (KvFormat f : kAllFormats) {
    for (int splits : {1, 3}) {
      Case c;
      c.format = f;
      c.ramp = 1.5f;
      c.block_size = 64;
      c.s_q = 2;
      c.splits = splits;
      c.seqlens = {700, 130};
      c.seed = 41 + static_cast<uint32_t>(f) + static_cast<uint32_t>(splits);
      run_case(c, &pool_);
    }
  }
}

TEST_F(AttentionTest, SparseIndicesWithInvalidEntries) {
  for (KvFormat f : kAllFormats) {
    Case c;
    c.format = f;
    c.sparse = true;
    c.topk = 48;
    c.s_q = 2;
    c.seqlens = {120, 0, 77};
    c.splits = 3;
    run_case(c, &pool_);
    c.topk_length = true;
    c.seed = 9;
    run_case(c, &pool_);
  }
}

TEST_F(AttentionTest, Bf16QueriesAndNoPool) {
  Case c;
  c.format = KvFormat::kNvfp4DsMla;
  c.bf16_q = true;
  c.seqlens = {90, 33};
  Built t = build(c);
  std::vector<float> ro, rl, go, gl;
  auto pr = t.params(ro, rl);
  ASSERT_TRUE(mla_attention_reference(pr).ok());
  auto pg = t.params(go, gl);
  ASSERT_TRUE(mla_attention_cpu(pg).ok());  // no pool: the calling thread runs every unit
  expect_close(t, ro, rl, go, gl, "bf16 q");
}

TEST_F(AttentionTest, EmptyQueriesGiveZeroAndMinusInfinity) {
  Case c;
  c.seqlens = {0, 0};
  c.s_q = 2;
  Built t = build(c);
  std::vector<float> o, l;
  auto p = t.params(o, l);
  ASSERT_TRUE(mla_attention_cpu(p, {&pool_}).ok());
  for (float x : o) EXPECT_EQ(x, 0.0f);
  for (float x : l) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
}

TEST_F(AttentionTest, SplitsMergedByMergeAttnStatesEqualOnePass) {
  // Two halves of a request's tokens as sparse index lists, each attended separately,
  // merged with the public merge, against one pass over all tokens; plus an empty part.
  Case c;
  c.format = KvFormat::kFp8DsMla;
  c.seqlens = {150};
  c.heads = 4;
  Built t = build(c);
  const auto& w = t.written[0];
  auto run_sparse = [&](std::vector<int32_t> idx, std::vector<float>& o, std::vector<float>& l) {
    Built& tt = t;
    tt.c.sparse = true;
    tt.c.topk = static_cast<int>(idx.size());
    tt.indices = idx;
    auto p = tt.params(o, l);
    ASSERT_TRUE(mla_attention_reference(p).ok());
  };
  std::vector<int32_t> all(w.begin(), w.end()), a(w.begin(), w.begin() + 70), b(w.begin() + 70, w.end());
  std::vector<float> o_all, l_all, o_a, l_a, o_b, l_b, o_e, l_e;
  run_sparse(all, o_all, l_all);
  run_sparse(a, o_a, l_a);
  run_sparse(b, o_b, l_b);
  run_sparse({-1}, o_e, l_e);  // empty partial
  const int64_t N = 4;
  std::vector<float> parts_o, parts_l;
  for (auto* v : {&o_a, &o_e, &o_b}) parts_o.insert(parts_o.end(), v->begin(), v->end());
  for (auto* v : {&l_a, &l_e, &l_b}) parts_l.insert(parts_l.end(), v->begin(), v->end());
  std::vector<float> mo(N * kLatentDim), ml(N);
  ASSERT_TRUE(merge_attn_states(TensorView::contiguous(parts_o.data(), DType::kF32, {3, N, kLatentDim}),
                                TensorView::contiguous(parts_l.data(), DType::kF32, {3, N}),
                                TensorView::contiguous(mo.data(), DType::kF32, {N, kLatentDim}),
                                TensorView::contiguous(ml.data(), DType::kF32, {N}))
                  .ok());
  for (int64_t r = 0; r < N; ++r) {
    EXPECT_NEAR(ml[static_cast<std::size_t>(r)], l_all[static_cast<std::size_t>(r)], 1e-5 * std::fabs(l_all[static_cast<std::size_t>(r)]) + 1e-6);
    for (int d = 0; d < kLatentDim; ++d) {
      const std::size_t i = static_cast<std::size_t>(r * kLatentDim + d);
      EXPECT_NEAR(mo[i], o_all[i], 1e-5 * (std::fabs(o_all[i]) + 1.0f));
    }
  }
  // Only empty partials: out 0, lse -inf.
  std::vector<float> eo(2 * kLatentDim, std::numeric_limits<float>::quiet_NaN()), el(2, -INFINITY), so(kLatentDim), sl(1);
  ASSERT_TRUE(merge_attn_states(TensorView::contiguous(eo.data(), DType::kF32, {2, 1, kLatentDim}),
                                TensorView::contiguous(el.data(), DType::kF32, {2, 1}),
                                TensorView::contiguous(so.data(), DType::kF32, {1, kLatentDim}),
                                TensorView::contiguous(sl.data(), DType::kF32, {1}))
                  .ok());
  EXPECT_EQ(sl[0], -INFINITY);
  for (float x : so) EXPECT_EQ(x, 0.0f);
}

TEST_F(AttentionTest, NeedleRetrievedAt16KInEveryFormat) {
  // 16K tokens of random latents; one needle whose latent is the query's direction
  // scaled up. Its score must rank first after quantization, and the output must lean
  // toward it.
  const int T = 16384, needle = 12345;
  std::mt19937 rng(77);
  std::normal_distribution<float> nd;
  std::vector<float> lat(static_cast<std::size_t>(T) * kLatentDim), rope(static_cast<std::size_t>(T) * kRopeDim);
  for (float& x : lat) x = nd(rng) * 0.5f;
  for (float& x : rope) x = nd(rng) * 0.5f;
  std::vector<float> q(kQkDim);
  for (float& x : q) x = nd(rng);
  for (int d = 0; d < kLatentDim; ++d) lat[static_cast<std::size_t>(needle) * kLatentDim + static_cast<std::size_t>(d)] = 0.25f * q[static_cast<std::size_t>(d)];
  for (KvFormat f : kAllFormats) {
    KvCache::Config cfg;
    cfg.num_blocks = T / 64;
    cfg.layers = {{f, 1.0f}};
    auto cache = KvCache::create_cpu(cfg);
    std::vector<int64_t> slots(T);
    std::iota(slots.begin(), slots.end(), 0);
    ASSERT_TRUE((*cache)->write(0, TensorView::contiguous(slots.data(), DType::kI64, {T}),
                                TensorView::contiguous(lat.data(), DType::kF32, {T, kLatentDim}),
                                TensorView::contiguous(rope.data(), DType::kF32, {T, kRopeDim}))
                    .ok());
    auto v = *(*cache)->layer(0);
    int rank = 0;
    double needle_score = 0;
    std::vector<double> score(T);
    for (int t = 0; t < T; ++t) {
      auto k = decoded(v, t);
      double s = 0;
      for (int d = 0; d < kQkDim; ++d) s += static_cast<double>(q[static_cast<std::size_t>(d)]) * k[static_cast<std::size_t>(d)];
      score[static_cast<std::size_t>(t)] = s;
    }
    needle_score = score[needle];
    for (double s : score) rank += s > needle_score;
    EXPECT_EQ(rank, 0) << format_name(f);
    // Through the optimized kernel: the needle dominates the output.
    std::vector<int32_t> table(T / 64), len = {T};
    std::iota(table.begin(), table.end(), 0);
    std::vector<float> out(kLatentDim), lse(1);
    MlaAttentionParams p;
    p.q = TensorView::contiguous(q.data(), DType::kF32, {1, 1, 1, kQkDim});
    p.cache = v;
    p.block_table = TensorView::contiguous(table.data(), DType::kI32, {1, T / 64});
    p.seqlens = TensorView::contiguous(len.data(), DType::kI32, {1});
    p.softmax_scale = 0.1352f;
    p.num_splits = 4;
    p.out = TensorView::contiguous(out.data(), DType::kF32, {1, 1, 1, kLatentDim});
    p.lse = TensorView::contiguous(lse.data(), DType::kF32, {1, 1, 1});
    ASSERT_TRUE(mla_attention_cpu(p, {&pool_}).ok());
    double dot = 0, n1 = 0, n2 = 0;
    for (int d = 0; d < kLatentDim; ++d) {
      dot += out[static_cast<std::size_t>(d)] * q[static_cast<std::size_t>(d)];
      n1 += out[static_cast<std::size_t>(d)] * out[static_cast<std::size_t>(d)];
      n2 += q[static_cast<std::size_t>(d)] * q[static_cast<std::size_t>(d)];
    }
    EXPECT_GT(dot / std::sqrt(n1 * n2), 0.9) << format_name(f) << ": output does not point at the needle";
  }
}

TEST_F(AttentionTest, BadArguments) {
  Case c;
  c.seqlens = {20, 10};
  Built t = build(c);
  std::vector<float> o, l;
  auto expect_err = [&](auto mutate, const char* needle) {
    auto p = t.params(o, l);
    mutate(p);
    Status st = mla_attention_cpu(p, {&pool_});
    ASSERT_FALSE(st.ok()) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    Status st2 = mla_attention_reference(p);
    EXPECT_FALSE(st2.ok()) << needle;
    for (float x : o) ASSERT_TRUE(std::isnan(x)) << "out was written on failure";
  };
  expect_err([](MlaAttentionParams& p) { p.q.shape[3] = 512; }, "q: expected shape");
  expect_err([](MlaAttentionParams& p) { p.q.dtype = DType::kI32; }, "q: expected dtype");
  expect_err([](MlaAttentionParams& p) { p.out.shape[3] = 576; }, "out: expected shape");
  expect_err([](MlaAttentionParams& p) { p.lse.dtype = DType::kF64; }, "lse: expected dtype");
  expect_err([](MlaAttentionParams& p) { p.softmax_scale = 0; }, "softmax_scale");
  expect_err([](MlaAttentionParams& p) { p.softmax_scale = NAN; }, "softmax_scale");
  expect_err([](MlaAttentionParams& p) { p.num_splits = 0; }, "num_splits");
  expect_err([](MlaAttentionParams& p) { p.seqlens.shape[0] = 3; }, "seqlens");
  expect_err([&](MlaAttentionParams& p) { p.block_table.ptr<int32_t>()[1 * t.max_blocks + 0] = 9999; }, "block_table[1][0] = 9999");
  t = build(c);
  expect_err([&](MlaAttentionParams& p) { p.block_table.ptr<int32_t>()[0] = -1; }, "block_table[0][0] = -1");
  t = build(c);
  expect_err([&](MlaAttentionParams& p) { p.seqlens.ptr<int32_t>()[1] = 1000; }, "seqlens[1] = 1000");
  t = build(c);
  expect_err([](MlaAttentionParams& p) { p.cache.record_bytes = 100; }, "record_bytes");
  expect_err([](MlaAttentionParams& p) { p.cache.outer_scale = -1; }, "outer_scale");
  expect_err([](MlaAttentionParams& p) { p.out.device = Device::cuda(0); }, "cuda:0");
  Case sc = c;
  sc.sparse = true;
  sc.topk = 8;
  sc.topk_length = true;
  t = build(sc);
  expect_err([](MlaAttentionParams& p) { p.topk_length.ptr<int32_t>()[1] = 9; }, "topk_length[1] = 9");
  t = build(sc);
  expect_err([](MlaAttentionParams& p) { p.indices.dtype = DType::kI64; }, "indices: expected dtype");
}

}  // namespace
}  // namespace mlakv
