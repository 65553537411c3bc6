// mlakv demo: the main job on an embedded default. One MLA layer at DeepSeek-V3
// geometry (absorbed 576-wide query, 512 + 64 latent), a synthetic RMS-normed latent
// context (docs/demo.md) with a planted needle, attended in every KV format; each is
// compared with the float64 reference on the unquantized latent.
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <vector>

#include "cli/cli.h"
#include "cli/progress.h"
#include "mlakv/codec.h"
#include "mlakv/eval_stats.h"
#include "mlakv/synthetic.h"
#include "mlakv/attention.h"
#include "mlakv/model_config.h"
#include "mlakv/thread_pool.h"

namespace mlakv::cli {
namespace {

// --context: 4M tokens need ~28 GiB on the host (see the memory check in run_demo).
constexpr int64_t kMaxDemoContext = int64_t{1} << 22;
constexpr int kMaxDemoReps = 10000;

struct DemoArgs {
  int64_t context = 16384;
  int heads = 16;
  std::string format = "all";
  int threads = 0;
  int reps = 5;
  bool json = false;
};

struct FormatResult {
  KvFormat format;
  int record_bytes;
  double cache_mib;
  double rel_l2, cosine, lse_max_err;
  int64_t needle_rank;
  double needle_weight;  // head 0's softmax weight on the needle over the decoded scores (float64)
  double step_ms, tokens_per_s, cache_gbps;
};

Status run_demo(const DemoArgs& a) {
  if (a.context < 2 || a.context > kMaxDemoContext) {
    return invalid_argument(fmt::format("--context must be in [2, {}], got {}", kMaxDemoContext, a.context));
  }
  if (a.heads < 1 || a.heads > 128) return invalid_argument(fmt::format("--heads must be in [1, 128], got {}", a.heads));
  if (a.reps < 1 || a.reps > kMaxDemoReps) {
    return invalid_argument(fmt::format("--reps must be in [1, {}], got {}", kMaxDemoReps, a.reps));
  }
  // Host memory the run holds at once: the float32 context twice (generated latents and
  // the reference's packed copy), the geometry cache and one format's cache (bf16 at most).
  const double need = static_cast<double>(a.context) * (2.0 * 4 * kQkDim + 2.0 * record_bytes(KvFormat::kBf16));
  const double have = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  if (have > 0 && need > 0.8 * have) {
    return resource_exhausted(fmt::format("--context {} needs about {:.1f} GiB of memory; this machine has {:.1f} GiB",
                                          a.context, need / (1 << 30), have / (1 << 30)));
  }
  if (a.threads < 0) return invalid_argument(fmt::format("--threads must be >= 0 (0 = all), got {}", a.threads));
  std::vector<KvFormat> formats;
  if (a.format == "all") {
    for (const FormatInfo& f : all_formats()) formats.push_back(f.format);
  } else if (auto f = parse_format(a.format)) {
    formats.push_back(*f);
  } else {
    return invalid_argument(fmt::format("--format: unknown format '{}' (see 'mlakv formats', or 'all')", a.format));
  }
  const ModelConfig model = find_model_preset("deepseek-v3")->config;
  const float scale = static_cast<float>(model.softmax_scale());
  const int64_t T = a.context, H = a.heads;
  const int bs = kDefaultBlockSize;
  const int64_t num_blocks = (T + bs - 1) / bs;
  ThreadPool pool(a.threads);
  const bool progress = !a.json;

  // Context: synthetic kv_c_normed + rotated k_pe; queries; the needle.
  std::vector<float> lat(static_cast<std::size_t>(T) * kLatentDim), rope(static_cast<std::size_t>(T) * kRopeDim);
  synthetic::LatentGenerator gen({});
  {
    Progress pr("generating the synthetic context", T, progress);
    for (int64_t t0 = 0; t0 < T; t0 += 4096) {
      const int64_t n = std::min<int64_t>(4096, T - t0);
      gen.generate(n, lat.data() + t0 * kLatentDim, rope.data() + t0 * kRopeDim);
      pr.update(t0 + n);
    }
  }
  std::vector<float> q(static_cast<std::size_t>(H) * kQkDim);
  {
    synthetic::LatentGenerator qgen({.seed = 7});
    // Each head's query: a latent part and a RoPE part (both matter: fp8 RoPE must show).
    for (int64_t h = 0; h < H; ++h) qgen.generate(1, q.data() + h * kQkDim, q.data() + h * kQkDim + kLatentDim);
    // Absorbed queries are not normed like the cache: give them unit-variance latents.
    for (int64_t h = 0; h < H; ++h) {
      for (int d = 0; d < kLatentDim; ++d) q[static_cast<std::size_t>(h * kQkDim + d)] /= gen.gamma()[static_cast<std::size_t>(d)];
    }
  }
  // Needle: an ordinary token plus beta x head 0's latent query direction (at an
  // ordinary token's norm), beta chosen so that the needle takes exactly half of head 0's
  // attention in the float64 reference on the unquantized context. At weight 1/2 the
  // weight moves by a quarter of any score error, so the formats' errors show in it.
  const int64_t needle = T * 37 / 100;
  auto ref_score = [&](int64_t t) {
    double s = 0;
    for (int d = 0; d < kLatentDim; ++d) {
      s += static_cast<double>(q[static_cast<std::size_t>(d)]) * lat[static_cast<std::size_t>(t * kLatentDim + d)];
    }
    for (int d = 0; d < kRopeDim; ++d) {
      s += static_cast<double>(q[static_cast<std::size_t>(kLatentDim + d)]) * rope[static_cast<std::size_t>(t * kRopeDim + d)];
    }
    return s * scale;
  };
  {
    double qn = 0, gn = 0;
    for (int d = 0; d < kLatentDim; ++d) {
      qn += static_cast<double>(q[static_cast<std::size_t>(d)]) * q[static_cast<std::size_t>(d)];
      gn += static_cast<double>(gen.gamma()[static_cast<std::size_t>(d)]) * gen.gamma()[static_cast<std::size_t>(d)];
    }
    const double k = std::sqrt(gn / qn);
    double m = -INFINITY;
    std::vector<double> others(static_cast<std::size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      others[static_cast<std::size_t>(t)] = t == needle ? -INFINITY : ref_score(t);
      m = std::max(m, others[static_cast<std::size_t>(t)]);
    }
    double sum = 0;
    for (double v : others) sum += std::exp(v - m);
    const double lse_others = m + std::log(sum);
    // s(beta) = s(0) + beta * scale * k * |q|^2: solve s(beta) = lse_others.
    const double beta = std::max(0.0, (lse_others - ref_score(needle)) / (static_cast<double>(scale) * k * qn));
    for (int d = 0; d < kLatentDim; ++d) {
      float& x = lat[static_cast<std::size_t>(needle * kLatentDim + d)];
      x = static_cast<float>(x + beta * k * q[static_cast<std::size_t>(d)]);
    }
  }
  // Head 0's weight on the needle in float64 over scores s_t: exp(s_n - m) / sum exp(s_t - m),
  // never above 1.
  auto needle_weight = [&](const std::vector<double>& sc) {
    const double m = *std::max_element(sc.begin(), sc.end());
    double sum = 0;
    for (double v : sc) sum += std::exp(v - m);
    return std::exp(sc[static_cast<std::size_t>(needle)] - m) / sum;
  };
  double ref_needle_weight = 0;
  {
    std::vector<double> sc(static_cast<std::size_t>(T));
    for (int64_t t = 0; t < T; ++t) sc[static_cast<std::size_t>(t)] = ref_score(t);
    ref_needle_weight = needle_weight(sc);
  }

  std::vector<int32_t> table(static_cast<std::size_t>(num_blocks)), seqlen = {static_cast<int32_t>(T)};
  std::iota(table.begin(), table.end(), 0);
  auto params = [&](const CacheLayerView& view, std::vector<float>& out, std::vector<float>& lse, int splits) {
    MlaAttentionParams p;
    p.q = TensorView::contiguous(q.data(), DType::kF32, {1, 1, H, kQkDim});
    p.cache = view;
    p.block_table = TensorView::contiguous(table.data(), DType::kI32, {1, num_blocks});
    p.seqlens = TensorView::contiguous(seqlen.data(), DType::kI32, {1});
    p.softmax_scale = scale;
    p.num_splits = splits;
    out.assign(static_cast<std::size_t>(H) * kLatentDim, 0.0f);
    lse.assign(static_cast<std::size_t>(H), 0.0f);
    p.out = TensorView::contiguous(out.data(), DType::kF32, {1, 1, H, kLatentDim});
    p.lse = TensorView::contiguous(lse.data(), DType::kF32, {1, 1, H});
    return p;
  };

  // float64 reference on the unquantized latent (the cache view only lends geometry).
  std::vector<float> kv(static_cast<std::size_t>(num_blocks * bs) * kQkDim, 0.0f), ref_o, ref_lse;
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(lat.data() + t * kLatentDim, kLatentDim, kv.data() + t * kQkDim);
    std::copy_n(rope.data() + t * kRopeDim, kRopeDim, kv.data() + t * kQkDim + kLatentDim);
  }
  {
    KvCache::Config geo;
    geo.num_blocks = num_blocks;
    MLAKV_ASSIGN_OR_RETURN(auto geo_cache, KvCache::create_cpu(geo));
    MLAKV_ASSIGN_OR_RETURN(CacheLayerView gv, geo_cache->layer(0));
    Progress pr("float64 reference on the unquantized latent", 1, progress);
    auto p = params(gv, ref_o, ref_lse, 1);
    MLAKV_RETURN_IF_ERROR(mla_attention_reference_unquantized(
        p, TensorView::contiguous(kv.data(), DType::kF32, {num_blocks * bs, kQkDim})));
  }

