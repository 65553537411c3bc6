// A checkpoint's config.json, found the one way every reader finds it: `path` names the
// file itself or a checkpoint directory holding it (hf_config.h, kv_b_proj.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "mlakv/file_io.h"
#include "mlakv/status.h"

namespace mlakv::io {

struct ConfigJson {
  std::string file;  // the config.json read (for error messages)
  std::string text;
};

// kNotFound / kIoError from reading the file, naming it.
inline StatusOr<ConfigJson> read_config_json(const std::string& path) {
  ConfigJson c;
  c.file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) c.file = (std::filesystem::path(path) / "config.json").string();
  MLAKV_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, read_file(c.file, kMaxConfigBytes));
  c.text.assign(bytes.begin(), bytes.end());
  return c;
}

}  // namespace mlakv::io
