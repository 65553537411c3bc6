// mlakv calibrate: NVFP4 outer scales (nvfp4_ds_mla_outer_scale_v1) from captured
// kv_c_normed activations, or by running a model over calibration text (docs/calibration.md).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "cli/cli.h"
#include "cli/model_input.h"
#include "cli/progress.h"
#include "mlakv/eval.h"
#include "mlakv/file_io.h"
#include "mlakv/latent_calib.h"
#include "mlakv/model.h"
#include "mlakv/outer_scales.h"
#include "mlakv/safetensors.h"

namespace mlakv::cli {
namespace {

struct CalibrateArgs {
  std::vector<std::string> activations;
  std::string out, model, text, tokens, plot;
  std::string recipe = "fork", importance = std::string(latent_importance_name(LatentTransformRecipe{}.importance));
  bool no_center = false, no_rotate = false, no_rope_rotate = false;
  double sd_power = LatentTransformRecipe{}.sd_power;
  uint64_t seed = LatentTransformRecipe{}.seed;
  int seed_candidates = LatentTransformRecipe{}.seed_candidates;
  std::string select_format = std::string(format_name(LatentTransformRecipe{}.select_format));
  std::string nvfp4_scales;  // "" = the recipe's default (search); mlakv recipe only
  int64_t context = 2048, windows = 8;
  int num_layers = 0, threads = 0;
  bool json = false;
};

struct TextInput {
  std::unique_ptr<Model> model;
  std::vector<int32_t> ids;
};

StatusOr<TextInput> load_text_input(const CalibrateArgs& a) {
  if (!a.activations.empty()) return invalid_argument("give either --activations or --model, not both");
  if (a.text.empty() == a.tokens.empty()) return invalid_argument("--model needs exactly one of --text and --tokens");
  if (a.threads < 0) return invalid_argument(fmt::format("--threads must be >= 0 (0 = all cores), got {}", a.threads));
  MLAKV_RETURN_IF_ERROR(io::check_not_same_file(a.out, "--out", a.text.empty() ? a.tokens : a.text,
                                                a.text.empty() ? "--tokens" : "--text"));
  MLAKV_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::load(a.model, ModelLoadOptions{.threads = a.threads}));
  std::optional<Tokenizer> tok;
  if (auto t = tokenizer_for(a.model, *model); t.ok()) tok = std::move(t).value();
  else if (!a.text.empty()) return t.status();
  MLAKV_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                         input_tokens(a.text, a.tokens, tok ? &*tok : nullptr, model->vocab_size()));
  const int64_t max_pos = model->config().max_position_embeddings;
  if (max_pos > 0 && a.context > max_pos) {
    return invalid_argument(fmt::format("--context {} exceeds the model's max_position_embeddings ({})", a.context,
                                        max_pos));
  }
  if (a.num_layers != 0 && a.num_layers != model->num_layers()) {
    return invalid_argument(fmt::format("--num-layers {}: the model has {} decoder layers", a.num_layers,
                                        model->num_layers()));
  }
  MLAKV_RETURN_IF_ERROR(eval_windows(ids, a.context, a.windows).status());
  return TextInput{std::move(model), std::move(ids)};
}

// --model DIR (--text FILE | --tokens FILE): windows cut as `mlakv eval` cuts them, the
// float32-cache model run over them, max |kv_c_normed| per layer.
StatusOr<OuterScales> calibrate_from_text(const CalibrateArgs& a, std::vector<int64_t>& tokens_per_layer) {
  MLAKV_ASSIGN_OR_RETURN(TextInput in, load_text_input(a));
  Model* model = in.model.get();
  const std::vector<int32_t>& ids = in.ids;
  Progress pr(fmt::format("calibrating: {} windows x {} tokens", a.windows, a.context), a.windows, !a.json);
  MLAKV_ASSIGN_OR_RETURN(OuterScales s, calibrate_outer_scales(*model, ids, a.context, a.windows, 0,
                                                               [&](std::string_view, int64_t d, int64_t) {
                                                                 pr.update(d);
                                                               }));
  tokens_per_layer.assign(static_cast<std::size_t>(s.num_layers()), a.context * a.windows);
  return s;
}

StatusOr<OuterScales> calibrate_from_captures(const CalibrateArgs& a, std::vector<int64_t>& tokens);

