// mlakv plan: KV-cache capacity for a model, format and deployment.
#include <fmt/format.h>

#include <filesystem>
#include <vector>

#include "cli/cli.h"
#include "mlakv/hf_config.h"
#include "mlakv/plan.h"
#include "mlakv/safetensors.h"

namespace mlakv::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct PlanArgs {
  std::string model = "glm-5.2";
  std::string format = "fp8_ds_mla";
  std::optional<double> gpu_mem, mem_util, reserved, weight_gib;
  std::optional<int> gpus, tp, dcp;
  std::optional<int64_t> context;
  double activation_gib = 4.0;
  int block_size = 64;
  bool no_mtp = false;
  bool json = false;
};

struct ResolvedModel {
  ModelConfig config;
  std::optional<ModelPreset> preset;  // set for a preset name
  std::optional<double> weight_gib;   // the checkpoint's tensor bytes, when known
  std::string weight_source;          // where weight_gib comes from
};

// Sum of every tensor's bytes in the checkpoint directory `dir` (the index's shards, or
// model.safetensors); nullopt when the directory holds no safetensors.
StatusOr<std::optional<double>> checkpoint_weight_gib(const std::filesystem::path& dir) {
  std::error_code ec;
  const bool has_weights = std::filesystem::exists(dir / "model.safetensors.index.json", ec) ||
                           std::filesystem::exists(dir / "model.safetensors", ec);
  if (!has_weights) return std::optional<double>();
  MLAKV_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::open(dir.string()));
  uint64_t bytes = 0;
  for (const std::string& name : ckpt->names()) {
    const SafetensorsFile* shard = ckpt->shard_of(name);
    if (const SafetensorsTensorInfo* info = shard != nullptr ? shard->info(name) : nullptr) bytes += info->nbytes();
  }
  return std::optional<double>(static_cast<double>(bytes) / kGiB);
}

StatusOr<ResolvedModel> resolve_model(const std::string& name) {
  ResolvedModel r;
  if (auto p = find_model_preset(name)) {
    r.config = p->config;
    r.preset = *p;
    r.weight_gib = p->deploy.weight_gib;
    r.weight_source = "the preset's published checkpoint";
    return r;
  }
  std::error_code ec;
  if (std::filesystem::exists(name, ec)) {
    MLAKV_ASSIGN_OR_RETURN(r.config, load_hf_config(name));
    const std::filesystem::path p(name);
    const std::filesystem::path dir = std::filesystem::is_directory(p, ec) ? p : p.parent_path();
    MLAKV_ASSIGN_OR_RETURN(r.weight_gib, checkpoint_weight_gib(dir.empty() ? std::filesystem::path(".") : dir));
    if (r.weight_gib) r.weight_source = "the checkpoint's safetensors tensor bytes";
    return r;
  }
  std::string names;
  for (const ModelPreset& p : model_presets()) names += fmt::format("{}{}", names.empty() ? "" : ", ", p.name);
  return not_found(fmt::format(
      "--model: '{}' is neither a preset ({}) nor an existing config.json or checkpoint directory", name, names));
}

std::string group(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return v < 0 ? "-" + out : out;
}

