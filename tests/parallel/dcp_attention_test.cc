// DCP attention on the host: dcp = 1..4 thread ranks, each with its own paged cache of
// the interleaved tokens, against one cache holding every token - every format, decode,
// causal and non-causal multi-token queries, split-KV inside ranks, requests shorter
// than the rank count, both combines (all-gather + merge, reduce-scatter over heads),
// and the argument errors (no rank may hang).
//
// Records are encoded per token, so a rank's cache holds exactly the bytes of the
// single cache for its tokens (checked byte for byte); outputs differ only by float32
// summation order and the merge. Tolerance (derived; tests/attention_test.cc's bound):
// with d = 578 u scale max_t sum_k |q_k K_tk| the float32 score error, n the request's
// tokens and S the number of partials (splits x dcp), one pass is within
//   e_o = 2 (e^(2d) - 1) vmax + (2n + 8 + 4S) u vmax,  e_l = d + (n + 8 + 4S) u + 2u|lse|
// of the float64 reference. The merge of the rank partials sees each rank's lse off by
// <= e_l, which moves the normalized merge weights by factors within e^(+-2 e_l): a
// further 2 (e^(2 e_l) - 1) vmax on out, and the merged lse adds (dcp + 2) u (|lse| + 1).
// Both the DCP and the single-rank result are checked against the float64 reference
// with their bounds, and against each other with the sum of the two. A second, tighter
// check: the DCP error may be at most 4x the single-rank float32 error (max over rows).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "format/record_codec.h"
#include "mlakv/dcp.h"

