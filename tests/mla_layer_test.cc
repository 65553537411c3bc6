// The MLA attention layer (include/mlakv/mla_layer.h) against Hugging Face transformers.
//
// tests/data/hf_parity/<geometry>/ holds a one-layer checkpoint, its inputs and the
// outputs of transformers' attention module in float32 (`output`) and float64
// (`output_f64`); tools/make_hf_parity_fixtures.py made them. Tolerances are derived:
//
//  1. The math (projections, norms, YaRN RoPE, absorption, W_UV, o_proj): mlakv's stages
//     with float64 attention on the UNQUANTIZED latent must be within 2 e_ref of
//     output_f64, where e_ref = max |output - output_f64| is what transformers' own
//     float32 arithmetic costs on the same layer. mlakv accumulates every matmul in
//     float64, so it is no less accurate than a float32 framework.
//  2. The cache (each record format; two prefill chunks and two single-token decode steps
//     on one paged cache with shuffled blocks and NaN-poisoned free slots):
//     a. every decoded record is within the format's per-element rounding bound of what
//        was written (bf16: 2^-8 |x|; e4m3: 2^-4 |x| + scale 2^-10; e2m1: half a step of
//        the group scale, or the clip; the outer scale s_l multiplied back);
//     b. the layer's output equals the float64 specification on those decoded records
//        (mla_attention_reference + W_UV + o_proj) within 4 e_naive, e_naive being how far
//        a naive float32 attention over the same records lands from that specification:
//        only the float32 attention kernel's arithmetic separates the two.
//     What is left between the cached output and transformers is then the format's own
//     rounding, |spec - unquantized|, which the report prints next to the total.
// The errors are printed per geometry and format (the parity report in docs/layer.md).
#include "mlakv/mla_layer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "mlakv/attention.h"
#include "mlakv/codec.h"
#include "mlakv/hf_config.h"
#include "mlakv/numerics.h"
#include "mlakv/outer_scales.h"
#include "mlakv/safetensors.h"
#include "mlakv/thread_pool.h"

namespace mlakv {
namespace {

namespace fs = std::filesystem;

const char* const kGeometries[] = {"deepseek_v3", "deepseek_v2_lite", "glm4_moe_lite", "kimi_k2",
                                   "deepseek_v3_halfsplit"};

std::string fixture_dir(const std::string& name) { return std::string(MLAKV_TEST_DATA_DIR) + "/hf_parity/" + name; }

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

WeightQuantOptions quant_of(const std::string& dir) {
  auto q = load_checkpoint_quant_options(dir);
  EXPECT_TRUE(q.ok()) << q.status().to_string();
  return q.ok() ? *q : WeightQuantOptions{};
}

struct Fixture {
  std::string name, dir;
  ModelConfig cfg;
  int layer = 0;
  int64_t N = 0, D = 0;
  std::vector<float> hidden, out32;
  std::vector<int64_t> pos;
  std::vector<double> out64;
  double hf_softmax_scale = 0;
  MlaLayerWeights w;
  double e_ref = 0, ref_max = 0;

