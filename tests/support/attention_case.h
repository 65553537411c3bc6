// Adversarial attention cases shared by the CPU attention tests and the CUDA harness:
// a cache with shuffled block tables, ragged and empty requests, unused slots poisoned
// with NaN (0xFF decodes to NaN in every format), random queries, and sparse index
// lists mixing valid slots with skipped entries. Header-only test support.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "format/record_codec.h"
#include "mlakv/attention.h"

namespace mlakv::test {

struct Case {
  KvFormat format = KvFormat::kBf16;
  int block_size = 16;
  int heads = 8;
  int s_q = 1;
  std::vector<int> seqlens = {40};
  bool causal = true;
  int splits = 1;
  bool sparse = false;
  int topk = 0;
  bool topk_length = false;
  float outer_scale = 1.0f;
  bool token_scale = false;  // nvfp4 per-token scale mode (then outer_scale stays 1)
  bool bf16_q = false;
  // Record magnitudes grow with the 64-token tile: position pos is written x (1 + ramp *
  // (pos / 64)), so a row's score maximum rises by many units from tile to tile and every
  // kernel's running maximum (a lazy one included) has to move and rescale repeatedly.
  float ramp = 0.0f;
  uint32_t seed = 1;
};

struct Built {
  Case c;
  std::unique_ptr<KvCache> cache;
  CacheLayerView view;
  int64_t max_blocks = 1;
  std::vector<int32_t> table, seqlens, indices, topk_len;
  std::vector<std::vector<int64_t>> written;  // slots written per request, by position (-1: skipped by the kernels)
  std::vector<float> q;
  std::vector<uint16_t> q16;

