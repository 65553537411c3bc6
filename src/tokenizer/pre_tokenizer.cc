// The pre-tokenizer pipeline: every step maps each current piece to new pieces, empty
// ones dropped (PreTokenizedString::split), as the library's Sequence does.
#include <algorithm>

#include <fmt/format.h>

#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"

namespace mlakv::tok {

namespace {

struct Span {
  std::size_t begin;
  std::size_t end;
  bool flag;  // is_match before the behaviour, remove after it
};

// Pattern::find_matches for a regex: matches and the gaps between them, covering `s`.
Status find_matches(const Regex& re, std::string_view s, bool invert, std::vector<Span>* spans,
                    std::vector<std::pair<std::size_t, std::size_t>>* scratch) {
  spans->clear();
  if (s.empty()) {
    spans->push_back({0, 0, invert});
    return Status::Ok();
  }
  MLAKV_RETURN_IF_ERROR(re.find_all(s, scratch));
  std::size_t prev = 0;
  for (const auto& [b, e] : *scratch) {
    if (prev != b) spans->push_back({prev, b, invert});
    spans->push_back({b, e, !invert});
    prev = e;
  }
  if (prev != s.size()) spans->push_back({prev, s.size(), invert});
  return Status::Ok();
}

// NormalizedString::split: the behaviour turns (offsets, is_match) into (offsets, remove).
void apply_behavior(SplitBehavior behavior, std::vector<Span>* spans) {
  std::vector<Span> acc;
  acc.reserve(spans->size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (auto& sp : *spans) sp.flag = false;
      return;
    case SplitBehavior::kRemoved:
      return;  // matches are removed
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Span& sp : *spans) {
        if (sp.flag == previous_match && !acc.empty()) {
          acc.back().end = sp.end;
        } else {
          acc.push_back({sp.begin, sp.end, false});
        }
        previous_match = sp.flag;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& sp : *spans) {
        if (sp.flag && !previous_match && !acc.empty()) {
          acc.back().end = sp.end;
        } else {
          acc.push_back({sp.begin, sp.end, false});
        }
        previous_match = sp.flag;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = spans->rbegin(); it != spans->rend(); ++it) {
        if (it->flag && !previous_match && !acc.empty()) {
          acc.back().begin = it->begin;
        } else {
          acc.push_back({it->begin, it->end, false});
        }
        previous_match = it->flag;
      }
      std::reverse(acc.begin(), acc.end());
      break;
    }
  }
  spans->swap(acc);
}

}  // namespace

Status pre_tokenize(const std::vector<PreTokStep>& steps, std::string_view text, std::vector<std::string>* pieces) {
  pieces->clear();
  if (!text.empty()) pieces->emplace_back(text);
  std::vector<std::string> next;
  std::vector<Span> spans;
  std::vector<std::pair<std::size_t, std::size_t>> scratch;
  for (const PreTokStep& step : steps) {
    next.clear();
    for (std::string& piece : *pieces) {
      if (step.type == PreTokStep::Type::kByteLevel) {
        if (step.add_prefix_space && piece.front() != ' ') piece.insert(piece.begin(), ' ');
        if (!step.regex) {
          std::string mapped;
          byte_level_encode(piece, mapped);
          next.push_back(std::move(mapped));
          continue;
        }
        MLAKV_RETURN_IF_ERROR(find_matches(*step.regex, piece, false, &spans, &scratch));
        apply_behavior(SplitBehavior::kIsolated, &spans);
        for (const Span& sp : spans) {
          if (sp.flag || sp.end == sp.begin) continue;
          std::string mapped;
          byte_level_encode(std::string_view(piece).substr(sp.begin, sp.end - sp.begin), mapped);
          next.push_back(std::move(mapped));
        }
        continue;
      }
      MLAKV_RETURN_IF_ERROR(find_matches(*step.regex, piece, step.invert, &spans, &scratch));
      apply_behavior(step.behavior, &spans);
      for (const Span& sp : spans) {
        if (sp.flag || sp.end == sp.begin) continue;
        next.emplace_back(std::string_view(piece).substr(sp.begin, sp.end - sp.begin));
      }
    }
    pieces->swap(next);
  }
  return Status::Ok();
}

}  // namespace mlakv::tok
