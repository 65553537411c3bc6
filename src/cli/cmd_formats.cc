// mlakv formats: every KV record format with its size and byte layout.
#include <fmt/format.h>

#include "cli/cli.h"
#include "mlakv/formats.h"

namespace mlakv::cli {

void add_formats_command(Cli& cli) {
  auto* cmd = cli.app.add_subcommand("formats", "List the KV record formats: bytes per token per layer and layout");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print JSON instead of a table");
  cmd->callback([&cli, json] {
    cli.action = [json]() -> Status {
      if (*json) {
        nlohmann::json out = nlohmann::json::array();
        for (const FormatInfo& f : all_formats()) {
          nlohmann::json regions = nlohmann::json::array();
          for (const RecordRegion& r : f.regions) {
            regions.push_back({{"offset", r.offset}, {"bytes", r.bytes}, {"content", std::string(r.what)}});
          }
          out.push_back({{"name", std::string(f.name)},
                         {"bytes_per_token_per_layer", f.record_bytes},
                         {"outer_scale", f.has_outer_scale},
                         {"summary", std::string(f.summary)},
                         {"vllm_kv_cache_dtype", std::string(f.vllm_kv_cache_dtype)},
                         {"layout", regions}});
        }
        const IndexerRecordInfo& ix = indexer_record_info();
        nlohmann::json regions = nlohmann::json::array();
        for (const RecordRegion& r : ix.regions) {
          regions.push_back({{"offset", r.offset}, {"bytes", r.bytes}, {"content", std::string(r.what)}});
        }
        print_json({{"formats", out},
                    {"indexer_record",
                     {{"name", std::string(ix.name)},
                      {"bytes_per_token_per_indexer_layer", ix.record_bytes},
                      {"summary", std::string(ix.summary)},
                      {"layout", regions}}}});
        return Status::Ok();
      }
      for (const FormatInfo& f : all_formats()) {
        fmt::print("{}  {} B per token per layer{}\n  {}\n  vLLM: --kv-cache-dtype {}\n", f.name, f.record_bytes,
                   f.has_outer_scale ? ", per-layer outer scale" : "", f.summary, f.vllm_kv_cache_dtype);
        for (const RecordRegion& r : f.regions) {
          fmt::print("    [{:>4}, {:>4})  {}\n", r.offset, r.offset + r.bytes, r.what);
        }
        fmt::print("\n");
      }
      const IndexerRecordInfo& ix = indexer_record_info();
      fmt::print("{}  {} B per token per indexer layer (beside the MLA record on DSA models)\n  {}\n", ix.name,
                 ix.record_bytes, ix.summary);
      for (const RecordRegion& r : ix.regions) {
        fmt::print("    [{:>4}, {:>4})  {}\n", r.offset, r.offset + r.bytes, r.what);
      }
      return Status::Ok();
    };
  });
}

}  // namespace mlakv::cli