  MlaAttentionParams params(std::vector<float>& out, std::vector<float>& lse) {
    const int64_t B = static_cast<int64_t>(c.seqlens.size());
    out.assign(static_cast<std::size_t>(B * c.s_q * c.heads * kLatentDim), std::numeric_limits<float>::quiet_NaN());
    lse.assign(static_cast<std::size_t>(B * c.s_q * c.heads), std::numeric_limits<float>::quiet_NaN());
    MlaAttentionParams p;
    p.q = c.bf16_q ? TensorView::contiguous(q16.data(), DType::kBF16, {B, c.s_q, c.heads, kQkDim})
                   : TensorView::contiguous(q.data(), DType::kF32, {B, c.s_q, c.heads, kQkDim});
    p.cache = view;
    p.block_table = TensorView::contiguous(table.data(), DType::kI32, {B, max_blocks});
    p.seqlens = TensorView::contiguous(seqlens.data(), DType::kI32, {B});
    if (c.sparse) {
      p.indices = TensorView::contiguous(indices.data(), DType::kI32, {B, c.s_q, c.topk});
      if (c.topk_length) p.topk_length = TensorView::contiguous(topk_len.data(), DType::kI32, {B});
    }
    p.softmax_scale = 0.1352f;
    p.causal = c.causal;
    p.num_splits = c.splits;
    p.out = TensorView::contiguous(out.data(), DType::kF32, {B, c.s_q, c.heads, kLatentDim});
    p.lse = TensorView::contiguous(lse.data(), DType::kF32, {B, c.s_q, c.heads});
    return p;
  }
};

inline Built build(const Case& c) {
  Built t;
  t.c = c;
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int B = static_cast<int>(c.seqlens.size());
  int64_t need = 0;
  for (int len : c.seqlens) {
    const int64_t nb = (len + c.block_size - 1) / c.block_size;
    need += nb;
    t.max_blocks = std::max<int64_t>(t.max_blocks, nb);
  }
  const int64_t num_blocks = need + 3;  // a few blocks nobody owns
  KvCache::Config cfg;
  cfg.num_blocks = num_blocks;
  cfg.block_size = c.block_size;
  cfg.layers = {{c.format, c.outer_scale, c.token_scale}};
  t.cache = std::move(KvCache::create_cpu(cfg).value());
  t.cache->fill(0xFF);  // poison: decodes to NaN in every format, so a stray read shows
  t.view = *t.cache->layer(0);
  // Shuffled block tables: blocks handed out in a random order, unused entries -1.
  std::vector<int32_t> perm(static_cast<std::size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  t.table.assign(static_cast<std::size_t>(B * t.max_blocks), -1);
  std::size_t next = 0;
  std::vector<float> ch(kLatentDim);
  for (float& s : ch) s = std::exp2(std::uniform_real_distribution<float>(-2.0f, 1.0f)(rng));
  for (int b = 0; b < B; ++b) {
    const int len = c.seqlens[static_cast<std::size_t>(b)];
    t.seqlens.push_back(len);
    const int64_t nb = (len + c.block_size - 1) / c.block_size;
    for (int64_t k = 0; k < nb; ++k) t.table[static_cast<std::size_t>(b * t.max_blocks + k)] = perm[next++];
    std::vector<int64_t> slots;
    for (int pos = 0; pos < len; ++pos) {
      slots.push_back(static_cast<int64_t>(t.table[static_cast<std::size_t>(b * t.max_blocks + pos / c.block_size)]) *
                          c.block_size + pos % c.block_size);
    }
    std::vector<float> lat(static_cast<std::size_t>(len) * kLatentDim), rope(static_cast<std::size_t>(len) * kRopeDim);
    for (std::size_t i = 0; i < lat.size(); ++i) lat[i] = nd(rng) * ch[i % kLatentDim];
    for (float& x : rope) x = nd(rng);
    if (c.ramp != 0.0f) {
      for (int pos = 0; pos < len; ++pos) {
        const float g = 1.0f + c.ramp * static_cast<float>(pos / 64);
        for (int d = 0; d < kLatentDim; ++d) lat[static_cast<std::size_t>(pos) * kLatentDim + static_cast<std::size_t>(d)] *= g;
        for (int d = 0; d < kRopeDim; ++d) rope[static_cast<std::size_t>(pos) * kRopeDim + static_cast<std::size_t>(d)] *= g;
      }
    }
    if (len > 0) {
      EXPECT_TRUE(t.cache->write(0, TensorView::contiguous(slots.data(), DType::kI64, {len}),
                                 TensorView::contiguous(lat.data(), DType::kF32, {len, kLatentDim}),
                                 TensorView::contiguous(rope.data(), DType::kF32, {len, kRopeDim}))
                      .ok());
    }
    t.written.push_back(slots);
  }
  t.q.resize(static_cast<std::size_t>(B * c.s_q * c.heads * kQkDim));
  for (float& x : t.q) x = nd(rng) * 0.7f;
  if (c.bf16_q) {
    for (float& x : t.q) {
      t.q16.push_back(f32_to_bf16(x));
      x = bf16_to_f32(t.q16.back());
    }
  }
  if (c.sparse) {
    // Valid written slots mixed with skipped entries: -1, other negatives, the slot
    // count itself, and a huge value.
    const int32_t bad[] = {-1, -7, static_cast<int32_t>(t.view.num_slots()), std::numeric_limits<int32_t>::max()};
    for (int b = 0; b < B; ++b) {
      for (int i = 0; i < c.s_q; ++i) {
        for (int k = 0; k < c.topk; ++k) {
          const auto& w = t.written[static_cast<std::size_t>(b)];
          const bool valid = !w.empty() && std::uniform_int_distribution<int>(0, 4)(rng) != 0;
          t.indices.push_back(valid ? static_cast<int32_t>(w[std::uniform_int_distribution<std::size_t>(0, w.size() - 1)(rng)])
                                    : bad[std::uniform_int_distribution<int>(0, 3)(rng)]);
        }
      }
      t.topk_len.push_back(std::uniform_int_distribution<int>(0, c.topk)(rng));
    }
  }
  return t;
}

// Tokens query (b, i) attends to, as slots (the test's own reading of the semantics).
inline std::vector<int64_t> token_set(const Built& t, int b, int i) {
  const Case& c = t.c;
  std::vector<int64_t> out;
  if (c.sparse) {
    const int n = c.topk_length ? t.topk_len[static_cast<std::size_t>(b)] : c.topk;
    for (int k = 0; k < n; ++k) {
      const int32_t s = t.indices[static_cast<std::size_t>((b * c.s_q + i) * c.topk + k)];
      if (s >= 0 && s < t.view.num_slots()) out.push_back(s);
    }
    return out;
  }
  const int len = c.seqlens[static_cast<std::size_t>(b)];
  const int vis = c.causal ? std::clamp(len - c.s_q + i + 1, 0, len) : len;
  const auto& w = t.written[static_cast<std::size_t>(b)];
  for (int k = 0; k < vis; ++k) {
    if (w[static_cast<std::size_t>(k)] >= 0) out.push_back(w[static_cast<std::size_t>(k)]);  // -1: a page a test made invalid
  }
  return out;
}

// Makes page `page` of request b's block table invalid (`id`: -1, or an id past the
// cache's blocks) for the CUDA kernels, which cannot validate a device table and skip such
// pages (params/attention.h); token_set then drops those tokens too (their slots keep their
// records: a kernel that read them anyway would differ from the reference). The CPU entry
// points validate host tables and refuse such entries instead.
inline void invalidate_page(Built& t, int b, int64_t page, int32_t id) {
  t.table[static_cast<std::size_t>(b * t.max_blocks + page)] = id;
  auto& w = t.written[static_cast<std::size_t>(b)];
  const int64_t bs = t.c.block_size;
  for (int64_t pos = page * bs; pos < (page + 1) * bs && pos < static_cast<int64_t>(w.size()); ++pos) {
    w[static_cast<std::size_t>(pos)] = -1;
  }
}

// Decoded [latent | rope] of a slot.
inline std::vector<float> decoded(const CacheLayerView& v, int64_t slot) {
  std::vector<float> k(kQkDim);
  codec::decode_record(v.format, v.record(slot), v.outer_scale, k.data(), k.data() + kLatentDim, v.token_scale);
  return k;
}

inline std::string describe(const Case& c) {
  std::string s = std::string(format_name(c.format)) + " bs=" + std::to_string(c.block_size) + " H=" +
                  std::to_string(c.heads) + " s_q=" + std::to_string(c.s_q) + " splits=" + std::to_string(c.splits) +
                  (c.causal ? " causal" : " full") + (c.sparse ? " sparse topk=" + std::to_string(c.topk) : "") +
                  (c.token_scale ? " token-scale" : "") +
                  " seqlens=";
  for (int l : c.seqlens) s += std::to_string(l) + ",";
  return s;
}

}  // namespace mlakv::test
