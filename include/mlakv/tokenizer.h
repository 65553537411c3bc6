// Tokenizers for the model runner (docs/tokenizer.md).
//
// Two kinds:
//   - byte level: vocab 256, byte b is id b, no file (Tokenizer::byte_level());
//   - a Hugging Face `tokenizer.json` of the byte-level BPE kind that DeepSeek-V2/V3/V3.2
//     and GLM-4.x ship (Tokenizer::load; Kimi K2 ships a tiktoken model instead, not read). Encoding is id-for-id what the Python
//     `tokenizers` library (0.23) gives for the same file; tests/tokenizer_test.cc
//     checks that on tokenizers trained with it (tools/make_tokenizer_fixtures.py).
//
// Supported tokenizer.json pieces (anything else is refused with kUnimplemented naming
// the field and the value):
//   normalizer     null, or a `Sequence` with no normalizers;
//   pre_tokenizer  null, `ByteLevel` {add_prefix_space, use_regex (GPT-2's regex)}, `Split`
//                  {pattern String|Regex, behavior Isolated|Removed|MergedWithPrevious|
//                  MergedWithNext|Contiguous, invert}, or a `Sequence` of those;
//   model          `BPE` {vocab, merges as "a b" strings or [a, b] pairs, ignore_merges,
//                  unk_token, fuse_unk; dropout null, byte_fallback false, no
//                  continuing_subword_prefix / end_of_word_suffix};
//   added_tokens   special and not, with single_word / lstrip / rstrip / normalized as the
//                  library applies them (split out of the text before pre-tokenization);
//   post_processor null, `ByteLevel` (adds nothing), `TemplateProcessing` (its `single`
//                  template: special tokens around $A), or a `Sequence` of those;
//   decoder        `ByteLevel`.
// `tokenizer_config.json` next to the file, when present, names bos_token / eos_token.
//
// Text is UTF-8. BPE tokenizers refuse invalid UTF-8 (kInvalidArgument naming the byte
// offset): the Python library only ever sees valid strings, so there is no reference
// behaviour to match. The byte-level tokenizer takes any bytes.
//
// Everything read from disk is untrusted: size bounds, JSON nesting depth, ids in range,
// duplicate tokens or ids, merges naming unknown tokens are checked and give a Status
// naming the problem. A Tokenizer is cheap to copy (shared, immutable state plus a
// thread-safe word cache); all methods are safe to call from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mlakv/status.h"

namespace mlakv {

// The largest tokenizer.json / tokenizer_config.json mlakv reads (DeepSeek-V3's is 7.5 MB).
inline constexpr uint64_t kMaxTokenizerJsonBytes = uint64_t{64} << 20;
// Token ids must lie in [0, kMaxTokenizerVocab).
inline constexpr int64_t kMaxTokenizerVocab = int64_t{1} << 24;
// The largest pre-tokenized ids file read_token_file accepts (2^28 tokens).
inline constexpr uint64_t kMaxTokenFileBytes = uint64_t{1} << 30;

struct TokenizerImpl;  // src/tokenizer/tokenizer_impl.h

class Tokenizer {
 public:
  enum class Kind { kByteLevel, kBpe };

  // Vocab 256: byte b <-> id b; no special tokens, nothing added by encode.
  static Tokenizer byte_level();
  // `path` is a tokenizer.json file or a directory holding one. tokenizer_config.json in
  // the same directory, when present, supplies bos/eos. kNotFound / kIoError from the
  // file system, kInvalidArgument / kDataLoss for malformed content, kUnimplemented for
  // valid settings mlakv does not support; messages name the file and the field.
  static StatusOr<Tokenizer> load(const std::string& path);
  // The same from texts; `source` names them in errors; `config_json` may be empty.
  static StatusOr<Tokenizer> from_json(std::string_view tokenizer_json, std::string_view source,
                                       std::string_view config_json = {});

  Kind kind() const;
  // One more than the largest id of the model vocab and the added tokens (ids may have
  // gaps; id_to_token reports those as kNotFound).
  int32_t vocab_size() const;

  // Text -> ids. `add_special_tokens` applies the post-processor (DeepSeek's template
  // prepends BOS); false gives the bare encoding. Errors: invalid UTF-8 (byte offset), a
  // byte the vocab cannot represent when the model has no unk_token (the library would
  // silently drop it).
  StatusOr<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens = true) const;
  // Ids -> text bytes, as the library's decode: every token (added ones too) through the
  // ByteLevel decoder, which turns a token spelled in the byte alphabet into its bytes and
  // leaves any other token as its own UTF-8. Special tokens are kept unless
  // `skip_special_tokens`. The bytes are returned as they are: where the library then
  // replaces invalid UTF-8 by U+FFFD (a sequence that cuts a character), mlakv does not.
  // kOutOfRange for an id outside the vocab or in a gap.
  StatusOr<std::string> decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The token's string as tokenizer.json spells it (byte-level alphabet for model tokens,
  // the content for added tokens; for the byte-level tokenizer: the one raw byte).
  StatusOr<std::string> id_to_token(int32_t id) const;
  StatusOr<int32_t> token_to_id(std::string_view token) const;
  // True for added tokens marked special.
  bool is_special(int32_t id) const;

  // From tokenizer_config.json (bos_token / eos_token), else unset.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // The ids the post-processor puts before / after the text (DeepSeek: {BOS} / {}).
  const std::vector<int32_t>& prefix_ids() const;
  const std::vector<int32_t>& suffix_ids() const;

 private:
  explicit Tokenizer(std::shared_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<TokenizerImpl> impl_;
};

// Pre-tokenized input (`--tokens FILE`): a file of little-endian int32 ids. Errors: the
// file is empty, larger than kMaxTokenFileBytes or not a multiple of 4 bytes; an id
// outside [0, vocab_size) (named with its index).
StatusOr<std::vector<int32_t>> read_token_file(const std::string& path, int32_t vocab_size);

}  // namespace mlakv