// --recipe mlakv: the latent transform (mean, per-dim scale, signed Hadamard, s_l on c').
Status run_calibrate_mlakv(const CalibrateArgs& a) {
  if (a.model.empty()) return invalid_argument("--recipe mlakv needs --model DIR and calibration text");
  if (!a.activations.empty()) return invalid_argument("--recipe mlakv runs the model: give --model, not --activations");
  LatentTransformRecipe r;
  MLAKV_RETURN_IF_ERROR(set_latent_importance(r, a.importance));
  r.center = !a.no_center;
  r.rotate = !a.no_rotate;
  r.rope_rotate = !a.no_rope_rotate;
  r.seed = a.seed;
  r.sd_power = a.sd_power;
  r.seed_candidates = a.seed_candidates;
  const std::optional<KvFormat> sel = parse_format(a.select_format);
  if (!sel || *sel == KvFormat::kF32) {
    return invalid_argument(fmt::format("--select-format: '{}' is not a lossy record format (see 'mlakv formats')",
                                        a.select_format));
  }
  r.select_format = *sel;
  if (!a.nvfp4_scales.empty()) {
    MLAKV_ASSIGN_OR_RETURN(r.nvfp4_scales, parse_nvfp4_scale_mode(a.nvfp4_scales, "--nvfp4-scales"));
  }
  if (a.seed_candidates < 1 || a.seed_candidates > 64) {
    return invalid_argument(fmt::format("--seed-candidates must be in [1, 64], got {}", a.seed_candidates));
  }
  const bool selecting = (r.rotate || r.rope_rotate) && r.seed_candidates > 1;
  MLAKV_ASSIGN_OR_RETURN(TextInput in, load_text_input(a));
  const int64_t passes = selecting ? 3 + r.seed_candidates : 2;
  Progress pr(fmt::format("calibrating (mlakv recipe): {} passes over {} windows x {} tokens{}", passes, a.windows,
                          a.context, selecting ? fmt::format(" ({} sign seeds tried)", r.seed_candidates) : ""),
              passes * a.windows, !a.json);
  MLAKV_ASSIGN_OR_RETURN(LatentTransformCalibration c,
                         calibrate_latent_transform(*in.model, in.ids, a.context, a.windows, 0, r,
                                                    [&](std::string_view, int64_t d, int64_t) { pr.update(d); }));
  MLAKV_RETURN_IF_ERROR(write_latent_transform(a.out, c.transform, c.max_abs));
  const int n = c.transform.num_layers();
  if (a.json) {
    nlohmann::json layers = nlohmann::json::array();
    for (int l = 0; l < n; ++l) {
      const LatentTransformLayer& L = c.transform.layers[static_cast<std::size_t>(l)];
      const auto [dmin, dmax] = std::minmax_element(L.d.begin(), L.d.end());
      layers.push_back({{"layer", l}, {"max_abs", c.max_abs[static_cast<std::size_t>(l)]},
                        {"scale", L.outer_scale}, {"d_min", *dmin}, {"d_max", *dmax}});
    }
    nlohmann::json search = nullptr;
    if (const auto& ss = c.transform.seed_search) {
      nlohmann::json cand = nlohmann::json::array();
      for (std::size_t i = 0; i < ss->seeds.size(); ++i)
        cand.push_back({{"seed", ss->seeds[i]}, {"kld_mean", ss->kld_mean[i]}});
      search = {{"format", ss->format}, {"candidates", cand}, {"chosen", ss->chosen}};
    }
    print_json({{"out", a.out}, {"format", std::string(kLatentTransformFileFormat)}, {"num_layers", n},
                {"importance", c.transform.importance},
                {"nvfp4_scales", std::string(nvfp4_scale_mode_name(c.transform.nvfp4_scales))},
                {"seed_search", search}, {"layers", layers}});
    return Status::Ok();
  }
  if (const auto& ss = c.transform.seed_search) {
    fmt::print("sign seeds tried ({} KLD on the calibration windows):", ss->format);
    for (std::size_t i = 0; i < ss->seeds.size(); ++i)
      fmt::print(" {} {:.4e}{}", ss->seeds[i], ss->kld_mean[i], ss->seeds[i] == ss->chosen ? " (chosen)" : "");
    fmt::print("\n");
  }
  fmt::print("{:>6}{:>14}{:>14}{:>10}{:>10}\n", "layer", "max |c'|", "scale", "d min", "d max");
  for (int l = 0; l < n; ++l) {
    const LatentTransformLayer& L = c.transform.layers[static_cast<std::size_t>(l)];
    const auto [dmin, dmax] = std::minmax_element(L.d.begin(), L.d.end());
    fmt::print("{:>6}{:>14.6g}{:>14.6g}{:>10.3g}{:>10.3g}\n", l, c.max_abs[static_cast<std::size_t>(l)], L.outer_scale,
               *dmin, *dmax);
  }
  fmt::print("wrote {} ({}, {} layers, importance {}, rotation {}, RoPE rotation {}, nvfp4 scales {})\n", a.out,
             kLatentTransformFileFormat, n, c.transform.importance, r.rotate ? "on" : "off",
             r.rope_rotate ? "on" : "off", nvfp4_scale_mode_name(c.transform.nvfp4_scales));
  return Status::Ok();
}

