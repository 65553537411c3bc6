// mlakv absorb: build W_UK_T / W_UV from a checkpoint's (or a synthetic) kv_b_proj, and
// with --report compare the two allocation orders' memory figures (docs/absorb.md).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/cli.h"
#include "cli/progress.h"
#include "mlakv/file_io.h"
#include "mlakv/absorb.h"
#include "mlakv/hf_config.h"
#include "mlakv/safetensors.h"
#include "mlakv/synthetic_weights.h"

namespace mlakv::cli {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = kMiB * 1024.0;

// x units as bytes: finite, >= 0 and at most 2^60 bytes, else nullopt.
std::optional<std::size_t> checked_bytes(double x, double unit) {
  if (!std::isfinite(x) || x < 0 || x * unit > 1152921504606846976.0) return std::nullopt;
  return static_cast<std::size_t>(x * unit);
}

struct AbsorbArgs {
  std::string model_dir;
  std::string model_positional;  // deprecated `absorb MODEL_DIR`
  std::string synthetic;
  std::string encoding;  // "" = detected (checkpoint) / fp8 (synthetic)
  int tp = 1;
  int tp_rank = 0;
  std::optional<int> layers;
  bool no_mtp = false;
  std::string dtype = "bf16";
  std::string scratch_dtype;  // "" = dtype
  std::string order = "persistent-first";
  bool stage_quantized = false;
  bool report = false;
  std::optional<double> gpu_mem;
  std::string quantized_copy = "persistent";
  double other_weights_mib = 0;
  bool host_memory = false;
  std::string out;
  bool json = false;
};

StatusOr<WeightEncoding> parse_encoding(const std::string& s) {
  static const std::map<std::string, WeightEncoding> kNames = {
      {"dense", WeightEncoding::kDense},
      {"fp8", WeightEncoding::kFp8Block},
      {"fp8_block", WeightEncoding::kFp8Block},
      {"nvfp4", WeightEncoding::kModelOptNvfp4},
      {"modelopt_nvfp4", WeightEncoding::kModelOptNvfp4},
      {"compressed_tensors_nvfp4", WeightEncoding::kCompressedTensorsNvfp4},
      {"gptq", WeightEncoding::kGptq},
      {"awq", WeightEncoding::kAwq},
  };
  auto it = kNames.find(s);
  if (it == kNames.end()) {
    return invalid_argument(fmt::format(
        "--encoding: unknown '{}' (dense, fp8, nvfp4, compressed_tensors_nvfp4, gptq, awq)", s));
  }
  return it->second;
}

StatusOr<DType> parse_dtype(const std::string& s, const char* option) {
  if (s == "bf16") return DType::kBF16;
  if (s == "f32") return DType::kF32;
  return invalid_argument(fmt::format("{}: '{}' is not bf16 or f32", option, s));
}

StatusOr<AllocationOrder> parse_order(const std::string& s) {
  if (s == "persistent-first" || s == "persistent_first") return AllocationOrder::kPersistentFirst;
  if (s == "scratch-first" || s == "scratch_first") return AllocationOrder::kScratchFirst;
  return invalid_argument(fmt::format("--order: '{}' is not persistent-first or scratch-first", s));
}

StatusOr<QuantizedCopy> parse_quantized_copy(const std::string& s) {
  if (s == "none") return QuantizedCopy::kNone;
  if (s == "transient") return QuantizedCopy::kTransient;
  if (s == "persistent") return QuantizedCopy::kPersistent;
  return invalid_argument(fmt::format("--quantized-copy: '{}' is not none, transient or persistent", s));
}

// The weights to absorb: a checkpoint directory or a synthetic one of a preset's geometry.
struct Source {
  ModelConfig config;
  std::unique_ptr<TensorSource> tensors;
  WeightQuantOptions quant;
  double default_gpu_gib = 80.0;
};

StatusOr<Source> open_source(const AbsorbArgs& a) {
  if (a.model_dir.empty() == a.synthetic.empty()) {
    return invalid_argument("give exactly one of --model DIR (a checkpoint directory) and --synthetic PRESET");
  }
  Source s;
  std::optional<WeightEncoding> forced;
  if (!a.encoding.empty()) {
    MLAKV_ASSIGN_OR_RETURN(WeightEncoding e, parse_encoding(a.encoding));
    forced = e;
  }
  if (!a.synthetic.empty()) {
    std::optional<ModelPreset> preset = find_model_preset(a.synthetic);
    if (!preset) {
      std::string names;
      for (const ModelPreset& p : model_presets()) names += fmt::format("{}{}", names.empty() ? "" : ", ", p.name);
      return not_found(fmt::format("--synthetic: no preset '{}' ({})", a.synthetic, names));
    }
    s.config = preset->config;
    s.default_gpu_gib = preset->deploy.gpu_mem_gib;
    synthetic::KvBProjCheckpointSpec spec;
    spec.layers = s.config.cache_layers();
    spec.encoding = forced.value_or(WeightEncoding::kFp8Block);
    MLAKV_ASSIGN_OR_RETURN(s.tensors, synthetic::make_kv_b_proj_checkpoint(s.config, spec));
  } else {
    MLAKV_ASSIGN_OR_RETURN(s.config, load_hf_config(a.model_dir));
    MLAKV_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::open(a.model_dir));
    s.tensors = std::move(ckpt);
    // The checkpoint's quantization_config says what the tensors cannot (fp8 block shape,
    // GPTQ zero convention, group size).
    MLAKV_ASSIGN_OR_RETURN(s.quant, load_checkpoint_quant_options(a.model_dir));
  }
  s.quant.encoding = forced;
  if (a.layers) {
    if (*a.layers < 1 || *a.layers > s.config.num_layers) {
      return invalid_argument(fmt::format("--layers {}: must be in [1, {}] (the model's decoder layers)", *a.layers,
                                          s.config.num_layers));
    }
    s.config.num_layers = *a.layers;
    s.config.num_mtp_layers = 0;
    s.config.indexer_layers = std::min(s.config.indexer_layers, s.config.num_layers);
  }
  return s;
}

