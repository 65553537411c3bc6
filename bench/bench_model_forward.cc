// Whole-model prefill and decode on the CPU (include/mlakv/model.h) per cache format, on
// a synthetic DeepSeek-V2-Lite-shaped stack (D 2048, H 16, P 128, R 64, V 128, L 512,
// dense MLP 10944, experts of 1408 with 6 routed + 2 shared) shrunk to fit a small
// machine: 1 dense layer + 1 MoE layer of 16 experts, vocab 8192, bf16 weights
// (about 570 MB, written once to $TMPDIR/mlakv_bench_v2lite). MLAKV_BENCH_MODEL=DIR runs
// a real checkpoint directory instead.
//   prefill: 512 tokens in chunks of 256, tokens/s;
//   decode:  1 token after a 512-token prefill, tokens/s, and best_vs_weight_read =
//            step time / (bytes of the weights one decode step reads / memcpy GB/s), the
//            issue's "within 1.5x of the time to read the weights once".
// Threads: MLAKV_THREADS (default: all hardware threads).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cpu_bench_util.h"

#include "mlakv/model.h"
#include "mlakv/numerics.h"
#include "mlakv/roofline.h"
#include "mlakv/safetensors.h"

namespace {

using namespace mlakv;
namespace fs = std::filesystem;

using bench::threads;

constexpr int kD = 2048, kH = 16, kP = 128, kR = 64, kV = 128, kL = 512, kI = 10944, kMI = 1408, kE = 16, kVocab = 8192;

std::string synthetic_dir() {
  const fs::path dir = fs::temp_directory_path() / "mlakv_bench_v2lite";
  if (fs::exists(dir / "model.safetensors")) return dir.string();
  fs::create_directories(dir);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<std::pair<std::string, std::vector<uint16_t>>> store;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool ones = false) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<uint16_t> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = f32_to_bf16(ones ? 1.0f : nd(rng));
    store.emplace_back(name, std::move(v));
    shapes.emplace_back(name, std::move(shape));
  };
  add("model.embed_tokens.weight", {kVocab, kD});
  add("lm_head.weight", {kVocab, kD});
  add("model.norm.weight", {kD}, true);
  for (int l = 0; l < 2; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add(p + "input_layernorm.weight", {kD}, true);
    add(p + "post_attention_layernorm.weight", {kD}, true);
    add(p + "self_attn.q_proj.weight", {kH * (kP + kR), kD});
    add(p + "self_attn.kv_a_proj_with_mqa.weight", {kL + kR, kD});
    add(p + "self_attn.kv_a_layernorm.weight", {kL}, true);
    add(p + "self_attn.kv_b_proj.weight", {kH * (kP + kV), kL});
    add(p + "self_attn.o_proj.weight", {kD, kH * kV});
    if (l == 0) {
      add(p + "mlp.gate_proj.weight", {kI, kD});
      add(p + "mlp.up_proj.weight", {kI, kD});
      add(p + "mlp.down_proj.weight", {kD, kI});
    } else {
      add(p + "mlp.gate.weight", {kE, kD});
      for (int e = 0; e < kE; ++e) {
        add(fmt::format("{}mlp.experts.{}.gate_proj.weight", p, e), {kMI, kD});
        add(fmt::format("{}mlp.experts.{}.up_proj.weight", p, e), {kMI, kD});
        add(fmt::format("{}mlp.experts.{}.down_proj.weight", p, e), {kD, kMI});
      }
      add(p + "mlp.shared_experts.gate_proj.weight", {2 * kMI, kD});
      add(p + "mlp.shared_experts.up_proj.weight", {2 * kMI, kD});
      add(p + "mlp.shared_experts.down_proj.weight", {kD, 2 * kMI});
    }
  }
  std::vector<std::pair<std::string, TensorView>> views;
  for (std::size_t i = 0; i < store.size(); ++i) {
    TensorView v;
    v.data = store[i].second.data();
    v.dtype = DType::kBF16;
    v.ndim = static_cast<int>(shapes[i].second.size());
    int64_t st = 1;
    for (int d = v.ndim - 1; d >= 0; --d) {
      v.shape[static_cast<std::size_t>(d)] = shapes[i].second[static_cast<std::size_t>(d)];
      v.strides[static_cast<std::size_t>(d)] = st;
      st *= v.shape[static_cast<std::size_t>(d)];
    }
    views.emplace_back(store[i].first, v);
  }
  (void)write_safetensors((dir / "model.safetensors").string(), views);
  std::ofstream(dir / "config.json") << fmt::format(
      R"({{"model_type": "deepseek_v2", "vocab_size": {}, "hidden_size": {}, "intermediate_size": {},
 "moe_intermediate_size": {}, "num_hidden_layers": 2, "num_attention_heads": {}, "num_key_value_heads": {},
 "n_routed_experts": {}, "n_shared_experts": 2, "num_experts_per_tok": 6, "topk_method": "greedy",
 "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 1.0,
 "q_lora_rank": null, "kv_lora_rank": {}, "qk_nope_head_dim": {}, "qk_rope_head_dim": {}, "v_head_dim": {},
 "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
 "rope_theta": 10000, "rope_scaling": {{"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
 "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}}}})",
      kVocab, kD, kI, kMI, kH, kH, kE, kL, kP, kR, kV);
  return dir.string();
}

Model& model() {
  static std::unique_ptr<Model> m = [] {
    const char* dir = std::getenv("MLAKV_BENCH_MODEL");
    auto r = Model::load(dir ? std::string(dir) : synthetic_dir(), {.threads = threads()});
    if (!r.ok()) {
      std::fprintf(stderr, "error: %s\n", r.status().message().c_str());
      std::exit(1);
    }
    return std::move(*r);
  }();
  return *m;
}

std::vector<int32_t> tokens(int64_t n) {
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = static_cast<int32_t>((i * 7919) % model().vocab_size());
  return t;
}

void BM_Prefill(benchmark::State& state) {
  const auto f = static_cast<KvFormat>(state.range(0));
  Model& m = model();
  const int64_t n = 512, chunk = 256;
  auto cache = std::move(m.create_cache({LayerFormat{f, 1.0f}}, n).value());
  const auto tok = tokens(n);
  std::vector<float> logits(static_cast<std::size_t>(chunk * m.vocab_size()));
  for (auto _ : state) {
    const SeqId s = cache->add_sequence();
    for (int64_t at = 0; at < n; at += chunk) {
      const Status st = m.forward(*cache, s, std::span<const int32_t>(tok.data() + at, chunk),
                                  TensorView::contiguous(logits.data(), DType::kF32, {chunk, m.vocab_size()}));
      if (!st.ok()) state.SkipWithError(st.to_string().c_str());
    }
    (void)cache->free(s);
  }
  state.SetLabel(fmt::format("{} threads={}", format_name(f), threads()));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Prefill)->DenseRange(0, 3)->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();

void BM_Decode(benchmark::State& state) {
  const auto f = static_cast<KvFormat>(state.range(0));
  Model& m = model();
  const int64_t ctx = 512;
  auto cache = std::move(m.create_cache({LayerFormat{f, 1.0f}}, ctx + 4096).value());
  const SeqId s = cache->add_sequence();
  const auto tok = tokens(ctx);
  std::vector<float> logits(static_cast<std::size_t>(ctx * m.vocab_size()));
  (void)m.forward(*cache, s, tok, TensorView::contiguous(logits.data(), DType::kF32, {ctx, m.vocab_size()}));
  ForwardOptions fo;
  fo.last_token_only = true;
  int32_t next = 1;
  double best = 1e30;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = m.forward(*cache, s, std::span<const int32_t>(&next, 1),
                                TensorView::contiguous(logits.data(), DType::kF32, {1, m.vocab_size()}), fo);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
    next = (next * 31 + 7) % m.vocab_size();
  }
  // Bytes one decode step reads: every non-expert weight, plus (top_k + shared) of the
  // experts: the routed share is (top_k / E) of the expert bytes.
  const ModelArch& a = m.arch();
  const ModelMemory& mem = m.memory();
  const double touched =
      static_cast<double>(mem.resident_bytes()) -
      static_cast<double>(mem.routed_expert_bytes) * (1.0 - double(a.routing.top_k) / std::max(1, a.routing.num_experts));
  static const double gbps = cpu::measure_memcpy_gbps(std::size_t{256} << 20, 3);
  state.counters["decode_bytes_MB"] = touched * 1e-6;
  state.counters["memcpy_GB/s"] = gbps;
  state.counters["best_vs_weight_read"] = best / (touched * 1e-9 / gbps);
  state.SetLabel(fmt::format("{} threads={}", format_name(f), threads()));
  state.counters["tokens/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["best_step_ms"] = best * 1e3;
}
BENCHMARK(BM_Decode)->DenseRange(0, 3)->Unit(benchmark::kMillisecond)->Iterations(30)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
