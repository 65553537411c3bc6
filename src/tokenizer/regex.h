// PCRE2 (Debian libpcre2-dev) behind the tokenizer: patterns compiled with
// PCRE2_UTF | PCRE2_UCP so \p{L}, \p{N}, \s, ... are Unicode classes as in Oniguruma,
// the engine the Python `tokenizers` library uses; JIT-compiled where available.
// Subjects must be valid UTF-8 (the tokenizer validates once, so matching skips
// PCRE2's own check, which would otherwise rescan the subject on every call).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mlakv/status.h"

namespace mlakv::tok {

class Regex {
 public:
  // `literal`: the pattern is a plain string (Split's {"String": ...}).
  // kInvalidArgument naming `source` and PCRE2's message on a bad pattern.
  static StatusOr<Regex> compile(std::string_view pattern, bool literal, std::string_view source);

  // Non-overlapping matches [begin, end) left to right, with Oniguruma's iterator rule
  // for empty matches (an empty match right where the previous match ended is skipped
  // by advancing one character), which is what the tokenizers library sees.
  Status find_all(std::string_view subject, std::vector<std::pair<std::size_t, std::size_t>>* out) const;

  // Whether the pattern matches at the very start of `subject` (anchored).
  bool matches_at_start(std::string_view subject) const;

 private:
  struct Code;
  explicit Regex(std::shared_ptr<const Code> code) : code_(std::move(code)) {}
  std::shared_ptr<const Code> code_;
};

}  // namespace mlakv::tok