  TensorView hidden_view(int64_t t0 = 0, int64_t n = -1) const {
    return TensorView::contiguous(hidden.data() + t0 * D, DType::kF32, {n < 0 ? N : n, D});
  }
  TensorView pos_view(int64_t t0 = 0, int64_t n = -1) const {
    return TensorView::contiguous(pos.data() + t0, DType::kI64, {n < 0 ? N : n});
  }
};

template <class T>
std::vector<T> read_all(const SafetensorsFile& f, const char* name, DType dtype) {
  auto t = f.find(name);
  EXPECT_TRUE(t.has_value()) << name;
  if (!t) return {};
  EXPECT_EQ(t->dtype, dtype) << name;
  const T* p = t->ptr<const T>();
  return std::vector<T>(p, p + t->numel());
}

std::unique_ptr<Fixture> load_fixture(const std::string& name) {
  auto fx = std::make_unique<Fixture>();
  fx->name = name;
  fx->dir = fixture_dir(name);
  auto cfg = load_hf_config(fx->dir);
  EXPECT_TRUE(cfg.ok()) << cfg.status().to_string();
  if (!cfg.ok()) return nullptr;
  fx->cfg = *cfg;
  auto io = SafetensorsFile::open(fx->dir + "/io.safetensors");
  EXPECT_TRUE(io.ok()) << io.status().to_string();
  if (!io.ok()) return nullptr;
  fx->layer = std::stoi((*io)->metadata().at("layer"));
  fx->hidden = read_all<float>(**io, "hidden_states", DType::kF32);
  fx->pos = read_all<int64_t>(**io, "positions", DType::kI64);
  fx->out32 = read_all<float>(**io, "output", DType::kF32);
  fx->out64 = read_all<double>(**io, "output_f64", DType::kF64);
  fx->hf_softmax_scale = read_all<double>(**io, "softmax_scale", DType::kF64).at(0);
  fx->N = static_cast<int64_t>(fx->pos.size());
  fx->D = fx->cfg.hidden_size;
  EXPECT_EQ(static_cast<int64_t>(fx->hidden.size()), fx->N * fx->D);
  for (std::size_t i = 0; i < fx->out64.size(); ++i) {
    fx->e_ref = std::max(fx->e_ref, std::fabs(fx->out32[i] - fx->out64[i]));
    fx->ref_max = std::max(fx->ref_max, std::fabs(fx->out64[i]));
  }
  auto ckpt = Checkpoint::open(fx->dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  if (!ckpt.ok()) return nullptr;
  MlaLoadOptions lo;
  lo.quant = quant_of(fx->dir);
  auto w = load_mla_layer(**ckpt, fx->cfg, fx->layer, lo);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  if (!w.ok()) return nullptr;
  fx->w = std::move(*w);
  return fx;
}

// Stage outputs on the unquantized latent, attention in float64.
struct Unquantized {
  std::vector<float> q, lat, rope, out;
};

Unquantized run_unquantized(const Fixture& fx) {
  const int64_t N = fx.N, H = fx.cfg.num_heads;
  Unquantized u;
  u.q.resize(static_cast<std::size_t>(N * H * kQkDim));
  u.lat.resize(static_cast<std::size_t>(N * kLatentDim));
  u.rope.resize(static_cast<std::size_t>(N * kRopeDim));
  Status st = mla_layer_project(fx.w, fx.cfg, fx.hidden_view(), fx.pos_view(),
                                TensorView::contiguous(u.q.data(), DType::kF32, {N, H, kQkDim}),
                                TensorView::contiguous(u.lat.data(), DType::kF32, {N, kLatentDim}),
                                TensorView::contiguous(u.rope.data(), DType::kF32, {N, kRopeDim}));
  EXPECT_TRUE(st.ok()) << st.to_string();
  KvCache::Config geo;
  geo.num_blocks = N;
  geo.block_size = 1;
  auto cache = KvCache::create_cpu(geo);
  EXPECT_TRUE(cache.ok());
  std::vector<float> kv(static_cast<std::size_t>(N * kQkDim));
  for (int64_t t = 0; t < N; ++t) {
    std::copy_n(u.lat.data() + t * kLatentDim, kLatentDim, kv.data() + t * kQkDim);
    std::copy_n(u.rope.data() + t * kRopeDim, kRopeDim, kv.data() + t * kQkDim + kLatentDim);
  }
  std::vector<int32_t> table(static_cast<std::size_t>(N)), seqlen = {static_cast<int32_t>(N)};
  std::iota(table.begin(), table.end(), 0);
  std::vector<float> o_lat(static_cast<std::size_t>(N * H * kLatentDim)), lse(static_cast<std::size_t>(N * H));
  MlaAttentionParams p;
  p.q = TensorView::contiguous(u.q.data(), DType::kF32, {1, N, H, kQkDim});
  p.cache = *(*cache)->layer(0);
  p.block_table = TensorView::contiguous(table.data(), DType::kI32, {1, N});
  p.seqlens = TensorView::contiguous(seqlen.data(), DType::kI32, {1});
  p.softmax_scale = static_cast<float>(fx.cfg.softmax_scale());
  p.out = TensorView::contiguous(o_lat.data(), DType::kF32, {1, N, H, kLatentDim});
  p.lse = TensorView::contiguous(lse.data(), DType::kF32, {1, N, H});
  st = mla_attention_reference_unquantized(p, TensorView::contiguous(kv.data(), DType::kF32, {N, kQkDim}));
  EXPECT_TRUE(st.ok()) << st.to_string();
  u.out.resize(static_cast<std::size_t>(N * fx.D));
  st = mla_layer_output(fx.w, TensorView::contiguous(o_lat.data(), DType::kF32, {N, H, kLatentDim}),
                        TensorView::contiguous(u.out.data(), DType::kF32, {N, fx.D}));
  EXPECT_TRUE(st.ok()) << st.to_string();
  return u;
}

// The layer through a paged cache in `format`: block size 3, a dummy sequence first so the
// blocks are not in order, unused slots poisoned with NaN, the tokens fed as two prefill
// chunks and two single-token decode steps.
struct Cached {
  std::vector<float> out;
  std::unique_ptr<PagedKvCache> cache;
  SeqId seq = -1;
};

Cached run_cached(const Fixture& fx, KvFormat format, float outer_scale, ThreadPool* pool, int splits) {
  const int64_t N = fx.N;
  KvCache::Config cc;
  cc.num_layers = 2;  // the layer runs on cache layer 1; layer 0 is another format
  cc.block_size = 3;
  cc.num_blocks = (N + 4) / 3 + 4;
  cc.layers = {{KvFormat::kBf16, 1.0f}, {format, outer_scale}};
  auto cache = PagedKvCache::create_cpu(cc);
  EXPECT_TRUE(cache.ok()) << cache.status().to_string();
  (*cache)->storage().fill(0xFF);
  const SeqId dummy = (*cache)->add_sequence();
  EXPECT_TRUE((*cache)->append(dummy, 4).ok());
  const SeqId seq = (*cache)->add_sequence();
  const std::vector<int64_t> chunks = {N - 4, 2, 1, 1};
  std::vector<float> out(static_cast<std::size_t>(N * fx.D), std::nanf(""));
  int64_t t0 = 0;
  for (int64_t n : chunks) {
    EXPECT_TRUE((*cache)->append(seq, n).ok());
    if (t0 == 0) {
      EXPECT_TRUE((*cache)->free(dummy).ok());  // its blocks return to the free list mid-sequence
    }
    MlaForwardOptions fo;
    fo.pool = pool;
    fo.num_splits = splits;
    const Status st = mla_layer_forward(fx.w, fx.cfg, **cache, 1, seq, fx.hidden_view(t0, n), fx.pos_view(t0, n),
                                        TensorView::contiguous(out.data() + t0 * fx.D, DType::kF32, {n, fx.D}), fo);
    EXPECT_TRUE(st.ok()) << st.to_string();
    t0 += n;
  }
  return {std::move(out), std::move(*cache), seq};
}

// Per-element bounds |decoded - written| of one record format, for the latent [N, 512] and
// rope [N, 64] a cache receives.
void element_bounds(KvFormat f, float s_l, const Unquantized& u, int64_t N, std::vector<double>& Ec,
                    std::vector<double>& Ek) {
  Ec.assign(static_cast<std::size_t>(N * kLatentDim), 0.0);
  Ek.assign(static_cast<std::size_t>(N * kRopeDim), 0.0);
  constexpr double kBf16 = 0x1p-8;  // bf16 round-to-nearest: 8 significant bits
  constexpr double kE4m3 = 0x1p-4;  // e4m3 normal: 4 significant bits
  for (int64_t t = 0; t < N; ++t) {
    const float* x = u.lat.data() + t * kLatentDim;
    double* ec = Ec.data() + t * kLatentDim;
    const float* r = u.rope.data() + t * kRopeDim;
    double* ek = Ek.data() + t * kRopeDim;
    switch (f) {
      case KvFormat::kF32:  // stores the values: exact
        break;
      case KvFormat::kBf16:
        for (int d = 0; d < kLatentDim; ++d) ec[d] = kBf16 * std::fabs(x[d]);
        break;
      case KvFormat::kFp8DsMla:
        for (int tile = 0; tile < kLatentDim / 128; ++tile) {
          double amax = 0;
          for (int d = 128 * tile; d < 128 * tile + 128; ++d)
            amax = std::max(amax, static_cast<double>(std::fabs(x[d])));
          const double s = 2.0 * std::max(amax / 448.0, 1e-4);  // the power-of-two scale is below twice this
          for (int d = 128 * tile; d < 128 * tile + 128; ++d) {
            ec[d] = kE4m3 * std::fabs(x[d]) + s * 0x1p-10 + 0x1p-22 * std::fabs(x[d]);
          }
        }
        break;
      case KvFormat::kNvfp4DsMla:
      case KvFormat::kNvfp4DsMlaFp8Rope:
      case KvFormat::kNvfp4DsMlaInt8Rope:
        for (int g = 0; g < kLatentDim / 16; ++g) {
          float amax = 0;
          for (int d = 16 * g; d < 16 * g + 16; ++d) amax = std::max(amax, std::fabs(x[d] / s_l));
          const double sf = e4m3_to_f32(f32_to_e4m3_satfinite(amax / 6.0f));
          for (int d = 16 * g; d < 16 * g + 16; ++d) {
            const double y = std::fabs(static_cast<double>(x[d]) / s_l);
            double e;
            if (sf == 0.0) {
              e = y;
            } else if (y > 6 * sf) {
              e = y - 6 * sf;  // clipped to the largest e2m1 value
            } else {
              const double ratio = y / sf;  // e2m1 steps: 0.5 below 2, 1 below 4, 2 up to 6
              e = (ratio <= 2 ? 0.25 : ratio <= 4 ? 0.5 : 1.0) * sf;
            }
            ec[d] = e * s_l + 0x1p-21 * std::fabs(x[d]);
          }
        }
        break;
    }
    if (f == KvFormat::kNvfp4DsMlaFp8Rope) {
      float amax = 0;
      for (int d = 0; d < kRopeDim; ++d) amax = std::max(amax, std::fabs(r[d]));
      const double rs = amax * (1.0f / 448.0f);
      for (int d = 0; d < kRopeDim; ++d) {
        const double v = std::fabs(r[d]);
        ek[d] = kE4m3 * v + rs * 0x1p-10 + std::max(0.0, v - 448 * rs) + 0x1p-21 * v;
      }
    } else if (f == KvFormat::kNvfp4DsMlaInt8Rope) {
      float amax = 0;
      for (int d = 0; d < kRopeDim; ++d) amax = std::max(amax, std::fabs(r[d]));
      const double rs = amax * (1.0f / 127.0f);
      for (int d = 0; d < kRopeDim; ++d) {
        const double v = std::fabs(r[d]);  // half a step, past-127 clamp, float32 roundings
        ek[d] = 0.5 * rs + std::max(0.0, v - 127 * rs) + 0x1p-21 * v;
      }
    } else if (f != KvFormat::kF32) {
      for (int d = 0; d < kRopeDim; ++d) ek[d] = kBf16 * std::fabs(r[d]);
    }
  }
}

// The sequence's records of cache layer 1, decoded: latent [N, 512], rope [N, 64].
void decode_sequence(const Cached& c, int64_t N, std::vector<float>& lat, std::vector<float>& rope) {
  auto view = c.cache->storage().layer(1);
  ASSERT_TRUE(view.ok());
  auto table = c.cache->blocks().block_table(c.seq);
  ASSERT_TRUE(table.ok());
  lat.resize(static_cast<std::size_t>(N * kLatentDim));
  rope.resize(static_cast<std::size_t>(N * kRopeDim));
  const CodecParams p{view->format, view->outer_scale};
  for (int64_t t = 0; t < N; ++t) {
    const int64_t slot =
        static_cast<int64_t>((*table)[static_cast<std::size_t>(t / view->block_size)]) * view->block_size +
        t % view->block_size;
    ASSERT_TRUE(decode_records(p, TensorView::contiguous(view->record(slot), DType::kU8, {1, view->record_bytes}),
                               TensorView::contiguous(lat.data() + t * kLatentDim, DType::kF32, {1, kLatentDim}),
                               TensorView::contiguous(rope.data() + t * kRopeDim, DType::kF32, {1, kRopeDim}))
                    .ok());
  }
}

// The float64 specification over the cached records: mla_attention_reference, then W_UV and o_proj.
std::vector<float> spec_output(const Fixture& fx, const Unquantized& u, const Cached& c) {
  const int64_t N = fx.N, H = fx.cfg.num_heads;
  auto table = c.cache->blocks().block_table(c.seq);
  EXPECT_TRUE(table.ok());
  std::vector<int32_t> tab(table->begin(), table->end()), seqlen = {static_cast<int32_t>(N)};
  std::vector<float> o_lat(static_cast<std::size_t>(N * H * kLatentDim)), lse(static_cast<std::size_t>(N * H));
  std::vector<float> q = u.q;
  MlaAttentionParams p;
  p.q = TensorView::contiguous(q.data(), DType::kF32, {1, N, H, kQkDim});
  p.cache = *c.cache->storage().layer(1);
  p.block_table = TensorView::contiguous(tab.data(), DType::kI32, {1, static_cast<int64_t>(tab.size())});
  p.seqlens = TensorView::contiguous(seqlen.data(), DType::kI32, {1});
  p.softmax_scale = static_cast<float>(fx.cfg.softmax_scale());
  p.out = TensorView::contiguous(o_lat.data(), DType::kF32, {1, N, H, kLatentDim});
  p.lse = TensorView::contiguous(lse.data(), DType::kF32, {1, N, H});
  Status st = mla_attention_reference(p);
  EXPECT_TRUE(st.ok()) << st.to_string();
  std::vector<float> out(static_cast<std::size_t>(N * fx.D));
  st = mla_layer_output(fx.w, TensorView::contiguous(o_lat.data(), DType::kF32, {N, H, kLatentDim}),
                        TensorView::contiguous(out.data(), DType::kF32, {N, fx.D}));
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

// A naive float32 attention over decoded records (float32 dot products, softmax and sums,
// in plain loop order), then the same output stage: the yardstick for what float32
// arithmetic may cost the attention kernel (STYLE: compare with a same-precision naive
// implementation).
std::vector<float> naive_f32_output(const Fixture& fx, const Unquantized& u, const std::vector<float>& lat,
                                    const std::vector<float>& rope) {
  const int64_t N = fx.N, H = fx.cfg.num_heads;
  const float scale = static_cast<float>(fx.cfg.softmax_scale());
  std::vector<float> o_lat(static_cast<std::size_t>(N * H * kLatentDim), 0.0f), s(static_cast<std::size_t>(N));
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float* q = u.q.data() + (t * H + h) * kQkDim;
      float m = -INFINITY;
      for (int64_t k = 0; k <= t; ++k) {
        float acc = 0.0f;
        for (int d = 0; d < kLatentDim; ++d) acc += q[d] * lat[static_cast<std::size_t>(k * kLatentDim + d)];
        for (int d = 0; d < kRopeDim; ++d) acc += q[kLatentDim + d] * rope[static_cast<std::size_t>(k * kRopeDim + d)];
        s[static_cast<std::size_t>(k)] = acc * scale;
        m = std::max(m, s[static_cast<std::size_t>(k)]);
      }
      float denom = 0.0f;
      float* o = o_lat.data() + (t * H + h) * kLatentDim;
      for (int64_t k = 0; k <= t; ++k) {
        const float pk = std::exp(s[static_cast<std::size_t>(k)] - m);
        denom += pk;
        for (int d = 0; d < kLatentDim; ++d) o[d] += pk * lat[static_cast<std::size_t>(k * kLatentDim + d)];
      }
      for (int d = 0; d < kLatentDim; ++d) o[d] /= denom;
    }
  }
  std::vector<float> out(static_cast<std::size_t>(N * fx.D));
  EXPECT_TRUE(mla_layer_output(fx.w, TensorView::contiguous(o_lat.data(), DType::kF32, {N, H, kLatentDim}),
                               TensorView::contiguous(out.data(), DType::kF32, {N, fx.D}))
                  .ok());
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}
double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

class HfParity : public ::testing::TestWithParam<const char*> {};

TEST_P(HfParity, ConfigMatchesTransformers) {
  auto fx = load_fixture(GetParam());
  ASSERT_TRUE(fx);
  // Both evaluate (P+R)^-0.5 * m^2 in float64.
  EXPECT_NEAR(fx->cfg.softmax_scale(), fx->hf_softmax_scale, 1e-15 * fx->hf_softmax_scale);
  EXPECT_EQ(fx->cfg.kv_lora_rank, kLatentDim);
  EXPECT_EQ(fx->cfg.qk_rope_head_dim, kRopeDim);
}

// Check 1 of the file comment: the layer's math against transformers.
TEST_P(HfParity, UnquantizedMatchesFloat64WithinHfFloat32Error) {
  auto fx = load_fixture(GetParam());
  ASSERT_TRUE(fx);
  const Unquantized u = run_unquantized(*fx);
  const double err64 = max_abs_diff(u.out, fx->out64), err32 = max_abs_diff(u.out, fx->out32);
  std::printf("[parity] %-22s unquantized   |mlakv-hf64| %.3e  |mlakv-hf32| %.3e  e_ref %.3e  max|out| %.3e\n",
              fx->name.c_str(), err64, err32, fx->e_ref, fx->ref_max);
  EXPECT_GT(fx->e_ref, 0.0);
  EXPECT_LE(err64, 2 * fx->e_ref) << "mlakv is less accurate than transformers in float32";
}

// Check 2: every record format, prefill chunks and decode steps on one paged cache.
TEST_P(HfParity, CachedFormatsWithinDerivedBounds) {
  auto fx = load_fixture(GetParam());
  ASSERT_TRUE(fx);
  const Unquantized u = run_unquantized(*fx);
  double lat_max = 0;
  for (float v : u.lat) lat_max = std::max(lat_max, static_cast<double>(std::fabs(v)));
  const float calibrated = static_cast<float>(lat_max / layout::kOuterScaleDenominator);
  ThreadPool pool(3);
  struct Case {
    KvFormat f;
    float s_l;
    const char* label;
  };
  const Case cases[] = {{KvFormat::kF32, 1.0f, "f32"},
                        {KvFormat::kBf16, 1.0f, "bf16"},
                        {KvFormat::kFp8DsMla, 1.0f, "fp8_ds_mla"},
                        {KvFormat::kNvfp4DsMla, 1.0f, "nvfp4_ds_mla"},
                        {KvFormat::kNvfp4DsMla, calibrated, "nvfp4_ds_mla+scale"},
                        {KvFormat::kNvfp4DsMlaFp8Rope, 1.0f, "nvfp4_ds_mla_fp8rope"},
                        {KvFormat::kNvfp4DsMlaFp8Rope, calibrated, "nvfp4_fp8rope+scale"},
                        {KvFormat::kNvfp4DsMlaInt8Rope, calibrated, "nvfp4_int8rope+scale"}};
  double nvfp4_err[2] = {0, 0};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    const Cached cached = run_cached(*fx, c.f, c.s_l, &pool, 2);
    // a. the records against the format's rounding bound
    std::vector<double> Ec, Ek;
    element_bounds(c.f, c.s_l, u, fx->N, Ec, Ek);
    std::vector<float> dlat, drope;
    decode_sequence(cached, fx->N, dlat, drope);
    int bad = 0;
    for (std::size_t i = 0; i < dlat.size(); ++i) {
      const double d = std::fabs(static_cast<double>(dlat[i]) - u.lat[i]);
      if (!(d <= Ec[i]) && bad++ < 3)
        ADD_FAILURE() << "latent " << i << ": |decoded - written| " << d << " > " << Ec[i];
    }
    for (std::size_t i = 0; i < drope.size(); ++i) {
      const double d = std::fabs(static_cast<double>(drope[i]) - u.rope[i]);
      if (!(d <= Ek[i]) && bad++ < 6) ADD_FAILURE() << "rope " << i << ": |decoded - written| " << d << " > " << Ek[i];
    }
    // b. the output against the float64 specification on the same records
    const std::vector<float> spec = spec_output(*fx, u, cached);
    const double slack = 4 * max_abs_diff(naive_f32_output(*fx, u, dlat, drope), spec);
    EXPECT_GT(slack, 0.0);
    double kernel_err = 0;
    for (std::size_t i = 0; i < cached.out.size(); ++i) {
      ASSERT_TRUE(std::isfinite(cached.out[i])) << "output " << i;
      const double d = std::fabs(static_cast<double>(cached.out[i]) - spec[i]);
      kernel_err = std::max(kernel_err, d);
      if (!(d <= slack) && bad++ < 9) ADD_FAILURE() << "output " << i << ": |cached - spec| " << d << " > " << slack;
    }
    const double err32 = max_abs_diff(cached.out, fx->out32), err64 = max_abs_diff(cached.out, fx->out64);
    const double rounding = max_abs_diff(spec, u.out);
    std::printf(
        "[parity] %-22s %-21s |mlakv-hf32| %.3e (%.2e of max|out|)  |mlakv-hf64| %.3e  format rounding "
        "|spec-unquantized| %.3e  kernel |cached-spec| %.3e (4 e_naive32 %.1e)\n",
        fx->name.c_str(), c.label, err32, err32 / fx->ref_max, err64, rounding, kernel_err, slack);
    if (c.f == KvFormat::kNvfp4DsMla) nvfp4_err[c.s_l == 1.0f ? 0 : 1] = err64;
  }
  if (fx->name == "glm4_moe_lite") {
    // kv_c_normed peaks near 0.02 here: uncalibrated group scales are e4m3 subnormals.
    EXPECT_LT(nvfp4_err[1], 0.5 * nvfp4_err[0]) << "the outer scale should fix subnormal group scales";
  }
}

// The trace holds what capture needs; decode after prefill equals one whole pass.
TEST_P(HfParity, TraceHoldsTheUnquantizedLatent) {
  auto fx = load_fixture(GetParam());
  ASSERT_TRUE(fx);
  const Unquantized u = run_unquantized(*fx);
  KvCache::Config cc;
  cc.num_blocks = fx->N;
  cc.block_size = 4;
  auto cache = PagedKvCache::create_cpu(cc);
  ASSERT_TRUE(cache.ok());
  const SeqId seq = (*cache)->add_sequence();
  ASSERT_TRUE((*cache)->append(seq, fx->N).ok());
  std::vector<float> out(static_cast<std::size_t>(fx->N * fx->D));
  MlaLayerTrace trace;
  MlaForwardOptions fo;
  fo.trace = &trace;
  ASSERT_TRUE(mla_layer_forward(fx->w, fx->cfg, **cache, 0, seq, fx->hidden_view(), fx->pos_view(),
                                TensorView::contiguous(out.data(), DType::kF32, {fx->N, fx->D}), fo)
                  .ok());
  EXPECT_EQ(trace.kv_c_normed, u.lat);  // the same projection code: bit-identical
  EXPECT_EQ(trace.k_pe, u.rope);
  EXPECT_EQ(trace.q, u.q);
  EXPECT_EQ(trace.attn_latent.size(), static_cast<std::size_t>(fx->N * fx->cfg.num_heads * kLatentDim));
}

INSTANTIATE_TEST_SUITE_P(Geometries, HfParity, ::testing::ValuesIn(kGeometries),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// ---- bad checkpoints and bad arguments -----------------------------------------------------

// The deepseek_v3 fixture's tensors, in memory, with one edit.
std::unique_ptr<TensorMap> edited_checkpoint(const std::string& drop, const std::string& replace = "",
                                             DType dtype = DType::kF32, std::vector<int64_t> shape = {},
                                             const void* bytes = nullptr, std::size_t nbytes = 0) {
  auto src = Checkpoint::open(fixture_dir("deepseek_v3"));
  EXPECT_TRUE(src.ok());
  auto m = std::make_unique<TensorMap>();
  for (const std::string& name : (*src)->names()) {
    if (name == drop) continue;
    const TensorView t = *(*src)->find(name);
    std::vector<int64_t> s(t.shape.begin(), t.shape.begin() + t.ndim);
    EXPECT_TRUE(m->add(name, t.dtype, s, t.data, static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype)).ok());
  }
  if (!replace.empty()) {
    EXPECT_TRUE(m->add(replace, dtype, shape, bytes, nbytes).ok());
  }
  return m;
}

StatusOr<MlaLayerWeights> load_edited(const TensorMap& m, ModelConfig cfg, int layer = 0) {
  MlaLoadOptions lo;
  lo.quant = quant_of(fixture_dir("deepseek_v3"));
  return load_mla_layer(m, cfg, layer, lo);
}

TEST(MlaLayerLoad, BadCheckpoints) {
  auto cfg = load_hf_config(fixture_dir("deepseek_v3"));
  ASSERT_TRUE(cfg.ok());
  const std::string pre = "model.layers.0.self_attn.";
  {  // the unedited copy loads
    auto m = edited_checkpoint("");
    EXPECT_TRUE(load_edited(*m, *cfg).ok());
  }
  {  // a missing projection
    auto m = edited_checkpoint(pre + "kv_b_proj.weight");
    auto st = load_edited(*m, *cfg).status();
    EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
    EXPECT_NE(st.message().find("kv_b_proj"), std::string::npos) << st.message();
  }
  {  // a missing fp8 block scale
    auto m = edited_checkpoint(pre + "o_proj.weight_scale_inv");
    auto st = load_edited(*m, *cfg).status();
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("o_proj"), std::string::npos) << st.message();
  }
  {  // a missing norm
    auto m = edited_checkpoint(pre + "q_a_layernorm.weight");
    auto st = load_edited(*m, *cfg).status();
    EXPECT_EQ(st.code(), StatusCode::kNotFound);
    EXPECT_NE(st.message().find("q_a_layernorm.weight"), std::string::npos) << st.message();
  }
  {  // a projection of the wrong shape
    std::vector<uint8_t> z(31 * 64, 0);
    auto m = edited_checkpoint(pre + "q_a_proj.weight", pre + "q_a_proj.weight", DType::kF8E4M3, {31, 64}, z.data(),
                               z.size());
    auto st = load_edited(*m, *cfg).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("q_a_proj"), std::string::npos) << st.message();
  }
  {  // a NaN in a bf16 norm
    std::vector<uint16_t> v(512, f32_to_bf16(1.0f));
    v[77] = kBf16NaN;
    auto m = edited_checkpoint(pre + "kv_a_layernorm.weight", pre + "kv_a_layernorm.weight", DType::kBF16, {512},
                               v.data(), v.size() * 2);
    auto st = load_edited(*m, *cfg).status();
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.to_string();
    EXPECT_NE(st.message().find("kv_a_layernorm.weight"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("[77]"), std::string::npos) << st.message();
  }
  {  // a norm of the wrong dtype and of the wrong length
    std::vector<int32_t> v(512, 1);
    auto m = edited_checkpoint(pre + "kv_a_layernorm.weight", pre + "kv_a_layernorm.weight", DType::kI32, {512},
                               v.data(), v.size() * 4);
    auto st = load_edited(*m, *cfg).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("i32"), std::string::npos) << st.message();
    std::vector<float> f(500, 1.0f);
    m = edited_checkpoint(pre + "kv_a_layernorm.weight", pre + "kv_a_layernorm.weight", DType::kF32, {500}, f.data(),
                          f.size() * 4);
    st = load_edited(*m, *cfg).status();
    EXPECT_NE(st.message().find("[512]"), std::string::npos) << st.message();
  }
  {  // a bias of the wrong length
    std::vector<float> b(63, 0.0f);
    auto m = edited_checkpoint("", pre + "o_proj.bias", DType::kF32, {63}, b.data(), b.size() * 4);
    auto st = load_edited(*m, *cfg).status();
    EXPECT_NE(st.message().find("o_proj.bias"), std::string::npos) << st.message();
  }
  {  // a config that does not match the weights, and a layer that does not exist
    auto m = edited_checkpoint("");
    ModelConfig c = *cfg;
    c.num_heads = 2;
    auto st = load_edited(*m, c).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("q_b_proj"), std::string::npos) << st.message();
    st = load_edited(*m, *cfg, 1).status();
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
    c = *cfg;
    c.qk_rope_head_dim = 63;
    EXPECT_FALSE(load_edited(*m, c).ok());
  }
}

