// Bounded reads and the one atomic writer (mlakv/file_io.h, docs/security.md).
#include "mlakv/file_io.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>
#include <utility>

#include "mlakv/untrusted.h"

namespace mlakv::io {
namespace {

std::string q(std::string_view path) { return escape_untrusted(path, 4096); }

std::string file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "unknown type";
}

// 16 hex digits from the kernel's CSPRNG: the temporary's name cannot be guessed.
std::string random_suffix() {
  uint64_t r = 0;
  std::size_t got = 0;
  while (got < sizeof r) {
    const ssize_t n = ::getrandom(reinterpret_cast<uint8_t*>(&r) + got, sizeof r - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;  // O_EXCL still guarantees exclusivity; only the unpredictability is weaker
    }
    got += static_cast<std::size_t>(n);
  }
  if (got < sizeof r) r ^= static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull ^ reinterpret_cast<uintptr_t>(&r);
  return fmt::format("{:016x}", r);
}

std::string parent_dir(const std::string& path) {
  const std::filesystem::path p(path);
  const std::filesystem::path d = p.parent_path();
  return d.empty() ? std::string(".") : d.string();
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);  // best effort: some file systems refuse fsync on directories
  ::close(fd);
}

}  // namespace

StatusOr<OpenedFile> open_regular_file(const std::string& path) {
  if (path.empty()) return invalid_argument("path is empty");
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return not_found(fmt::format("{}: no such file", q(path)));
    return io_error(fmt::format("{}: cannot open: {}", q(path), std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return io_error(fmt::format("{}: cannot stat: {}", q(path), std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(fmt::format("{}: not a regular file ({})", q(path), file_kind(st.st_mode)));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return OpenedFile{fd, static_cast<uint64_t>(st.st_size)};
}

StatusOr<std::vector<uint8_t>> read_file(const std::string& path, std::size_t max_bytes) {
  MLAKV_ASSIGN_OR_RETURN(OpenedFile f, open_regular_file(path));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{f.fd};
  if (f.size > max_bytes) {
    return invalid_argument(
        fmt::format("{}: {} bytes exceeds the {}-byte limit for this input", q(path), f.size, max_bytes));
  }
  std::vector<uint8_t> data;
  try {
    data.resize(static_cast<std::size_t>(f.size));
  } catch (const std::bad_alloc&) {
    return resource_exhausted(fmt::format("{}: cannot allocate {} bytes to read it", q(path), f.size));
  }
  // Read until EOF, not just st_size bytes (a file may grow, /proc files report 0), but
  // never past max_bytes. A full buffer is probed with one byte before it is grown, so a
  // file of exactly st_size bytes is read with one allocation.
  std::size_t have = 0;
  for (;;) {
    if (have == data.size()) {
      uint8_t probe;
      const ssize_t n = ::read(f.fd, &probe, 1);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        return io_error(fmt::format("{}: read failed: {}", q(path), std::strerror(errno)));
      }
      if (have >= max_bytes) {
        return invalid_argument(fmt::format("{}: more than the {}-byte limit for this input", q(path), max_bytes));
      }
      try {
        data.resize(std::min(max_bytes, std::max<std::size_t>(data.size() * 2, 4096)));
      } catch (const std::bad_alloc&) {
        return resource_exhausted(fmt::format("{}: cannot allocate memory to read it", q(path)));
      }
      data[have++] = probe;
      continue;
    }
    const ssize_t n = ::read(f.fd, data.data() + have, data.size() - have);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(fmt::format("{}: read failed: {}", q(path), std::strerror(errno)));
    }
    if (n == 0) break;
    have += static_cast<std::size_t>(n);
  }
  data.resize(have);
  return data;
}

StatusOr<std::string> read_text_file(const std::string& path, std::size_t max_bytes) {
  MLAKV_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, read_file(path, max_bytes));
  try {
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::bad_alloc&) {
    return resource_exhausted(fmt::format("{}: cannot allocate {} bytes", q(path), bytes.size()));
  }
}

bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  struct stat sa {}, sb {};
  const bool ea = ::stat(a.c_str(), &sa) == 0, eb = ::stat(b.c_str(), &sb) == 0;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (ea != eb) return false;
  // Neither exists yet (two outputs): the same resolved path is the same file to be.
  std::error_code ec1, ec2;
  const auto ca = std::filesystem::weakly_canonical(a, ec1), cb = std::filesystem::weakly_canonical(b, ec2);
  return !ec1 && !ec2 && ca == cb;
}

