// mlakv layer-forward: one MLA attention layer of a Hugging Face checkpoint on the CPU,
// over a paged cache in any KV format (docs/layer.md), optionally capturing kv_c_normed
// for calibration (docs/calibration.md).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "cli/cli.h"
#include "mlakv/eval.h"
#include "mlakv/file_io.h"
#include "mlakv/hf_config.h"
#include "mlakv/latent_calib.h"
#include "mlakv/mla_layer.h"
#include "mlakv/outer_scales.h"
#include "mlakv/safetensors.h"
#include "mlakv/thread_pool.h"

namespace mlakv::cli {
namespace {

struct LayerForwardArgs {
  std::string model, input, output, format = "bf16", scales, capture;
  int layer = 0;
  int64_t chunk = 0;  // tokens per call; 0 = all at once
  int block_size = kDefaultBlockSize;
  int threads = 0;
  bool json = false;
};

// A [T, D] (or [1, T, D]) f32 / bf16 / f16 tensor of `f` as float32 rows.
StatusOr<std::vector<float>> input_rows(const SafetensorsFile& f, const char* name, int64_t d, int64_t& rows) {
  const std::optional<TensorView> t = f.find(name);
  if (!t) return not_found(fmt::format("{}: tensor '{}' is missing", f.path(), name));
  const bool batched = t->ndim == 3 && t->size(0) == 1;
  if (!(t->ndim == 2 || batched) || t->size(t->ndim - 1) != d || t->size(t->ndim - 2) < 1 ||
      (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16)) {
    return invalid_argument(fmt::format("{}: tensor '{}' must be [T >= 1, {}] or [1, T, {}] of f32, bf16 or f16, got "
                                        "{} {}",
                                        f.path(), name, d, d, dtype_name(t->dtype), t->shape_string()));
  }
  rows = t->size(t->ndim - 2);
  std::vector<float> out(static_cast<std::size_t>(rows * d));
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (t->dtype == DType::kF32) {
      out[i] = t->ptr<const float>()[i];
    } else {
      const uint16_t h = t->ptr<const uint16_t>()[i];
      out[i] = t->dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  return out;
}

// positions [T] (or [1, T]) of i64 or i32.
StatusOr<std::vector<int64_t>> input_positions(const SafetensorsFile& f, int64_t rows) {
  const std::optional<TensorView> t = f.find("positions");
  if (!t) return not_found(fmt::format("{}: tensor 'positions' is missing", f.path()));
  const bool ok_shape = (t->ndim == 1 && t->size(0) == rows) || (t->ndim == 2 && t->size(0) == 1 && t->size(1) == rows);
  if (!ok_shape || (t->dtype != DType::kI64 && t->dtype != DType::kI32)) {
    return invalid_argument(fmt::format(
        "{}: tensor 'positions' must be [{}] or [1, {}] of i64 or i32 (one per hidden_states row), got {} {}",
        f.path(), rows, rows, dtype_name(t->dtype), t->shape_string()));
  }
  std::vector<int64_t> out(static_cast<std::size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    out[static_cast<std::size_t>(i)] =
        t->dtype == DType::kI64 ? t->ptr<const int64_t>()[i] : static_cast<int64_t>(t->ptr<const int32_t>()[i]);
  }
  return out;
}

Status run_layer_forward(const LayerForwardArgs& a) {
  // NAME, or an nvfp4 NAME + "+token-scale": the per-token scale mode (as `mlakv eval --formats`
  // and `mlakv generate --format` spell it).
  MLAKV_ASSIGN_OR_RETURN(const EvalFormat row, parse_eval_format(a.format, "--format"));
  const KvFormat format = row.format;
  const bool token_scale = row.token_scale;
  if (token_scale && !a.scales.empty()) {
    return invalid_argument(fmt::format("--format {} with --scales {}: the per-token scale mode replaces the outer "
                                        "scale (s_t per record); give no calibration file",
                                        a.format, a.scales));
  }
  if (a.block_size < 1 || a.block_size > 4096) {
    return invalid_argument(fmt::format("--block-size must be in [1, 4096], got {}", a.block_size));
  }
  if (a.chunk < 0) return invalid_argument(fmt::format("--chunk must be >= 0, got {}", a.chunk));
  if (a.threads < 0) return invalid_argument(fmt::format("--threads must be >= 0, got {}", a.threads));

  // Outputs never replace an input, and --capture never replaces --output.
  MLAKV_RETURN_IF_ERROR(io::check_not_same_file(a.output, "--output", a.input, "--input"));
  MLAKV_RETURN_IF_ERROR(io::check_not_same_file(a.output, "--output", a.scales, "--scales"));
  if (!a.capture.empty()) {
    MLAKV_RETURN_IF_ERROR(io::check_not_same_file(a.capture, "--capture", a.output, "--output"));
    MLAKV_RETURN_IF_ERROR(io::check_not_same_file(a.capture, "--capture", a.input, "--input"));
    MLAKV_RETURN_IF_ERROR(io::check_not_same_file(a.capture, "--capture", a.scales, "--scales"));
  }
  MLAKV_ASSIGN_OR_RETURN(ModelConfig cfg, load_hf_config(a.model));
  MLAKV_ASSIGN_OR_RETURN(WeightQuantOptions quant, load_checkpoint_quant_options(a.model));
  if (a.layer < 0 || a.layer >= cfg.cache_layers()) {
    return out_of_range(fmt::format("--layer {} is outside [0, {}) for {}", a.layer, cfg.cache_layers(), cfg.name));
  }
  std::optional<OuterScales> scales;
  std::optional<LatentTransformKernel> transform;
  Nvfp4ScaleMode nvfp4_scales = Nvfp4ScaleMode::kRn;  // the mlakv file's, on an nvfp4 format
  if (!a.scales.empty()) {
    // Either kind of file: the fork's outer scales or the mlakv recipe's latent transform.
    MLAKV_ASSIGN_OR_RETURN(ScaleFile f, load_scale_file(a.scales));
    if (f.kind == ScaleFile::Kind::kOuterScales) {
      scales = std::move(f.outer_scales);
    } else {
      if (a.layer >= f.transform.num_layers()) {
        return invalid_argument(fmt::format("--scales {}: the latent transform covers layers [0, {}), not --layer {}",
                                            a.scales, f.transform.num_layers(), a.layer));
      }
      MLAKV_ASSIGN_OR_RETURN(transform,
                             LatentTransformKernel::create(f.transform.layers[static_cast<std::size_t>(a.layer)]));
      if (is_nvfp4_format(format)) nvfp4_scales = f.transform.nvfp4_scales;
    }
  }
  MLAKV_ASSIGN_OR_RETURN(CacheLayerFormats lf, cache_layer_formats(format, 1, nullptr));
  lf.layers[0].token_scale = token_scale;
  if (transform && format_info(format).has_outer_scale) lf.layers[0].outer_scale = transform->layer().outer_scale;
  lf.layers[0].nvfp4_scales = nvfp4_scales;
  if (scales) {
    // The cache holds this one layer: its scale is the file's entry for --layer.
    MLAKV_ASSIGN_OR_RETURN(CacheLayerFormats all, cache_layer_formats(format, a.layer + 1, &*scales));
    lf.layers[0] = all.layers.back();
    if (!all.warning.empty()) std::fprintf(stderr, "warning: --scales %s: %s\n", a.scales.c_str(), all.warning.c_str());
  }

  MLAKV_ASSIGN_OR_RETURN(auto input, SafetensorsFile::open(a.input));
  int64_t T = 0;
  MLAKV_ASSIGN_OR_RETURN(std::vector<float> hidden, input_rows(*input, "hidden_states", cfg.hidden_size, T));
  MLAKV_ASSIGN_OR_RETURN(std::vector<int64_t> positions, input_positions(*input, T));
  // RoPE past the model's context is extrapolation the checkpoint was never trained on:
  // refused, naming the first such token (docs/layer.md).
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = positions[static_cast<std::size_t>(t)];
    if (pos < 0 || (cfg.max_position_embeddings > 0 && pos >= cfg.max_position_embeddings)) {
      return out_of_range(fmt::format("{}: positions[{}] = {} is outside [0, {}) (the model's "
                                      "max_position_embeddings)",
                                      a.input, t, pos, cfg.max_position_embeddings));
    }
  }

  MLAKV_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::open(a.model));
  for (const auto& shard : ckpt->shards()) {
    MLAKV_RETURN_IF_ERROR(io::check_not_same_file(a.output, "--output", shard->path(), "a --model shard"));
    MLAKV_RETURN_IF_ERROR(io::check_not_same_file(a.capture, "--capture", shard->path(), "a --model shard"));
  }
  ThreadPool pool(a.threads);
  MlaLoadOptions lo;
  lo.quant = quant;
  MLAKV_ASSIGN_OR_RETURN(MlaLayerWeights w, load_mla_layer(*ckpt, cfg, a.layer, lo));
  if (transform) MLAKV_RETURN_IF_ERROR(fold_latent_transform(w, transform->layer()));

