// mlakv eval: teacher-forced KLD / perplexity over text windows, calibration from text,
// needle retrieval (docs/needle.md) and greedy generation, on the CPU model runner.
#include "mlakv/eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace mlakv {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void report_progress(const ProgressFn& fn, std::string_view what, int64_t done, int64_t total) {
  if (fn) fn(what, done, total);
}

// A paged cache for one spec, sized for `tokens` tokens of one sequence.
StatusOr<std::unique_ptr<PagedKvCache>> cache_for(const Model& model, const EvalCacheSpec& spec, int64_t tokens,
                                                  int block_size) {
  if (spec.transform != nullptr) {
    // The transform's layers carry their own s_l and nvfp4 group-scale choice; the
    // per-token scale mode would replace both (and the row would be labelled with neither).
    if (spec.token_scale)
      return invalid_argument(fmt::format(
          "eval cache spec ({}, recipe {}): the per-token scale mode and a latent transform (outer scales s_l, "
          "nvfp4_scales '{}') are exclusive; use one",
          format_name(spec.format), spec.recipe, nvfp4_scale_mode_name(spec.transform->transform().nvfp4_scales)));
    MLAKV_ASSIGN_OR_RETURN(std::vector<LayerFormat> layers,
                           model.transform_layer_formats(spec.format, spec.transform->transform()));
    return model.create_cache(layers, tokens, block_size);
  }
  const OuterScales* scales = spec.scales.num_layers() > 0 ? &spec.scales : nullptr;
  MLAKV_ASSIGN_OR_RETURN(CacheLayerFormats f, cache_layer_formats(spec.format, model.num_layers(), scales));
  if (spec.token_scale) {
    for (LayerFormat& lf : f.layers) {
      lf.token_scale = true;
      MLAKV_RETURN_IF_ERROR(check_token_scale(lf.format, true, lf.outer_scale, "eval cache spec"));
    }
  }
  return model.create_cache(f.layers, tokens, block_size);
}

int32_t argmax(std::span<const float> row) {
  // Ties go to the lowest id (docs/needle.md step 8).
  int32_t best = 0;
  for (std::size_t v = 1; v < row.size(); ++v) {
    if (row[v] > row[static_cast<std::size_t>(best)]) best = static_cast<int32_t>(v);
  }
  return best;
}

// The reference: the paged cache in the unquantized f32 record format (float32 exactly as
// computed), attended by the same kernels as every other format, so a row's KLD measures
// only what its records lose (and an f32 row is exactly 0).
const EvalCacheSpec kReferenceSpec{KvFormat::kF32, {}, "none", nullptr, "none"};

// One sequence's forward through a paged cache.
struct Runner {
  Model& model;
  PagedKvCache& cache;
  const FoldedLatentTransform* transform = nullptr;
  SeqId seq = -1;

  void start() { seq = cache.add_sequence(); }
  Status forward(std::span<const int32_t> toks, std::vector<float>& logits, bool last_only,
                 const LatentObserver& observer = {}, const QueryObserver& query_observer = {}) {
    const int64_t rows = last_only ? 1 : static_cast<int64_t>(toks.size());
    logits.resize(static_cast<std::size_t>(rows * model.vocab_size()));
    const TensorView out = TensorView::contiguous(logits.data(), DType::kF32, {rows, model.vocab_size()});
    ForwardOptions fo;
    fo.last_token_only = last_only;
    fo.observer = observer;
    fo.query_observer = query_observer;
    fo.transform = transform;
    return model.forward(cache, seq, toks, out, fo);
  }
  void finish() {
    if (seq < 0) return;
    (void)cache.free(seq);
    seq = -1;
  }
};

}  // namespace