Status run_plan(const PlanArgs& a) {
  MLAKV_ASSIGN_OR_RETURN(ResolvedModel model, resolve_model(a.model));
  auto fmt_id = parse_format(a.format);
  if (!fmt_id) return invalid_argument(fmt::format("--format: unknown format '{}' (see 'mlakv formats')", a.format));
  if (!(a.activation_gib >= 0)) {
    return invalid_argument(fmt::format("--activation-gib must be >= 0, got {}", a.activation_gib));
  }
  if (a.weight_gib && !(*a.weight_gib >= 0)) {
    return invalid_argument(fmt::format("--weight-gib must be >= 0, got {}", *a.weight_gib));
  }
  if (a.reserved && a.weight_gib) {
    return invalid_argument("--reserved (everything that is not KV, per GPU) and --weight-gib exclude each other");
  }
  const DeploymentDefaults generic{};
  const DeploymentDefaults& d = model.preset ? model.preset->deploy : generic;
  // Which values fell back to a default (the note names only those).
  std::vector<std::string> defaulted;
  PlanParams p;
  p.format = *fmt_id;
  // --gpus alone: TP over all of them; --tp alone: one TP group.
  p.tp = a.tp.value_or(a.gpus.value_or(d.tp));
  p.gpus = a.gpus.value_or(a.tp ? *a.tp : d.gpus);
  if (!a.gpus && !a.tp) defaulted.push_back(fmt::format("{} GPU(s) at tp {} (--gpus/--tp)", p.gpus, p.tp));
  p.gpu_mem_gib = a.gpu_mem.value_or(d.gpu_mem_gib);
  if (!a.gpu_mem) defaulted.push_back(fmt::format("{} GiB per GPU (--gpu-mem)", p.gpu_mem_gib));
  p.dcp = a.dcp.value_or(d.dcp);
  p.mem_util = a.mem_util.value_or(d.mem_util);
  p.block_size = a.block_size;
  p.max_model_len = a.context.value_or(0);
  p.include_mtp = !a.no_mtp;
  std::string reservation;
  if (a.reserved) {
    p.reserved_gib = *a.reserved;
    reservation = "--reserved";
  } else if (a.weight_gib || model.weight_gib) {
    p.weight_gib = a.weight_gib.value_or(model.weight_gib.value_or(0));
    p.reserved_gib = a.activation_gib;
    reservation = a.weight_gib ? "--weight-gib" : model.weight_source;
  } else {
    p.reserved_gib = 0;
    reservation = "nothing";
    defaulted.push_back("no weights reserved: the checkpoint's size is unknown (--weight-gib or --reserved)");
  }
  MLAKV_ASSIGN_OR_RETURN(PlanResult r, plan_capacity(model.config, p));
  const ModelConfig& m = model.config;
  std::string note;
  if (!defaulted.empty()) {
    note = fmt::format("{}: {}", model.preset ? "the preset's deployment" : "generic defaults", defaulted[0]);
    for (std::size_t i = 1; i < defaulted.size(); ++i) note += "; " + defaulted[i];
    if (model.preset && !model.preset->deploy.note.empty()) note += fmt::format(" ({})", model.preset->deploy.note);
  }
  if (a.json) {
    print_json({{"model", m.name},
                {"model_type", m.model_type},
                {"format", a.format},
                {"layers", m.num_layers},
                {"mtp_layers", m.num_mtp_layers},
                {"include_mtp", p.include_mtp},
                {"cache_layers", r.cache_layers},
                {"indexer_layers", r.indexer_layers},
                {"gpus", p.gpus},
                {"gpu_mem_gib", p.gpu_mem_gib},
                {"tp", p.tp},
                {"dcp", p.dcp},
                {"mem_util", p.mem_util},
                {"weight_gib", p.weight_gib},
                {"weight_source", reservation},
                {"weight_gib_per_gpu", r.weight_gib_per_gpu},
                {"reserved_gib", r.reserved_gib_per_gpu},
                {"block_size", p.block_size},
                {"bytes_per_token_per_layer", r.record_bytes},
                {"indexer_bytes_per_token", r.indexer_bytes_per_token},
                {"bytes_per_token", r.bytes_per_token},
                {"kv_gib_per_gpu", r.kv_gib_per_gpu},
                {"blocks_per_gpu", r.blocks_per_gpu},
                {"tokens_per_gpu", r.tokens_per_gpu},
                {"tokens_per_replica", r.tokens_per_replica},
                {"replicas", r.replicas},
                {"total_tokens", r.total_tokens},
                {"max_position_embeddings", m.max_position_embeddings},
                {"max_model_len", r.max_model_len},
                {"pool_request_tokens", r.pool_request_tokens},
                {"max_request_tokens", r.max_request_tokens},
                {"concurrency_tokens", r.concurrency_tokens},
                {"max_concurrency", r.max_concurrency},
                {"defaults_note", note}});
    return Status::Ok();
  }
  fmt::print("model        {} ({}): {} layers + {} MTP{}, {} heads, latent {} + rope {}, context {}\n", m.name,
             m.model_type, m.num_layers, m.num_mtp_layers, p.include_mtp ? "" : " (not cached: --no-mtp)",
             m.num_heads, m.kv_lora_rank, m.qk_rope_head_dim,
             m.max_position_embeddings > 0 ? group(m.max_position_embeddings) : std::string("unknown"));
  fmt::print("deployment   {} GPU x {} GiB, tp {}, dcp {}, mem-util {}, block {}\n", p.gpus, p.gpu_mem_gib, p.tp,
             p.dcp, p.mem_util, p.block_size);
  if (p.weight_gib > 0) {
    fmt::print("reserved     {:.2f} GiB per GPU = weights {:.1f} GiB / tp {} = {:.2f} GiB ({}) + {} GiB activations\n",
               r.reserved_gib_per_gpu, p.weight_gib, p.tp, r.weight_gib_per_gpu, reservation, p.reserved_gib);
  } else {
    fmt::print("reserved     {} GiB per GPU ({})\n", p.reserved_gib, reservation);
  }
  if (!note.empty()) fmt::print("             ({})\n", note);
  fmt::print("format       {}: {} B per token per layer\n", a.format, r.record_bytes);
  fmt::print("per token    {} B = {} cache layers x {} B", group(r.bytes_per_token), r.cache_layers, r.record_bytes);
  if (r.indexer_layers > 0) {
    fmt::print(" + {} indexer layers x {} B", r.indexer_layers, layout::indexer::kRecordBytes);
  }
  fmt::print("\n");
  fmt::print("KV per GPU   {:.2f} GiB -> {} blocks = {} tokens\n", r.kv_gib_per_gpu, group(r.blocks_per_gpu),
             group(r.tokens_per_gpu));
  const std::string dcp = p.dcp > 1 ? fmt::format(", spread over {} DCP ranks", p.dcp) : std::string();
  if (r.max_model_len > 0 && r.max_request_tokens < r.pool_request_tokens) {
    fmt::print("longest request  {} tokens ({}; the pool alone would hold {}{})\n", group(r.max_request_tokens),
               p.max_model_len > 0 ? "--context" : "the model's max_position_embeddings",
               group(r.pool_request_tokens), dcp);
  } else {
    fmt::print("longest request  {} tokens (the pool{}{})\n", group(r.max_request_tokens), dcp,
               r.max_model_len > 0 ? "" : "; the model's context length is unknown");
  }
  fmt::print("concurrency  {:.2f}x requests of {} tokens per replica (vLLM's \"Maximum concurrency for {} tokens "
             "per request\")\n",
             r.max_concurrency, group(r.concurrency_tokens), group(r.concurrency_tokens));
  fmt::print("whole deployment {} replica(s), {} tokens\n", r.replicas, group(r.total_tokens));
  return Status::Ok();
}

}  // namespace