  const int64_t chunk = a.chunk == 0 ? T : std::min<int64_t>(a.chunk, T);
  KvCache::Config cc;
  cc.num_layers = 1;
  cc.block_size = a.block_size;
  cc.num_blocks = (T + a.block_size - 1) / a.block_size;
  cc.layers = lf.layers;
  cc.on_warning = [&a](int, const std::string& message) {
    std::fprintf(stderr, "warning: layer %d: %s\n", a.layer, message.c_str());
  };
  MLAKV_ASSIGN_OR_RETURN(auto cache, PagedKvCache::create_cpu(cc));
  const SeqId seq = cache->add_sequence();

  std::vector<float> out(static_cast<std::size_t>(T * cfg.hidden_size));
  std::vector<float> captured;
  const bool capture = !a.capture.empty();
  if (capture) captured.reserve(static_cast<std::size_t>(T) * kLatentDim);
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    MLAKV_RETURN_IF_ERROR(cache->append(seq, n).status());
    MlaLayerTrace trace;
    MlaForwardOptions fo;
    fo.pool = &pool;
    fo.trace = capture ? &trace : nullptr;
    fo.transform = transform ? &*transform : nullptr;
    const Status st = mla_layer_forward(
        w, cfg, *cache, 0, seq,
        TensorView::contiguous(hidden.data() + t0 * cfg.hidden_size, DType::kF32, {n, cfg.hidden_size}),
        TensorView::contiguous(positions.data() + t0, DType::kI64, {n}),
        TensorView::contiguous(out.data() + t0 * cfg.hidden_size, DType::kF32, {n, cfg.hidden_size}), fo);
    if (!st.ok()) return st.with_context(fmt::format("{}: tokens [{}, {})", a.input, t0, t0 + n));
    if (capture) captured.insert(captured.end(), trace.kv_c_normed.begin(), trace.kv_c_normed.end());
  }