StatusOr<std::vector<std::span<const int32_t>>> eval_windows(std::span<const int32_t> tokens, int64_t context,
                                                             int64_t windows, int64_t skip) {
  if (context < 2) return invalid_argument(fmt::format("context must be >= 2 tokens, got {}", context));
  if (windows < 1) return invalid_argument(fmt::format("windows must be >= 1, got {}", windows));
  if (skip < 0) return invalid_argument(fmt::format("skip must be >= 0, got {}", skip));
  const int64_t have = static_cast<int64_t>(tokens.size());
  if (context > (std::numeric_limits<int64_t>::max() - skip) / windows) {
    return invalid_argument(fmt::format("{} windows of {} tokens overflow", windows, context));
  }
  const int64_t need = skip + context * windows;
  if (have < need) {
    return invalid_argument(fmt::format(
        "the input has {} tokens; {} windows of {} tokens{} need {} (give more text, or fewer/shorter windows)", have,
        windows, context, skip > 0 ? fmt::format(" after the first {}", skip) : std::string(), need));
  }
  std::vector<std::span<const int32_t>> out;
  for (int64_t w = 0; w < windows; ++w) out.push_back(tokens.subspan(static_cast<std::size_t>(skip + w * context),
                                                                     static_cast<std::size_t>(context)));
  return out;
}

StatusOr<EvalReport> evaluate(Model& model, std::span<const int32_t> tokens, std::span<const EvalCacheSpec> specs,
                              const EvalOptions& opt) {
  MLAKV_ASSIGN_OR_RETURN(auto windows, eval_windows(tokens, opt.context, opt.windows));
  MLAKV_ASSIGN_OR_RETURN(std::unique_ptr<PagedKvCache> ref, cache_for(model, kReferenceSpec, opt.context, opt.block_size));
  std::vector<std::unique_ptr<PagedKvCache>> caches;
  EvalReport rep;
  for (const EvalCacheSpec& s : specs) {
    MLAKV_ASSIGN_OR_RETURN(auto c, cache_for(model, s, opt.context, opt.block_size));
    caches.push_back(std::move(c));
    rep.rows.push_back(EvalRow{.spec = s});
  }
  const int64_t V = model.vocab_size();
  std::vector<float> ref_logits, q_logits;
  const int64_t total = static_cast<int64_t>(windows.size()) * static_cast<int64_t>(1 + specs.size());
  int64_t done = 0;
  for (std::size_t w = 0; w < windows.size(); ++w) {
    const auto win = windows[w];
    const int64_t T = static_cast<int64_t>(win.size());
    auto target = [&](int64_t t) -> int64_t { return t + 1 < T ? win[static_cast<std::size_t>(t + 1)] : -1; };
    {
      Runner r{model, *ref};
      r.start();
      const auto t0 = std::chrono::steady_clock::now();
      const Status st = r.forward(win, ref_logits, false);
      rep.reference_seconds += seconds_since(t0);
      r.finish();
      MLAKV_RETURN_IF_ERROR(st.with_context(fmt::format("window {} (reference)", w)));
      rep.reference_tokens += T;
      for (int64_t t = 0; t < T; ++t) {
        std::span<const float> row(ref_logits.data() + t * V, static_cast<std::size_t>(V));
        MLAKV_RETURN_IF_ERROR(rep.reference.notify_logits(row, row, t, target(t)));
      }
      report_progress(opt.progress, "reference", ++done, total);
    }
    for (std::size_t i = 0; i < specs.size(); ++i) {
      Runner r{model, *caches[i], specs[i].transform.get()};
      r.start();
      const auto t0 = std::chrono::steady_clock::now();
      const Status st = r.forward(win, q_logits, false);
      rep.rows[i].seconds += seconds_since(t0);
      r.finish();
      MLAKV_RETURN_IF_ERROR(st.with_context(fmt::format("window {} ({})", w, format_name(specs[i].format))));
      rep.rows[i].tokens += T;
      for (int64_t t = 0; t < T; ++t) {
        MLAKV_RETURN_IF_ERROR(rep.rows[i].kld.notify_logits(
            std::span<const float>(ref_logits.data() + t * V, static_cast<std::size_t>(V)),
            std::span<const float>(q_logits.data() + t * V, static_cast<std::size_t>(V)), t, target(t)));
      }
      report_progress(opt.progress, format_name(specs[i].format), ++done, total);
    }
  }
  return rep;
}

