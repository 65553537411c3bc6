#include "core/file_io.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace mlakv::io {

StatusOr<std::vector<uint8_t>> read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return not_found(fmt::format("{}: no such file", path));
    return io_error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  std::vector<uint8_t> data;
  uint8_t buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + n);
  const bool err = std::ferror(f) != 0;
  std::fclose(f);
  if (err) return io_error(fmt::format("{}: read failed", path));
  return data;
}

Status write_file(const std::string& path, const void* data, std::size_t size) {
  const std::string tmp = path + ".tmp-mlakv";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return io_error(fmt::format("{}: cannot create: {}", path, std::strerror(errno)));
  const bool ok = (size == 0 || std::fwrite(data, 1, size, f) == size);
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    std::remove(tmp.c_str());
    return io_error(fmt::format("{}: write failed", path));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    return io_error(fmt::format("{}: cannot rename into place: {}", path, ec.message()));
  }
  return Status::Ok();
}

}  // namespace mlakv::io