  const std::map<std::string, std::string> meta = {{"generator", "mlakv layer-forward"},
                                                   {"model", portable_name(cfg.name)},
                                                   {"layer", std::to_string(a.layer)},
                                                   {"format", std::string(format_name(format))},
                                                   {"outer_scale", fmt::format("{}", lf.layers[0].outer_scale)},
                                                   {"token_scale", token_scale ? "true" : "false"},
                                                   {"nvfp4_scales", std::string(nvfp4_scale_mode_name(nvfp4_scales))},
                                                   {"recipe", transform ? "mlakv" : (scales ? "fork" : "none")}};
  // Both files or neither: each is written to its temporary first, and only when both
  // are complete are they renamed into place.
  MLAKV_ASSIGN_OR_RETURN(io::AtomicFile out_file, io::AtomicFile::create(a.output));
  MLAKV_RETURN_IF_ERROR(write_safetensors(
      out_file, {{"output", TensorView::contiguous(out.data(), DType::kF32, {T, cfg.hidden_size})}}, meta));
  std::optional<io::AtomicFile> capture_file;
  if (capture) {
    MLAKV_ASSIGN_OR_RETURN(capture_file, io::AtomicFile::create(a.capture));
    MLAKV_RETURN_IF_ERROR(write_safetensors(
        *capture_file,
        {{capture_tensor_name(a.layer), TensorView::contiguous(captured.data(), DType::kF32, {T, kLatentDim})}},
        {{"generator", "mlakv layer-forward --capture"}, {"model", portable_name(cfg.name)}}));
    MLAKV_RETURN_IF_ERROR(capture_file->commit());
  }
  MLAKV_RETURN_IF_ERROR(out_file.commit());
  if (a.json) {
    print_json({{"model", cfg.name},
                {"layer", a.layer},
                {"tokens", T},
                {"chunk", chunk},
                {"format", std::string(format_name(format))},
                {"outer_scale", lf.layers[0].outer_scale},
                {"token_scale", token_scale},
                {"nvfp4_scales", std::string(nvfp4_scale_mode_name(nvfp4_scales))},
                {"recipe", transform ? "mlakv" : (scales ? "fork" : "none")},
                {"softmax_scale", cfg.softmax_scale()},
                {"output", a.output},
                {"capture", capture ? nlohmann::json(a.capture) : nlohmann::json(nullptr)}});
  } else {
    fmt::print("layer {} of {}: {} tokens ({} per call) through a {} cache ({}{}) -> {}\n", a.layer, cfg.name, T, chunk,
               format_name(format),
               token_scale ? std::string("per-token scale mode")
                           : fmt::format("outer scale {}", lf.layers[0].outer_scale),
               transform ? fmt::format(", mlakv latent transform, nvfp4 scales {}", nvfp4_scale_mode_name(nvfp4_scales))
                         : std::string(),
               a.output);
    if (capture) fmt::print("captured {} [{}, {}] -> {}\n", capture_tensor_name(a.layer), T, kLatentDim, a.capture);
  }
  return Status::Ok();
}

}  // namespace