TEST(MlaLayerForward, BadArguments) {
  auto fx = load_fixture("deepseek_v2_lite");
  ASSERT_TRUE(fx);
  KvCache::Config cc;
  cc.num_blocks = 8;
  cc.block_size = 4;
  auto cache = PagedKvCache::create_cpu(cc);
  ASSERT_TRUE(cache.ok());
  const SeqId seq = (*cache)->add_sequence();
  ASSERT_TRUE((*cache)->append(seq, 3).ok());
  std::vector<float> out(static_cast<std::size_t>(fx->N * fx->D));
  auto out_view = [&](int64_t n) { return TensorView::contiguous(out.data(), DType::kF32, {n, fx->D}); };
  auto fwd = [&](int layer, SeqId s, const TensorView& h, const TensorView& p, const TensorView& o) {
    return mla_layer_forward(fx->w, fx->cfg, **cache, layer, s, h, p, o);
  };
  // more new tokens than the sequence holds
  Status st = fwd(0, seq, fx->hidden_view(0, 4), fx->pos_view(0, 4), out_view(4));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
  // unknown sequence, cache layer out of range
  EXPECT_FALSE(fwd(0, seq + 7, fx->hidden_view(0, 3), fx->pos_view(0, 3), out_view(3)).ok());
  EXPECT_EQ(fwd(1, seq, fx->hidden_view(0, 3), fx->pos_view(0, 3), out_view(3)).code(), StatusCode::kOutOfRange);
  // a negative position, a wrong hidden size, i32 hidden, aliasing output
  std::vector<int64_t> bad_pos = {0, -1, 2};
  st = fwd(0, seq, fx->hidden_view(0, 3), TensorView::contiguous(bad_pos.data(), DType::kI64, {3}), out_view(3));
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("positions[1]"), std::string::npos) << st.message();
  st = fwd(0, seq, TensorView::contiguous(fx->hidden.data(), DType::kF32, {3, fx->D - 1}), fx->pos_view(0, 3),
           out_view(3));
  EXPECT_NE(st.message().find("hidden"), std::string::npos) << st.message();
  st = fwd(0, seq, TensorView::contiguous(fx->hidden.data(), DType::kI32, {3, fx->D}), fx->pos_view(0, 3), out_view(3));
  EXPECT_NE(st.message().find("hidden"), std::string::npos) << st.message();
  std::vector<float> h(fx->hidden.begin(), fx->hidden.begin() + 3 * fx->D);
  st = fwd(0, seq, TensorView::contiguous(h.data(), DType::kF32, {3, fx->D}), fx->pos_view(0, 3),
           TensorView::contiguous(h.data(), DType::kF32, {3, fx->D}));
  EXPECT_NE(st.message().find("overlap"), std::string::npos) << st.message();
  h[5] = std::nanf("");
  st = fwd(0, seq, TensorView::contiguous(h.data(), DType::kF32, {3, fx->D}), fx->pos_view(0, 3), out_view(3));
  EXPECT_NE(st.message().find("hidden[0, 5]"), std::string::npos) << st.message();
  // weights that do not match the config
  ModelConfig other = fx->cfg;
  other.num_heads = 4;
  st = mla_layer_forward(fx->w, other, **cache, 0, seq, fx->hidden_view(0, 3), fx->pos_view(0, 3), out_view(3));
  EXPECT_NE(st.message().find("do not match"), std::string::npos) << st.message();
  // a cache whose geometry is not the model's
  KvCache::Config small = cc;
  small.latent_dim = 256;
  auto c2 = PagedKvCache::create_cpu(small);
  ASSERT_TRUE(c2.ok());
  const SeqId s2 = (*c2)->add_sequence();
  ASSERT_TRUE((*c2)->append(s2, 3).ok());
  st = mla_layer_forward(fx->w, fx->cfg, **c2, 0, s2, fx->hidden_view(0, 3), fx->pos_view(0, 3), out_view(3));
  EXPECT_NE(st.message().find("latent 256"), std::string::npos) << st.message();
  // the cache is untouched by every failed call: all records still zero
  auto view = (*cache)->storage().layer(0);
  ASSERT_TRUE(view.ok());
  for (int64_t i = 0; i < view->num_slots() * view->record_bytes; ++i) ASSERT_EQ(view->data[i], 0) << i;
}

