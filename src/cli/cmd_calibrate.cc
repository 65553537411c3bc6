// mlakv calibrate: NVFP4 outer scales (nvfp4_ds_mla_outer_scale_v1) from captured
// kv_c_normed activations (docs/calibration.md).
#include <fmt/format.h>

#include "cli/cli.h"
#include "mlakv/file_io.h"
#include "mlakv/outer_scales.h"
#include "mlakv/safetensors.h"

namespace mlakv::cli {
namespace {

struct CalibrateArgs {
  std::vector<std::string> activations;
  std::string out;
  int num_layers = 0;
  bool json = false;
};

Status run_calibrate(const CalibrateArgs& a) {
  if (a.num_layers < 0) return invalid_argument(fmt::format("--num-layers must be >= 0, got {}", a.num_layers));
  for (const std::string& path : a.activations) {
    MLAKV_RETURN_IF_ERROR(io::check_not_same_file(a.out, "--out", path, "--activations"));
  }
  OuterScaleCalibrator cal;
  for (const std::string& path : a.activations) {
    MLAKV_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(path));
    MLAKV_RETURN_IF_ERROR(cal.add_capture(*f).status());
  }
  MLAKV_ASSIGN_OR_RETURN(OuterScales s, cal.finish(a.num_layers));
  MLAKV_RETURN_IF_ERROR(write_outer_scales(a.out, s));
  if (a.json) {
    nlohmann::json layers = nlohmann::json::array();
    for (int l = 0; l < s.num_layers(); ++l) {
      layers.push_back({{"layer", l},
                        {"tokens", cal.tokens()[static_cast<std::size_t>(l)]},
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
    fmt::print("{:>6}{:>10}{:>14.6g}{:>14.6g}\n", l, cal.tokens()[static_cast<std::size_t>(l)],
               s.max_abs[static_cast<std::size_t>(l)], s.scales[static_cast<std::size_t>(l)]);
  }
  fmt::print("wrote {} ({} layers; layers past {} use 1.0)\n", a.out, s.num_layers(), s.num_layers() - 1);
  return Status::Ok();
}

}  // namespace

void add_calibrate_command(Cli& cli) {
  auto a = std::make_shared<CalibrateArgs>();
  auto* cmd = cli.app.add_subcommand("calibrate", "NVFP4 outer scales from captured kv_c_normed activations");
  cmd->add_option("--activations", a->activations,
                  "safetensors capture(s) holding layers.<i>.kv_c_normed [T, 512] (repeatable)")
      ->required();
  cmd->add_option("--out", a->out, "Scale file to write (nvfp4_ds_mla_outer_scale_v1 JSON)")->required();
  cmd->add_option("--num-layers", a->num_layers, "Layers the file covers (0 = one past the highest captured)")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([&cli, a] { cli.action = [a] { return run_calibrate(*a); }; });
}

}  // namespace mlakv::cli