  const int splits = std::max(1, pool.num_threads());
  std::vector<FormatResult> results;
  for (KvFormat f : formats) {
    FormatResult r{};
    r.format = f;
    r.record_bytes = record_bytes(f);
    KvCache::Config cfg;
    cfg.num_blocks = num_blocks;
    cfg.layers = {{f, 1.0f}};
    MLAKV_ASSIGN_OR_RETURN(auto cache, KvCache::create_cpu(cfg));
    r.cache_mib = static_cast<double>(cache->bytes()) / (1 << 20);
    {
      Progress pr(fmt::format("writing {} tokens as {}", T, format_name(f)), T, progress);
      std::vector<int64_t> slots(4096);
      for (int64_t t0 = 0; t0 < T; t0 += 4096) {
        const int64_t n = std::min<int64_t>(4096, T - t0);
        std::iota(slots.begin(), slots.begin() + n, t0);
        MLAKV_RETURN_IF_ERROR(cache->write(0, TensorView::contiguous(slots.data(), DType::kI64, {n}),
                                           TensorView::contiguous(lat.data() + t0 * kLatentDim, DType::kF32, {n, kLatentDim}),
                                           TensorView::contiguous(rope.data() + t0 * kRopeDim, DType::kF32, {n, kRopeDim})));
        pr.update(t0 + n);
      }
    }
    MLAKV_ASSIGN_OR_RETURN(CacheLayerView view, cache->layer(0));
    std::vector<float> out, lse;
    auto p = params(view, out, lse, splits);
    std::vector<double> times;
    {
      Progress pr(fmt::format("attention over {} ({} runs)", format_name(f), a.reps + 1), a.reps + 1, progress);
      for (int rep = 0; rep <= a.reps; ++rep) {  // the first run warms up
        const auto t0 = std::chrono::steady_clock::now();
        MLAKV_RETURN_IF_ERROR(mla_attention_cpu(p, {&pool}));
        if (rep > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        pr.update(rep + 1);
      }
    }
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2];
    r.step_ms = t * 1e3;
    r.tokens_per_s = static_cast<double>(T) / t;
    r.cache_gbps = static_cast<double>(T) * r.record_bytes / t * 1e-9;
    ErrorStats out_err, lse_err;  // the eval room's accumulators (include/mlakv/eval_stats.h)
    MLAKV_RETURN_IF_ERROR(out_err.notify(ref_o, out));
    for (std::size_t h = 0; h < lse.size(); ++h) lse_err.notify(ref_lse[h], lse[h]);
    r.rel_l2 = out_err.rel_l2();
    r.cosine = out_err.cosine();
    r.lse_max_err = lse_err.max_abs();
    // Needle rank for head 0: tokens whose decoded score beats the needle's.
    std::vector<double> score(static_cast<std::size_t>(T));
    std::vector<float> dec_lat(static_cast<std::size_t>(T) * kLatentDim), dec_rope(static_cast<std::size_t>(T) * kRopeDim);
    MLAKV_RETURN_IF_ERROR(decode_records(
        CodecParams{.format = f, .outer_scale = view.outer_scale},
        TensorView::contiguous(view.record(0), DType::kU8, {T, r.record_bytes}),
        TensorView::contiguous(dec_lat.data(), DType::kF32, {T, kLatentDim}),
        TensorView::contiguous(dec_rope.data(), DType::kF32, {T, kRopeDim})));
    for (int64_t tk = 0; tk < T; ++tk) {
      const float* kl = dec_lat.data() + tk * kLatentDim;
      const float* kr = dec_rope.data() + tk * kRopeDim;
      double s = 0;
      for (int d = 0; d < kLatentDim; ++d) s += static_cast<double>(q[static_cast<std::size_t>(d)]) * kl[d];
      for (int d = 0; d < kRopeDim; ++d) s += static_cast<double>(q[static_cast<std::size_t>(kLatentDim + d)]) * kr[d];
      score[static_cast<std::size_t>(tk)] = s * scale;
    }
    r.needle_rank = std::count_if(score.begin(), score.end(), [&](double s) { return s > score[static_cast<std::size_t>(needle)]; });
    r.needle_weight = needle_weight(score);
    results.push_back(r);
  }