TEST(MlaLayerAbsorb, PerHeadInterleaveByHand) {
  // H = 2, P = 1, V = 2, L = 3: rows h*(P+V) + p are W_UK, the next V rows W_UV^T.
  const std::vector<float> kv_b = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18};
  auto geo = [](int H, int P, int V, int L) {
    return MlaGeometry{.num_heads = H, .kv_lora_rank = L, .qk_nope_head_dim = P, .v_head_dim = V};
  };
  std::vector<float> uk, uv;
  ASSERT_TRUE(absorb_kv_b_proj(kv_b, geo(2, 1, 2, 3), uk, uv).ok());
  EXPECT_EQ(uk, (std::vector<float>{1, 2, 3, 10, 11, 12}));
  EXPECT_EQ(uv, (std::vector<float>{4, 7, 5, 8, 6, 9, 13, 16, 14, 17, 15, 18}));
  EXPECT_EQ(absorb_kv_b_proj(kv_b, geo(2, 1, 2, 4), uk, uv).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(absorb_kv_b_proj(kv_b, geo(0, 1, 2, 3), uk, uv).code(), StatusCode::kInvalidArgument);
}

// ---- the CLI -----------------------------------------------------------------------------

struct CliRun {
  int rc;
  std::string out, err;
};

class LayerCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mlakv_layer_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  CliRun run(const std::string& args) {
    const std::string o = path("stdout"), e = path("stderr");
    const int status = std::system((std::string(MLAKV_CLI_PATH) + " " + args + " >" + o + " 2>" + e).c_str());
    return {WEXITSTATUS(status), slurp(o), slurp(e)};
  }
  std::string path(const char* name) const { return (dir_ / name).string(); }
  static std::vector<float> read_f32(const std::string& file, const char* name) {
    auto f = SafetensorsFile::open(file);
    EXPECT_TRUE(f.ok()) << f.status().to_string();
    if (!f.ok()) return {};
    return read_all<float>(**f, name, DType::kF32);
  }
  // The library with the CLI's settings: one cache layer, block size 4, chunks of 5.
  static std::vector<float> library(const Fixture& fx, KvFormat f, float s_l) {
    KvCache::Config cc;
    cc.block_size = 4;
    cc.num_blocks = (fx.N + 3) / 4;
    cc.layers = {{f, s_l}};
    auto cache = PagedKvCache::create_cpu(cc);
    EXPECT_TRUE(cache.ok());
    const SeqId seq = (*cache)->add_sequence();
    std::vector<float> out(static_cast<std::size_t>(fx.N * fx.D));
    for (int64_t t0 = 0; t0 < fx.N; t0 += 5) {
      const int64_t n = std::min<int64_t>(5, fx.N - t0);
      EXPECT_TRUE((*cache)->append(seq, n).ok());
      EXPECT_TRUE(mla_layer_forward(fx.w, fx.cfg, **cache, 0, seq, fx.hidden_view(t0, n), fx.pos_view(t0, n),
                                    TensorView::contiguous(out.data() + t0 * fx.D, DType::kF32, {n, fx.D}))
                      .ok());
    }
    return out;
  }
  fs::path dir_;
};

