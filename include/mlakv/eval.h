// What each KV record format costs a whole model, measured on real text (`mlakv eval`):
// teacher-forced KLD against an unquantized float32 cache (the paged cache in the f32
// record format, attended by the same kernels as every format), top-1 agreement, perplexity,
// and needle retrieval by greedy decoding through the cache (docs/eval.md, docs/needle.md).
//
// Decode-equivalent: each window is run as one prefill through the cache under test,
// and the runner writes a chunk's records before attending, so every position attends
// to the records of every earlier token and its own exactly as the cache stores them -
// what a decode step of that token would see.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mlakv/eval_stats.h"
#include "mlakv/formats.h"
#include "mlakv/latent_calib.h"
#include "mlakv/model.h"
#include "mlakv/outer_scales.h"
#include "mlakv/status.h"
#include "mlakv/tokenizer.h"

namespace mlakv {

// Progress of a long run: `what` names the stage, done of total units.
using ProgressFn = std::function<void(std::string_view what, int64_t done, int64_t total)>;

// The first `windows` consecutive, non-overlapping `context`-token slices of `tokens`
// starting at token `skip`. kInvalidArgument when the input is too short (the message
// gives the tokens needed and available) or context / windows < 1.
StatusOr<std::vector<std::span<const int32_t>>> eval_windows(std::span<const int32_t> tokens, int64_t context,
                                                             int64_t windows, int64_t skip = 0);

// One cache configuration under test.
struct EvalCacheSpec {
  KvFormat format = KvFormat::kBf16;
  // Per-layer outer scales (nvfp4 formats); empty: 1.0 everywhere (uncalibrated).
  OuterScales scales;
  // How the scales were obtained, for the report: "none", "auto", the file name, or
  // "token" for the per-token scale mode.
  std::string scales_label = "none";
  // The mlakv recipe: a latent transform folded for the model under evaluation
  // (Model::fold_latent_transform); its s_l replace `scales` where the format has an outer
  // scale. nullptr: no transform.
  std::shared_ptr<const FoldedLatentTransform> transform{};
  // The recipe for the report: "none" (uncalibrated), "fork" (outer scales), "mlakv".
  std::string recipe = "none";
  // The nvfp4 per-token scale mode (LayerFormat::token_scale) on every layer; needs empty
  // `scales` (the mode replaces the outer scale) and no `transform` (kInvalidArgument: the
  // transform's s_l and nvfp4_scales would not apply).
  bool token_scale = false;
};

struct EvalOptions {
  int64_t context = 2048;
  int64_t windows = 32;
  int block_size = kDefaultBlockSize;
  ProgressFn progress{};
};

struct EvalRow {
  EvalCacheSpec spec;
  KldStats kld{};           // per position vs the reference; its ppl_q() is this cache's perplexity
  double seconds = 0;      // forward time over all windows
  int64_t tokens = 0;      // tokens run
  int needle_found = 0;
  int needle_total = 0;
};

struct EvalReport {
  KldStats reference;  // the reference against itself: ppl_ref() is the model's perplexity
  double reference_seconds = 0;
  int64_t reference_tokens = 0;
  int reference_needle_found = 0;
  int reference_needle_total = 0;
  std::vector<EvalRow> rows;  // one per spec, in order
};

// Teacher-forced evaluation of every spec over the windows of `tokens` (eval_windows).
// Per window: the reference logits (a PagedKvCache in the f32 record format: float32 as
// computed, so a spec of format f32 gives KLD 0 exactly), then each spec's (a PagedKvCache
// in its format and scales), compared position by position: KL(P_ref || P_spec), top-1
// agreement, and the NLL of the true next token (the window's last position has none).
// Errors: those of eval_windows, of the caches and of Model::forward; nothing partial.
StatusOr<EvalReport> evaluate(Model& model, std::span<const int32_t> tokens, std::span<const EvalCacheSpec> specs,
                              const EvalOptions& opt);

// ---- calibration from text ---------------------------------------------------------

// Runs the model over the windows of `tokens` (eval_windows) with the f32 reference
// cache and takes max |kv_c_normed| per layer, as the fork does: s_l = max_abs / 2688.
StatusOr<OuterScales> calibrate_outer_scales(Model& model, std::span<const int32_t> tokens, int64_t context,
                                             int64_t windows, int64_t skip = 0, const ProgressFn& progress = {});

// The mlakv recipe from text (docs/calibration.md "The mlakv recipe"): pass 1 runs the model
// over the windows with the f32 reference cache and accumulates per layer the latent's mean
// and second moments and (for the query importances) the absorbed queries' second moments
// (LatentTransformCalibrator); pass 2 runs them again and takes max |c'| of the transformed
// latents, s_l = max / 2688. `max_abs` is that max per layer (the file's audit field). With
// recipe.seed_candidates n > 1 (and a rotation), pass 2 measures n candidate sign seeds
// (seed + k * kLatentSeedStride) at once and a third pass over the same windows evaluates each
// candidate's cache in recipe.select_format against the f32 reference (evaluate()); the
// lowest mean KLD is kept and recorded in transform.seed_search. kInvalidArgument for n
// outside [1, 64], a seed without room for its candidates, or select_format f32.
struct LatentTransformCalibration {
  LatentTransform transform;
  std::vector<double> max_abs;
};
StatusOr<LatentTransformCalibration> calibrate_latent_transform(Model& model, std::span<const int32_t> tokens,
                                                               int64_t context, int64_t windows, int64_t skip,
                                                               const LatentTransformRecipe& recipe,
                                                               const ProgressFn& progress = {});

// ---- needle retrieval (docs/needle.md) -----------------------------------------------

struct NeedleTrial {
  int index = 0;
  int64_t length = 0;          // context length L (prompt = L - kNeedleMaxNewTokens tokens)
  double depth = 0;            // the target's depth
  std::vector<int32_t> prompt;
  std::string key, value;      // the target's
};

inline constexpr int kNeedleMaxNewTokens = 8;

// The `n` trials of docs/needle.md over `eval_tokens` (no special tokens) for a model of
// `max_position` positions. kInvalidArgument when the eval text is too short for a
// trial (the message gives the tokens needed and available) or n < 1.
StatusOr<std::vector<NeedleTrial>> make_needle_trials(const Tokenizer& tokenizer, std::span<const int32_t> eval_tokens,
                                                      int64_t max_position, int n);

// Greedy decode of one trial through a cache: nullptr spec = the f32 reference.
// Returns whether the answer matches (docs/needle.md step 9) and the generated text.
struct NeedleAnswer {
  bool found = false;
  std::string text;
};
StatusOr<NeedleAnswer> run_needle_trial(Model& model, const Tokenizer& tokenizer, const NeedleTrial& trial,
                                        const EvalCacheSpec* spec, int block_size = kDefaultBlockSize);

// ---- greedy generation ---------------------------------------------------------------

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated (the prompt excluded)
  double prefill_seconds = 0;
  double decode_seconds = 0;
};
// Prefills `prompt` (>= 1 token) and decodes up to max_new_tokens greedily (argmax, ties
// to the lowest id), stopping early at `stop_id` when given. spec nullptr: the f32 reference.
StatusOr<GenerateResult> generate_greedy(Model& model, std::span<const int32_t> prompt, int max_new_tokens,
                                         const EvalCacheSpec* spec, std::optional<int32_t> stop_id = {},
                                         int block_size = kDefaultBlockSize);