StatusOr<OuterScales> calibrate_outer_scales(Model& model, std::span<const int32_t> tokens, int64_t context,
                                             int64_t windows, int64_t skip, const ProgressFn& progress) {
  MLAKV_ASSIGN_OR_RETURN(auto wins, eval_windows(tokens, context, windows, skip));
  MLAKV_ASSIGN_OR_RETURN(std::unique_ptr<PagedKvCache> ref, cache_for(model, kReferenceSpec, context, kDefaultBlockSize));
  OuterScaleCalibrator cal;
  Status observed = Status::Ok();
  std::vector<float> logits;
  for (std::size_t w = 0; w < wins.size(); ++w) {
    Runner r{model, *ref};
    r.start();
    const Status st = r.forward(wins[w], logits, true, [&](int layer, const TensorView& kv) {
      if (observed.ok()) observed = cal.add(layer, kv, fmt::format("window {} layer {} kv_c_normed", w, layer));
    });
    r.finish();
    MLAKV_RETURN_IF_ERROR(st.with_context(fmt::format("calibration window {}", w)));
    MLAKV_RETURN_IF_ERROR(observed);
    report_progress(progress, "calibration", static_cast<int64_t>(w) + 1, static_cast<int64_t>(wins.size()));
  }
  return cal.finish(model.num_layers());
}

