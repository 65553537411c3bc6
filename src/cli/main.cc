#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <new>

#include "cli/cli.h"
#include "mlakv/untrusted.h"

namespace mlakv::cli {

// Strings that are not valid UTF-8 (a path, a name from a file) are printed with
// U+FFFD instead of throwing nlohmann::type_error after the work is done.
void print_json(const nlohmann::json& j) {
  fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
}

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
  // Nothing escapes: a failed Status, an exception from any layer (allocation, a JSON
  // type error, CLI11) all end as "error: ..." and exit 1. Messages are escaped once
  // more (mlakv/untrusted.h) so no control byte reaches the terminal.
  mlakv::Status st;
  try {
    st = cli.action();
  } catch (const std::bad_alloc&) {
    st = mlakv::resource_exhausted("out of memory");
  } catch (const std::exception& e) {
    st = mlakv::internal_error(fmt::format("unexpected failure: {}", e.what()));
  } catch (...) {
    st = mlakv::internal_error("unexpected failure (unknown exception)");
  }
  if (!st.ok()) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", mlakv::escape_untrusted(st.message(), 1 << 16).c_str());
    return 1;
  }
  return 0;
}