TEST_F(LayerCli, ForwardMatchesTheLibrary) {
  auto fx = load_fixture("deepseek_v3");
  ASSERT_TRUE(fx);
  const std::string base = "layer-forward --model " + fx->dir + " --layer 0 --input " + fx->dir +
                           "/io.safetensors --chunk 5 --block-size 4 --threads 1 --output " + path("y.safetensors");
  CliRun r = run(base + " --format fp8_ds_mla --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["tokens"].get<int>(), fx->N);
  EXPECT_EQ(read_f32(path("y.safetensors"), "output"), library(*fx, KvFormat::kFp8DsMla, 1.0f));
}

TEST_F(LayerCli, CaptureCalibrateAndApplyScales) {
  auto fx = load_fixture("glm4_moe_lite");
  ASSERT_TRUE(fx);
  const std::string base = "layer-forward --model " + fx->dir + " --layer 0 --input " + fx->dir +
                           "/io.safetensors --chunk 5 --block-size 4 --threads 1 --output " + path("y.safetensors");
  CliRun r = run(base + " --capture " + path("a.safetensors"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::vector<float> lat = read_f32(path("a.safetensors"), "layers.0.kv_c_normed");
  const Unquantized u = run_unquantized(*fx);
  EXPECT_EQ(lat, u.lat);
  double m = 0;
  for (float v : lat) m = std::max(m, static_cast<double>(std::fabs(v)));

  r = run("calibrate --activations " + path("a.safetensors") + " --out " + path("s.json") + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto s = load_outer_scales(path("s.json"));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_EQ(s->num_layers(), 1);
  EXPECT_EQ(s->max_abs[0], m);
  EXPECT_EQ(s->scales[0], m / 2688.0);

  r = run(base + " --format nvfp4_ds_mla --scales " + path("s.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
  EXPECT_EQ(read_f32(path("y.safetensors"), "output"),
            library(*fx, KvFormat::kNvfp4DsMla, static_cast<float>(m / 2688.0)));

  // A scale file with a format that has no outer scale: a warning, and the scales are unused.
  r = run(base + " --format bf16 --scales " + path("s.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("warning:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no outer scale"), std::string::npos) << r.err;
  EXPECT_EQ(read_f32(path("y.safetensors"), "output"), library(*fx, KvFormat::kBf16, 1.0f));
}

TEST_F(LayerCli, BadInputsAreErrors) {
  const std::string dir = fixture_dir("kimi_k2");
  const std::string base = "layer-forward --model " + dir + " --output " + path("y.safetensors");
  // hidden_states missing (the model file is a safetensors without it)
  CliRun r = run(base + " --layer 2 --input " + dir + "/model.safetensors");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("error:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hidden_states"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
  // a layer the config does not have, an unknown format
  r = run(base + " --layer 3 --input " + dir + "/io.safetensors");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--layer 3"), std::string::npos) << r.err;
  r = run(base + " --layer 2 --format fp3 --input " + dir + "/io.safetensors");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("fp3"), std::string::npos) << r.err;
  // a layer the config has but the checkpoint does not
  r = run(base + " --layer 0 --input " + dir + "/io.safetensors");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("model.layers.0.self_attn"), std::string::npos) << r.err;
  // positions of the wrong dtype (i64 and i32 are accepted)
  {
    std::vector<float> h(static_cast<std::size_t>(2 * 32), 0.5f);
    std::vector<float> p = {0, 1};
    ASSERT_TRUE(write_safetensors(path("x.safetensors"),
                                  {{"hidden_states", TensorView::contiguous(h.data(), DType::kF32, {2, 32})},
                                   {"positions", TensorView::contiguous(p.data(), DType::kF32, {2})}})
                    .ok());
  }
  r = run(base + " --layer 2 --input " + path("x.safetensors"));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("positions"), std::string::npos) << r.err;
  // a bad scale file names the file and field
  {
    std::ofstream(path("bad.json")) << R"({"format": "nvfp4_ds_mla_outer_scale_v1", "num_layers": 1, "latent_dim": 512,
      "denominator": 2688.0, "scales": [0.0]})";
  }
  r = run(base + " --layer 2 --format nvfp4_ds_mla --input " + dir + "/io.safetensors --scales " + path("bad.json"));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("bad.json"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'scales'[0]"), std::string::npos) << r.err;
  // a config that is not an MLA model
  fs::create_directories(dir_ / "m");
  std::ofstream(path("m/config.json")) << R"({"model_type": "llama", "hidden_size": 32})";
  r = run("layer-forward --model " + path("m") + " --layer 0 --input " + dir + "/io.safetensors --output " +
          path("y.safetensors"));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("kv_lora_rank"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("y.safetensors")));
}

}  // namespace
}  // namespace mlakv
