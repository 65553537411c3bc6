// Whole-file reads and crash-safe writes (write to a temporary, then rename), so a
// failed command never leaves a half-written output behind.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mlakv/status.h"

namespace mlakv::io {

StatusOr<std::vector<uint8_t>> read_file(const std::string& path);
Status write_file(const std::string& path, const void* data, std::size_t size);
inline Status write_file(const std::string& path, const std::string& text) {
  return write_file(path, text.data(), text.size());
}

}  // namespace mlakv::io
