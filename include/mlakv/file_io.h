// File I/O for inputs that may be hostile and outputs that must never be half-written.
//
// Reads: the path is opened non-blocking and fstat'ed before any byte is read, so a
// FIFO, socket, device (/dev/zero) or directory is refused instead of hanging or
// reading forever; the size is checked against a limit before allocating.
//
// Writes: one writer (AtomicFile) for every output. It creates an exclusive temporary
// with an unpredictable name in the target's directory (O_CREAT | O_EXCL | O_NOFOLLOW,
// so a planted symlink is never followed), writes, fsyncs, gives it the mode of the
// file it replaces (or 0666 minus the umask for a new file), renames it over the
// target and fsyncs the directory. Until commit() the target is untouched; a writer
// destroyed without commit() removes its temporary. See docs/security.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mlakv/status.h"

namespace mlakv::io {

// Size limits for inputs read whole into memory.
inline constexpr std::size_t kMaxConfigBytes = std::size_t{16} << 20;       // config.json, scale files
inline constexpr std::size_t kMaxIndexBytes = std::size_t{100} << 20;       // model.safetensors.index.json
inline constexpr std::size_t kMaxRawInputBytes = std::size_t{4} << 30;      // `codec --in` raw rows / records

// The whole of a regular file of at most `max_bytes`. Errors: kNotFound (no such
// file), kInvalidArgument (not a regular file: FIFO, device, directory, socket; or
// larger than max_bytes, naming both sizes), kIoError (the OS refused), and
// kResourceExhausted when the buffer cannot be allocated.
StatusOr<std::vector<uint8_t>> read_file(const std::string& path, std::size_t max_bytes);
StatusOr<std::string> read_text_file(const std::string& path, std::size_t max_bytes);

// Opens `path` read-only without blocking (O_NONBLOCK, then cleared) and refuses
// anything but a regular file. Returns the descriptor (the caller closes it) and its
// size. Used by read_file and by the safetensors mapper.
struct OpenedFile {
  int fd = -1;
  uint64_t size = 0;
};
StatusOr<OpenedFile> open_regular_file(const std::string& path);

// Whether `a` and `b` name the same file: for two existing files, the same st_dev and
// st_ino after following links; when neither exists yet (two outputs), the same
// resolved path. False when only one exists or either is empty.
bool same_file(const std::string& a, const std::string& b);

// kInvalidArgument when output `out` (option name `out_option`) is the same file as
// input `in`: "--out x.bin is the same file as --in x.bin".
Status check_not_same_file(const std::string& out, std::string_view out_option, const std::string& in,
                           std::string_view in_option);

// An output file written through a temporary (see the header comment). Move-only.
class AtomicFile {
 public:
  // Creates the temporary next to `path`. kIoError when the directory refuses it.
  static StatusOr<AtomicFile> create(const std::string& path);

  AtomicFile(AtomicFile&& o) noexcept;
  AtomicFile& operator=(AtomicFile&& o) noexcept;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // removes the temporary unless committed

  // Appends bytes (retries short writes). kIoError on failure; the file is then poisoned
  // and commit() fails.
  Status write(const void* data, std::size_t size);
  // fsync, chmod, rename over the target, fsync the directory. At most once.
  Status commit();
  // Removes the temporary now (also done by the destructor).
  void discard();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  AtomicFile() = default;
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  bool failed_ = false;
  bool done_ = false;
};

// Writes `size` bytes to `path` atomically (AtomicFile::create, write, commit).
Status write_file(const std::string& path, const void* data, std::size_t size);
inline Status write_file(const std::string& path, std::string_view text) {
  return write_file(path, text.data(), text.size());
}

}  // namespace mlakv::io
