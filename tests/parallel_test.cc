// Ranks on the host: the thread communicator's collectives against hand-computed
// values (exact: integer-valued floats, and a sum whose rank order decides the
// result), its argument errors and timeout; the DCP index math and per-rank block
// accounting against brute-force counts and mlakv plan; tensor-parallel heads against
// an unsharded float64 projection. DCP attention itself is tests/parallel/dcp_attention_test.cc.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "mlakv/attention.h"
#include "mlakv/dcp.h"
#include "mlakv/parallel.h"
#include "mlakv/plan.h"

namespace mlakv {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // float32 unit roundoff

std::vector<std::unique_ptr<Communicator>> comms(int n, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto c = make_thread_communicators(n, {timeout});
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return std::move(c).value();
}

template <class T>
TensorView view(std::vector<T>& v, DType t, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(v.data(), t, shape);
}

bool contains(const Status& st, const std::string& needle) { return st.message().find(needle) != std::string::npos; }

// ---- collectives -------------------------------------------------------------------------
TEST(ThreadComm, AllGatherStacksEveryRanksChunkInRankOrder) {
  for (int n : {1, 2, 3, 4}) {
    auto cs = comms(n);
    ASSERT_TRUE(run_ranks(cs, [&](Communicator& c) -> Status {
                  std::vector<float> in(5);
                  for (int i = 0; i < 5; ++i) in[static_cast<std::size_t>(i)] = static_cast<float>(c.rank() * 100 + i);
                  std::vector<float> a(static_cast<std::size_t>(n * 5), -1), b(a.size(), -1);
                  MLAKV_RETURN_IF_ERROR(c.all_gather(view(in, DType::kF32, {5}), view(a, DType::kF32, {n, 5})));
                  MLAKV_RETURN_IF_ERROR(c.all_gather(view(in, DType::kF32, {5}), view(b, DType::kF32, {n * 5})));
                  for (int k = 0; k < n; ++k) {
                    for (int i = 0; i < 5; ++i) {
                      const float want = static_cast<float>(k * 100 + i);
                      if (a[static_cast<std::size_t>(k * 5 + i)] != want || b[static_cast<std::size_t>(k * 5 + i)] != want) {
                        return internal_error("wrong gathered value");
                      }
                    }
                  }
                  // Any dtype moves as bytes; the in-place form (in is the rank's own chunk of out).
                  std::vector<uint8_t> bytes(static_cast<std::size_t>(n * 3));
                  for (int i = 0; i < 3; ++i) bytes[static_cast<std::size_t>(c.rank() * 3 + i)] = static_cast<uint8_t>(7 * c.rank() + i);
                  MLAKV_RETURN_IF_ERROR(c.all_gather(TensorView::contiguous(bytes.data() + c.rank() * 3, DType::kU8, {3}),
                                                     view(bytes, DType::kU8, {n, 3})));
                  for (int k = 0; k < n; ++k) {
                    for (int i = 0; i < 3; ++i) {
                      if (bytes[static_cast<std::size_t>(k * 3 + i)] != 7 * k + i) return internal_error("in-place gather");
                    }
                  }
                  return Status::Ok();
                }).ok());
  }
}

TEST(ThreadComm, ReduceScatterAndAllReduceSumExactly) {
  for (int n : {1, 2, 3, 4}) {
    auto cs = comms(n);
    Status st = run_ranks(cs, [&](Communicator& c) -> Status {
      // in_k[j] = (k + 1) * (j + 1): rank r's chunk sums to (j + 1) * n (n + 1) / 2, exact.
      std::vector<float> in(static_cast<std::size_t>(n * 3)), out(3, -1);
      for (int j = 0; j < n * 3; ++j) in[static_cast<std::size_t>(j)] = static_cast<float>((c.rank() + 1) * (j + 1));
      MLAKV_RETURN_IF_ERROR(c.reduce_scatter_sum(view(in, DType::kF32, {n, 3}), view(out, DType::kF32, {3})));
      for (int i = 0; i < 3; ++i) {
        const int j = c.rank() * 3 + i;
        if (out[static_cast<std::size_t>(i)] != static_cast<float>((j + 1) * n * (n + 1) / 2)) return internal_error("reduce_scatter");
      }
      std::vector<int64_t> v = {c.rank() + int64_t{1}, -3 * c.rank()};
      MLAKV_RETURN_IF_ERROR(c.all_reduce_sum(view(v, DType::kI64, {2}), view(v, DType::kI64, {2})));  // in place
      if (v[0] != n * (n + 1) / 2 || v[1] != -3 * n * (n - 1) / 2) return internal_error("all_reduce i64");
      std::vector<double> d = {0.5 * c.rank()}, dout(1);
      MLAKV_RETURN_IF_ERROR(c.all_reduce_sum(view(d, DType::kF64, {1}), view(dout, DType::kF64, {1})));
      if (dout[0] != 0.25 * n * (n - 1)) return internal_error("all_reduce f64");
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
}

TEST(ThreadComm, SumsAddInRankOrder) {
  // Rank values 1, 2^-24, 2^-24, -1: in rank order ((1 + 2^-24) + 2^-24) - 1 = 0 in
  // float32 (each 1 + 2^-24 is a tie that rounds to even, 1); any order adding the two
  // small values first would give 2^-23. And random values: bitwise the sequential fold.
  auto cs = comms(4);
  const float vals[4] = {1.0f, std::ldexp(1.0f, -24), std::ldexp(1.0f, -24), -1.0f};
  std::vector<std::vector<float>> rnd(4, std::vector<float>(64));
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (auto& r : rnd) {
    for (float& x : r) x = nd(rng) * std::exp2(static_cast<float>(rng() % 20) - 10);
  }
  std::vector<float> want(64);
  for (int i = 0; i < 64; ++i) {
    float acc = rnd[0][static_cast<std::size_t>(i)];
    for (int k = 1; k < 4; ++k) acc = acc + rnd[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)];
    want[static_cast<std::size_t>(i)] = acc;
  }
  Status st = run_ranks(cs, [&](Communicator& c) -> Status {
    std::vector<float> x = {vals[c.rank()]}, y(1, -7);
    MLAKV_RETURN_IF_ERROR(c.all_reduce_sum(view(x, DType::kF32, {1}), view(y, DType::kF32, {1})));
    if (y[0] != 0.0f) return internal_error(fmt::format("rank-order sum gave {}", y[0]));
    for (int rep = 0; rep < 50; ++rep) {  // also stresses the two-phase rendezvous
      std::vector<float> in = rnd[static_cast<std::size_t>(c.rank())], out(64);
      MLAKV_RETURN_IF_ERROR(c.all_reduce_sum(view(in, DType::kF32, {64}), view(out, DType::kF32, {64})));
      if (std::memcmp(out.data(), want.data(), 64 * sizeof(float)) != 0) return internal_error("not the rank-order fold");
    }
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
}

TEST(ThreadComm, BarrierWaitsForEveryRank) {
  auto cs = comms(4);
  std::atomic<int> before{0};
  Status st = run_ranks(cs, [&](Communicator& c) -> Status {
    for (int round = 1; round <= 20; ++round) {
      before.fetch_add(1);
      MLAKV_RETURN_IF_ERROR(c.barrier());
      if (before.load() < 4 * round) return internal_error("left the barrier early");
      MLAKV_RETURN_IF_ERROR(c.barrier());  // nobody starts the next round before all checked
    }
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
}

// Runs one collective per rank with per-rank arguments; returns every rank's Status.
std::vector<Status> each(std::vector<std::unique_ptr<Communicator>>& cs, const std::function<Status(Communicator&)>& fn) {
  std::vector<Status> out(cs.size());
  std::vector<std::thread> ts;
  for (std::size_t r = 0; r < cs.size(); ++r) ts.emplace_back([&, r] { out[r] = fn(*cs[r]); });
  for (auto& t : ts) t.join();
  return out;
}

TEST(ThreadComm, BadArgumentsFailOnEveryRankNamingTheRank) {
  auto cs = comms(3);
  std::vector<std::vector<float>> in(3, std::vector<float>(8)), out(3, std::vector<float>(24));
  // Rank 1 gathers 6 elements where the others gather 8.
  auto st = each(cs, [&](Communicator& c) {
    const int64_t m = c.rank() == 1 ? 6 : 8;
    return c.all_gather(TensorView::contiguous(in[c.rank()].data(), DType::kF32, {m}),
                        TensorView::contiguous(out[c.rank()].data(), DType::kF32, {3, m}));
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(st[r].ok());
    EXPECT_TRUE(contains(st[r], "rank 1 passed in = 6 elements of f32, rank 0 8")) << st[r].message();
  }
  // Rank 2's out is on a GPU: rank 2 names the device, the others name rank 2.
  st = each(cs, [&](Communicator& c) {
    TensorView o = TensorView::contiguous(out[c.rank()].data(), DType::kF32, {3, 8});
    if (c.rank() == 2) o.device = Device::cuda(0);
    return c.all_gather(TensorView::contiguous(in[c.rank()].data(), DType::kF32, {8}), o);
  });
  EXPECT_TRUE(contains(st[2], "out must be on cpu, got cuda:0")) << st[2].message();
  EXPECT_TRUE(contains(st[0], "rank 2's arguments are invalid")) << st[0].message();
  EXPECT_TRUE(contains(st[1], "rank 2's arguments are invalid")) << st[1].message();
  // Local errors on one rank: wrong stacked shape, non-contiguous, dtype, no bf16 sums.
  auto expect_local = [&](const std::function<Status(Communicator&, bool)>& call, const std::string& needle) {
    auto s = each(cs, [&](Communicator& c) { return call(c, c.rank() == 0); });
    EXPECT_TRUE(contains(s[0], needle)) << s[0].message();
    for (int r = 1; r < 3; ++r) EXPECT_TRUE(contains(s[r], "rank 0's arguments are invalid")) << s[r].message();
  };
  expect_local([&](Communicator& c, bool bad) {
    return c.all_gather(TensorView::contiguous(in[c.rank()].data(), DType::kF32, {8}),
                        TensorView::contiguous(out[c.rank()].data(), DType::kF32, {bad ? 2 : 3, 8}));
  }, "out must hold 3 chunks of in's shape [8]");
  expect_local([&](Communicator& c, bool bad) {
    TensorView i = TensorView::contiguous(in[c.rank()].data(), DType::kF32, {4, 2});
    if (bad) std::swap(i.strides[0], i.strides[1]);
    return c.all_reduce_sum(i, TensorView::contiguous(out[c.rank()].data(), DType::kF32, {4, 2}));
  }, "in must be contiguous");
  expect_local([&](Communicator& c, bool bad) {
    return c.all_reduce_sum(TensorView::contiguous(in[c.rank()].data(), DType::kF32, {8}),
                            TensorView::contiguous(out[c.rank()].data(), bad ? DType::kI32 : DType::kF32, {8}));
  }, "out (i32 [8]) must match in (f32 [8])");
  expect_local([&](Communicator& c, bool bad) {
    const DType t = bad ? DType::kBF16 : DType::kF32;
    return c.reduce_scatter_sum(TensorView::contiguous(in[c.rank()].data(), t, {3, 2}),
                                TensorView::contiguous(out[c.rank()].data(), t, {2}));
  }, "cannot add dtype bf16");
  // Different collectives on different ranks.
  st = each(cs, [&](Communicator& c) {
    if (c.rank() == 1) return c.barrier();
    return c.all_reduce_sum(TensorView::contiguous(in[c.rank()].data(), DType::kF32, {8}),
                            TensorView::contiguous(out[c.rank()].data(), DType::kF32, {8}));
  });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(contains(st[r], "rank 0 called all_reduce_sum, rank 1 barrier")) << st[r].message();
  // After all those failures the group still works.
  st = each(cs, [](Communicator& c) { return c.barrier(); });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(st[r].ok()) << st[r].to_string();
}

TEST(ThreadComm, AMissingRankTimesOutAndBreaksTheGroup) {
  auto cs = comms(3, std::chrono::milliseconds(100));
  auto st = each(cs, [](Communicator& c) { return c.rank() == 2 ? Status::Ok() : c.barrier(); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(contains(st[r], "rank(s) 2 never arrived")) << st[r].message();
  }
  Status late = cs[2]->barrier();  // the group is broken: fails at once
  EXPECT_TRUE(contains(late, "the rank group is broken")) << late.message();
}

TEST(ThreadComm, FactoryAndRunRanksErrors) {
  EXPECT_FALSE(make_thread_communicators(0).ok());
  EXPECT_FALSE(make_thread_communicators(2, {std::chrono::milliseconds(0)}).ok());
  auto cs = comms(3);
  EXPECT_EQ(cs[1]->rank(), 1);
  EXPECT_EQ(cs[1]->size(), 3);
  EXPECT_EQ(cs[1]->device(), Device::cpu());
  EXPECT_EQ(cs[1]->stream(), nullptr);
  EXPECT_TRUE(cs[1]->set_stream(nullptr).ok());
  int dummy = 0;
  EXPECT_FALSE(cs[1]->set_stream(&dummy).ok());
  Status st = run_ranks(cs, [](Communicator& c) {
    return c.rank() >= 1 ? invalid_argument(fmt::format("boom {}", c.rank())) : Status::Ok();
  });
  EXPECT_EQ(st.message(), "rank 1: boom 1");
  EXPECT_FALSE(run_ranks({}, [](Communicator&) { return Status::Ok(); }).ok());
}

// ---- DCP index math and block accounting -----------------------------------------------------
TEST(DcpIndex, LocalCountsMatchABruteForceCount) {
  for (int dcp = 1; dcp <= 5; ++dcp) {
    for (int64_t n = 0; n <= 40; ++n) {
      int64_t total = 0;
      for (int r = 0; r < dcp; ++r) {
        int64_t count = 0;
        for (int64_t p = 0; p < n; ++p) count += p % dcp == r;
        EXPECT_EQ(dcp_local_count(n, r, dcp), count) << "n " << n << " r " << r << " dcp " << dcp;
        total += dcp_local_count(n, r, dcp);
      }
      EXPECT_EQ(total, n);
    }
    for (int64_t p = 0; p < 30; ++p) {  // position -> (owner, local) -> position
      EXPECT_EQ(dcp_local_position(p, dcp) * dcp + dcp_owner(p, dcp), p);
      EXPECT_EQ(dcp_local_count(p + 1, dcp_owner(p, dcp), dcp), dcp_local_position(p, dcp) + 1);
    }
  }
}

TEST(DcpIndex, CausalLocalSeqlensCountTheVisiblePositionsOfEachRank) {
  // Query i of s_q sees global positions [0, v_i), v_i = clamp(len - s_q + i + 1, 0, len);
  // rank r must see exactly its positions among them.
  std::vector<int32_t> table = {0, 1, 2, 3, 4, 5}, lens = {0, 2, 9, 23};
  for (int dcp = 1; dcp <= 4; ++dcp) {
    for (int r = 0; r < dcp; ++r) {
      for (int s_q : {1, 3, 5}) {
        for (bool causal : {true, false}) {
          auto m = dcp_local_metadata(r, dcp, view(table, DType::kI32, {4, 1}), view(lens, DType::kI32, {4}), s_q, causal);
          ASSERT_TRUE(m.ok()) << m.status().to_string();
          const bool per_query = causal && s_q > 1;
          ASSERT_EQ(m->rows, per_query ? 4 * s_q : 4);
          EXPECT_EQ(m->s_q, per_query ? 1 : s_q);
          for (int b = 0; b < 4; ++b) {
            for (int i = 0; i < (per_query ? s_q : 1); ++i) {
              const int len = lens[static_cast<std::size_t>(b)];
              const int v = per_query ? std::clamp(len - s_q + i + 1, 0, len) : len;
              int count = 0;
              for (int p = 0; p < v; ++p) count += p % dcp == r;
              const std::size_t row = static_cast<std::size_t>(per_query ? b * s_q + i : b);
              EXPECT_EQ(m->seqlens[row], count) << "b " << b << " i " << i << " r " << r << " dcp " << dcp;
              EXPECT_EQ(m->block_table[row], table[static_cast<std::size_t>(b)]);
            }
          }
        }
      }
    }
  }
  EXPECT_FALSE(dcp_local_metadata(4, 4, view(table, DType::kI32, {4, 1}), view(lens, DType::kI32, {4}), 1, true).ok());
  EXPECT_FALSE(dcp_local_metadata(0, 4, view(table, DType::kI32, {4, 1}), view(lens, DType::kI32, {4}), 0, true).ok());
  lens[1] = -1;
  auto neg = dcp_local_metadata(0, 2, view(table, DType::kI32, {4, 1}), view(lens, DType::kI32, {4}), 1, true);
  EXPECT_TRUE(contains(neg.status(), "seqlens[1] = -1")) << neg.status().message();
}

TEST(DcpBlocks, AppendsInterleaveOverRanksAndMatchTheBlockTables) {
  const int dcp = 3, bs = 4;
  auto m = DcpBlockManager::create(dcp, 20, bs);
  ASSERT_TRUE(m.ok());
  const SeqId a = m->add_sequence(), b = m->add_sequence();
  std::vector<int64_t> pos_rank, pos_slot;  // sequence a, by global position
  for (int64_t n : {5, 1, 0, 7, 2}) {  // a's appends interleaved with b's
    auto s = m->append(a, n);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(s->first_position, static_cast<int64_t>(pos_rank.size()));
    for (int64_t k = 0; k < n; ++k) {
      EXPECT_EQ(s->rank[static_cast<std::size_t>(k)], (s->first_position + k) % dcp);
      pos_rank.push_back(s->rank[static_cast<std::size_t>(k)]);
      pos_slot.push_back(s->slot[static_cast<std::size_t>(k)]);
    }
    ASSERT_TRUE(m->append(b, 3).ok());
  }
  EXPECT_EQ(*m->length(a), 15);
  EXPECT_EQ(*m->length(b), 15);
  std::set<std::pair<int, int64_t>> used;
  for (int r = 0; r < dcp; ++r) {
    std::vector<int32_t> table, local, global;
    int64_t mb = 0;
    const SeqId seqs[] = {a, b};
    ASSERT_TRUE(m->fill_tables(r, seqs, table, mb, local, global).ok());
    EXPECT_EQ(local[0], dcp_local_count(15, r, dcp));
    EXPECT_EQ(global[0], 15);
    EXPECT_EQ(global[1], 15);
  }
  for (std::size_t p = 0; p < pos_slot.size(); ++p) {
    const int r = pos_rank[p];
    auto bm = m->rank(r);
    ASSERT_TRUE(bm.ok());
    auto table = (*bm)->block_table(a);
    const int64_t lp = static_cast<int64_t>(p) / dcp;  // local position of global p
    EXPECT_EQ(pos_slot[p], int64_t{(*table)[static_cast<std::size_t>(lp / bs)]} * bs + lp % bs) << "position " << p;
    EXPECT_TRUE(used.insert({r, pos_slot[p]}).second) << "slot reused";
  }
  ASSERT_TRUE(m->free(a).ok());
  EXPECT_FALSE(m->free(a).ok());
  EXPECT_FALSE(m->append(a, 1).ok());
  EXPECT_FALSE(m->rank(3).ok());
  EXPECT_FALSE(DcpBlockManager::create(0, 4).ok());
}

TEST(DcpBlocks, CapacityIsTokensPerRankTimesDcpAndAppendsAreAllOrNothing) {
  for (int dcp : {1, 2, 3, 4}) {
    const int bs = 8, blocks = 5;
    auto m = DcpBlockManager::create(dcp, blocks, bs);
    ASSERT_TRUE(m.ok());
    const SeqId s = m->add_sequence();
    const int64_t cap = dcp_max_request_tokens(int64_t{blocks} * bs, dcp);
    ASSERT_EQ(cap, int64_t{blocks} * bs * dcp);
    ASSERT_TRUE(m->append(s, cap - 1).ok());
    // One more token fits (rank (cap - 1) % dcp still has room); two more do not:
    // rank 0 is full then, and nothing of the failed append may stay.
    auto over = m->append(s, 2);
    ASSERT_FALSE(over.ok());
    EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
    EXPECT_TRUE(contains(over.status(), "on dcp rank 0")) << over.status().message();
    EXPECT_EQ(*m->length(s), cap - 1);
    ASSERT_TRUE(m->append(s, 1).ok());
    EXPECT_EQ(*m->length(s), cap);
    for (int r = 0; r < dcp; ++r) EXPECT_EQ((*m->rank(r))->num_free_blocks(), 0);
  }
}

TEST(DcpBlocks, PlanMaxRequestIsTheInterleavedCapacity) {
  // mlakv plan multiplies a GPU's tokens by dcp; with the interleaving, the request
  // that fills rank 0 exactly (ceil(n / dcp) = tokens_per_gpu) is that long.
  auto preset = find_model_preset("glm-5.2");
  ASSERT_TRUE(preset.has_value());
  for (int dcp : {1, 2, 4}) {
    PlanParams p;
    p.format = KvFormat::kNvfp4DsMlaFp8Rope;
    p.gpus = 4;
    p.tp = 4;
    p.dcp = dcp;
    p.gpu_mem_gib = 0.05;  // a few blocks, so a DcpBlockManager of that size is cheap
    p.mem_util = 1.0;
    p.block_size = 16;
    auto r = plan_capacity(preset->config, p);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_GT(r->blocks_per_gpu, 0);
    EXPECT_EQ(r->max_request_tokens, dcp_max_request_tokens(r->tokens_per_gpu, dcp));
    auto m = DcpBlockManager::create(dcp, r->blocks_per_gpu, p.block_size);
    ASSERT_TRUE(m.ok());
    const SeqId s = m->add_sequence();
    EXPECT_TRUE(m->append(s, r->max_request_tokens).ok());
    EXPECT_FALSE(m->append(s, 1).ok());
  }
}

// ---- tensor-parallel heads -------------------------------------------------------------------
TEST(TensorParallel, SliceCopiesTheRanksHeadsAlongAnyDimension) {
  const int H = 8, P = 3, L = 5;
  std::vector<float> w(H * P * L);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  for (int tp : {1, 2, 4}) {
    const int Hr = H / tp;
    for (int r = 0; r < tp; ++r) {
      std::vector<float> s0(static_cast<std::size_t>(Hr * P * L));
      ASSERT_TRUE(tp_slice(view(w, DType::kF32, {H, P, L}), 0, r, tp, view(s0, DType::kF32, {Hr, P, L})).ok());
      for (int h = 0; h < Hr; ++h) {  // W_UK_T [H, P, L]: rows of heads r*Hr + h
        for (int k = 0; k < P * L; ++k) EXPECT_EQ(s0[static_cast<std::size_t>(h * P * L + k)], w[static_cast<std::size_t>((r * Hr + h) * P * L + k)]);
      }
      // o_proj [D, H * V] viewed [D, H, V] (here [P, H, L]): the rank's column block of each row.
      std::vector<float> o(static_cast<std::size_t>(P * Hr * L));
      ASSERT_TRUE(tp_slice(view(w, DType::kF32, {P, H, L}), 1, r, tp, view(o, DType::kF32, {P, Hr, L})).ok());
      for (int d = 0; d < P; ++d) {
        for (int k = 0; k < Hr * L; ++k) {
          EXPECT_EQ(o[static_cast<std::size_t>(d * Hr * L + k)], w[static_cast<std::size_t>(d * H * L + r * Hr * L + k)]);
        }
      }
    }
  }
  // A strided (transposed) input and the last dimension.
  TensorView t = TensorView::contiguous(w.data(), DType::kF32, {P * L, H});  // element (i, h) at h * P * L + i
  t.strides = {1, P * L};
  std::vector<float> out(static_cast<std::size_t>(P * L * 2));
  ASSERT_TRUE(tp_slice(t, 1, 3, 4, view(out, DType::kF32, {P * L, 2})).ok());
  for (int i = 0; i < P * L; ++i) {
    for (int h = 0; h < 2; ++h) EXPECT_EQ(out[static_cast<std::size_t>(i * 2 + h)], w[static_cast<std::size_t>((6 + h) * P * L + i)]);
  }
  std::vector<float> small(static_cast<std::size_t>(3 * P * L));
  EXPECT_TRUE(contains(tp_slice(view(w, DType::kF32, {H, P, L}), 0, 0, 3, view(small, DType::kF32, {3, P, L})),
                       "not divisible by tp 3"));
  EXPECT_TRUE(contains(tp_slice(view(w, DType::kF32, {H, P, L}), 0, 2, 2, view(small, DType::kF32, {4, P, L})),
                       "rank 2 is outside [0, 2)"));
  EXPECT_TRUE(contains(tp_slice(view(w, DType::kF32, {H, P, L}), 0, 0, 2, view(small, DType::kF32, {3, P, L})),
                       "out must have shape [4, 3, 5]"));
  EXPECT_TRUE(contains(tp_slice(view(w, DType::kF32, {H, P, L}), 3, 0, 2, view(small, DType::kF32, {3, P, L})),
                       "dim 3 is not a dimension"));
}

TEST(TensorParallel, ShardedOutputProjectionWithAllReduceEqualsTheUnshardedOne) {
  const int T = 3, H = 8, L = 32, V = 16, D = 24;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<float> o_lat(T * H * L), w_uv(H * L * V), o_proj(D * H * V);
  for (float& x : o_lat) x = nd(rng);
  for (float& x : w_uv) x = nd(rng) * 0.1f;
  for (float& x : o_proj) x = nd(rng) * 0.1f;
  // The unsharded projection in float64, straight from the formula, and per output the
  // sum of |contribution| of each rank's heads (the error scale of the sharded sum).
  auto head_term = [&](int t, int d, int h) {
    double acc = 0;
    for (int v = 0; v < V; ++v) {
      double z = 0;
      for (int l = 0; l < L; ++l) z += double{o_lat[static_cast<std::size_t>((t * H + h) * L + l)]} * w_uv[static_cast<std::size_t>((h * L + l) * V + v)];
      acc += double{o_proj[static_cast<std::size_t>(d * H * V + h * V + v)]} * z;
    }
    return acc;
  };
  for (int tp : {1, 2, 4}) {
    const int Hr = H / tp;
    auto cs = comms(tp);
    std::vector<std::vector<float>> y(static_cast<std::size_t>(tp), std::vector<float>(T * D, NAN));
    Status st = run_ranks(cs, [&](Communicator& c) -> Status {
      const int r = c.rank();
      std::vector<float> ol(static_cast<std::size_t>(T * Hr * L)), wv(static_cast<std::size_t>(Hr * L * V)),
          op(static_cast<std::size_t>(D * Hr * V));
      MLAKV_RETURN_IF_ERROR(tp_slice(view(o_lat, DType::kF32, {T, H, L}), 1, r, tp, view(ol, DType::kF32, {T, Hr, L})));
      MLAKV_RETURN_IF_ERROR(tp_slice(view(w_uv, DType::kF32, {H, L, V}), 0, r, tp, view(wv, DType::kF32, {Hr, L, V})));
      MLAKV_RETURN_IF_ERROR(tp_slice(view(o_proj, DType::kF32, {D, H, V}), 1, r, tp, view(op, DType::kF32, {D, Hr, V})));
      return tp_output_projection(c, view(ol, DType::kF32, {T, Hr, L}), view(wv, DType::kF32, {Hr, L, V}),
                                  view(op, DType::kF32, {D, Hr * V}), view(y[static_cast<std::size_t>(r)], DType::kF32, {T, D}));
    });
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (int t = 0; t < T; ++t) {
      for (int d = 0; d < D; ++d) {
        double exact = 0, scale = 0;
        for (int r = 0; r < tp; ++r) {
          double part = 0;
          for (int h = r * Hr; h < (r + 1) * Hr; ++h) part += head_term(t, d, h);
          exact += part;
          scale += std::fabs(part);
        }
        // Each rank rounds its float64 partial once (<= u |part_r|), the all-reduce adds tp
        // floats in order (<= (tp - 1) u sum |partial|): |y - exact| <= (tp + 1) u sum_r |part_r|
        // (the float64 accumulation error is below 2^-40 relative and covered by the +1).
        const double tol = (tp + 1) * kU * scale + 1e-30;
        for (int r = 0; r < tp; ++r) {
          const float got = y[static_cast<std::size_t>(r)][static_cast<std::size_t>(t * D + d)];
          EXPECT_LE(std::fabs(got - exact), tol) << "tp " << tp << " rank " << r << " t " << t << " d " << d;
          EXPECT_EQ(got, y[0][static_cast<std::size_t>(t * D + d)]) << "ranks disagree";
        }
      }
    }
  }
}

TEST(TensorParallel, AttentionOverTheRanksHeadsIsTheUnshardedAttentionsRows) {
  // Heads are independent: attention on a rank's q slice gives exactly those heads'
  // rows of the unsharded call (float64 reference: the same operations per head).
  const int H = 8, T = 40, bs = 16;
  KvCache::Config cfg;
  cfg.num_blocks = 3;
  cfg.block_size = bs;
  cfg.layers = {{KvFormat::kFp8DsMla, 1.0f}};
  auto cache = KvCache::create_cpu(cfg);
  ASSERT_TRUE(cache.ok());
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> lat(T * kLatentDim), rope(T * kRopeDim), q(2 * H * kQkDim);
  for (float& x : lat) x = nd(rng);
  for (float& x : rope) x = nd(rng);
  for (float& x : q) x = nd(rng) * 0.5f;
  std::vector<int64_t> slots(T);
  for (int i = 0; i < T; ++i) slots[static_cast<std::size_t>(i)] = i;
  ASSERT_TRUE((*cache)->write(0, view(slots, DType::kI64, {T}), view(lat, DType::kF32, {T, kLatentDim}),
                              view(rope, DType::kF32, {T, kRopeDim})).ok());
  std::vector<int32_t> table = {0, 1, 2}, lens = {T};
  auto run = [&](std::vector<float>& qq, int heads, std::vector<float>& o, std::vector<float>& l) {
    o.assign(static_cast<std::size_t>(2 * heads * kLatentDim), NAN);
    l.assign(static_cast<std::size_t>(2 * heads), NAN);
    MlaAttentionParams p;
    p.q = view(qq, DType::kF32, {1, 2, heads, kQkDim});
    p.cache = *(*cache)->layer(0);
    p.block_table = view(table, DType::kI32, {1, 3});
    p.seqlens = view(lens, DType::kI32, {1});
    p.softmax_scale = 0.1352f;
    p.out = view(o, DType::kF32, {1, 2, heads, kLatentDim});
    p.lse = view(l, DType::kF32, {1, 2, heads});
    return mla_attention_reference(p);
  };
  std::vector<float> full_o, full_l;
  ASSERT_TRUE(run(q, H, full_o, full_l).ok());
  for (int tp : {2, 4}) {
    const int Hr = H / tp;
    for (int r = 0; r < tp; ++r) {
      std::vector<float> qr(static_cast<std::size_t>(2 * Hr * kQkDim)), o, l;
      ASSERT_TRUE(tp_slice(view(q, DType::kF32, {1, 2, H, kQkDim}), 2, r, tp, view(qr, DType::kF32, {1, 2, Hr, kQkDim})).ok());
      ASSERT_TRUE(run(qr, Hr, o, l).ok());
      for (int i = 0; i < 2; ++i) {
        for (int h = 0; h < Hr; ++h) {
          EXPECT_EQ(l[static_cast<std::size_t>(i * Hr + h)], full_l[static_cast<std::size_t>(i * H + r * Hr + h)]);
          EXPECT_EQ(0, std::memcmp(&o[static_cast<std::size_t>((i * Hr + h) * kLatentDim)],
                                   &full_o[static_cast<std::size_t>((i * H + r * Hr + h) * kLatentDim)], kLatentDim * sizeof(float)));
        }
      }
    }
  }
}

TEST(TensorParallel, ABadRankFailsEveryRankWithoutHanging) {
  const int T = 2, Hr = 2, L = 4, V = 3, D = 5;
  auto cs = comms(3, std::chrono::seconds(10));
  std::vector<float> ol(T * Hr * L, 1), wv(Hr * L * V, 1), op(D * Hr * V, 1);
  std::vector<std::vector<float>> y(3, std::vector<float>(T * D));
  auto st = each(cs, [&](Communicator& c) {
    const int64_t cols = c.rank() == 1 ? Hr * V + 1 : Hr * V;  // rank 1's o_proj is mis-shaped
    return tp_output_projection(c, view(ol, DType::kF32, {T, Hr, L}), view(wv, DType::kF32, {Hr, L, V}),
                                TensorView::contiguous(op.data(), DType::kF32, {D, cols}),
                                view(y[static_cast<std::size_t>(c.rank())], DType::kF32, {T, D}));
  });
  EXPECT_TRUE(contains(st[1], "tp rank 1/3: o_proj: expected shape")) << st[1].message();
  EXPECT_TRUE(contains(st[0], "rank 1's arguments are invalid")) << st[0].message();
  EXPECT_TRUE(contains(st[2], "rank 1's arguments are invalid")) << st[2].message();
}

}  // namespace
}  // namespace mlakv