Status check_not_same_file(const std::string& out, std::string_view out_option, const std::string& in,
                           std::string_view in_option) {
  if (!out.empty() && !in.empty() && same_file(out, in)) {
    return invalid_argument(fmt::format("{} {} is the same file as {} {}: refusing to overwrite an input", out_option,
                                        q(out), in_option, q(in)));
  }
  return Status::Ok();
}

// ---- AtomicFile -----------------------------------------------------------------------

StatusOr<AtomicFile> AtomicFile::create(const std::string& path) {
  if (path.empty()) return invalid_argument("output path is empty");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return invalid_argument(fmt::format("{}: is a directory, expected a file to write", q(path)));
  }
  const std::string dir = parent_dir(path);
  const std::string base = std::filesystem::path(path).filename().string();
  AtomicFile f;
  f.path_ = path;
  for (int attempt = 0; attempt < 16; ++attempt) {
    std::string tmp = (std::filesystem::path(dir) / fmt::format(".{}.tmp-mlakv-{}", base, random_suffix())).string();
    // O_EXCL | O_NOFOLLOW: never opens an existing file or follows a planted symlink.
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0) {
      f.fd_ = fd;
      f.tmp_ = std::move(tmp);
      return f;
    }
    if (errno != EEXIST) {
      return io_error(fmt::format("{}: cannot create a temporary in {}: {}", q(path), q(dir), std::strerror(errno)));
    }
  }
  return io_error(fmt::format("{}: cannot create a unique temporary in {}", q(path), q(dir)));
}

AtomicFile::AtomicFile(AtomicFile&& o) noexcept
    : path_(std::move(o.path_)), tmp_(std::move(o.tmp_)), fd_(o.fd_), failed_(o.failed_), done_(o.done_) {
  o.fd_ = -1;
  o.done_ = true;
  o.tmp_.clear();
}

AtomicFile& AtomicFile::operator=(AtomicFile&& o) noexcept {
  if (this != &o) {
    discard();
    path_ = std::move(o.path_);
    tmp_ = std::move(o.tmp_);
    fd_ = o.fd_;
    failed_ = o.failed_;
    done_ = o.done_;
    o.fd_ = -1;
    o.done_ = true;
    o.tmp_.clear();
  }
  return *this;
}

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::discard() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!done_ && !tmp_.empty()) ::unlink(tmp_.c_str());
  done_ = true;
}

Status AtomicFile::write(const void* data, std::size_t size) {
  if (done_ || fd_ < 0) return failed_precondition(fmt::format("{}: write after commit or discard", q(path_)));
  if (failed_) return io_error(fmt::format("{}: an earlier write failed", q(path_)));
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      failed_ = true;
      return io_error(fmt::format("{}: write failed: {}", q(path_), std::strerror(errno)));
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return Status::Ok();
}

Status AtomicFile::commit() {
  if (done_ || fd_ < 0) return failed_precondition(fmt::format("{}: commit after commit or discard", q(path_)));
  auto fail = [&](std::string what, int err) {
    discard();
    return io_error(fmt::format("{}: {}: {}", q(path_), what, std::strerror(err)));
  };
  if (failed_) {
    discard();
    return io_error(fmt::format("{}: write failed; nothing was replaced", q(path_)));
  }
  // Keep the mode of the file being replaced; a new file keeps 0666 minus the umask.
  struct stat old {};
  if (::stat(path_.c_str(), &old) == 0 && S_ISREG(old.st_mode)) {
    if (::fchmod(fd_, old.st_mode & 07777) != 0) return fail("cannot set the mode", errno);
  }
  if (::fsync(fd_) != 0) return fail("fsync failed", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return fail("close failed", errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) return fail("cannot rename into place", errno);
  done_ = true;
  fsync_dir(parent_dir(path_));
  return Status::Ok();
}

Status write_file(const std::string& path, const void* data, std::size_t size) {
  MLAKV_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  if (size != 0) MLAKV_RETURN_IF_ERROR(f.write(data, size));
  return f.commit();
}

}  // namespace mlakv::io