Status run_calibrate(const CalibrateArgs& a) {
  if (a.num_layers < 0) return invalid_argument(fmt::format("--num-layers must be >= 0, got {}", a.num_layers));
  if (a.recipe == "mlakv") return run_calibrate_mlakv(a);
  if (a.recipe != "fork") return invalid_argument(fmt::format("--recipe must be fork or mlakv, got '{}'", a.recipe));
  if (!a.nvfp4_scales.empty()) {
    return invalid_argument("--nvfp4-scales is an option of --recipe mlakv: the fork's nvfp4_ds_mla_outer_scale_v1 "
                            "file records no encoder option (its records round each group scale to nearest)");
  }
  if (a.activations.empty() && a.model.empty()) {
    return invalid_argument("give captured activations (--activations FILE...) or a model and text (--model DIR --text FILE)");
  }
  std::vector<int64_t> tokens;
  OuterScales s;
  if (!a.model.empty()) {
    MLAKV_ASSIGN_OR_RETURN(s, calibrate_from_text(a, tokens));
  } else {
    MLAKV_ASSIGN_OR_RETURN(s, calibrate_from_captures(a, tokens));
  }
  MLAKV_RETURN_IF_ERROR(write_outer_scales(a.out, s));
  if (!a.plot.empty()) {
    MLAKV_RETURN_IF_ERROR(io::write_file(a.plot, scale_profile_svg(s, fmt::format("outer scales: {}", a.out))));
  }
  if (a.json) {
    nlohmann::json layers = nlohmann::json::array();
    for (int l = 0; l < s.num_layers(); ++l) {
      layers.push_back({{"layer", l},
                        {"tokens", tokens[static_cast<std::size_t>(l)]},
                        {"max_abs", s.max_abs[static_cast<std::size_t>(l)]},
                        {"scale", s.scales[static_cast<std::size_t>(l)]}});
    }
    print_json({{"out", a.out},
                {"format", std::string(kOuterScaleFileFormat)},
                {"num_layers", s.num_layers()},
                {"layers", layers}});
    return Status::Ok();
  }
  fmt::print("{:>6}{:>10}{:>14}{:>14}\n", "layer", "tokens", "max |latent|", "scale");
  for (int l = 0; l < s.num_layers(); ++l) {
    fmt::print("{:>6}{:>10}{:>14.6g}{:>14.6g}\n", l, tokens[static_cast<std::size_t>(l)],
               s.max_abs[static_cast<std::size_t>(l)], s.scales[static_cast<std::size_t>(l)]);
  }
  fmt::print("wrote {} ({} layers; layers past {} use 1.0)\n", a.out, s.num_layers(), s.num_layers() - 1);
  return Status::Ok();
}

