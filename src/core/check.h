// Internal invariant checks with file:line (STYLE.md 8: one error policy per layer).
//
//   MLAKV_CHECK(cond)             always on; on failure prints
//   MLAKV_CHECK(cond, "why")        "<file>:<line>: MLAKV_CHECK failed: <cond> (<why>)"
//                                 to stderr and calls std::abort().
//   MLAKV_DCHECK(cond[, "why"])   the same in builds without NDEBUG; with NDEBUG (Release)
//                                 it compiles to nothing: `cond` is type-checked but not
//                                 evaluated, so it may be costly or have no release meaning.
//
// For the library's own invariants only: a state the code itself guarantees, whose
// breach is a bug in mlakv (a free block missing from its segment map, an index the
// caller already validated). Use MLAKV_CHECK where continuing would corrupt memory or
// results, MLAKV_DCHECK where the release build has a safe fallback after it. Never for
// anything a caller, a file or a user can get wrong: that is validated and returned as
// a Status naming the problem (mlakv/status.h); the library does not abort on input.
// The optional message must be a string literal.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace mlakv::detail {

[[noreturn]] inline void check_failed(const char* file, int line, const char* kind, const char* cond,
                                      const char* why) {
  if (why[0] != '\0') {
    std::fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", file, line, kind, cond, why);
  } else {
    std::fprintf(stderr, "%s:%d: %s failed: %s\n", file, line, kind, cond);
  }
  std::fflush(stderr);
  std::abort();
}

}  // namespace mlakv::detail

#define MLAKV_CHECK(cond, ...)                                                                    \
  (static_cast<bool>(cond) ? static_cast<void>(0)                                                 \
                           : ::mlakv::detail::check_failed(__FILE__, __LINE__, "MLAKV_CHECK", #cond, \
                                                           "" __VA_ARGS__))

#ifdef NDEBUG
#define MLAKV_DCHECK(cond, ...) static_cast<void>(sizeof(static_cast<bool>(cond)))
#else
#define MLAKV_DCHECK(cond, ...)                                                                    \
  (static_cast<bool>(cond) ? static_cast<void>(0)                                                  \
                           : ::mlakv::detail::check_failed(__FILE__, __LINE__, "MLAKV_DCHECK", #cond, \
                                                           "" __VA_ARGS__))
#endif
