// The `mlakv` command line: each subcommand registers itself on the CLI11 app and
// leaves the action to run in `Cli::action`; main() runs it and turns a failed
// Status into "error: ..." on stderr and a non-zero exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <string>

#include "mlakv/status.h"

namespace mlakv::cli {

struct Cli {
  CLI::App app{"mlakv: Multi-head Latent Attention KV caches and attention"};
  std::function<Status()> action;
};

void add_formats_command(Cli& cli);
void add_codec_command(Cli& cli);
void add_plan_command(Cli& cli);
void add_demo_command(Cli& cli);
void add_layer_forward_command(Cli& cli);
void add_calibrate_command(Cli& cli);
void add_absorb_command(Cli& cli);
void add_weights_commands(Cli& cli);
void add_eval_command(Cli& cli);  // eval and generate

// Prints JSON to stdout, 2-space indented.
void print_json(const nlohmann::json& j);

// The model as output files' metadata names it: a preset as is, a checkpoint by its
// directory's own name (never an absolute path: files stay shareable).
inline std::string portable_name(const std::string& name) {
  std::filesystem::path p(name);
  if (p.filename() == "config.json") p = p.parent_path();
  if (p.filename().empty()) p = p.parent_path();  // "dir/"
  const std::string base = p.filename().string();
  return base.empty() ? name : base;
}

}  // namespace mlakv::cli
