// mlakv plan: KV-cache capacity for a model, format and deployment.
#include <fmt/format.h>

#include <filesystem>

#include "cli/cli.h"
#include "mlakv/hf_config.h"
#include "mlakv/plan.h"

namespace mlakv::cli {
namespace {

struct PlanArgs {
  std::string model = "glm-5.2";
  std::string format = "fp8_ds_mla";
  std::optional<double> gpu_mem, mem_util, reserved;
  std::optional<int> gpus, tp, dcp;
  int block_size = 64;
  bool json = false;
};

StatusOr<ModelPreset> resolve_model(const std::string& name) {
  if (auto p = find_model_preset(name)) return *p;
  std::error_code ec;
  if (std::filesystem::exists(name, ec)) {
    MLAKV_ASSIGN_OR_RETURN(ModelConfig c, load_hf_config(name));
    ModelPreset p{"", std::move(c), DeploymentDefaults{}};
    p.deploy.note = "generic defaults (1 x 80 GiB, no reservation): pass --gpus/--gpu-mem/--reserved";
    return p;
  }
  std::string names;
  for (const ModelPreset& p : model_presets()) names += fmt::format("{}{}", names.empty() ? "" : ", ", p.name);
  return not_found(fmt::format("--model: '{}' is neither a preset ({}) nor an existing config.json path", name,
                               names));
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
  MLAKV_ASSIGN_OR_RETURN(ModelPreset preset, resolve_model(a.model));
  auto fmt_id = parse_format(a.format);
  if (!fmt_id) return invalid_argument(fmt::format("--format: unknown format '{}' (see 'mlakv formats')", a.format));
  PlanParams p;
  p.format = *fmt_id;
  p.gpus = a.gpus.value_or(preset.deploy.gpus);
  p.gpu_mem_gib = a.gpu_mem.value_or(preset.deploy.gpu_mem_gib);
  p.tp = a.tp.value_or(a.gpus ? std::min(*a.gpus, preset.deploy.tp) : preset.deploy.tp);
  p.dcp = a.dcp.value_or(preset.deploy.dcp);
  p.mem_util = a.mem_util.value_or(preset.deploy.mem_util);
  p.reserved_gib = a.reserved.value_or(preset.deploy.reserved_gib);
  p.block_size = a.block_size;
  MLAKV_ASSIGN_OR_RETURN(PlanResult r, plan_capacity(preset.config, p));
  const ModelConfig& m = preset.config;
  if (a.json) {
    print_json({{"model", m.name},
                {"model_type", m.model_type},
                {"format", a.format},
                {"layers", m.num_layers},
                {"mtp_layers", m.num_mtp_layers},
                {"cache_layers", r.cache_layers},
                {"indexer_layers", r.indexer_layers},
                {"gpus", p.gpus},
                {"gpu_mem_gib", p.gpu_mem_gib},
                {"tp", p.tp},
                {"dcp", p.dcp},
                {"mem_util", p.mem_util},
                {"reserved_gib", p.reserved_gib},
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
                {"max_request_tokens", r.max_request_tokens},
                {"defaults_note", std::string(preset.deploy.note)}});
    return Status::Ok();
  }
  fmt::print("model        {} ({}): {} layers + {} MTP, {} heads, latent {} + rope {}\n", m.name, m.model_type,
             m.num_layers, m.num_mtp_layers, m.num_heads, m.kv_lora_rank, m.qk_rope_head_dim);
  fmt::print("deployment   {} GPU x {} GiB, tp {}, dcp {}, mem-util {}, reserved {} GiB, block {}\n", p.gpus,
             p.gpu_mem_gib, p.tp, p.dcp, p.mem_util, p.reserved_gib, p.block_size);
  if (!preset.deploy.note.empty()) fmt::print("             ({})\n", preset.deploy.note);
  fmt::print("format       {}: {} B per token per layer\n", a.format, r.record_bytes);
  fmt::print("per token    {} B = {} cache layers x {} B", group(r.bytes_per_token), r.cache_layers, r.record_bytes);
  if (r.indexer_layers > 0) {
    fmt::print(" + {} indexer layers x {} B", r.indexer_layers, layout::indexer::kRecordBytes);
  }
  fmt::print("\n");
  fmt::print("KV per GPU   {:.2f} GiB -> {} blocks = {} tokens\n", r.kv_gib_per_gpu, group(r.blocks_per_gpu),
             group(r.tokens_per_gpu));
  fmt::print("longest request  {} tokens{}\n", group(r.max_request_tokens),
             p.dcp > 1 ? fmt::format(" (spread over {} DCP ranks)", p.dcp) : std::string());
  fmt::print("whole deployment {} replica(s), {} tokens\n", r.replicas, group(r.total_tokens));
  return Status::Ok();
}

}  // namespace

void add_plan_command(Cli& cli) {
  auto a = std::make_shared<PlanArgs>();
  auto* cmd = cli.app.add_subcommand("plan", "KV-cache capacity: bytes per token, tokens per GPU, longest request");
  cmd->add_option("--model", a->model,
                  "Preset (deepseek-v2-lite, deepseek-v3, deepseek-v3.2, kimi-k2, glm-4.7-flash, glm-5, "
                  "glm-5.2) or a config.json path")
      ->capture_default_str();
  cmd->add_option("--format", a->format, "KV record format")->capture_default_str();
  cmd->add_option("--gpu-mem", a->gpu_mem, "GiB of memory per GPU (default: the preset's)");
  cmd->add_option("--gpus", a->gpus, "Number of GPUs (default: the preset's)");
  cmd->add_option("--tp", a->tp, "Tensor-parallel size (default: the preset's)");
  cmd->add_option("--dcp", a->dcp, "Decode-context-parallel size, divides tp (default 1)");
  cmd->add_option("--mem-util", a->mem_util, "Fraction of GPU memory the engine uses (default 0.9)");
  cmd->add_option("--reserved", a->reserved, "GiB per GPU for weights and activations (default: the preset's)");
  cmd->add_option("--block-size", a->block_size, "Tokens per cache block")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([&cli, a] { cli.action = [a] { return run_plan(*a); }; });
}

}  // namespace mlakv::cli