StatusOr<LatentTransformCalibration> calibrate_latent_transform(Model& model, std::span<const int32_t> tokens,
                                                               int64_t context, int64_t windows, int64_t skip,
                                                               const LatentTransformRecipe& recipe,
                                                               const ProgressFn& progress) {
  MLAKV_ASSIGN_OR_RETURN(auto wins, eval_windows(tokens, context, windows, skip));
  MLAKV_ASSIGN_OR_RETURN(std::unique_ptr<PagedKvCache> ref, cache_for(model, kReferenceSpec, context, kDefaultBlockSize));
  const int n = model.num_layers();
  LatentTransformCalibrator cal(n);
  const bool need_q = recipe.importance == LatentImportance::kQuery ||
                      recipe.importance == LatentImportance::kQueryOutput;
  if (recipe.seed_candidates < 1 || recipe.seed_candidates > 64)
    return invalid_argument(fmt::format("seed_candidates must be in [1, 64], got {}", recipe.seed_candidates));
  if (recipe.seed > (uint64_t{1} << 53) - 1 - static_cast<uint64_t>(recipe.seed_candidates) * kLatentSeedStride)
    return invalid_argument(fmt::format("seed {}: its {} candidates (seed + k * 2^20) must stay below 2^53",
                                        recipe.seed, recipe.seed_candidates));
  if (static_cast<int>(recipe.select_format) >= kNumKvFormats || recipe.select_format == KvFormat::kF32)
    return invalid_argument("select_format: seeds are selected in a lossy record format (f32 is the reference)");
  const bool selecting = (recipe.rotate || recipe.rope_rotate) && recipe.seed_candidates > 1;
  const int64_t total = static_cast<int64_t>(wins.size()) * (selecting ? 2 + 1 + recipe.seed_candidates : 2);
  std::vector<float> logits;
  // Pass 1: latent means and second moments, the absorbed queries' second moments.
  for (std::size_t w = 0; w < wins.size(); ++w) {
    Status observed = Status::Ok();
    Runner r{model, *ref};
    r.start();
    const Status st = r.forward(
        wins[w], logits, true,
        [&](int layer, const TensorView& kv) {
          if (observed.ok()) observed = cal.add_latent(layer, kv, fmt::format("window {} kv_c_normed", w));
        },
        need_q ? QueryObserver([&](int layer, const TensorView& q) {
          if (observed.ok()) observed = cal.add_query(layer, q, fmt::format("window {} q", w));
        })
               : QueryObserver());
    r.finish();
    MLAKV_RETURN_IF_ERROR(st.with_context(fmt::format("calibration window {}", w)));
    MLAKV_RETURN_IF_ERROR(observed);
    report_progress(progress, "calibration (moments)", static_cast<int64_t>(w) + 1, total);
  }
  std::vector<std::vector<double>> energy;
  if (recipe.importance == LatentImportance::kOutput || recipe.importance == LatentImportance::kQueryOutput) {
    for (int l = 0; l < n; ++l) {
      MLAKV_ASSIGN_OR_RETURN(std::vector<double> e, model.latent_output_energy(l));
      energy.push_back(std::move(e));
    }
  }
  // The candidates: one transform per base seed (mu and d do not depend on it).
  const bool rotates = recipe.rotate || recipe.rope_rotate;
  const int K = rotates ? recipe.seed_candidates : 1;
  std::vector<LatentTransform> cands;
  for (int k = 0; k < K; ++k) {
    LatentTransformRecipe r = recipe;
    r.seed = recipe.seed + static_cast<uint64_t>(k) * kLatentSeedStride;
    MLAKV_ASSIGN_OR_RETURN(LatentTransform t, cal.finish(r, energy));
    cands.push_back(std::move(t));
  }
  // Pass 2: max |c'| per layer under each candidate, s_l = max / 2688 (the fork's rule on c').
  std::vector<std::vector<LatentTransformKernel>> kernels;
  for (const LatentTransform& t : cands) {
    MLAKV_ASSIGN_OR_RETURN(std::vector<LatentTransformKernel> k, make_latent_transform_kernels(t));
    kernels.push_back(std::move(k));
  }
  std::vector<std::vector<double>> max_abs(static_cast<std::size_t>(K), std::vector<double>(static_cast<std::size_t>(n)));
  for (std::size_t w = 0; w < wins.size(); ++w) {
    Runner r{model, *ref};
    r.start();
    const Status st = r.forward(wins[w], logits, true, [&](int layer, const TensorView& kv) {
      float buf[kLatentDim];
      for (int k = 0; k < K; ++k) {
        const LatentTransformKernel& kern = kernels[static_cast<std::size_t>(k)][static_cast<std::size_t>(layer)];
        double m = max_abs[static_cast<std::size_t>(k)][static_cast<std::size_t>(layer)];
        for (int64_t t = 0; t < kv.size(0); ++t) {
          kern.latent(kv.ptr<const float>() + t * kLatentDim, buf);
          for (float v : buf) m = std::max(m, static_cast<double>(std::abs(v)));
        }
        max_abs[static_cast<std::size_t>(k)][static_cast<std::size_t>(layer)] = m;
      }
    });
    r.finish();
    MLAKV_RETURN_IF_ERROR(st.with_context(fmt::format("calibration window {}", w)));
    report_progress(progress, "calibration (max |c'|)", static_cast<int64_t>(wins.size() + w) + 1, total);
  }
  for (int k = 0; k < K; ++k)
    MLAKV_RETURN_IF_ERROR(set_transform_outer_scales(cands[static_cast<std::size_t>(k)],
                                                     max_abs[static_cast<std::size_t>(k)]));
  int best = 0;
  if (K > 1) {
    // Selection on the same calibration windows: each candidate folded into the model and its
    // cache in select_format run against the unquantized reference (one reference pass per
    // window for all of them); the lowest mean KLD wins, ties to the first.
    std::vector<EvalCacheSpec> specs;
    for (const LatentTransform& t : cands) {
      auto folded = model.fold_latent_transform(t);
      if (!folded.ok()) return folded.status().with_context("seed selection");
      specs.push_back({recipe.select_format, {}, "seed", std::move(folded).value(), "mlakv"});
    }
    EvalOptions eo;
    eo.context = context;
    eo.windows = windows;
    eo.progress = [&](std::string_view, int64_t d, int64_t) {
      report_progress(progress, "calibration (seed selection)", 2 * static_cast<int64_t>(wins.size()) + d, total);
    };
    auto rep = evaluate(model, tokens.subspan(static_cast<std::size_t>(skip)), specs, eo);
    if (!rep.ok()) return rep.status().with_context("seed selection");
    LatentSeedSearch s;
    s.format = std::string(format_name(recipe.select_format));
    s.context = context;
    s.windows = windows;
    for (int k = 0; k < K; ++k) {
      const double kld = rep->rows[static_cast<std::size_t>(k)].kld.kld_mean();
      if (!std::isfinite(kld)) return internal_error(fmt::format("seed selection: candidate {} has KLD {}", k, kld));
      s.seeds.push_back(recipe.seed + static_cast<uint64_t>(k) * kLatentSeedStride);
      s.kld_mean.push_back(kld);
      if (kld < s.kld_mean[static_cast<std::size_t>(best)]) best = k;
    }
    s.chosen = s.seeds[static_cast<std::size_t>(best)];
    cands[static_cast<std::size_t>(best)].seed_search = std::move(s);
  }
  LatentTransformCalibration out;
  out.transform = std::move(cands[static_cast<std::size_t>(best)]);
  out.max_abs = std::move(max_abs[static_cast<std::size_t>(best)]);
  MLAKV_RETURN_IF_ERROR(validate_latent_transform(out.transform));
  return out;
}

