#include <fmt/format.h>

#include <cstdio>

#include "cli/cli.h"

namespace mlakv::cli {

void print_json(const nlohmann::json& j) { fmt::print("{}\n", j.dump(2)); }

}  // namespace mlakv::cli

int main(int argc, char** argv) {
  using namespace mlakv::cli;
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
    return e.get_exit_code() != 0 ? e.get_exit_code() : 2;
  }
  if (!cli.action) {
    std::fprintf(stderr, "error: no command given\n");
    return 2;
  }
  const mlakv::Status st = cli.action();
  if (!st.ok()) {
    std::fprintf(stderr, "error: %s\n", st.message().c_str());
    return 1;
  }
  return 0;
}
