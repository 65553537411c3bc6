// `mlakv eval`: what each KV format costs a whole model on real text (teacher-forced KLD
// against a float32 cache, top-1, perplexity, needle retrieval), and `mlakv generate`.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <sstream>

#include "cli/cli.h"
#include "cli/model_input.h"
#include "cli/progress.h"
#include "mlakv/file_io.h"
#include "mlakv/eval.h"
#include "mlakv/latent_calib.h"
#include "mlakv/model.h"
#include "mlakv/outer_scales.h"
#include "mlakv/reparam.h"
#include "mlakv/tokenizer.h"

namespace mlakv::cli {
namespace {

namespace fs = std::filesystem;

struct EvalArgs {
  std::string model, text, tokens, formats = "bf16,fp8_ds_mla,nvfp4_ds_mla,nvfp4_ds_mla_fp8rope,nvfp4_ds_mla_int8rope",
              plot;
  std::vector<std::string> scales;
  std::string recipe;  // fork | mlakv | both; empty: fork (the files' own kinds with --scales FILE)
  std::string importance = std::string(latent_importance_name(LatentTransformRecipe{}.importance));
  int seed_candidates = LatentTransformRecipe{}.seed_candidates;
  std::string nvfp4_scales = std::string(nvfp4_scale_mode_name(LatentTransformRecipe{}.nvfp4_scales));
  int64_t context = 2048, windows = 32, calib_windows = 4;
  int needle = 0, threads = 0, block_size = kDefaultBlockSize;
  bool json = false;
};

std::string fmt_kld(double v) { return v == 0 ? "0" : fmt::format("{:.3e}", v); }

Status run_eval(const EvalArgs& a) {
  if (a.text.empty() == a.tokens.empty()) return invalid_argument("give exactly one of --text FILE and --tokens FILE");
  if (a.threads < 0) return invalid_argument(fmt::format("--threads must be >= 0 (0 = all cores), got {}", a.threads));
  // Each entry: a format name, or an nvfp4 format + kTokenScaleSuffix (the per-token scale mode).
  std::vector<EvalFormat> formats;
  {
    std::stringstream ss(a.formats);
    std::string f;
    while (std::getline(ss, f, ',')) {
      if (f.empty()) continue;
      auto row = parse_eval_format(f);
      if (!row.ok()) return invalid_argument("--" + row.status().message());  // "--formats: ..."
      formats.push_back(*row);
    }
    if (formats.empty()) return invalid_argument("--formats: no format given");
  }
  const bool progress = true;
  std::unique_ptr<Model> model;
  {
    Progress pr(fmt::format("loading {}", a.model), 1, progress);
    MLAKV_ASSIGN_OR_RETURN(model, Model::load(a.model, ModelLoadOptions{.threads = a.threads}));
  }
  std::optional<Tokenizer> tok;
  if (auto t = tokenizer_for(a.model, *model); t.ok()) tok = std::move(t).value();
  else if (!a.text.empty() || a.needle > 0) return t.status();
  MLAKV_ASSIGN_OR_RETURN(std::vector<int32_t> ids, input_tokens(a.text, a.tokens, tok ? &*tok : nullptr,
                                                                model->vocab_size()));
  if (!a.recipe.empty() && a.recipe != "fork" && a.recipe != "mlakv" && a.recipe != "both")
    return invalid_argument(fmt::format("--recipe must be fork, mlakv or both, got '{}'", a.recipe));
  if (a.scales.empty() && !a.recipe.empty())
    return invalid_argument("--recipe needs --scales (auto, or a calibration file)");
  LatentTransformRecipe importance;
  MLAKV_RETURN_IF_ERROR(set_latent_importance(importance, a.importance));
  // The whole run is one library call (eval_model: the same as mlakv.Model.eval); one
  // progress bar per stage, made when the stage reports first.
  EvalRequest req;
  req.formats = formats;
  req.scales = a.scales;
  req.recipe = a.recipe;
  req.importance = importance.importance;
  req.importance_weights = std::move(importance.weights);
  if (a.seed_candidates < 1 || a.seed_candidates > 64)
    return invalid_argument(fmt::format("--seed-candidates must be in [1, 64], got {}", a.seed_candidates));
  req.seed_candidates = a.seed_candidates;
  MLAKV_ASSIGN_OR_RETURN(req.nvfp4_scales, parse_nvfp4_scale_mode(a.nvfp4_scales, "--nvfp4-scales"));
  req.context = a.context;
  req.windows = a.windows;
  req.calib_windows = a.calib_windows;
  req.needle = a.needle;
  req.block_size = a.block_size;
  std::string stage;
  std::unique_ptr<Progress> pr;
  req.progress = [&](std::string_view what, int64_t done, int64_t total) {
    if (what != stage) {
      stage = std::string(what);
      std::string label;
      if (what == "eval") {
        label = fmt::format("teacher-forced eval: {} windows x {} tokens, reference + {} caches", a.windows, a.context,
                            total / std::max<int64_t>(a.windows, 1) - 1);
      } else if (what == "needle") {
        label = fmt::format("needles: {} trials x {} caches (greedy decode)", a.needle, total / std::max(a.needle, 1));
      } else {
        label = fmt::format("{} on text after the eval windows", what);
      }
      pr.reset();
      pr = std::make_unique<Progress>(label, total, progress);
    }
    pr->update(done);
  };
  auto report = eval_model(*model, tok ? &*tok : nullptr, ids, req);
  pr.reset();
  if (!report.ok()) return report.status();
  EvalReport rep = std::move(report).value();
  if (!a.plot.empty()) {
    const std::string svg = eval_plot_svg(
        rep, fmt::format("mlakv eval: {} ({} windows x {} tokens)", fs::path(a.model).filename().string(), a.windows,
                         a.context));
    MLAKV_RETURN_IF_ERROR(io::write_file(a.plot, svg));
  }
  const double ref_tps = rep.reference_seconds > 0 ? rep.reference_tokens / rep.reference_seconds : 0;
  if (a.json) {
    fmt::print("{}\n", eval_report_json(rep, a.model, a.context, a.windows));
    return Status::Ok();
  }
  fmt::print("mlakv eval: {} ({}, {} layers), {} windows x {} tokens ({} positions scored)\n", a.model,
             model->config().model_type, model->num_layers(), a.windows, a.context, rep.reference.count() - a.windows);
  for (const std::string& n : model->notes()) fmt::print("note: {}\n", n);
  fmt::print("reference (float32 cache): ppl {:.4f} ({:.4f} bits/token), {:.0f} tokens/s{}\n\n",
             rep.reference.ppl_ref(), std::log2(rep.reference.ppl_ref()), ref_tps,
             rep.reference_needle_total ? fmt::format(", needle {}/{}", rep.reference_needle_found,
                                                      rep.reference_needle_total)
                                        : "");
  std::size_t sw = 8;  // the scales column fits the longest file name
  for (const EvalRow& r : rep.rows) sw = std::max(sw, r.spec.scales_label.size());
  fmt::print("{:<22} {:>7} {:>6} {:>{}} {:>10} {:>10} {:>7} {:>8} {:>8} {:>9}\n", "format", "B/token", "recipe",
             "scales", sw, "KLD mean", "KLD p99", "top-1", "ppl", "needle", "tokens/s");
  for (const EvalRow& r : rep.rows) {
    fmt::print("{:<22} {:>7} {:>6} {:>{}} {:>10} {:>10} {:>6.2f}% {:>8.4f} {:>8} {:>9.0f}\n",
               format_name(r.spec.format), record_bytes(r.spec.format), r.spec.recipe, r.spec.scales_label, sw,
               fmt_kld(r.kld.kld_mean()),
               fmt_kld(r.kld.kld_p99()),
               100 * r.kld.top1_agree(), r.kld.ppl_q(),
               r.needle_total ? fmt::format("{}/{}", r.needle_found, r.needle_total) : "-",
               r.seconds > 0 ? r.tokens / r.seconds : 0);
  }
  if (model->dense_beyond_topk()) {
    fmt::print("note: context exceeded the DSA indexer's top-k; attention ran dense (the indexer is not run)\n");
  }
  return Status::Ok();
}

struct GenArgs {
  std::string model, prompt, format = "bf16";
  int max_tokens = 64, threads = 0;
  bool json = false;
};

Status run_generate(const GenArgs& a) {
  if (a.max_tokens < 1 || a.max_tokens > 1 << 20) {
    return invalid_argument(fmt::format("--max-tokens must be in [1, 1048576], got {}", a.max_tokens));
  }
  if (a.threads < 0) return invalid_argument(fmt::format("--threads must be >= 0 (0 = all cores), got {}", a.threads));
  EvalCacheSpec spec;
  // "reference" is the unquantized f32 record format, the reference `eval` measures against;
  // an nvfp4 format + "+token-scale" is that format in the per-token scale mode.
  EvalFormat row{KvFormat::kF32, false};
  if (a.format != "reference") {
    MLAKV_ASSIGN_OR_RETURN(row, parse_eval_format(a.format, "--format"));
  }
  spec.format = row.format;
  spec.token_scale = row.token_scale;
  if (row.token_scale) spec.scales_label = "token";
  MLAKV_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::load(a.model, ModelLoadOptions{.threads = a.threads}));
  MLAKV_ASSIGN_OR_RETURN(Tokenizer tok, tokenizer_for(a.model, *model));
  MLAKV_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, tok.encode(a.prompt, true));
  if (prompt.empty()) return invalid_argument("--prompt: the prompt encodes to no tokens");
  const int64_t max_pos = model->config().max_position_embeddings;
  if (max_pos > 0 && static_cast<int64_t>(prompt.size()) + a.max_tokens > max_pos) {
    return invalid_argument(fmt::format("prompt ({} tokens) + --max-tokens {} exceed max_position_embeddings ({})",
                                        prompt.size(), a.max_tokens, max_pos));
  }
  MLAKV_ASSIGN_OR_RETURN(GenerateResult g,
                         generate_greedy(*model, prompt, a.max_tokens, &spec, tok.eos_id()));
  MLAKV_ASSIGN_OR_RETURN(std::string text, tok.decode(g.tokens, true));
  const double prefill_tps = g.prefill_seconds > 0 ? prompt.size() / g.prefill_seconds : 0;
  const double decode_tps = g.decode_seconds > 0 ? g.tokens.size() / g.decode_seconds : 0;
  if (a.json) {
    const nlohmann::json j = {{"format", std::string(format_name(spec.format))},
                              {"token_scale", spec.token_scale},
                              {"prompt_tokens", prompt.size()},
                              {"generated_tokens", g.tokens.size()},
                              {"tokens", g.tokens},
                              {"text", text},
                              {"prefill_tokens_per_s", prefill_tps},
                              {"decode_tokens_per_s", decode_tps}};
    // Generated bytes may cut a UTF-8 character: replace what is not valid UTF-8.
    fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return Status::Ok();
  }
  fmt::print("{}{}\n", a.prompt, text);
  fmt::print(stderr, "[{} cache: prompt {} tokens at {:.0f} tokens/s, {} generated at {:.1f} tokens/s]\n",
             format_name(spec.format), prompt.size(), prefill_tps, g.tokens.size(), decode_tps);
  return Status::Ok();
}

