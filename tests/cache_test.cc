// Paged cache: block allocation, fork / free reference counting, all-or-nothing
// appends, and writes that skip padding slots and reject out-of-range ones.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "format/record_codec.h"
#include "mlakv/cache.h"

namespace mlakv {
namespace {

TEST(BlockManager, AppendFillsTheTailThenTakesNewBlocks) {
  auto bm = BlockManager::create(8, 4);
  ASSERT_TRUE(bm.ok());
  SeqId s = bm->add_sequence();
  auto a = bm->append(s, 3);
  ASSERT_TRUE(a.ok());
  // First block handed out is 0: slots 0, 1, 2.
  EXPECT_EQ(*a, (std::vector<int64_t>{0, 1, 2}));
  auto b = bm->append(s, 6);  // 1 more in block 0, then block 1 (4), then block 2 (1)
  EXPECT_EQ(*b, (std::vector<int64_t>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(*bm->length(s), 9);
  EXPECT_EQ(bm->num_free_blocks(), 5);
  auto table = bm->block_table(s);
  EXPECT_EQ(std::vector<int32_t>(table->begin(), table->end()), (std::vector<int32_t>{0, 1, 2}));
}

TEST(BlockManager, OutOfBlocksChangesNothing) {
  auto bm = BlockManager::create(3, 4);
  SeqId s = bm->add_sequence();
  ASSERT_TRUE(bm->append(s, 10).ok());  // 3 blocks
  const auto before = *bm->block_table(s);
  std::vector<int32_t> saved(before.begin(), before.end());
  auto r = bm->append(s, 3);  // 2 fit in the tail, 1 needs a block
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("needs 1 more blocks"), std::string::npos) << r.status().message();
  EXPECT_EQ(*bm->length(s), 10);
  auto after = *bm->block_table(s);
  EXPECT_EQ(std::vector<int32_t>(after.begin(), after.end()), saved);
  EXPECT_EQ(bm->num_free_blocks(), 0);
  EXPECT_TRUE(bm->append(s, 2).ok());  // exactly the tail
  EXPECT_EQ(bm->append(s, 0)->size(), 0u);
}

TEST(BlockManager, ForkSharesFullBlocksAndCopiesThePartialTail) {
  auto bm = BlockManager::create(10, 4);
  SeqId p = bm->add_sequence();
  ASSERT_TRUE(bm->append(p, 9).ok());  // blocks 0, 1 full; block 2 holds 1 token
  auto f = bm->fork(p);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->has_tail_copy);
  EXPECT_EQ(f->tail_src, 2);
  auto ct = *bm->block_table(f->child);
  EXPECT_EQ(ct[0], 0);
  EXPECT_EQ(ct[1], 1);
  EXPECT_EQ(ct[2], f->tail_dst);
  EXPECT_NE(f->tail_dst, 2);
  EXPECT_EQ(bm->ref_count(0), 2);
  EXPECT_EQ(bm->ref_count(1), 2);
  EXPECT_EQ(bm->ref_count(2), 1);
  EXPECT_EQ(*bm->length(f->child), 9);
  // Appends diverge: the child's next token lands in its own tail block.
  EXPECT_EQ(bm->append(f->child, 1)->at(0), f->tail_dst * 4 + 1);
  EXPECT_EQ(bm->append(p, 1)->at(0), 2 * 4 + 1);
  // Freeing the parent keeps the shared blocks alive for the child.
  const int64_t free_before = bm->num_free_blocks();
  ASSERT_TRUE(bm->free(p).ok());
  EXPECT_EQ(bm->num_free_blocks(), free_before + 1);  // only block 2 returns
  EXPECT_EQ(bm->ref_count(0), 1);
  ASSERT_TRUE(bm->free(f->child).ok());
  EXPECT_EQ(bm->num_free_blocks(), 10);
  EXPECT_EQ(bm->free(p).code(), StatusCode::kNotFound);
  // A fork of a block-aligned sequence copies nothing.
  SeqId q = bm->add_sequence();
  ASSERT_TRUE(bm->append(q, 8).ok());
  auto g = bm->fork(q);
  EXPECT_FALSE(g->has_tail_copy);
}

TEST(BlockManager, BadArguments) {
  EXPECT_FALSE(BlockManager::create(0, 4).ok());
  EXPECT_FALSE(BlockManager::create(4, 0).ok());
  auto bm = BlockManager::create(4, 4);
  EXPECT_EQ(bm->append(99, 1).status().code(), StatusCode::kNotFound);
  SeqId s = bm->add_sequence();
  EXPECT_EQ(bm->append(s, -1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bm->fork(99).status().code(), StatusCode::kNotFound);
}

TEST(PagedKvCache, WriteSkipsPaddingAndPlacesRecordsAtTheirSlots) {
  KvCache::Config cfg;
  cfg.num_layers = 2;
  cfg.num_blocks = 4;
  cfg.block_size = 3;
  cfg.layers = {{KvFormat::kFp8DsMla, 1.0f}, {KvFormat::kNvfp4DsMla, 0.5f}};
  auto cache = PagedKvCache::create_cpu(cfg);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  (*cache)->storage().fill(0xEE);
  const int n = 3;
  std::vector<float> lat(n * kLatentDim), rope(n * kRopeDim);
  for (std::size_t i = 0; i < lat.size(); ++i) lat[i] = std::sin(0.1f * static_cast<float>(i));
  for (std::size_t i = 0; i < rope.size(); ++i) rope[i] = std::cos(0.2f * static_cast<float>(i));
  const std::vector<int64_t> slots = {7, -1, 2};  // token 1 is padding
  for (int layer = 0; layer < 2; ++layer) {
    ASSERT_TRUE((*cache)->write(layer, slots, TensorView::contiguous(lat.data(), DType::kF32, {n, kLatentDim}),
                                TensorView::contiguous(rope.data(), DType::kF32, {n, kRopeDim}))
                    .ok());
    auto v = *(*cache)->storage().layer(layer);
    // The record at slot 7 equals a standalone encoding of token 0; slot 2 of token 2.
    std::vector<uint8_t> want(static_cast<std::size_t>(v.record_bytes));
    for (auto [slot, tok] : {std::pair<int64_t, int>{7, 0}, {2, 2}}) {
      codec::encode_record(v.format, lat.data() + tok * kLatentDim, rope.data() + tok * kRopeDim, v.outer_scale,
                           Fp8ScaleMode::kPow2, want.data());
      EXPECT_EQ(std::memcmp(v.record(slot), want.data(), want.size()), 0) << "layer " << layer << " slot " << slot;
    }
    // Every other slot is untouched.
    for (int64_t s = 0; s < v.num_slots(); ++s) {
      if (s == 7 || s == 2) continue;
      for (int i = 0; i < v.record_bytes; ++i) ASSERT_EQ(v.record(s)[i], 0xEE) << "slot " << s;
    }
  }
}

TEST(PagedKvCache, OutOfRangeSlotWritesNothing) {
  KvCache::Config cfg;
  cfg.num_blocks = 2;
  cfg.block_size = 4;
  cfg.layers = {{KvFormat::kBf16, 1.0f}};
  auto cache = PagedKvCache::create_cpu(cfg);
  (*cache)->storage().fill(0x11);
  std::vector<float> lat(2 * kLatentDim, 1.0f), rope(2 * kRopeDim, 1.0f);
  const std::vector<int64_t> slots = {0, 8};  // 8 == capacity
  Status st = (*cache)->write(0, slots, TensorView::contiguous(lat.data(), DType::kF32, {2, kLatentDim}),
                              TensorView::contiguous(rope.data(), DType::kF32, {2, kRopeDim}));
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("slot 8"), std::string::npos) << st.message();
  auto v = *(*cache)->storage().layer(0);
  for (int64_t i = 0; i < v.num_slots() * v.record_bytes; ++i) ASSERT_EQ(v.data[i], 0x11);
  // Non-finite input: also nothing written.
  lat[5] = NAN;
  st = (*cache)->write(0, std::vector<int64_t>{0, 1}, TensorView::contiguous(lat.data(), DType::kF32, {2, kLatentDim}),
                       TensorView::contiguous(rope.data(), DType::kF32, {2, kRopeDim}));
  EXPECT_NE(st.message().find("token 0 dimension 5"), std::string::npos) << st.message();
  for (int64_t i = 0; i < v.num_slots() * v.record_bytes; ++i) ASSERT_EQ(v.data[i], 0x11);
  EXPECT_EQ((*cache)->storage().layer(1).status().code(), StatusCode::kOutOfRange);
}

TEST(PagedKvCache, ForkCopiesTheTailRecordsInEveryLayer) {
  KvCache::Config cfg;
  cfg.num_layers = 2;
  cfg.num_blocks = 6;
  cfg.block_size = 4;
  cfg.layers = {{KvFormat::kNvfp4DsMlaFp8Rope, 1.0f}};
  auto cache = PagedKvCache::create_cpu(cfg);
  PagedKvCache& c = **cache;
  SeqId s = c.add_sequence();
  auto slots = *c.append(s, 6);
  std::vector<float> lat(6 * kLatentDim), rope(6 * kRopeDim);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (float& x : lat) x = nd(rng);
  for (float& x : rope) x = nd(rng);
  for (int l = 0; l < 2; ++l) {
    ASSERT_TRUE(c.write(l, slots, TensorView::contiguous(lat.data(), DType::kF32, {6, kLatentDim}),
                        TensorView::contiguous(rope.data(), DType::kF32, {6, kRopeDim}))
                    .ok());
  }
  auto child = c.fork(s);
  ASSERT_TRUE(child.ok());
  auto pt = *c.blocks().block_table(s);
  auto ct = *c.blocks().block_table(*child);
  ASSERT_NE(pt[1], ct[1]);
  for (int l = 0; l < 2; ++l) {
    auto v = *c.storage().layer(l);
    for (int o = 0; o < 2; ++o) {  // the two tokens of the partial tail block
      EXPECT_EQ(std::memcmp(v.record(pt[1] * 4 + o), v.record(ct[1] * 4 + o), static_cast<std::size_t>(v.record_bytes)), 0);
    }
  }
}

TEST(KvCache, ConfigErrors) {
  KvCache::Config cfg;
  cfg.num_blocks = 4;
  cfg.layers = {{KvFormat::kFp8DsMla, 2.0f}};  // fp8 has no outer scale
  auto r = KvCache::create_cpu(cfg);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layer 0"), std::string::npos) << r.status().message();
  cfg.layers = {{KvFormat::kBf16, 1.0f}, {KvFormat::kBf16, 1.0f}};
  cfg.num_layers = 3;
  EXPECT_FALSE(KvCache::create_cpu(cfg).ok());
  cfg.num_layers = 1;
  cfg.layers = {{KvFormat::kBf16, 1.0f}};
  cfg.block_size = 0;
  EXPECT_FALSE(KvCache::create_cpu(cfg).ok());
  cfg.block_size = 4;
  cfg.latent_dim = 256;
  cfg.rope_dim = 32;
  EXPECT_TRUE(KvCache::create_cpu(cfg).ok());  // bf16 takes any geometry
  cfg.layers = {{KvFormat::kNvfp4DsMla, 1.0f}};
  EXPECT_FALSE(KvCache::create_cpu(cfg).ok());
}

}  // namespace
}  // namespace mlakv
