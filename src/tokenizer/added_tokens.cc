// Splitting added tokens out of the text, as AddedVocabulary::find_matches does
// (tokenizers/src/tokenizer/added_vocabulary.rs): leftmost-longest literal matches; a
// single_word token only counts where no word character touches it; lstrip / rstrip
// widen the match over the whitespace next to it.
#include <algorithm>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace mlakv::tok {

namespace {

// The library uses Rust's regex `\w` and `\s` (Unicode): \w is Alphabetic, M, Nd, Pc and
// Join_Control; \s is White_Space.
const Regex& word_char_re() {
  static const Regex re =
      Regex::compile(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])", false, "word class").value();
  return re;
}
const Regex& space_char_re() {
  static const Regex re = Regex::compile(R"(\p{White_Space})", false, "space class").value();
  return re;
}

bool char_matches(const Regex& re, std::string_view s, std::size_t at) {
  const std::size_t len = utf8_char_len(static_cast<unsigned char>(s[at]));
  return re.matches_at_start(s.substr(at, len));
}

// ends_with_word(&s[..end]) / starts_with_word(&s[begin..])
bool word_before(std::string_view s, std::size_t end) {
  return end > 0 && char_matches(word_char_re(), s, utf8_prev_char_start(s, end));
}
bool word_after(std::string_view s, std::size_t begin) {
  return begin < s.size() && char_matches(word_char_re(), s, begin);
}

// space_leftmost_at_end(&s[..end]): where the whitespace run ending at `end` starts.
std::size_t space_run_start(std::string_view s, std::size_t end) {
  while (end > 0) {
    const std::size_t p = utf8_prev_char_start(s, end);
    if (!char_matches(space_char_re(), s, p)) break;
    end = p;
  }
  return end;
}
// begin + space_rightmost_at_start(&s[begin..]): where the whitespace run from `begin` ends.
std::size_t space_run_end(std::string_view s, std::size_t begin) {
  while (begin < s.size() && char_matches(space_char_re(), s, begin)) {
    begin += utf8_char_len(static_cast<unsigned char>(s[begin]));
  }
  return begin;
}

}  // namespace

AddedMatcher::AddedMatcher() : nodes_(1) {}

void AddedMatcher::add(std::string_view pattern, int32_t token) {
  int32_t node = 0;
  for (char ch : pattern) {
    const auto c = static_cast<unsigned char>(ch);
    auto& next = nodes_[node].next;
    auto it = std::lower_bound(next.begin(), next.end(), c, [](const auto& e, unsigned char v) { return e.first < v; });
    if (it != next.end() && it->first == c) {
      node = it->second;
    } else {
      const auto child = static_cast<int32_t>(nodes_.size());
      next.insert(it, {c, child});
      nodes_.emplace_back();
      node = child;
    }
  }
  if (nodes_[node].token < 0) ++count_;
  nodes_[node].token = token;
}

void AddedMatcher::find_matches(std::string_view text, const std::vector<AddedToken>& tokens,
                                std::vector<Segment>* out) const {
  out->clear();
  if (text.empty()) return;
  std::size_t start_offset = 0;
  std::size_t pos = 0;  // where the trie search resumes (the end of the last raw match)
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  while (count_ > 0 && pos < text.size()) {
    // Leftmost-longest: the first position with any match, and there the longest one.
    std::size_t mstart = 0;
    std::size_t mend = 0;
    int32_t mtok = -1;
    for (std::size_t i = pos; i < text.size() && mtok < 0; ++i) {
      int32_t node = 0;
      for (std::size_t j = i; j < text.size(); ++j) {
        const auto& next = nodes_[node].next;
        auto it = std::lower_bound(next.begin(), next.end(), s[j],
                                   [](const auto& e, unsigned char v) { return e.first < v; });
        if (it == next.end() || it->first != s[j]) break;
        node = it->second;
        if (nodes_[node].token >= 0) {
          mstart = i;
          mend = j + 1;
          mtok = nodes_[node].token;
        }
      }
    }
    if (mtok < 0) break;
    pos = mend;
    const AddedToken& t = tokens[mtok];
    std::size_t start = mstart;
    std::size_t stop = mend;
    if (t.single_word) {
      const bool start_space = start == 0 || !word_before(text, start);
      const bool stop_space = stop == text.size() || !word_after(text, stop);
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) start = std::max(space_run_start(text, start), start_offset);
    if (t.rstrip) stop = space_run_end(text, stop);
    if (start_offset < start) out->push_back({start_offset, start, -1});
    out->push_back({start, stop, mtok});
    start_offset = stop;
  }
  if (start_offset != text.size()) out->push_back({start_offset, text.size(), -1});
}

}  // namespace mlakv::tok
