// The tokenizer room's internal pieces (include/mlakv/tokenizer.h is the API):
//   added-token matching (added_tokens.cc), the pre-tokenizer pipeline
//   (pre_tokenizer.cc), the BPE model (bpe.cc), tokenizer.json loading
//   (tokenizer_json.cc). Each follows the Python `tokenizers` library (0.23) step by
//   step; the function comments name the Rust function they mirror.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "mlakv/status.h"
#include "mlakv/tokenizer.h"
#include "tokenizer/regex.h"

namespace mlakv::tok {

// ---- added tokens (tokenizers/src/tokenizer/added_vocabulary.rs) ----
struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};

// A piece of the input: [begin, end) of the text it was cut from, and the added token
// it is (index into TokenizerImpl::added), or -1 for plain text.
struct Segment {
  std::size_t begin = 0;
  std::size_t end = 0;
  int32_t added = -1;
};

// Leftmost-longest, non-overlapping matching of a set of literal patterns (what the
// library's Aho-Corasick with MatchKind::LeftmostLongest returns), as a byte trie.
class AddedMatcher {
 public:
  AddedMatcher();
  void add(std::string_view pattern, int32_t token);
  bool empty() const { return count_ == 0; }
  // AddedVocabulary::find_matches: the segments covering `text`, with single_word /
  // lstrip / rstrip applied. `text` is valid UTF-8.
  void find_matches(std::string_view text, const std::vector<AddedToken>& tokens, std::vector<Segment>* out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;  // sorted by byte
    int32_t token = -1;
  };
  std::vector<Node> nodes_;
  int count_ = 0;
};

// ---- pre-tokenizers (tokenizers/src/pre_tokenizers/{split,byte_level,sequence}.rs) ----
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokStep {
  enum class Type { kSplit, kByteLevel };
  Type type = Type::kSplit;
  std::optional<Regex> regex;  // Split's pattern; ByteLevel's GPT-2 regex when use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
};

// Runs the steps over `text`; `pieces` receives the pre-tokens the model encodes.
Status pre_tokenize(const std::vector<PreTokStep>& steps, std::string_view text, std::vector<std::string>* pieces);

// ---- the BPE model (tokenizers/src/models/bpe/{model,word}.rs) ----
class Bpe {
 public:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<uint64_t, Merge> merges;
  bool ignore_merges = false;
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;

  // BPE::tokenize of one pre-token: its ids appended to `out`. kInvalidArgument when a
  // character has no token and there is no unk_token (the library drops it silently).
  Status encode_word(std::string_view word, std::vector<int32_t>* out) const;

 private:
  Status merge_word(std::string_view word, std::vector<int32_t>* out) const;
  static constexpr std::size_t kCacheCapacity = std::size_t{1} << 16;
  static constexpr std::size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace mlakv::tok

namespace mlakv {

struct TokenizerImpl {
  Tokenizer::Kind kind = Tokenizer::Kind::kByteLevel;
  int32_t vocab_size = 256;
  std::string source;  // the file, for messages

  std::vector<tok::PreTokStep> pre;
  tok::Bpe bpe;
  std::vector<std::string> model_tokens;  // id -> model vocab token ("" where absent)
  std::vector<uint8_t> has_model_token;   // id -> 1 where the model vocab has it

  std::vector<tok::AddedToken> added;
  std::unordered_map<int32_t, int32_t> added_by_id;            // id -> index into added
  std::unordered_map<std::string, int32_t> added_by_content;   // content -> index
  tok::AddedMatcher raw_matcher;         // tokens with normalized == false
  tok::AddedMatcher normalized_matcher;  // tokens with normalized == true

  std::vector<int32_t> prefix;  // post-processor ids before / after $A
  std::vector<int32_t> suffix;
  std::optional<int32_t> bos;
  std::optional<int32_t> eos;
};

// tokenizer_json.cc
StatusOr<std::shared_ptr<TokenizerImpl>> parse_tokenizer_json(std::string_view text, std::string_view source,
                                                              std::string_view config_text,
                                                              std::string_view config_source);

}  // namespace mlakv