StatusOr<AbsorbModelOptions> model_options(const AbsorbArgs& a, const Source& s) {
  AbsorbModelOptions o;
  MLAKV_ASSIGN_OR_RETURN(o.absorb.dtype, parse_dtype(a.dtype, "--dtype"));
  if (!a.scratch_dtype.empty()) {
    MLAKV_ASSIGN_OR_RETURN(DType sd, parse_dtype(a.scratch_dtype, "--scratch-dtype"));
    o.absorb.scratch_dtype = sd;
  }
  MLAKV_ASSIGN_OR_RETURN(o.absorb.order, parse_order(a.order));
  o.absorb.stage_quantized = a.stage_quantized;
  o.absorb.quant = s.quant;
  o.tp_size = a.tp;
  o.tp_rank = a.tp_rank;
  o.include_mtp = !a.no_mtp;
  return o;
}

nlohmann::json run_json(const AbsorbMemoryRun& r) {
  const AllocatorStats& l = r.after_load;
  const AllocatorStats& e = r.after_empty_cache;
  return {{"order", std::string(allocation_order_name(r.order))},
          {"allocated_bytes", l.allocated_bytes},
          {"reserved_bytes", l.reserved_bytes},
          {"reserved_but_unallocated_bytes", l.reserved_but_unallocated},
          {"largest_free_block_bytes", l.largest_free_block},
          {"segments", l.num_segments},
          {"peak_reserved_bytes", l.peak_reserved},
          {"after_empty_cache",
           {{"reserved_bytes", e.reserved_bytes},
            {"reserved_but_unallocated_bytes", e.reserved_but_unallocated},
            {"largest_free_block_bytes", e.largest_free_block},
            {"segments", e.num_segments}}},
          {"requested_bytes", r.requested_bytes},
          {"overhead_bytes", l.reserved_bytes - r.requested_bytes},
          {"kv_cache_max_bytes", r.kv_cache_max_bytes}};
}

// A failure while MTP layers are included says how to leave them out.
Status with_mtp_hint(const Status& st, const Source& s, const AbsorbModelOptions& o) {
  if (!o.include_mtp || s.config.num_mtp_layers == 0) return st;
  return Status(st.code(), fmt::format("{} (the config declares {} MTP layer(s) from model.layers.{}; --no-mtp skips "
                                       "them)",
                                       st.message(), s.config.num_mtp_layers, s.config.num_layers));
}

