// `mlakv eval` as one library call: validation, scales (none / "auto" / a file),
// teacher-forced evaluation and needle trials, and the report's JSON. The CLI
// (src/cli/cmd_eval.cc) and the Python package (python/src/module.cc) both call these,
// so the two frontends run the same thing and print the same keys.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "mlakv/eval.h"
#include "mlakv/latent_calib.h"

namespace mlakv {

StatusOr<EvalFormat> parse_eval_format(std::string_view f, std::string_view what) {
  const bool ts = f.size() > kTokenScaleSuffix.size() && f.ends_with(kTokenScaleSuffix);
  const std::string name(ts ? f.substr(0, f.size() - kTokenScaleSuffix.size()) : f);
  const auto k = parse_format(name);
  if (!k) return invalid_argument(fmt::format("{}: unknown format '{}'", what, name));
  if (ts && !is_nvfp4_format(*k)) {
    return invalid_argument(fmt::format("{} {}: {} is a mode of the nvfp4 formats only", what, f, kTokenScaleSuffix));
  }
  return EvalFormat{*k, ts};
}

StatusOr<EvalReport> eval_model(Model& model, const Tokenizer* tokenizer, std::span<const int32_t> tokens,
                                const EvalRequest& req) {
  std::vector<EvalFormat> formats;
  for (const EvalFormat& f : req.formats) {
    if (std::find(formats.begin(), formats.end(), f) == formats.end()) formats.push_back(f);
  }
  if (formats.empty()) return invalid_argument("formats: no format given");
  if (req.needle < 0) return invalid_argument(fmt::format("needle: must be >= 0 trials, got {}", req.needle));
  if (req.needle > 0 && tokenizer == nullptr) {
    return invalid_argument("needle: needle trials need the model's tokenizer (tokenizer.json)");
  }
  const int64_t max_pos = model.config().max_position_embeddings;
  if (max_pos > 0 && req.context > max_pos) {
    return invalid_argument(
        fmt::format("context {} exceeds the model's max_position_embeddings ({})", req.context, max_pos));
  }
  if (req.needle > 0 && max_pos <= 0) {
    return invalid_argument("needle: needle trials need max_position_embeddings in the model's config.json");
  }
  // Too little input is an error before any work.
  MLAKV_RETURN_IF_ERROR(eval_windows(tokens, req.context, req.windows).status());

  // Recipes: fork (outer scales), mlakv (the latent transform), or both.
  const bool want_fork = req.recipe.empty() || req.recipe == "fork" || req.recipe == "both";
  const bool want_mlakv = req.recipe == "mlakv" || req.recipe == "both";
  if (!req.recipe.empty() && !want_fork && !want_mlakv) {
    return invalid_argument(fmt::format("recipe must be fork, mlakv or both, got '{}'", req.recipe));
  }
  if (want_mlakv && (req.seed_candidates < 1 || req.seed_candidates > 64)) {
    return invalid_argument(fmt::format("seed_candidates: must be in [1, 64], got {}", req.seed_candidates));
  }
  if (req.scales.empty() && !req.recipe.empty()) {
    return invalid_argument("recipe needs scales (auto, or a calibration file)");
  }
  for (const std::string& src : req.scales) {
    if (src == "auto" && req.calib_windows < 1) {
      return invalid_argument(fmt::format("calib_windows: must be >= 1 with scales 'auto', got {}", req.calib_windows));
    }
  }
  auto progress = [&](std::string_view stage, int64_t done, int64_t total) {
    if (req.progress) req.progress(stage, done, total);
  };

  // Calibrated sources: per scales entry, auto (the recipe's, calibrated on the input after
  // the eval windows) or a file of either kind (detected by its "format" key).
  struct Source {
    std::string label;
    std::optional<OuterScales> fork;
    std::shared_ptr<const FoldedLatentTransform> mlakv;
  };
  std::vector<Source> sources;
  for (const std::string& src : req.scales) {
    if (src == "auto") {
      const int64_t skip = req.context * req.windows;
      if (want_fork) {
        auto s = calibrate_outer_scales(
            model, tokens, req.context, req.calib_windows, skip,
            [&](std::string_view, int64_t d, int64_t t) { progress("calibration (fork recipe)", d, t); });
        if (!s.ok()) return s.status().with_context("scales auto (calibration windows follow the eval windows)");
        sources.push_back({"auto", std::move(s).value(), nullptr});
      }
      if (want_mlakv) {
        LatentTransformRecipe r;
        r.importance = req.importance;
        r.weights = req.importance_weights;
        r.seed_candidates = req.seed_candidates;
        r.nvfp4_scales = req.nvfp4_scales;
        auto c = calibrate_latent_transform(
            model, tokens, req.context, req.calib_windows, skip, r,
            [&](std::string_view, int64_t d, int64_t t) { progress("calibration (mlakv recipe)", d, t); });
        if (!c.ok()) return c.status().with_context("scales auto (calibration windows follow the eval windows)");
        MLAKV_ASSIGN_OR_RETURN(auto folded, model.fold_latent_transform(c->transform));
        sources.push_back({"auto", std::nullopt, std::move(folded)});
      }
      continue;
    }
    MLAKV_ASSIGN_OR_RETURN(ScaleFile f, load_scale_file(src));
    const std::string label = std::filesystem::path(src).filename().string();
    if (f.kind == ScaleFile::Kind::kOuterScales) {
      if (!req.recipe.empty() && !want_fork) {
        return invalid_argument(fmt::format("scales {}: a fork-recipe file ({}) with recipe {}", src,
                                            kOuterScaleFileFormat, req.recipe));
      }
      if (f.outer_scales.num_layers() < model.num_layers()) {
        return invalid_argument(fmt::format("scales {}: {} layers, the model has {}", src,
                                            f.outer_scales.num_layers(), model.num_layers()));
      }
      sources.push_back({label, std::move(f.outer_scales), nullptr});
    } else {
      if (!req.recipe.empty() && !want_mlakv) {
        return invalid_argument(fmt::format("scales {}: an mlakv-recipe file ({}) with recipe {}", src,
                                            kLatentTransformFileFormat, req.recipe));
      }
      auto folded = model.fold_latent_transform(f.transform);
      if (!folded.ok()) return folded.status().with_context(fmt::format("scales {}", src));
      sources.push_back({label, std::nullopt, std::move(folded).value()});
    }
  }
  std::vector<EvalCacheSpec> specs;
  for (const EvalFormat& fr : formats) {
    const KvFormat f = fr.format;
    if (fr.token_scale) {  // the mode replaces s_l: one row, no scales / recipe variant
      EvalCacheSpec t{f, {}, "token"};
      t.token_scale = true;
      specs.push_back(std::move(t));
      continue;
    }
    specs.push_back({f, {}, "none", nullptr, "none"});
    for (const Source& s : sources) {
      if (s.fork && format_info(f).has_outer_scale) specs.push_back({f, *s.fork, s.label, nullptr, "fork"});
      // The transform applies to every lossy format (its s_l only where the format has an outer scale).
      if (s.mlakv && f != KvFormat::kF32) specs.push_back({f, {}, s.label, s.mlakv, "mlakv"});
    }
  }

  EvalOptions opt;
  opt.context = req.context;
  opt.windows = req.windows;
  opt.block_size = req.block_size;
  opt.progress = [&](std::string_view, int64_t d, int64_t t) { progress("eval", d, t); };
  MLAKV_ASSIGN_OR_RETURN(EvalReport rep, evaluate(model, tokens, specs, opt));

  if (req.needle > 0) {
    MLAKV_ASSIGN_OR_RETURN(std::vector<NeedleTrial> trials, make_needle_trials(*tokenizer, tokens, max_pos, req.needle));
    const int64_t total = static_cast<int64_t>(trials.size() * (specs.size() + 1));
    int64_t done = 0;
    for (const NeedleTrial& t : trials) {
      MLAKV_ASSIGN_OR_RETURN(NeedleAnswer r, run_needle_trial(model, *tokenizer, t, nullptr, req.block_size));
      rep.reference_needle_found += r.found;
      ++rep.reference_needle_total;
      progress("needle", ++done, total);
      for (std::size_t i = 0; i < specs.size(); ++i) {
        MLAKV_ASSIGN_OR_RETURN(NeedleAnswer q, run_needle_trial(model, *tokenizer, t, &specs[i], req.block_size));
        rep.rows[i].needle_found += q.found;
        ++rep.rows[i].needle_total;
        progress("needle", ++done, total);
      }
    }
  }
  return rep;
}

Nvfp4ScaleMode row_nvfp4_scales(const EvalCacheSpec& spec) {
  if (spec.transform == nullptr || !is_nvfp4_format(spec.format) || spec.token_scale) return Nvfp4ScaleMode::kRn;
  return spec.transform->transform().nvfp4_scales;
}

std::string eval_report_json(const EvalReport& rep, std::string_view model, int64_t context, int64_t windows,
                             int indent) {
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); };
  const double ref_tps = rep.reference_seconds > 0 ? rep.reference_tokens / rep.reference_seconds : 0;
  nlohmann::json j;
  j["model"] = std::string(model);
  j["context"] = context;
  j["windows"] = windows;
  j["positions"] = rep.reference.count();
  j["reference"] = {{"ppl", num(rep.reference.ppl_ref())},
                    {"bits_per_token", num(rep.reference.bits_per_token_q())},
                    {"tokens_per_s", ref_tps},
                    {"needle_found", rep.reference_needle_found},
                    {"needle_total", rep.reference_needle_total}};
  nlohmann::json rows = nlohmann::json::array();
  for (const EvalRow& r : rep.rows) {
    nlohmann::json b = nlohmann::json::array();
    for (double v : r.kld.kld_by_bucket()) b.push_back(num(v));
    rows.push_back({{"format", format_name(r.spec.format)},
                    {"record_bytes", record_bytes(r.spec.format)},
                    {"recipe", r.spec.recipe},
                    {"scales", r.spec.scales_label},
                    {"token_scale", r.spec.token_scale},
                    {"nvfp4_scales", std::string(nvfp4_scale_mode_name(row_nvfp4_scales(r.spec)))},
                    {"kld_mean", num(r.kld.kld_mean())},
                    {"kld_p99", num(r.kld.kld_p99())},
                    {"kld_max", num(r.kld.kld_max())},
                    {"kld_by_position_bucket", b},
                    {"top1_agree", num(r.kld.top1_agree())},
                    {"ppl", num(r.kld.ppl_q())},
                    {"bits_per_token", num(r.kld.bits_per_token_q())},
                    {"tokens_per_s", r.seconds > 0 ? r.tokens / r.seconds : 0},
                    {"needle_found", r.needle_found},
                    {"needle_total", r.needle_total}});
  }
  j["formats"] = rows;
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace mlakv
