// The public Tokenizer (include/mlakv/tokenizer.h): loading, the encode pipeline
// (added tokens -> pre-tokenizer -> BPE -> post-processor), decode, and the reader of
// pre-tokenized id files.
#include "mlakv/tokenizer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <unistd.h>

#include <fmt/format.h>

#include "mlakv/file_io.h"

#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace mlakv {

namespace fs = std::filesystem;

namespace {

// Reads a whole file of at most `limit` bytes; a larger one is refused without reading
// it all (the size is checked on the bytes read, so pipes and growing files are bounded too).
StatusOr<std::string> read_bounded(const std::string& path, uint64_t limit, std::string_view what) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return invalid_argument(fmt::format("{}: is a directory, expected {}", path, what));
  // Non-blocking open + fstat first (mlakv/file_io.h): a FIFO or device is refused
  // instead of hanging or reading forever.
  MLAKV_ASSIGN_OR_RETURN(io::OpenedFile opened, io::open_regular_file(path));
  std::FILE* f = ::fdopen(opened.fd, "rb");
  if (f == nullptr) {
    const int err = errno;
    ::close(opened.fd);
    return io_error(fmt::format("{}: cannot open: {}", path, std::strerror(err)));
  }
  std::string data;
  char buf[1 << 16];
  std::size_t n = 0;
  bool too_big = false;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
    if (data.size() + n > limit) {
      too_big = true;
      break;
    }
    data.append(buf, n);
  }
  const bool err = std::ferror(f) != 0;
  std::fclose(f);
  if (too_big) return data_loss(fmt::format("{}: larger than the {} byte limit for {}", path, limit, what));
  if (err) return io_error(fmt::format("{}: read failed", path));
  return data;
}

StatusOr<std::vector<int32_t>> encode_bpe(const TokenizerImpl& t, std::string_view text, bool add_special) {
  if (const std::size_t bad = tok::first_invalid_utf8(text); bad != tok::kValidUtf8) {
    return invalid_argument(fmt::format("text is not valid UTF-8: byte 0x{:02x} at offset {}", static_cast<unsigned char>(text[bad]),
                                        bad));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + t.prefix.size() + t.suffix.size() + 4);
  if (add_special) ids.insert(ids.end(), t.prefix.begin(), t.prefix.end());

  std::vector<tok::Segment> outer;
  std::vector<tok::Segment> inner;
  std::vector<std::string> pieces;
  auto encode_text = [&](std::size_t base, std::string_view seg) -> Status {
    Status st = tok::pre_tokenize(t.pre, seg, &pieces);
    if (!st.ok()) return st.with_context(fmt::format("text at byte offset {}", base));
    for (const std::string& p : pieces) {
      st = t.bpe.encode_word(p, &ids);
      if (!st.ok()) return st.with_context(fmt::format("text at byte offset {}", base));
    }
    return Status::Ok();
  };
  // AddedVocabulary::extract_and_normalize: non-normalized added tokens on the raw text,
  // then (after the identity normalizer) normalized ones on the pieces left.
  t.raw_matcher.find_matches(text, t.added, &outer);
  for (const tok::Segment& o : outer) {
    if (o.added >= 0) {
      ids.push_back(t.added[o.added].id);
      continue;
    }
    const std::string_view seg = text.substr(o.begin, o.end - o.begin);
    if (t.normalized_matcher.empty()) {
      MLAKV_RETURN_IF_ERROR(encode_text(o.begin, seg));
      continue;
    }
    t.normalized_matcher.find_matches(seg, t.added, &inner);
    for (const tok::Segment& s : inner) {
      if (s.added >= 0) {
        ids.push_back(t.added[s.added].id);
      } else {
        MLAKV_RETURN_IF_ERROR(encode_text(o.begin + s.begin, seg.substr(s.begin, s.end - s.begin)));
      }
    }
  }
  if (add_special) ids.insert(ids.end(), t.suffix.begin(), t.suffix.end());
  return ids;
}

}  // namespace

Tokenizer Tokenizer::byte_level() {
  static const std::shared_ptr<TokenizerImpl> impl = [] {
    auto t = std::make_shared<TokenizerImpl>();
    t->kind = Kind::kByteLevel;
    t->vocab_size = 256;
    t->source = "byte-level tokenizer";
    return t;
  }();
  return Tokenizer(impl);
}

StatusOr<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json, std::string_view source,
                                         std::string_view config_json) {
  MLAKV_ASSIGN_OR_RETURN(auto impl, parse_tokenizer_json(tokenizer_json, source, config_json,
                                                         fmt::format("{} (tokenizer_config.json)", source)));
  return Tokenizer(std::move(impl));
}