// ---- needles (docs/needle.md) ----------------------------------------------------------

namespace {

constexpr uint64_t kNeedleSeed = 0x6D6C616B765F6E64ull;
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    s += kGolden;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return next() % n; }
};

}  // namespace

StatusOr<std::vector<NeedleTrial>> make_needle_trials(const Tokenizer& tok, std::span<const int32_t> E,
                                                      int64_t max_position, int n) {
  if (n < 1) return invalid_argument(fmt::format("needle trials must be >= 1, got {}", n));
  if (max_position < 64) {
    return invalid_argument(fmt::format("needles need a model of >= 64 positions, got {}", max_position));
  }
  static constexpr double kDepths[5] = {0.05, 0.25, 0.5, 0.75, 0.95};
  const int64_t T = static_cast<int64_t>(E.size());
  std::vector<NeedleTrial> out;
  for (int i = 0; i < n; ++i) {
    NeedleTrial tr;
    tr.index = i;
    tr.length = max_position * ((i % 4) + 1) / 4;
    tr.depth = kDepths[(i / 4) % 5];
    SplitMix64 rng{kNeedleSeed ^ (static_cast<uint64_t>(i) * kGolden)};
    std::string keys[3], values[3];
    for (int k = 0; k < 3; ++k) {
      for (;;) {
        std::string key;
        for (int c = 0; c < 6; ++c) key.push_back(static_cast<char>('a' + rng.below(26)));
        bool dup = false;
        for (int j = 0; j < k; ++j) dup |= keys[j] == key;
        if (!dup) {
          keys[k] = key;
          break;
        }
      }
      for (int c = 0; c < 6; ++c) values[k].push_back(static_cast<char>('0' + rng.below(10)));
    }
    std::vector<int32_t> defs[3];
    int64_t def_tokens = 0;
    for (int k = 0; k < 3; ++k) {
      MLAKV_ASSIGN_OR_RETURN(defs[k], tok.encode("\n# key " + keys[k] + " = " + values[k] + "\n", false));
      def_tokens += static_cast<int64_t>(defs[k].size());
    }
    MLAKV_ASSIGN_OR_RETURN(std::vector<int32_t> recall, tok.encode("\n# key " + keys[0] + " =", false));
    const int64_t H = tr.length - def_tokens - static_cast<int64_t>(recall.size()) - kNeedleMaxNewTokens;
    if (H <= 0 || T < H) {
      return invalid_argument(fmt::format(
          "needle trial {}: a {}-token context needs {} haystack tokens of eval text; {} are available", i,
          tr.length, std::max<int64_t>(H, 1), T));
    }
    const int64_t offset = static_cast<int64_t>(rng.below(static_cast<uint64_t>(T - H + 1)));
    double d[3] = {tr.depth, 0, 0};
    d[1] = static_cast<double>(rng.below(1000)) / 1000.0;
    d[2] = static_cast<double>(rng.below(1000)) / 1000.0;
    int64_t p[3];
    for (int k = 0; k < 3; ++k) p[k] = static_cast<int64_t>(std::floor(d[k] * static_cast<double>(H)));
    int order[3] = {0, 1, 2};
    std::stable_sort(order, order + 3, [&](int a, int b) { return p[a] < p[b]; });
    std::vector<int32_t>& pr = tr.prompt;
    pr.reserve(static_cast<std::size_t>(tr.length));
    int64_t h = 0;
    for (int k : order) {
      for (; h < p[k]; ++h) pr.push_back(E[static_cast<std::size_t>(offset + h)]);
      pr.insert(pr.end(), defs[k].begin(), defs[k].end());
    }
    for (; h < H; ++h) pr.push_back(E[static_cast<std::size_t>(offset + h)]);
    pr.insert(pr.end(), recall.begin(), recall.end());
    tr.key = keys[0];
    tr.value = values[0];
    out.push_back(std::move(tr));
  }
  return out;
}