struct ReparamArgs {
  std::string model, out, text, tokens;
  double lo = 0.02, hi = 5.0;
  int64_t context = 2048, windows = 2;
  int threads = 0;
  bool json = false;
};

Status run_reparam(const ReparamArgs& a) {
  if (a.text.empty() == a.tokens.empty()) return invalid_argument("give exactly one of --text FILE and --tokens FILE");
  if (!(a.lo > 0) || !(a.hi > a.lo) || !std::isfinite(a.hi)) {
    return invalid_argument(fmt::format("--min/--max: need 0 < min < max, got {} and {}", a.lo, a.hi));
  }
  if (a.threads < 0) return invalid_argument(fmt::format("--threads must be >= 0 (0 = all cores), got {}", a.threads));
  MLAKV_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::load(a.model, ModelLoadOptions{.threads = a.threads}));
  std::optional<Tokenizer> tok;
  if (auto t = tokenizer_for(a.model, *model); t.ok()) tok = std::move(t).value();
  MLAKV_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                         input_tokens(a.text, a.tokens, tok ? &*tok : nullptr, model->vocab_size()));
  MLAKV_ASSIGN_OR_RETURN(OuterScales natural, calibrate_outer_scales(*model, ids, a.context, a.windows));
  const int n = model->num_layers();
  std::vector<double> factors(static_cast<std::size_t>(n)), target(static_cast<std::size_t>(n));
  for (int l = 0; l < n; ++l) {
    // Log-spaced targets from --min to --max; a power-of-two factor keeps the rewrite exact.
    const double t = n == 1 ? a.hi : a.lo * std::pow(a.hi / a.lo, static_cast<double>(l) / (n - 1));
    const double m = natural.max_abs[static_cast<std::size_t>(l)];
    target[static_cast<std::size_t>(l)] = t;
    factors[static_cast<std::size_t>(l)] = std::exp2(std::round(std::log2(t / m)));
  }
  MLAKV_RETURN_IF_ERROR(reparametrize_latent_scale(a.model, a.out, factors));
  if (a.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (int l = 0; l < n; ++l) {
      const double m = natural.max_abs[static_cast<std::size_t>(l)];
      rows.push_back({{"layer", l}, {"max_abs", m}, {"factor", factors[static_cast<std::size_t>(l)]},
                      {"max_abs_after", m * factors[static_cast<std::size_t>(l)]}});
    }
    print_json({{"out", a.out}, {"layers", rows}});
    return Status::Ok();
  }
  fmt::print("{} -> {}: kv_a_layernorm.weight *= a_l, kv_b_proj.weight /= a_l (function-preserving)\n", a.model, a.out);
  fmt::print("{:>5} {:>14} {:>10} {:>14}\n", "layer", "max|latent|", "a_l", "max after");
  for (int l = 0; l < n; ++l) {
    const double m = natural.max_abs[static_cast<std::size_t>(l)];
    fmt::print("{:>5} {:>14.4g} {:>10.4g} {:>14.4g}\n", l, m, factors[static_cast<std::size_t>(l)],
               m * factors[static_cast<std::size_t>(l)]);
  }
  return Status::Ok();
}

}  // namespace

