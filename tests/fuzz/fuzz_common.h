// Shared helpers of the libFuzzer targets (docs/security.md "Fuzzing"). An invariant
// violation aborts with a message, which libFuzzer reports as a crash and saves.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include "mlakv/status.h"

namespace mlakv::fuzz {

[[noreturn]] inline void violated(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "fuzz invariant violated: %s %s\n", what, detail.c_str());
  std::abort();
}

#define MLAKV_FUZZ_CHECK(cond, detail)              \
  do {                                              \
    if (!(cond)) ::mlakv::fuzz::violated(#cond, detail); \
  } while (0)

// Library calls must never report kInternal (that is "a bug in mlakv").
inline void check_not_internal(const Status& st) {
  MLAKV_FUZZ_CHECK(st.code() != StatusCode::kInternal, st.to_string());
}

// A private scratch directory on tmpfs when there is one (fsync is cheap there).
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string d = std::string(base) + "/mlakv_fuzz_" + std::to_string(::getpid());
    (void)std::system(("mkdir -p " + d).c_str());
    return d;
  }();
  return dir;
}

inline void write_bytes(const std::string& path, const uint8_t* data, std::size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

inline std::string_view as_text(const uint8_t* data, std::size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

}  // namespace mlakv::fuzz