void add_layer_forward_command(Cli& cli) {
  auto a = std::make_shared<LayerForwardArgs>();
  auto* cmd = cli.app.add_subcommand("layer-forward", "Run one MLA attention layer of a checkpoint on the CPU");
  cmd->add_option("--model", a->model, "Checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("--layer", a->layer, "Layer index")->required();
  cmd->add_option("--input", a->input,
                  "safetensors with hidden_states [T, D] (or [1, T, D]; f32, bf16 or f16) and positions [T] (i64 or "
                  "i32). hidden_states is the attention input AFTER input_layernorm, not transformers' decoder-layer "
                  "hidden_states (the pre-norm residual: passing that gives plausible, wrong output)")
      ->required();
  cmd->add_option("--output", a->output, "safetensors to write: output [T, D] f32")->required();
  cmd->add_option("--format", a->format,
                  "KV cache format (see 'mlakv formats'); an nvfp4 format + '+token-scale' (e.g. "
                  "nvfp4_ds_mla+token-scale): the per-token scale mode (fp32 s_t per record replaces s_l; no --scales)")
      ->capture_default_str();
  cmd->add_option("--scales", a->scales,
                  "calibration file: nvfp4_ds_mla_outer_scale_v1 (the fork's outer scales, nvfp4 formats) or "
                  "mlakv_latent_transform_v2 / v1 (the mlakv recipe: the latent written transformed, the weights folded, "
                  "its nvfp4_scales applied on an nvfp4 --format)");
  cmd->add_option("--capture", a->capture, "Also write layers.<layer>.kv_c_normed [T, 512] f32 here");
  cmd->add_option("--chunk", a->chunk, "Tokens per call: prefill chunks, 1 = token-by-token decode (0 = all)")
      ->capture_default_str();
  cmd->add_option("--block-size", a->block_size, "Cache block size in tokens")->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU threads (0 = all)")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([&cli, a] { cli.action = [a] { return run_layer_forward(*a); }; });
}

}  // namespace mlakv::cli