void add_eval_command(Cli& cli) {
  auto a = std::make_shared<EvalArgs>();
  auto* cmd = cli.app.add_subcommand(
      "eval", "What each KV format costs a model on real text: teacher-forced KLD vs a float32 cache, top-1, "
              "perplexity, needle retrieval (docs/eval.md)");
  cmd->add_option("--model", a->model, "Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json)")
      ->required();
  cmd->add_option("--text", a->text, "UTF-8 text, tokenized with the model's tokenizer (no special tokens)");
  cmd->add_option("--tokens", a->tokens, "pre-tokenized input: little-endian int32 ids");
  cmd->add_option("--context", a->context, "tokens per window")->capture_default_str();
  cmd->add_option("--windows", a->windows, "windows: the first N consecutive, non-overlapping slices of the input")
      ->capture_default_str();
  cmd->add_option("--formats", a->formats,
                  "comma-separated record formats; an nvfp4 format with the suffix +token-scale (e.g. "
                  "nvfp4_ds_mla_fp8rope+token-scale) is a row in the per-token scale mode (scales column 'token')")
      ->capture_default_str();
  cmd->add_option("--scales", a->scales,
                  "calibration (repeatable): a file (nvfp4_ds_mla_outer_scale_v1: the fork's outer scales; "
                  "mlakv_latent_transform_v2 or _v1: the mlakv recipe; told apart by its \"format\" key), or 'auto' to "
                  "calibrate the --recipe recipes on the input after the eval windows (uncalibrated rows are always "
                  "reported too)");
  cmd->add_option("--recipe", a->recipe,
                  "with --scales auto: fork (outer scales, the default), mlakv (the latent transform) or both");
  cmd->add_option("--importance", a->importance,
                  "mlakv recipe under --scales auto: the per-dim importance (none, uniform, query, output, "
                  "query+output, or file:PATH: an mlakv_latent_importance_v1 file made from other text)")
      ->capture_default_str();
  cmd->add_option("--seed-candidates", a->seed_candidates,
                  "mlakv recipe under --scales auto: sign seeds tried on the calibration windows, the lowest-KLD one "
                  "kept (1: the default seed alone; docs/calibration.md)")
      ->capture_default_str();
  cmd->add_option("--nvfp4-scales", a->nvfp4_scales,
                  "mlakv recipe under --scales auto: how the nvfp4 writers choose group scales (search: RN-1, RN or "
                  "RN+1 by squared error; rn: round to nearest); a mlakv_latent_transform_v2 file carries its own, a "
                  "v1 file and the fork's outer scales mean rn")
      ->capture_default_str();
  cmd->add_option("--calib-windows", a->calib_windows, "windows calibrated on with --scales auto")->capture_default_str();
  cmd->add_option("--needle", a->needle, "needle trials (docs/needle.md), greedy-decoded through every cache")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--block-size", a->block_size, "cache block size")->capture_default_str();
  cmd->add_option("--plot", a->plot, "write an SVG: KLD per format and by position");
  cmd->add_flag("--json", a->json, "one JSON object on stdout");
  cmd->callback([&cli, a] { cli.action = [a] { return run_eval(*a); }; });

  auto g = std::make_shared<GenArgs>();
  auto* gen = cli.app.add_subcommand("generate", "Greedy decoding through the paged cache in a record format");
  gen->add_option("--model", g->model, "Hugging Face checkpoint directory")->required();
  gen->add_option("--prompt", g->prompt, "prompt text")->required();
  gen->add_option("--format", g->format,
                  "cache record format (f32: the unquantized reference eval measures against; an nvfp4 format + "
                  "'+token-scale': the per-token scale mode)")
      ->capture_default_str();
  gen->add_option("--max-tokens", g->max_tokens, "tokens to generate at most (stops at EOS)")->capture_default_str();
  gen->add_option("--threads", g->threads, "CPU threads (0 = all cores)")->capture_default_str();
  gen->add_flag("--json", g->json, "one JSON object on stdout");
  gen->callback([&cli, g] { cli.action = [g] { return run_generate(*g); }; });

  auto r = std::make_shared<ReparamArgs>();
  auto* rp = cli.app.add_subcommand(
      "reparam", "Write a function-preserving copy of a checkpoint whose cached latents span --min..--max per layer "
                 "(kv_a_layernorm x a_l, kv_b_proj / a_l; power-of-two a_l, so the rewrite is exact)");
  rp->add_option("--model", r->model, "source checkpoint directory")->required();
  rp->add_option("--out", r->out, "new checkpoint directory (must not exist)")->required();
  rp->add_option("--text", r->text, "text to measure the natural latent magnitudes on");
  rp->add_option("--tokens", r->tokens, "pre-tokenized input (little-endian int32 ids)");
  rp->add_option("--min", r->lo, "target max |kv_c_normed| of the first layer")->capture_default_str();
  rp->add_option("--max", r->hi, "target max |kv_c_normed| of the last layer")->capture_default_str();
  rp->add_option("--context", r->context, "tokens per measuring window")->capture_default_str();
  rp->add_option("--windows", r->windows, "measuring windows")->capture_default_str();
  rp->add_option("--threads", r->threads, "CPU threads (0 = all cores)")->capture_default_str();
  rp->add_flag("--json", r->json, "one JSON object on stdout");
  rp->callback([&cli, r] { cli.action = [r] { return run_reparam(*r); }; });
}

}  // namespace mlakv::cli