Status run_report(const AbsorbArgs& a, const Source& s, const AbsorbModelOptions& base) {
  AbsorbMemoryOptions mem;
  const double gib = a.gpu_mem.value_or(s.default_gpu_gib);
  if (!(gib > 0)) return invalid_argument(fmt::format("--gpu-mem {}: must be > 0 GiB", gib));
  if (!(a.other_weights_mib >= 0)) {
    return invalid_argument(fmt::format("--other-weights-mib {}: must be >= 0", a.other_weights_mib));
  }
  // double -> size_t only when finite and in range (--gpu-mem inf, 1e300).
  const std::optional<std::size_t> device_bytes = checked_bytes(gib, kGiB);
  if (!device_bytes) return invalid_argument(fmt::format("--gpu-mem {}: must be a finite size up to 2^50 GiB", gib));
  const std::optional<std::size_t> other_bytes = checked_bytes(a.other_weights_mib, kMiB);
  if (!other_bytes) {
    return invalid_argument(
        fmt::format("--other-weights-mib {}: must be a finite size up to 2^60 MiB", a.other_weights_mib));
  }
  mem.device_bytes = *device_bytes;
  mem.virtual_device = !a.host_memory;
  MLAKV_ASSIGN_OR_RETURN(mem.quantized_copy, parse_quantized_copy(a.quantized_copy));
  mem.other_weights_bytes = *other_bytes;
  AbsorbModelOptions o = base;
  std::unique_ptr<Progress> pr;
  const int per_run = s.config.num_layers + (o.include_mtp ? s.config.num_mtp_layers : 0);
  if (!a.json) pr = std::make_unique<Progress>("absorbing in both orders", 2 * per_run);
  int done = 0;
  o.progress = [&](int, int) {
    if (pr) pr->update(++done);
  };
  StatusOr<AbsorbMemoryReport> measured = measure_absorb_memory(*s.tensors, s.config, o, mem);
  if (!measured.ok()) return with_mtp_hint(measured.status(), s, o);
  const AbsorbMemoryReport& r = *measured;
  if (pr) pr->finish();

  const MlaGeometry& g = r.rank_geometry;
  const DType sdt = o.absorb.scratch_dtype.value_or(o.absorb.dtype);
  const auto rbu_change = static_cast<double>(r.persistent_first.after_load.reserved_but_unallocated) -
                          static_cast<double>(r.scratch_first.after_load.reserved_but_unallocated);
  const auto rbu_change_ec = static_cast<double>(r.persistent_first.after_empty_cache.reserved_but_unallocated) -
                             static_cast<double>(r.scratch_first.after_empty_cache.reserved_but_unallocated);
  if (a.json) {
    print_json({{"model", s.config.name},
                {"source", s.tensors->describe()},
                {"encoding", std::string(weight_encoding_name(r.encoding))},
                {"layers", r.layers},
                {"tp", o.tp_size},
                {"tp_rank", o.tp_rank},
                {"heads_per_rank", g.num_heads},
                {"qk_nope_head_dim", g.qk_nope_head_dim},
                {"v_head_dim", g.v_head_dim},
                {"kv_lora_rank", g.kv_lora_rank},
                {"dtype", std::string(dtype_name(o.absorb.dtype))},
                {"scratch_dtype", std::string(dtype_name(sdt))},
                {"quantized_copy", std::string(quantized_copy_name(mem.quantized_copy))},
                {"other_weights_bytes_per_layer", mem.other_weights_bytes},
                {"device_bytes", mem.device_bytes},
                {"device", mem.virtual_device ? "virtual" : "host"},
                {"pair_bytes_per_layer", r.pair_bytes_per_layer},
                {"scratch_bytes_per_layer", r.scratch_bytes_per_layer},
                {"quantized_bytes_per_layer", r.quantized_bytes_per_layer},
                {"scratch_first", run_json(r.scratch_first)},
                {"persistent_first", run_json(r.persistent_first)},
                {"reserved_but_unallocated_change_bytes", static_cast<int64_t>(rbu_change)},
                {"reserved_but_unallocated_change_after_empty_cache_bytes", static_cast<int64_t>(rbu_change_ec)}});
    return Status::Ok();
  }
  fmt::print("model      {} ({})\n", s.config.name, s.tensors->describe());
  fmt::print("geometry   {} layers, tp {} rank {}: {} heads x (P {} + V {}), L {}; kv_b_proj {}\n", r.layers,
             o.tp_size, o.tp_rank, g.num_heads, g.qk_nope_head_dim, g.v_head_dim, g.kv_lora_rank,
             weight_encoding_name(r.encoding));
  fmt::print("per layer  W_UK_T + W_UV {:.2f} MiB {}, scratch {:.2f} MiB {}, quantized kv_b_proj {:.2f} MiB ({}), "
             "other weights {:.2f} MiB\n",
             r.pair_bytes_per_layer / kMiB, dtype_name(o.absorb.dtype), r.scratch_bytes_per_layer / kMiB,
             dtype_name(sdt), r.quantized_bytes_per_layer / kMiB, quantized_copy_name(mem.quantized_copy),
             mem.other_weights_bytes / kMiB);
  fmt::print("device     {:.1f} GiB, {}\n\n", gib,
             mem.virtual_device ? "virtual backing (placement only, no memory touched)" : "host backing (values computed)");
  const AbsorbMemoryRun& sf = r.scratch_first;
  const AbsorbMemoryRun& pf = r.persistent_first;
  auto row = [](const char* what, double x, double y, const char* unit, int prec) {
    fmt::print("  {:<44} {:>14.{}f} {:>16.{}f}  {}\n", what, x, prec, y, prec, unit);
  };
  fmt::print("  {:<44} {:>14} {:>16}\n", "", "scratch-first", "persistent-first");
  row("allocated", sf.after_load.allocated_bytes / kGiB, pf.after_load.allocated_bytes / kGiB, "GiB", 3);
  row("requested by live tensors", sf.requested_bytes / kGiB, pf.requested_bytes / kGiB, "GiB", 3);
  row("reserved", sf.after_load.reserved_bytes / kGiB, pf.after_load.reserved_bytes / kGiB, "GiB", 3);
  row("reserved - requested (all waste)", (sf.after_load.reserved_bytes - sf.requested_bytes) / kMiB,
      (pf.after_load.reserved_bytes - pf.requested_bytes) / kMiB, "MiB", 1);
  row("reserved but unallocated", sf.after_load.reserved_but_unallocated / kGiB,
      pf.after_load.reserved_but_unallocated / kGiB, "GiB", 3);
  row("largest free block", sf.after_load.largest_free_block / kMiB, pf.after_load.largest_free_block / kMiB, "MiB",
      1);
  row("segments", static_cast<double>(sf.after_load.num_segments), static_cast<double>(pf.after_load.num_segments),
      "", 0);
  row("reserved but unallocated, after empty_cache", sf.after_empty_cache.reserved_but_unallocated / kGiB,
      pf.after_empty_cache.reserved_but_unallocated / kGiB, "GiB", 3);
  row("largest free block, after empty_cache", sf.after_empty_cache.largest_free_block / kMiB,
      pf.after_empty_cache.largest_free_block / kMiB, "MiB", 1);
  row("largest KV cache allocation", sf.kv_cache_max_bytes / kGiB, pf.kv_cache_max_bytes / kGiB, "GiB", 3);
  fmt::print("\npersistent-first changes reserved-but-unallocated by {:+.1f} MiB ({:+.1f} MiB after empty_cache)\n",
             rbu_change / kMiB, rbu_change_ec / kMiB);
  return Status::Ok();
}