namespace mlakv {
namespace {

constexpr double kU = 1.0 / (1 << 24);
constexpr float kScale = 0.1352f;
const KvFormat kAllFormats[] = {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla,
                                KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kNvfp4DsMlaInt8Rope};

struct Shape {
  int s_q = 1;
  bool causal = true;
  int splits = 1;
  const char* name = "";
};
const Shape kShapes[] = {{1, true, 1, "decode"}, {3, true, 1, "causal s_q=3"}, {3, false, 1, "full s_q=3"},
                         {1, true, 3, "decode splits=3"}};

// Requests: empty, shorter than every rank count, ragged, a few blocks long.
const std::vector<int> kSeqlens = {0, 1, 2, 3, 5, 70, 131};
constexpr int kHeads = 12;  // divisible by 1, 2, 3, 4 (reduce-scatter over heads)

struct Tokens {
  KvFormat format;
  float outer_scale;
  std::vector<std::vector<float>> lat, rope;  // per request: [len, 512], [len, 64]
  std::vector<float> q;                       // [B, s_q, H, 576]
};

Tokens make_tokens(KvFormat f, int s_q, uint32_t seed) {
  Tokens t;
  t.format = f;
  t.outer_scale = format_info(f).has_outer_scale ? 0.6f : 1.0f;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> ch(kLatentDim);  // per-channel magnitudes, as in attention_test
  for (float& s : ch) s = std::exp2(std::uniform_real_distribution<float>(-2.0f, 1.0f)(rng));
  for (int len : kSeqlens) {
    std::vector<float> lat(static_cast<std::size_t>(len) * kLatentDim), rope(static_cast<std::size_t>(len) * kRopeDim);
    for (std::size_t i = 0; i < lat.size(); ++i) lat[i] = nd(rng) * ch[i % kLatentDim];
    for (float& x : rope) x = nd(rng);
    t.lat.push_back(std::move(lat));
    t.rope.push_back(std::move(rope));
  }
  t.q.resize(kSeqlens.size() * static_cast<std::size_t>(s_q * kHeads * kQkDim));
  for (float& x : t.q) x = nd(rng) * 0.7f;
  return t;
}

// One cache with every token, blocks handed out in a shuffled order; unused slots NaN.
struct Single {
  std::unique_ptr<KvCache> cache;
  std::vector<int32_t> table, seqlens;
  int64_t max_blocks = 1;
  std::vector<std::vector<int64_t>> slots;  // per request, by position
};

Single make_single(const Tokens& t, int bs, uint32_t seed) {
  Single s;
  int64_t need = 0;
  for (int len : kSeqlens) {
    need += (len + bs - 1) / bs;
    s.max_blocks = std::max<int64_t>(s.max_blocks, (len + bs - 1) / bs);
  }
  KvCache::Config cfg;
  cfg.num_blocks = need + 2;
  cfg.block_size = bs;
  cfg.layers = {{t.format, t.outer_scale}};
  s.cache = std::move(KvCache::create_cpu(cfg).value());
  s.cache->fill(0xFF);
  std::vector<int32_t> perm(static_cast<std::size_t>(cfg.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int B = static_cast<int>(kSeqlens.size());
  s.table.assign(static_cast<std::size_t>(B * s.max_blocks), -1);
  std::size_t next = 0;
  for (int b = 0; b < B; ++b) {
    const int len = kSeqlens[static_cast<std::size_t>(b)];
    s.seqlens.push_back(len);
    for (int64_t k = 0; k < (len + bs - 1) / bs; ++k) s.table[static_cast<std::size_t>(b * s.max_blocks + k)] = perm[next++];
    std::vector<int64_t> sl;
    for (int p = 0; p < len; ++p) sl.push_back(int64_t{s.table[static_cast<std::size_t>(b * s.max_blocks + p / bs)]} * bs + p % bs);
    if (len > 0) {
      EXPECT_TRUE(s.cache->write(0, TensorView::contiguous(sl.data(), DType::kI64, {len}),
                                 TensorView::contiguous(t.lat[static_cast<std::size_t>(b)].data(), DType::kF32, {len, kLatentDim}),
                                 TensorView::contiguous(t.rope[static_cast<std::size_t>(b)].data(), DType::kF32, {len, kRopeDim}))
                      .ok());
    }
    s.slots.push_back(std::move(sl));
  }
  return s;
}

// dcp per-rank caches filled through DcpBlockManager + dcp_write: requests appended in
// chunks, round robin, so every rank's blocks interleave across requests.
struct Sharded {
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<std::vector<int32_t>> tables, local_seqlens;
  std::vector<int32_t> global_seqlens;
  int64_t max_blocks = 1;
  std::vector<int64_t> rank_max_blocks;
};

Sharded make_sharded(const Tokens& t, int dcp, int bs) {
  Sharded s;
  int64_t blocks = 2;
  for (int len : kSeqlens) blocks += (dcp_local_count(len, 0, dcp) + bs - 1) / bs;
  auto m = DcpBlockManager::create(dcp, blocks, bs);
  EXPECT_TRUE(m.ok());
  KvCache::Config cfg;
  cfg.num_blocks = blocks;
  cfg.block_size = bs;
  cfg.layers = {{t.format, t.outer_scale}};
  std::vector<KvCache*> raw;
  for (int r = 0; r < dcp; ++r) {
    s.caches.push_back(std::move(KvCache::create_cpu(cfg).value()));
    s.caches.back()->fill(0xFF);
    raw.push_back(s.caches.back().get());
  }
  const int B = static_cast<int>(kSeqlens.size());
  std::vector<SeqId> seqs;
  for (int b = 0; b < B; ++b) seqs.push_back(m->add_sequence());
  std::vector<int> done(static_cast<std::size_t>(B), 0);
  for (bool more = true; more;) {
    more = false;
    for (int b = 0; b < B; ++b) {
      const int len = kSeqlens[static_cast<std::size_t>(b)];
      const int n = std::min(len - done[static_cast<std::size_t>(b)], 1 + b * 7);
      if (n <= 0) continue;
      more = true;
      auto slots = m->append(seqs[static_cast<std::size_t>(b)], n);
      EXPECT_TRUE(slots.ok()) << slots.status().to_string();
      const int d0 = done[static_cast<std::size_t>(b)];
      EXPECT_TRUE(dcp_write(raw, 0, *slots,
                            TensorView::contiguous(t.lat[static_cast<std::size_t>(b)].data() + d0 * kLatentDim, DType::kF32, {n, kLatentDim}),
                            TensorView::contiguous(t.rope[static_cast<std::size_t>(b)].data() + d0 * kRopeDim, DType::kF32, {n, kRopeDim}))
                      .ok());
      done[static_cast<std::size_t>(b)] += n;
    }
  }
  s.tables.resize(static_cast<std::size_t>(dcp));
  s.local_seqlens.resize(static_cast<std::size_t>(dcp));
  s.rank_max_blocks.resize(static_cast<std::size_t>(dcp));
  for (int r = 0; r < dcp; ++r) {
    EXPECT_TRUE(m->fill_tables(r, seqs, s.tables[static_cast<std::size_t>(r)], s.rank_max_blocks[static_cast<std::size_t>(r)],
                               s.local_seqlens[static_cast<std::size_t>(r)], s.global_seqlens)
                    .ok());
  }
  return s;
}

// Decoded keys of request b and the per-row error bounds of the header comment.
struct Bounds {
  double vmax = 0;
  std::vector<std::vector<float>> keys;
};
Bounds request_bounds(const Single& s, KvFormat f, float outer, int b) {
  Bounds r;
  const CacheLayerView v = *s.cache->layer(0);
  for (int64_t slot : s.slots[static_cast<std::size_t>(b)]) {
    std::vector<float> k(kQkDim);
    codec::decode_record(f, v.record(slot), outer, k.data(), k.data() + kLatentDim);
    for (int d = 0; d < kLatentDim; ++d) r.vmax = std::max(r.vmax, std::fabs(double{k[static_cast<std::size_t>(d)]}));
    r.keys.push_back(std::move(k));
  }
  return r;
}

struct Result {
  std::vector<float> o, l;
};

// Runs DCP on dcp thread ranks; returns each rank's (out, lse).
std::vector<Result> run_dcp(const Tokens& t, const Sharded& sh, const Shape& shape, int dcp, DcpCombine mode) {
  auto comms = std::move(make_thread_communicators(dcp, {std::chrono::seconds(30)}).value());
  const int64_t B = static_cast<int64_t>(kSeqlens.size());
  const int64_t Hl = mode == DcpCombine::kAllGather ? kHeads : kHeads / dcp;
  std::vector<Result> res(static_cast<std::size_t>(dcp));
  Status st = run_ranks(comms, [&](Communicator& c) -> Status {
    const std::size_t r = static_cast<std::size_t>(c.rank());
    Result& out = res[r];
    out.o.assign(static_cast<std::size_t>(B * shape.s_q * Hl * kLatentDim), NAN);
    out.l.assign(static_cast<std::size_t>(B * shape.s_q * Hl), NAN);
    DcpAttentionParams p;
    p.q = TensorView::contiguous(t.q.data(), DType::kF32, {B, shape.s_q, kHeads, kQkDim});
    p.cache = *sh.caches[r]->layer(0);
    p.block_table = TensorView::contiguous(sh.tables[r].data(), DType::kI32, {B, sh.rank_max_blocks[r]});
    p.seqlens = TensorView::contiguous(sh.global_seqlens.data(), DType::kI32, {B});
    p.softmax_scale = kScale;
    p.causal = shape.causal;
    p.num_splits = shape.splits;
    p.combine = mode;
    p.out = TensorView::contiguous(out.o.data(), DType::kF32, {B, shape.s_q, Hl, kLatentDim});
    p.lse = TensorView::contiguous(out.l.data(), DType::kF32, {B, shape.s_q, Hl});
    return dcp_attention_cpu(c, p);
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
  return res;
}

MlaAttentionParams single_params(const Tokens& t, const Single& s, const Shape& shape, Result& r) {
  const int64_t B = static_cast<int64_t>(kSeqlens.size());
  r.o.assign(static_cast<std::size_t>(B * shape.s_q * kHeads * kLatentDim), NAN);
  r.l.assign(static_cast<std::size_t>(B * shape.s_q * kHeads), NAN);
  MlaAttentionParams p;
  p.q = TensorView::contiguous(t.q.data(), DType::kF32, {B, shape.s_q, kHeads, kQkDim});
  p.cache = *s.cache->layer(0);
  p.block_table = TensorView::contiguous(s.table.data(), DType::kI32, {B, s.max_blocks});
  p.seqlens = TensorView::contiguous(s.seqlens.data(), DType::kI32, {B});
  p.softmax_scale = kScale;
  p.causal = shape.causal;
  p.num_splits = 1;
  p.out = TensorView::contiguous(r.o.data(), DType::kF32, {B, shape.s_q, kHeads, kLatentDim});
  p.lse = TensorView::contiguous(r.l.data(), DType::kF32, {B, shape.s_q, kHeads});
  return p;
}

// Checks rank `rank`'s result (heads [h0, h0 + Hl)) against the float64 reference and
// the single-rank float32 result; raises `worst` to the max |out error| vs the reference.
void check(const Tokens& t, const Single& s, const Shape& shape, int dcp, const Result& ref, const Result& one,
           const Result& got, int h0, int Hl, const std::string& what, double& worst) {
  const int B = static_cast<int>(kSeqlens.size());
  for (int b = 0; b < B; ++b) {
    const Bounds bd = request_bounds(s, t.format, t.outer_scale, b);
    const double n = static_cast<double>(kSeqlens[static_cast<std::size_t>(b)]);
    for (int i = 0; i < shape.s_q; ++i) {
      for (int hh = 0; hh < Hl; ++hh) {
        const int h = h0 + hh;
        const std::size_t row = static_cast<std::size_t>((b * shape.s_q + i) * kHeads + h);
        const std::size_t grow = static_cast<std::size_t>((b * shape.s_q + i) * Hl + hh);
        const float* qr = t.q.data() + row * kQkDim;
        double d = 0;
        for (const auto& k : bd.keys) {
          double sabs = 0;
          for (int j = 0; j < kQkDim; ++j) sabs += std::fabs(double{qr[j]} * k[static_cast<std::size_t>(j)]);
          d = std::max(d, 578.0 * kU * kScale * sabs);
        }
        const float rl = ref.l[row], gl = got.l[grow], ol = one.l[row];
        ASSERT_FALSE(std::isnan(gl)) << what << ": lse NaN at b " << b << " i " << i << " h " << h;
        if (std::isinf(rl)) {  // nothing visible on any rank: the empty rule
          ASSERT_EQ(gl, rl) << what << ": empty row b " << b << " i " << i << " h " << h;
          for (int k = 0; k < kLatentDim; ++k) ASSERT_EQ(got.o[grow * kLatentDim + static_cast<std::size_t>(k)], 0.0f) << what;
          continue;
        }
        const double S1 = shape.splits, S = shape.splits * dcp;
        const double el1 = d + (n + 8 + 4 * S1) * kU + 2 * kU * std::fabs(rl);
        const double eo1 = 2 * std::expm1(2 * d) * bd.vmax + (2 * n + 8 + 4 * S1) * kU * bd.vmax;
        const double el_part = d + (n + 8 + 4 * S) * kU + 2 * kU * std::fabs(rl);
        const double elP = el_part + (dcp + 2) * kU * (std::fabs(rl) + 1);
        const double eoP = 2 * std::expm1(2 * d) * bd.vmax + (2 * n + 8 + 4 * S) * kU * bd.vmax +
                           2 * std::expm1(2 * el_part) * bd.vmax;
        ASSERT_LE(std::fabs(double{gl} - rl), elP) << what << ": lse b " << b << " i " << i << " h " << h;
        ASSERT_LE(std::fabs(double{ol} - rl), el1) << what << ": single-rank lse b " << b;
        ASSERT_LE(std::fabs(double{gl} - ol), elP + el1) << what << ": lse vs single rank, b " << b;
        for (int k = 0; k < kLatentDim; ++k) {
          const double go = got.o[grow * kLatentDim + static_cast<std::size_t>(k)];
          const double ro = ref.o[row * kLatentDim + static_cast<std::size_t>(k)];
          const double oo = one.o[row * kLatentDim + static_cast<std::size_t>(k)];
          ASSERT_TRUE(std::isfinite(go)) << what << ": out not finite";
          ASSERT_LE(std::fabs(go - ro), eoP) << what << ": out b " << b << " i " << i << " h " << h << " dim " << k;
          ASSERT_LE(std::fabs(oo - ro), eo1) << what << ": single-rank out b " << b;
          ASSERT_LE(std::fabs(go - oo), eoP + eo1) << what << ": out vs single rank, b " << b << " dim " << k;
          worst = std::max(worst, std::fabs(go - ro));
        }
      }
    }
  }
}

double max_err(const Result& a, const Result& ref) {
  double m = 0;
  for (std::size_t r = 0; r < ref.l.size(); ++r) {
    if (std::isinf(ref.l[r])) continue;
    for (int k = 0; k < kLatentDim; ++k) {
      const std::size_t i = r * kLatentDim + static_cast<std::size_t>(k);
      m = std::max(m, std::fabs(double{a.o[i]} - ref.o[i]));
    }
  }
  return m;
}

TEST(DcpAttention, EveryFormatEveryRankCountEqualsTheSingleRankResult) {
  const int bs = 16;
  for (KvFormat f : kAllFormats) {
    for (const Shape& shape : kShapes) {
      const Tokens t = make_tokens(f, shape.s_q, 100 + static_cast<uint32_t>(f) * 7 + static_cast<uint32_t>(shape.s_q));
      const Single single = make_single(t, bs, 9);
      Result ref, one;
      auto pr = single_params(t, single, shape, ref);
      ASSERT_TRUE(mla_attention_reference(pr).ok());
      auto po = single_params(t, single, shape, one);
      ASSERT_TRUE(mla_attention_cpu(po).ok());
      const double one_err = max_err(one, ref);
      for (int dcp = 1; dcp <= 4; ++dcp) {
        const Sharded sh = make_sharded(t, dcp, bs);
        // Every token's record is byte-identical in its rank's cache.
        const int rb = record_bytes(f);
        for (std::size_t b = 0; b < kSeqlens.size(); ++b) {
          EXPECT_EQ(sh.global_seqlens[b], kSeqlens[b]);
          for (int p = 0; p < kSeqlens[b]; ++p) {
            const int r = dcp_owner(p, dcp);
            const int64_t lp = dcp_local_position(p, dcp);
            const auto& tab = sh.tables[static_cast<std::size_t>(r)];
            const int64_t slot = int64_t{tab[static_cast<std::size_t>(b * sh.rank_max_blocks[static_cast<std::size_t>(r)] + lp / bs)]} * bs + lp % bs;
            ASSERT_EQ(0, std::memcmp(sh.caches[static_cast<std::size_t>(r)]->layer(0)->record(slot),
                                     single.cache->layer(0)->record(single.slots[b][static_cast<std::size_t>(p)]), static_cast<std::size_t>(rb)))
                << format_name(f) << " dcp " << dcp << " request " << b << " position " << p;
          }
          for (int r = 0; r < dcp; ++r) {
            EXPECT_EQ(sh.local_seqlens[static_cast<std::size_t>(r)][b], dcp_local_count(kSeqlens[b], r, dcp));
          }
        }
        for (DcpCombine mode : {DcpCombine::kAllGather, DcpCombine::kReduceScatterHeads}) {
          const std::string what = fmt::format("{} {} dcp={} {}", format_name(f), shape.name, dcp,
                                               mode == DcpCombine::kAllGather ? "all-gather" : "reduce-scatter");
          const auto res = run_dcp(t, sh, shape, dcp, mode);
          const int Hl = mode == DcpCombine::kAllGather ? kHeads : kHeads / dcp;
          double worst = 0;
          for (int r = 0; r < dcp; ++r) {
            const int h0 = mode == DcpCombine::kAllGather ? 0 : r * Hl;
            check(t, single, shape, dcp, ref, one, res[static_cast<std::size_t>(r)], h0, Hl, what + fmt::format(" rank {}", r),
                  worst);
            if (::testing::Test::HasFatalFailure()) return;
            if (mode == DcpCombine::kAllGather && r > 0) {  // every rank holds the same merged result
              EXPECT_EQ(0, std::memcmp(res[static_cast<std::size_t>(r)].o.data(), res[0].o.data(), res[0].o.size() * sizeof(float)))
                  << what;
            }
          }
          EXPECT_LE(worst, 4 * one_err + 8 * kU) << what << ": DCP error vs 4x the single-rank float32 error";
        }
      }
    }
  }
}

TEST(DcpAttention, RanksWithoutTokensContributeNothing) {
  // seqlen 1 over 4 ranks: ranks 1-3 hold nothing and return out 0, lse -inf exactly;
  // the merge then returns rank 0's partial unchanged, i.e. the single-token result.
  const Shape decode;
  const Tokens t = make_tokens(KvFormat::kFp8DsMla, 1, 3);
  const Single single = make_single(t, 16, 1);
  const Sharded sh = make_sharded(t, 4, 16);
  const int64_t B = static_cast<int64_t>(kSeqlens.size());
  for (int r = 1; r < 4; ++r) {
    std::vector<float> o(static_cast<std::size_t>(B * kHeads * kLatentDim), NAN), l(static_cast<std::size_t>(B * kHeads), NAN);
    DcpAttentionParams p;
    p.q = TensorView::contiguous(t.q.data(), DType::kF32, {B, 1, kHeads, kQkDim});
    p.cache = *sh.caches[static_cast<std::size_t>(r)]->layer(0);
    p.block_table = TensorView::contiguous(sh.tables[static_cast<std::size_t>(r)].data(), DType::kI32,
                                           {B, sh.rank_max_blocks[static_cast<std::size_t>(r)]});
    p.seqlens = TensorView::contiguous(sh.global_seqlens.data(), DType::kI32, {B});
    p.softmax_scale = kScale;
    ASSERT_TRUE(dcp_local_attention_cpu(r, 4, p, TensorView::contiguous(o.data(), DType::kF32, {B, 1, kHeads, kLatentDim}),
                                        TensorView::contiguous(l.data(), DType::kF32, {B, 1, kHeads}))
                    .ok());
    for (int h = 0; h < kHeads; ++h) {  // request 1 (seqlen 1): only rank 0 has its token
      EXPECT_EQ(l[static_cast<std::size_t>(1 * kHeads + h)], -INFINITY);
      for (int k = 0; k < kLatentDim; ++k) EXPECT_EQ(o[static_cast<std::size_t>((1 * kHeads + h) * kLatentDim + k)], 0.0f);
    }
  }
  Result one;
  auto po = single_params(t, single, decode, one);
  ASSERT_TRUE(mla_attention_cpu(po).ok());
  for (DcpCombine mode : {DcpCombine::kAllGather, DcpCombine::kReduceScatterHeads}) {
    const auto res = run_dcp(t, sh, decode, 4, mode);
    const int Hl = mode == DcpCombine::kAllGather ? kHeads : kHeads / 4;
    for (int r = 0; r < 4; ++r) {
      for (int hh = 0; hh < Hl; ++hh) {
        const int h = (mode == DcpCombine::kAllGather ? 0 : r * Hl) + hh;
        EXPECT_EQ(res[static_cast<std::size_t>(r)].l[static_cast<std::size_t>(1 * Hl + hh)], one.l[static_cast<std::size_t>(1 * kHeads + h)]);
        EXPECT_EQ(0, std::memcmp(&res[static_cast<std::size_t>(r)].o[static_cast<std::size_t>((1 * Hl + hh) * kLatentDim)],
                                 &one.o[static_cast<std::size_t>((1 * kHeads + h) * kLatentDim)], kLatentDim * sizeof(float)))
            << "rank " << r << " head " << h;
      }
    }
  }
}

TEST(DcpAttention, BadArgumentsFailOnEveryRankAndNobodyHangs) {
  const Tokens t = make_tokens(KvFormat::kBf16, 1, 4);
  const Sharded sh = make_sharded(t, 3, 16);
  const int64_t B = static_cast<int64_t>(kSeqlens.size());
  auto comms = std::move(make_thread_communicators(3, {std::chrono::seconds(10)}).value());
  auto run = [&](const std::function<void(DcpAttentionParams&, int)>& mutate) {
    std::vector<Status> st(3);
    std::vector<std::vector<float>> o(3, std::vector<float>(static_cast<std::size_t>(B * kHeads * kLatentDim))),
        l(3, std::vector<float>(static_cast<std::size_t>(B * kHeads)));
    std::vector<std::thread> ts;
    for (int r = 0; r < 3; ++r) {
      ts.emplace_back([&, r] {
        std::vector<int32_t> table = sh.tables[static_cast<std::size_t>(r)];
        DcpAttentionParams p;
        p.q = TensorView::contiguous(t.q.data(), DType::kF32, {B, 1, kHeads, kQkDim});
        p.cache = *sh.caches[static_cast<std::size_t>(r)]->layer(0);
        p.block_table = TensorView::contiguous(table.data(), DType::kI32, {B, sh.rank_max_blocks[static_cast<std::size_t>(r)]});
        p.seqlens = TensorView::contiguous(sh.global_seqlens.data(), DType::kI32, {B});
        p.softmax_scale = kScale;
        p.out = TensorView::contiguous(o[static_cast<std::size_t>(r)].data(), DType::kF32, {B, 1, kHeads, kLatentDim});
        p.lse = TensorView::contiguous(l[static_cast<std::size_t>(r)].data(), DType::kF32, {B, 1, kHeads});
        mutate(p, r);
        st[static_cast<std::size_t>(r)] = dcp_attention_cpu(*comms[static_cast<std::size_t>(r)], p);
      });
    }
    for (auto& th : ts) th.join();
    return st;
  };
  auto has = [](const Status& s, const std::string& needle) { return s.message().find(needle) != std::string::npos; };
  // Rank 2's block table names a block its cache does not have.
  auto st = run([](DcpAttentionParams& p, int r) {
    if (r == 2) p.block_table.ptr<int32_t>()[6 * p.block_table.size(1)] = 999;
  });
  EXPECT_TRUE(has(st[2], "dcp rank 2/3: block_table[6][0] = 999")) << st[2].message();
  EXPECT_TRUE(has(st[0], "rank 2's arguments are invalid")) << st[0].message();
  EXPECT_TRUE(has(st[1], "rank 2's arguments are invalid")) << st[1].message();
  // Reduce-scatter over 12 heads is fine for 3 ranks; a wrong out shape on rank 0 is not.
  st = run([&](DcpAttentionParams& p, int r) {
    p.combine = DcpCombine::kReduceScatterHeads;
    p.out = TensorView::contiguous(p.out.data, DType::kF32, {B, 1, r == 0 ? kHeads : kHeads / 3, kLatentDim});
    p.lse = TensorView::contiguous(p.lse.data, DType::kF32, {B, 1, kHeads / 3});
  });
  EXPECT_TRUE(has(st[0], "out: expected shape")) << st[0].message();
  EXPECT_TRUE(has(st[1], "rank 0's arguments are invalid")) << st[1].message();
  // Ranks disagreeing on the batch (q) fail together.
  st = run([&](DcpAttentionParams& p, int r) {
    if (r == 1) {
      p.q.shape[0] = B - 1;
      p.block_table.shape[0] = B - 1;
      p.seqlens.shape[0] = B - 1;
      p.out.shape[0] = B - 1;
      p.lse.shape[0] = B - 1;
    }
  });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(has(st[static_cast<std::size_t>(r)], "rank 1 passed in")) << st[static_cast<std::size_t>(r)].message();
  // A host cache expected; a q on the GPU.
  st = run([](DcpAttentionParams& p, int r) {
    if (r == 0) p.q.device = Device::cuda(0);
  });
  EXPECT_TRUE(has(st[0], "q: expected a tensor on cpu, got cuda:0")) << st[0].message();
  EXPECT_FALSE(st[1].ok());
}

TEST(DcpAttention, CombineRejectsHeadsNotDivisibleAndDeviceCommunicators) {
  std::vector<float> o(2 * kLatentDim), l(2), out(2 * kLatentDim), lo(2);
  auto two = std::move(make_thread_communicators(2).value());
  Status st = run_ranks(two, [&](Communicator& c) {
    std::vector<float> o3(3 * kLatentDim), l3(3), out3(3 * kLatentDim), lo3(3);
    return dcp_combine(c, TensorView::contiguous(o3.data(), DType::kF32, {1, 1, 3, kLatentDim}),
                       TensorView::contiguous(l3.data(), DType::kF32, {1, 1, 3}), DcpCombine::kReduceScatterHeads,
                       TensorView::contiguous(out3.data(), DType::kF32, {1, 1, 1, kLatentDim}),
                       TensorView::contiguous(lo3.data(), DType::kF32, {1, 1, 1}));
  });
  EXPECT_NE(st.message().find("needs H (3) divisible by dcp (2)"), std::string::npos) << st.message();
  struct FakeDevice final : Communicator {
    int rank() const override { return 0; }
    int size() const override { return 1; }
    Device device() const override { return Device::cuda(0); }
    std::string name() const override { return "fake"; }
    Status all_gather(const TensorView&, const TensorView&) override { return Status::Ok(); }
    Status reduce_scatter_sum(const TensorView&, const TensorView&) override { return Status::Ok(); }
    Status all_reduce_sum(const TensorView&, const TensorView&) override { return Status::Ok(); }
    Status barrier() override { return Status::Ok(); }
  } fake;
  st = dcp_combine(fake, TensorView::contiguous(o.data(), DType::kF32, {1, 1, 2, kLatentDim}),
                   TensorView::contiguous(l.data(), DType::kF32, {1, 1, 2}), DcpCombine::kAllGather,
                   TensorView::contiguous(out.data(), DType::kF32, {1, 1, 2, kLatentDim}),
                   TensorView::contiguous(lo.data(), DType::kF32, {1, 1, 2}));
  EXPECT_NE(st.message().find("use cuda::dcp_combine"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace mlakv