StatusOr<OuterScales> calibrate_from_captures(const CalibrateArgs& a, std::vector<int64_t>& tokens) {
  // The same capture twice would count its tokens twice and hide a missing one.
  for (std::size_t i = 0; i < a.activations.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      std::error_code ec;
      if (a.activations[i] == a.activations[j] ||
          std::filesystem::equivalent(a.activations[i], a.activations[j], ec)) {
        return invalid_argument(fmt::format("--activations: '{}' and '{}' are the same capture (each file once)",
                                            a.activations[j], a.activations[i]));
      }
    }
  }
  for (const std::string& path : a.activations) {
    MLAKV_RETURN_IF_ERROR(io::check_not_same_file(a.out, "--out", path, "--activations"));
  }
  OuterScaleCalibrator cal;
  for (const std::string& path : a.activations) {
    MLAKV_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(path));
    MLAKV_RETURN_IF_ERROR(cal.add_capture(*f).status());
  }
  MLAKV_ASSIGN_OR_RETURN(OuterScales s, cal.finish(a.num_layers));
  tokens = cal.tokens();
  tokens.resize(static_cast<std::size_t>(s.num_layers()), 0);
  return s;
}

}  // namespace

void add_calibrate_command(Cli& cli) {
  auto a = std::make_shared<CalibrateArgs>();
  auto* cmd = cli.app.add_subcommand(
      "calibrate", "NVFP4 outer scales from captured kv_c_normed activations, or from a model run over text");
  cmd->add_option("--activations", a->activations,
                  "safetensors capture(s) holding layers.<i>.kv_c_normed [T, 512] (repeatable)");
  cmd->add_option("--model", a->model, "or: run this checkpoint directory over calibration text");
  cmd->add_option("--text", a->text, "calibration text (with --model), tokenized with the model's tokenizer");
  cmd->add_option("--tokens", a->tokens, "calibration tokens (with --model): little-endian int32 ids");
  cmd->add_option("--context", a->context, "tokens per calibration window (with --model)")->capture_default_str();
  cmd->add_option("--windows", a->windows, "calibration windows (with --model), cut as mlakv eval cuts them")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU threads (with --model; 0 = all cores)")->capture_default_str();
  cmd->add_option("--plot", a->plot, "write an SVG of the per-layer profile");
  cmd->add_option("--out", a->out,
                  "Scale file to write (fork: nvfp4_ds_mla_outer_scale_v1; mlakv: mlakv_latent_transform_v2)")
      ->required();
  cmd->add_option("--recipe", a->recipe,
                  "fork: per-layer outer scales s_l = max|latent| / 2688; mlakv: the calibrated latent transform "
                  "(mean, per-dim scale, signed Hadamard, s_l on the transformed latent; needs --model)")
      ->capture_default_str();
  cmd->add_option("--importance", a->importance,
                  "mlakv recipe: the per-dim importance for d (none, uniform, query, output, query+output, or "
                  "file:PATH: an mlakv_latent_importance_v1 file, e.g. from tools/latent_importance.py)")
      ->capture_default_str();
  cmd->add_flag("--no-center", a->no_center, "mlakv recipe: do not subtract the mean latent");
  cmd->add_flag("--no-rotate", a->no_rotate, "mlakv recipe: no Hadamard rotation of the latent");
  cmd->add_flag("--no-rope-rotate", a->no_rope_rotate,
                "mlakv recipe: leave k_pe (and q_pe) unrotated (default: a signed 64-point Hadamard)");
  cmd->add_option("--sd-power", a->sd_power,
                  "mlakv recipe: d_i = sqrt(w_i) / sd_i^P (0.5: the error model's optimum; for studies)")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "mlakv recipe: the sign seed (layer l uses seed + 2l, its RoPE seed + 2l + 1)")
      ->capture_default_str();
  cmd->add_option("--seed-candidates", a->seed_candidates,
                  "mlakv recipe: sign seeds tried (seed + k * 2^20, k < N) on the calibration windows; the one with the "
                  "lowest KLD in --select-format is kept and recorded in the file (1: --seed as given)")
      ->capture_default_str();
  cmd->add_option("--select-format", a->select_format, "mlakv recipe: the record format the seed is selected in")
      ->capture_default_str();
  cmd->add_option("--nvfp4-scales", a->nvfp4_scales,
                  "mlakv recipe: how the nvfp4 writers choose each 16-dim group's scale, recorded in the file and in "
                  "effect during the seed selection: search (default: RN-1, RN or RN+1 by the group's squared error) "
                  "or rn (round to nearest, the fork's encoder)");
  cmd->add_option("--num-layers", a->num_layers, "Layers the file covers (0 = one past the highest captured)")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([&cli, a] { cli.action = [a] { return run_calibrate(*a); }; });
}

}  // namespace mlakv::cli