// A config that declares MTP layers the checkpoint does not ship (many published
// checkpoints drop them): absorb the decoder layers only, and say so.
bool mtp_missing(const AbsorbArgs& a, const Source& s) {
  if (a.no_mtp || !a.synthetic.empty() || a.layers || s.config.num_mtp_layers == 0) return false;
  const std::string prefix = fmt::format("model.layers.{}.self_attn.kv_b_proj.", s.config.num_layers);
  for (const std::string& n : s.tensors->names()) {
    if (n.compare(0, prefix.size(), prefix) == 0) return false;
  }
  return true;
}

Status run_absorb(AbsorbArgs a) {
  if (!a.model_positional.empty()) {
    if (!a.model_dir.empty()) return invalid_argument("give the checkpoint once: --model DIR (MODEL_DIR is deprecated)");
    std::fprintf(stderr, "note: 'mlakv absorb MODEL_DIR' is deprecated; use 'mlakv absorb --model MODEL_DIR'\n");
    a.model_dir = a.model_positional;
  }
  MLAKV_ASSIGN_OR_RETURN(Source s, open_source(a));
  if (mtp_missing(a, s)) {
    std::fprintf(stderr,
                 "note: %s declares %d MTP layer(s) but the checkpoint ships no model.layers.%d.self_attn.kv_b_proj: "
                 "absorbing the %d decoder layers only (as --no-mtp)\n",
                 portable_name(s.config.name).c_str(), s.config.num_mtp_layers, s.config.num_layers,
                 s.config.num_layers);
    a.no_mtp = true;
  }
  MLAKV_ASSIGN_OR_RETURN(AbsorbModelOptions o, model_options(a, s));
  if (a.report) {
    if (!a.out.empty()) return invalid_argument("--out: not with --report (the report computes no values)");
    return run_report(a, s, o);
  }
  std::optional<std::size_t> limit;
  if (a.gpu_mem) {
    if (!(*a.gpu_mem > 0)) return invalid_argument(fmt::format("--gpu-mem {}: must be > 0 GiB", *a.gpu_mem));
    limit = checked_bytes(*a.gpu_mem, kGiB);
    if (!limit) return invalid_argument(fmt::format("--gpu-mem {}: must be a finite size up to 2^50 GiB", *a.gpu_mem));
  }
  CachingAllocator alloc(make_host_backing(limit));
  std::unique_ptr<Progress> pr;
  const int total = s.config.num_layers + (o.include_mtp ? s.config.num_mtp_layers : 0);
  if (!a.json) pr = std::make_unique<Progress>("absorbing kv_b_proj", total);
  o.progress = [&](int done, int) {
    if (pr) pr->update(done);
  };
  StatusOr<std::vector<AbsorbedLayer>> absorbed = absorb_model(*s.tensors, s.config, alloc, o);
  if (!absorbed.ok()) return with_mtp_hint(absorbed.status(), s, o);
  std::vector<AbsorbedLayer> layers = std::move(*absorbed);
  if (pr) pr->finish();
  const AllocatorStats st = alloc.stats();
  if (!a.out.empty()) {
    if (const auto* ckpt = dynamic_cast<const Checkpoint*>(s.tensors.get())) {
      for (const auto& shard : ckpt->shards()) {
        MLAKV_RETURN_IF_ERROR(io::check_not_same_file(a.out, "--out", shard->path(), "a MODEL_DIR shard"));
      }
    }
    std::vector<std::pair<std::string, TensorView>> tensors;
    for (const AbsorbedLayer& l : layers) {
      tensors.emplace_back(fmt::format("model.layers.{}.self_attn.W_UK_T", l.layer), l.w_uk_t());
      tensors.emplace_back(fmt::format("model.layers.{}.self_attn.W_UV", l.layer), l.w_uv());
    }
    MLAKV_RETURN_IF_ERROR(write_safetensors(
        a.out, tensors,
        {{"mlakv", "absorbed MLA weights: W_UK_T [H, P, L], W_UV [H, L, V]"},
         {"model", portable_name(s.config.name)},
         {"tp", fmt::format("{} rank {}", o.tp_size, o.tp_rank)},
         {"allocation_order", std::string(allocation_order_name(o.absorb.order))}}));
  }
  const AbsorbedLayer& first = layers.front();
  const MlaGeometry& g = first.geometry;
  if (a.json) {
    print_json({{"model", s.config.name},
                {"source", s.tensors->describe()},
                {"layers", layers.size()},
                {"encoding", std::string(weight_encoding_name(first.source_encoding))},
                {"dtype", std::string(dtype_name(first.dtype))},
                {"order", std::string(allocation_order_name(o.absorb.order))},
                {"tp", o.tp_size},
                {"tp_rank", o.tp_rank},
                {"w_uk_t_shape", {g.num_heads, g.qk_nope_head_dim, g.kv_lora_rank}},
                {"w_uv_shape", {g.num_heads, g.kv_lora_rank, g.v_head_dim}},
                {"allocated_bytes", st.allocated_bytes},
                {"reserved_bytes", st.reserved_bytes},
                {"reserved_but_unallocated_bytes", st.reserved_but_unallocated},
                {"largest_free_block_bytes", st.largest_free_block},
                {"out", a.out}});
    return Status::Ok();
  }
  fmt::print("absorbed {} layers of {} ({} kv_b_proj) into {} W_UK_T {} + W_UV {}, {} order, tp {} rank {}\n",
             layers.size(), s.config.name, weight_encoding_name(first.source_encoding), dtype_name(first.dtype),
             first.w_uk_t().shape_string(), first.w_uv().shape_string(), allocation_order_name(o.absorb.order),
             o.tp_size, o.tp_rank);
  fmt::print("allocator: {:.3f} GiB allocated, {:.3f} GiB reserved, {:.1f} MiB reserved but unallocated, largest "
             "free block {:.1f} MiB\n",
             st.allocated_bytes / kGiB, st.reserved_bytes / kGiB, st.reserved_but_unallocated / kMiB,
             st.largest_free_block / kMiB);
  if (!a.out.empty()) fmt::print("wrote {} ({} tensors)\n", a.out, 2 * layers.size());
  return Status::Ok();
}

}  // namespace

