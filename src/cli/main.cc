#include <fmt/format.h>

#include <cstdio>
#include <string_view>

#include "cli/cli.h"

namespace mlakv::cli {

void print_json(const nlohmann::json& j) { fmt::print("{}\n", j.dump(2)); }

namespace {
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
}  // namespace

}  // namespace mlakv::cli

// Exit codes (README "Exit codes"): 0 success; 1 the command ran and failed (the Status
// names why); 2 usage: the command line does not parse (unknown option, missing or
// malformed value). Under --json a failure is also printed to stdout as
// {"error": {"code": "...", "message": "..."}}.
int main(int argc, char** argv) {
  using namespace mlakv::cli;
  bool json = false;
  for (int i = 1; i < argc; ++i) json = json || std::string_view(argv[i]) == "--json";
  auto json_error = [json](std::string_view code, const std::string& message) {
    if (json) print_json({{"error", {{"code", std::string(code)}, {"message", message}}}});
  };
  Cli cli;
  cli.app.require_subcommand(1);
  cli.app.set_version_flag("--version", "mlakv 0.1.0");
  add_formats_command(cli);
  add_codec_command(cli);
  add_plan_command(cli);
  add_demo_command(cli);
  add_layer_forward_command(cli);
  add_calibrate_command(cli);
  add_absorb_command(cli);
  add_eval_command(cli);
  try {
    cli.app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return cli.app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return cli.app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return cli.app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    std::fprintf(stderr, "run 'mlakv --help' (or 'mlakv <command> --help') for usage\n");
    json_error("usage", e.what());
    return kExitUsage;
  }
  if (!cli.action) {
    std::fprintf(stderr, "error: no command given\n");
    json_error("usage", "no command given");
    return kExitUsage;
  }
  const mlakv::Status st = cli.action();
  if (!st.ok()) {
    std::fprintf(stderr, "error: %s\n", st.message().c_str());
    json_error(mlakv::status_code_name(st.code()), st.message());
    return kExitFailure;
  }
  return 0;
}