  const int threads = pool.num_threads();
  if (a.json) {
    nlohmann::json j;
    j["model"] = "deepseek-v3 layer geometry (absorbed q 576, latent 512 + rope 64)";
    j["context"] = T;
    j["heads"] = H;
    j["softmax_scale"] = scale;
    j["needle_position"] = needle;
    j["needle_weight_reference"] = ref_needle_weight;
    j["threads"] = threads;
    j["simd"] = cpu_attention_isa();
    for (const FormatResult& r : results) {
      j["formats"].push_back({{"format", std::string(format_name(r.format))},
                              {"bytes_per_token", r.record_bytes},
                              {"cache_mib", r.cache_mib},
                              {"out_rel_l2", r.rel_l2},
                              {"out_cosine", r.cosine},
                              {"lse_max_abs_err", r.lse_max_err},
                              {"needle_rank", r.needle_rank},
                              {"needle_weight", r.needle_weight},
                              {"needle_weight_err", r.needle_weight - ref_needle_weight},
                              {"step_ms", r.step_ms},
                              {"tokens_per_s", r.tokens_per_s},
                              {"cache_gb_per_s", r.cache_gbps}});
    }
    print_json(j);
    return Status::Ok();
  }
  fmt::print("mlakv demo: one MLA layer at DeepSeek-V3 geometry, {} heads, {} tokens of synthetic RMS-normed latent,\n"
             "needle at position {} (reference weight {:.4f}); errors against the float64 reference on the\n"
             "unquantized latent.\n"
             "CPU decode: {} thread(s), {}, median of {} runs.\n\n",
             H, T, needle, ref_needle_weight, threads, cpu_attention_isa(), a.reps);
  fmt::print("{:<22}{:>7}{:>10}{:>12}{:>11}{:>11}{:>8}{:>9}{:>11}{:>10}{:>12}{:>9}\n", "format", "B/tok", "cache MiB",
             "out rel L2", "cosine", "lse err", "needle", "weight", "weight err", "step ms", "tokens/s", "GB/s");
  for (const FormatResult& r : results) {
    fmt::print("{:<22}{:>7}{:>10.2f}{:>12.2e}{:>11.7f}{:>11.2e}{:>8}{:>9.4f}{:>+11.2e}{:>10.2f}{:>12.3e}{:>9.2f}\n",
               format_name(r.format), r.record_bytes, r.cache_mib, r.rel_l2, r.cosine, r.lse_max_err,
               r.needle_rank == 0 ? std::string("1st") : fmt::format("#{}", r.needle_rank + 1), r.needle_weight,
               r.needle_weight - ref_needle_weight, r.step_ms, r.tokens_per_s, r.cache_gbps);
  }
  const auto found = std::count_if(results.begin(), results.end(), [](const FormatResult& r) { return r.needle_rank == 0; });
  std::string where;
  if (results.size() == 1) {
    where = fmt::format("{}", format_name(results[0].format));
  } else {
    where = found == static_cast<std::ptrdiff_t>(results.size()) ? "every format"
                                                                 : fmt::format("{} of {} formats", found, results.size());
  }
  fmt::print("\nneedle {} (ranked first) in {}; weight err = weight - the reference's {:.4f}.\n",
             results.size() == 1 && found == 0 ? "NOT retrieved" : "retrieved", where, ref_needle_weight);
  return Status::Ok();
}

}  // namespace

void add_demo_command(Cli& cli) {
  auto a = std::make_shared<DemoArgs>();
  auto* cmd = cli.app.add_subcommand("demo", "Attend over a 16K-token synthetic MLA context in every KV format");
  cmd->add_option("--context", a->context, "Tokens in the context")->capture_default_str();
  cmd->add_option("--heads", a->heads, "Query heads (16 = DeepSeek-V3's 128 heads at TP8)")->capture_default_str();
  cmd->add_option("--format", a->format, "One format, or all")->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU threads (0 = all)")->capture_default_str();
  cmd->add_option("--reps", a->reps, "Timed decode steps per format (median reported)")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([&cli, a] { cli.action = [a] { return run_demo(*a); }; });
}

}  // namespace mlakv::cli