void add_absorb_command(Cli& cli) {
  auto a = std::make_shared<AbsorbArgs>();
  auto* cmd = cli.app.add_subcommand(
      "absorb", "Build the absorbed MLA weights W_UK_T / W_UV from kv_b_proj; --report compares allocation orders");
  cmd->add_option("--model", a->model_dir, "Checkpoint directory (config.json + safetensors), as layer-forward takes");
  cmd->add_option("MODEL_DIR", a->model_positional, "Deprecated: the checkpoint directory (use --model)");
  cmd->add_option("--synthetic", a->synthetic, "Generate a preset's kv_b_proj instead of reading one (e.g. glm-5.2)");
  cmd->add_option("--encoding", a->encoding,
                  "kv_b_proj encoding: fp8, nvfp4, compressed_tensors_nvfp4, dense, gptq, awq (default: detected; "
                  "fp8 for --synthetic)");
  cmd->add_option("--tp", a->tp, "Tensor-parallel size (heads split across ranks)")->capture_default_str();
  cmd->add_option("--tp-rank", a->tp_rank, "The rank whose heads are absorbed")->capture_default_str();
  cmd->add_option("--layers", a->layers, "Absorb only the first N decoder layers (no MTP)");
  cmd->add_flag("--no-mtp", a->no_mtp,
                "Skip the model's MTP layers (automatic when the config declares MTP layers the checkpoint does not "
                "ship)");
  cmd->add_option("--dtype", a->dtype, "W_UK_T / W_UV dtype: bf16 or f32")->capture_default_str();
  cmd->add_option("--scratch-dtype", a->scratch_dtype, "Dequantization scratch dtype: bf16 or f32 (default: --dtype)");
  cmd->add_option("--order", a->order, "persistent-first or scratch-first (legacy)")->capture_default_str();
  cmd->add_flag("--stage-quantized", a->stage_quantized,
                "Copy the quantized tensors into allocator memory before dequantizing, as a device loader does (with "
                "--report: --quantized-copy transient)");
  cmd->add_flag("--report", a->report, "Load in both orders on a modelled GPU and compare the memory figures");
  cmd->add_option("--gpu-mem", a->gpu_mem, "GiB of the modelled GPU (default: the preset's, else 80)");
  cmd->add_option("--quantized-copy", a->quantized_copy,
                  "--report: the quantized kv_b_proj on the device: persistent (kept, as vLLM does), transient "
                  "(uploaded and freed per layer) or none")
      ->capture_default_str();
  cmd->add_option("--other-weights-mib", a->other_weights_mib,
                  "--report: MiB of other persistent weights placed per layer before its kv_b_proj")
      ->capture_default_str();
  cmd->add_flag("--host-memory", a->host_memory,
                "--report: allocate real host memory and compute values (default: a virtual device, no RAM)");
  cmd->add_option("--out", a->out,
                  "Write the absorbed pairs to this .safetensors file (model.layers.<i>.self_attn.W_UK_T / W_UV: the "
                  "decode-time weights a serving engine would precompute; docs/absorb.md)");
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([&cli, a] { cli.action = [a] { return run_absorb(*a); }; });
}

}  // namespace mlakv::cli