// ---- `mlakv eval` as one call (the CLI and the Python package share it) ----------------

// One row kind of `mlakv eval --formats`: a format, or an nvfp4 format in the per-token
// scale mode ("nvfp4_ds_mla+token-scale").
struct EvalFormat {
  KvFormat format = KvFormat::kBf16;
  bool token_scale = false;
  bool operator==(const EvalFormat&) const = default;
};
inline constexpr std::string_view kTokenScaleSuffix = "+token-scale";
// "NAME" or "NAME+token-scale"; kInvalidArgument naming `what` (the option it came from)
// and the text.
StatusOr<EvalFormat> parse_eval_format(std::string_view text, std::string_view what = "formats");

struct EvalRequest {
  std::vector<EvalFormat> formats;  // >= 1; duplicates are dropped, the order is kept
  // Calibrated sources (`--scales`), each "auto" (calibrated on `calib_windows` windows of the
  // input after the eval windows, for the recipes `recipe` asks for) or a scale file of
  // either kind (load_scale_file: nvfp4_ds_mla_outer_scale_v1 or mlakv_latent_transform_v2 / v1).
  std::vector<std::string> scales;
  // "" (fork for auto, the files' own kinds), "fork", "mlakv" or "both"; needs scales.
  std::string recipe;
  LatentImportance importance = LatentTransformRecipe{}.importance;  // for mlakv-recipe auto
  LatentImportanceWeights importance_weights;                         // with importance kFile
  int seed_candidates = LatentTransformRecipe{}.seed_candidates;     // for mlakv-recipe auto
  Nvfp4ScaleMode nvfp4_scales = LatentTransformRecipe{}.nvfp4_scales;  // for mlakv-recipe auto (files carry their own)
  int64_t context = 2048, windows = 32, calib_windows = 4;
  int needle = 0;  // needle trials (docs/needle.md): needs a tokenizer and max_position_embeddings
  int block_size = kDefaultBlockSize;
  // Stages, each counting done of total: "calibration (fork recipe)", "calibration (mlakv
  // recipe)" (windows), "eval" (window x cache runs, the reference included), "needle".
  ProgressFn progress;
};

// Validates the request (formats, context against max_position_embeddings, enough input
// for the windows, scale files covering every layer) before any model work, then
// calibrates (scales "auto"), evaluates and runs the needle trials. `tokenizer` may be
// null unless needle > 0. Errors name the argument; nothing partial.
StatusOr<EvalReport> eval_model(Model& model, const Tokenizer* tokenizer, std::span<const int32_t> tokens,
                                const EvalRequest& req);

// The report as `mlakv eval --json` prints it: {model, context, windows, positions,
// reference {ppl, bits_per_token, tokens_per_s, needle_found, needle_total}, formats [{format,
// record_bytes, recipe, scales, token_scale, nvfp4_scales, kld_mean, kld_p99, kld_max, kld_by_position_bucket, top1_agree, ppl,
// bits_per_token, tokens_per_s, needle_found, needle_total}]}; non-finite numbers are null,
// text that is not UTF-8 gets U+FFFD. `indent` < 0: one line.
// How a row's nvfp4 group scales were chosen: its transform's nvfp4_scales on an nvfp4 format
// (the mlakv recipe), else kRn (the fork's outer scales, uncalibrated, token-scale rows).
Nvfp4ScaleMode row_nvfp4_scales(const EvalCacheSpec& spec);
std::string eval_report_json(const EvalReport& report, std::string_view model, int64_t context, int64_t windows,
                             int indent = 2);

// ---- plots -----------------------------------------------------------------------------

// An SVG with two panels: mean KLD per row (bars, log scale) and KLD by position bucket
// (one line per row). Deterministic text.
std::string eval_plot_svg(const EvalReport& report, std::string_view title);
// An SVG bar chart of per-layer outer scales / max |kv_c_normed| (log scale).
std::string scale_profile_svg(const OuterScales& scales, std::string_view title);

}  // namespace mlakv
