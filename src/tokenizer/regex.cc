#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>

#include "tokenizer/utf8.h"

namespace mlakv::tok {

struct Regex::Code {
  pcre2_code* code = nullptr;
  std::string source;  // names the pattern in matching errors
  ~Code() { pcre2_code_free(code); }
};

namespace {

struct MatchData {
  pcre2_match_data* md;
  explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {}
  ~MatchData() { pcre2_match_data_free(md); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof(buf)) < 0) return fmt::format("PCRE2 error {}", code);
  return std::string(reinterpret_cast<const char*>(buf));
}

}  // namespace

StatusOr<Regex> Regex::compile(std::string_view pattern, bool literal, std::string_view source) {
  if (first_invalid_utf8(pattern) != kValidUtf8) {
    return invalid_argument(fmt::format("{}: the pattern is not valid UTF-8", source));
  }
  int err = 0;
  PCRE2_SIZE err_off = 0;
  uint32_t options = PCRE2_UTF | PCRE2_UCP;
  if (literal) options |= PCRE2_LITERAL;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err,
                                   &err_off, nullptr);
  if (code == nullptr) {
    return invalid_argument(fmt::format("{}: cannot compile the regex at pattern offset {}: {}", source, err_off,
                                        pcre2_message(err)));
  }
  auto owned = std::make_shared<Code>();
  owned->code = code;
  owned->source = std::string(source);
  // JIT is an optimisation only: when it is unavailable the interpreter gives the same matches.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return Regex(std::move(owned));
}

Status Regex::find_all(std::string_view subject, std::vector<std::pair<std::size_t, std::size_t>>* out) const {
  out->clear();
  MatchData m(code_->code);
  if (m.md == nullptr) return resource_exhausted("regex: cannot allocate match data");
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const std::size_t n = subject.size();
  std::size_t search_from = 0;
  bool have_last = false;
  std::size_t last_end = 0;
  while (search_from <= n) {
    const int rc = pcre2_match(code_->code, s, n, search_from, PCRE2_NO_UTF_CHECK, m.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT ||
        rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // A pattern that backtracks catastrophically on this text (PCRE2's default limits).
      return resource_exhausted(fmt::format("{}: regex gave up at byte {} of a {}-byte piece: {}", code_->source,
                                            search_from, n, pcre2_message(rc)));
    }
    if (rc < 0) return internal_error(fmt::format("{}: regex matching failed: {}", code_->source, pcre2_message(rc)));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
    const std::size_t b = ov[0];
    const std::size_t e = ov[1];
    if (b == e && have_last && last_end == e) {
      // Oniguruma's iterator: step one character past an empty match at the previous end.
      if (search_from >= n) break;
      search_from += utf8_char_len(static_cast<unsigned char>(subject[search_from]));
      continue;
    }
    out->emplace_back(b, e);
    search_from = e;
    have_last = true;
    last_end = e;
  }
  return Status::Ok();
}

bool Regex::matches_at_start(std::string_view subject) const {
  MatchData m(code_->code);
  if (m.md == nullptr) return false;
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0,
                             PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED, m.md, nullptr);
  return rc >= 0;
}

}  // namespace mlakv::tok
