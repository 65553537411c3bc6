#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <new>
#include <string_view>

#include "cli/cli.h"
#include "mlakv/untrusted.h"

namespace mlakv::cli {

// Strings that are not valid UTF-8 (a path, a name from a file) are printed with
// U+FFFD instead of throwing nlohmann::type_error after the work is done.
void print_json(const nlohmann::json& j) {
  fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
}

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
    json_error(mlakv::status_code_name(st.code()), st.message());
    return kExitFailure;
  }
  return 0;
}