void add_plan_command(Cli& cli) {
  auto a = std::make_shared<PlanArgs>();
  auto* cmd = cli.app.add_subcommand("plan", "KV-cache capacity: bytes per token, tokens per GPU, longest request");
  cmd->add_option("--model", a->model,
                  "A preset (deepseek-v2-lite, deepseek-v3, deepseek-v3.2, kimi-k2, glm-4.7-flash, glm-5, "
                  "glm-5.2), a config.json path, or a checkpoint directory (config.json + safetensors: the "
                  "weights' bytes are summed)")
      ->capture_default_str();
  cmd->add_option("--format", a->format, "KV record format")->capture_default_str();
  cmd->add_option("--gpu-mem", a->gpu_mem, "GiB of memory per GPU (default: the preset's, else 80)");
  cmd->add_option("--gpus", a->gpus, "Number of GPUs (default: --tp, else the preset's, else 1)");
  cmd->add_option("--tp", a->tp, "Tensor-parallel size (default: --gpus, else the preset's, else 1)");
  cmd->add_option("--dcp", a->dcp, "Decode-context-parallel size, divides tp (default 1)");
  cmd->add_option("--mem-util", a->mem_util, "Fraction of GPU memory the engine uses (default 0.9)");
  cmd->add_option("--weight-gib", a->weight_gib,
                  "GiB of weights in the whole checkpoint, split over tp (default: the preset's, or the "
                  "directory's safetensors bytes)");
  cmd->add_option("--activation-gib", a->activation_gib,
                  "GiB per GPU for activations, CUDA graphs and allocator slack, besides the weights")
      ->capture_default_str();
  cmd->add_option("--reserved", a->reserved,
                  "GiB per GPU that is not KV (weights and activations), instead of deriving it from the weights");
  cmd->add_option("--context", a->context,
                  "Tokens per request (vLLM's --max-model-len) for the longest request and the concurrency figure "
                  "(default: the model's max_position_embeddings)");
  cmd->add_flag("--no-mtp", a->no_mtp, "The MTP layers keep no KV (speculative decoding off)");
  cmd->add_option("--block-size", a->block_size, "Tokens per cache block")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([&cli, a] { cli.action = [a] { return run_plan(*a); }; });
}

}  // namespace mlakv::cli