StatusOr<Tokenizer> Tokenizer::load(const std::string& path) {
  std::error_code ec;
  fs::path file = path;
  if (fs::is_directory(file, ec)) file /= "tokenizer.json";
  MLAKV_ASSIGN_OR_RETURN(const std::string text, read_bounded(file.string(), kMaxTokenizerJsonBytes, "tokenizer.json"));
  const fs::path config = file.parent_path() / "tokenizer_config.json";
  std::string config_text;
  if (fs::exists(config, ec)) {
    MLAKV_ASSIGN_OR_RETURN(config_text, read_bounded(config.string(), kMaxTokenizerJsonBytes, "tokenizer_config.json"));
    if (config_text.empty()) return data_loss(fmt::format("{}: empty file", config.string()));
  }
  MLAKV_ASSIGN_OR_RETURN(auto impl, parse_tokenizer_json(text, file.string(), config_text, config.string()));
  return Tokenizer(std::move(impl));
}

Tokenizer::Kind Tokenizer::kind() const { return impl_->kind; }
int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
const std::vector<int32_t>& Tokenizer::prefix_ids() const { return impl_->prefix; }
const std::vector<int32_t>& Tokenizer::suffix_ids() const { return impl_->suffix; }

StatusOr<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (impl_->kind == Kind::kByteLevel) {
    std::vector<int32_t> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  return encode_bpe(*impl_, text, add_special_tokens);
}

StatusOr<std::string> Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const TokenizerImpl& t = *impl_;
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= t.vocab_size) {
      return out_of_range(fmt::format("decode: ids[{}] = {} is outside the vocab [0, {})", i, id, t.vocab_size));
    }
    if (t.kind == Kind::kByteLevel) {
      out.push_back(static_cast<char>(id));
      continue;
    }
    const std::string* token = nullptr;
    if (auto a = t.added_by_id.find(id); a != t.added_by_id.end()) {
      if (skip_special_tokens && t.added[a->second].special) continue;
      token = &t.added[a->second].content;
    } else if (static_cast<std::size_t>(id) < t.has_model_token.size() && t.has_model_token[id]) {
      token = &t.model_tokens[id];
    } else {
      return out_of_range(fmt::format("decode: ids[{}] = {} is a gap in the vocab (no token has that id)", i, id));
    }
    // The ByteLevel decoder, applied to every token as the library does (added ones too):
    // a token spelled in the byte alphabet becomes its bytes, any other its own UTF-8.
    if (!tok::byte_level_decode(*token, out)) out += *token;
  }
  return out;
}

StatusOr<std::string> Tokenizer::id_to_token(int32_t id) const {
  const TokenizerImpl& t = *impl_;
  if (id < 0 || id >= t.vocab_size) {
    return out_of_range(fmt::format("token id {} is outside the vocab [0, {})", id, t.vocab_size));
  }
  if (t.kind == Kind::kByteLevel) return std::string(1, static_cast<char>(id));
  if (auto a = t.added_by_id.find(id); a != t.added_by_id.end()) return t.added[a->second].content;
  if (static_cast<std::size_t>(id) < t.has_model_token.size() && t.has_model_token[id]) return t.model_tokens[id];
  return not_found(fmt::format("token id {} is a gap in the vocab (no token has that id)", id));
}

StatusOr<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const TokenizerImpl& t = *impl_;
  if (t.kind == Kind::kByteLevel) {
    if (token.size() == 1) return static_cast<int32_t>(static_cast<unsigned char>(token[0]));
    return not_found(fmt::format("byte-level tokens are single bytes, got {} bytes", token.size()));
  }
  const std::string key(token);
  if (auto a = t.added_by_content.find(key); a != t.added_by_content.end()) return t.added[a->second].id;
  if (auto v = t.bpe.vocab.find(key); v != t.bpe.vocab.end()) return v->second;
  return not_found(fmt::format("'{}' is not a token of {}", key.size() > 80 ? key.substr(0, 80) + "..." : key, t.source));
}

bool Tokenizer::is_special(int32_t id) const {
  auto a = impl_->added_by_id.find(id);
  return a != impl_->added_by_id.end() && impl_->added[a->second].special;
}

StatusOr<std::vector<int32_t>> read_token_file(const std::string& path, int32_t vocab_size) {
  if (vocab_size < 1) return invalid_argument(fmt::format("read_token_file: vocab_size must be >= 1, got {}", vocab_size));
  MLAKV_ASSIGN_OR_RETURN(const std::string data, read_bounded(path, kMaxTokenFileBytes, "a token file"));
  if (data.empty()) return data_loss(fmt::format("{}: empty token file (no ids)", path));
  if (data.size() % 4 != 0) {
    return data_loss(fmt::format("{}: {} bytes is not a whole number of int32 ids (size % 4 = {}; truncated?)", path,
                                 data.size(), data.size() % 4));
  }
  std::vector<int32_t> ids(data.size() / 4);
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const uint32_t u = uint32_t{p[4 * i]} | (uint32_t{p[4 * i + 1]} << 8) | (uint32_t{p[4 * i + 2]} << 16) |
                       (uint32_t{p[4 * i + 3]} << 24);
    const auto id = static_cast<int32_t>(u);
    if (id < 0 || id >= vocab_size) {
      return out_of_range(
          fmt::format("{}: token {} (byte offset {}) has id {}, outside the vocab [0, {})", path, i, 4 * i, id, vocab_size));
    }
    ids[i] = id;
  }
  return ids;
}

}  // namespace mlakv