static StatusOr<GenerateResult> generate_impl(Model& model, std::span<const int32_t> prompt, int max_new_tokens,
                                              const EvalCacheSpec* spec, std::optional<int32_t> stop_id,
                                              int block_size, const std::function<bool(int32_t)>* stop_after) {
  if (prompt.empty()) return invalid_argument("generate: the prompt has no tokens");
  if (max_new_tokens < 0) return invalid_argument(fmt::format("max_new_tokens must be >= 0, got {}", max_new_tokens));
  const int64_t need = static_cast<int64_t>(prompt.size()) + max_new_tokens;
  MLAKV_ASSIGN_OR_RETURN(std::unique_ptr<PagedKvCache> paged,
                         cache_for(model, spec ? *spec : kReferenceSpec, need, block_size));
  Runner r{model, *paged, spec != nullptr ? spec->transform.get() : nullptr};
  r.start();
  GenerateResult res;
  std::vector<float> logits;
  auto t0 = std::chrono::steady_clock::now();
  Status st = r.forward(prompt, logits, true);
  res.prefill_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (int g = 0; st.ok() && g < max_new_tokens; ++g) {
    const int32_t t = argmax(logits);
    res.tokens.push_back(t);
    if ((stop_id && t == *stop_id) || (stop_after && (*stop_after)(t))) break;
    if (g + 1 < max_new_tokens) st = r.forward(std::span<const int32_t>(&res.tokens.back(), 1), logits, true);
  }
  res.decode_seconds = seconds_since(t0);
  r.finish();
  MLAKV_RETURN_IF_ERROR(st);
  return res;
}

StatusOr<GenerateResult> generate_greedy(Model& model, std::span<const int32_t> prompt, int max_new_tokens,
                                         const EvalCacheSpec* spec, std::optional<int32_t> stop_id, int block_size) {
  return generate_impl(model, prompt, max_new_tokens, spec, stop_id, block_size, nullptr);
}

StatusOr<NeedleAnswer> run_needle_trial(Model& model, const Tokenizer& tok, const NeedleTrial& trial,
                                        const EvalCacheSpec* spec, int block_size) {
  // Stop after the first generated token whose text contains a newline.
  Status decode_error = Status::Ok();
  const std::function<bool(int32_t)> newline = [&](int32_t id) {
    auto s = tok.decode(std::span<const int32_t>(&id, 1));
    if (!s.ok()) {
      decode_error = s.status();
      return true;
    }
    return s->find('\n') != std::string::npos;
  };
  MLAKV_ASSIGN_OR_RETURN(GenerateResult g,
                         generate_impl(model, trial.prompt, kNeedleMaxNewTokens, spec, {}, block_size, &newline));
  MLAKV_RETURN_IF_ERROR(decode_error);
  MLAKV_ASSIGN_OR_RETURN(std::string text, tok.decode(g.tokens));
  NeedleAnswer a;
  a.text = text;
  std::size_t i = 0;
  while (i < text.size() && text[i] == ' ') ++i;
  const std::string_view rest = std::string_view(text).substr(i);
  a.found = rest.substr(0, trial.value.size()) == trial.value &&
            (rest.size() == trial.value.size() || !(rest[trial.value.size()] >= '0' && rest[trial.value.size()] <= '9'));
  return a;
}

}  // namespace mlakv
