// tokenizer.json (+ tokenizer_config.json) -> TokenizerImpl. The file is untrusted:
// nesting depth is bounded before parsing, duplicate keys in any object are refused
// (nlohmann would keep the last silently), every id is range-checked, every merge must
// name vocab tokens, and settings mlakv cannot honour are refused (kUnimplemented)
// rather than ignored.
#include <algorithm>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/untrusted_json.h"
#include "mlakv/untrusted.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace mlakv {

namespace {

using nlohmann::json;
using tok::AddedToken;
using tok::PreTokStep;
using tok::Regex;
using tok::SplitBehavior;

// tokenizer.json nests at most ~8 deep (post_processor Sequence -> TemplateProcessing ->
// single -> piece -> SpecialToken); anything far deeper is refused before parsing, so a
// nesting bomb cannot exhaust the stack of any recursive walk.
constexpr int kMaxJsonNesting = json_util::kMaxJsonDepth;  // the one limit (docs/security.md)

std::string shown(std::string_view s) { return quote_untrusted(s, 80); }

StatusOr<json> parse_json(std::string_view text, std::string_view source) {
  if (text.size() > kMaxTokenizerJsonBytes) {
    return data_loss(fmt::format("{}: {} bytes is over the {} byte limit", source, text.size(), kMaxTokenizerJsonBytes));
  }
  if (json_util::nesting_depth(text, kMaxJsonNesting) > kMaxJsonNesting) {
    return data_loss(fmt::format("{}: JSON nests deeper than {} levels", source, kMaxJsonNesting));
  }
  // Duplicate keys in any object (a vocab listing one token twice would otherwise keep
  // only its last id).
  std::vector<std::unordered_set<std::string>> keys;
  std::string duplicate;
  auto on_event = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (event == json::parse_event_t::key && duplicate.empty() && !keys.empty()) {
      if (const auto* k = parsed.get_ptr<const std::string*>(); k != nullptr && !keys.back().insert(*k).second) {
        duplicate = *k;
      }
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), on_event, /*allow_exceptions=*/false);
  } catch (const std::exception& e) {  // allocation failure: keep it inside the library
    return data_loss(fmt::format("{}: cannot parse JSON: {}", source, e.what()));
  }
  if (j.is_discarded()) return data_loss(fmt::format("{}: not valid JSON (truncated or malformed)", source));
  if (!j.is_object()) return data_loss(fmt::format("{}: top level must be a JSON object, got {}", source, j.type_name()));
  if (!duplicate.empty()) return data_loss(fmt::format("{}: an object lists the key {} twice", source, shown(duplicate)));
  return j;
}

// Field readers: `where` is the field's path for messages ("model.ignore_merges").
struct Reader {
  std::string_view source;

  Status bad(std::string_view where, std::string_view what) const {
    return data_loss(fmt::format("{}: {} must be {}", source, where, what));
  }
  Status unsupported(std::string_view where, std::string_view what) const {
    return unimplemented(fmt::format("{}: {}: {} is not supported by mlakv (docs/tokenizer.md)", source, where, what));
  }
  // Absent or null -> `dflt`.
  StatusOr<bool> boolean(const json& obj, const char* key, std::string_view where, bool dflt) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) return bad(where, "true or false");
    return it->get<bool>();
  }
  StatusOr<std::string> type_of(const json& obj, std::string_view where) const {
    if (!obj.is_object()) return bad(where, "an object");
    auto it = obj.find("type");
    if (it == obj.end() || !it->is_string()) return bad(std::string(where) + ".type", "a string");
    return it->get<std::string>();
  }
  StatusOr<int32_t> id(const json& v, std::string_view where) const {
    if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0) ||
        v.get<uint64_t>() >= static_cast<uint64_t>(kMaxTokenizerVocab)) {
      return bad(where, fmt::format("an integer id in [0, {})", kMaxTokenizerVocab));
    }
    return static_cast<int32_t>(v.get<uint64_t>());
  }
};

// ---- normalizer ----
Status read_normalizer(const Reader& r, const json& n, std::string_view where) {
  if (n.is_null()) return Status::Ok();
  MLAKV_ASSIGN_OR_RETURN(const std::string type, r.type_of(n, where));
  if (type == "Sequence") {
    auto it = n.find("normalizers");
    if (it == n.end() || !it->is_array()) return r.bad(std::string(where) + ".normalizers", "an array");
    for (std::size_t i = 0; i < it->size(); ++i) {
      MLAKV_RETURN_IF_ERROR(read_normalizer(r, (*it)[i], fmt::format("{}.normalizers[{}]", where, i)));
    }
    return Status::Ok();
  }
  return r.unsupported(where, fmt::format("normalizer type {} (only null or an empty Sequence: byte-level BPE "
                                          "tokenizers of DeepSeek/GLM do not normalize)",
                                          shown(type)));
}

// ---- pre-tokenizer ----
StatusOr<SplitBehavior> read_behavior(const Reader& r, const json& p, std::string_view where) {
  auto it = p.find("behavior");
  if (it == p.end() || !it->is_string()) return r.bad(std::string(where) + ".behavior", "a string");
  const std::string b = it->get<std::string>();
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return r.bad(std::string(where) + ".behavior",
               fmt::format("Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous, got {}", shown(b)));
}

Status read_pre_tokenizer(const Reader& r, const json& p, std::string_view where, std::vector<PreTokStep>* steps) {
  if (p.is_null()) return Status::Ok();
  MLAKV_ASSIGN_OR_RETURN(const std::string type, r.type_of(p, where));
  if (type == "Sequence") {
    auto it = p.find("pretokenizers");
    if (it == p.end() || !it->is_array()) return r.bad(std::string(where) + ".pretokenizers", "an array");
    for (std::size_t i = 0; i < it->size(); ++i) {
      MLAKV_RETURN_IF_ERROR(read_pre_tokenizer(r, (*it)[i], fmt::format("{}.pretokenizers[{}]", where, i), steps));
    }
    return Status::Ok();
  }
  PreTokStep step;
  if (type == "ByteLevel") {
    step.type = PreTokStep::Type::kByteLevel;
    // The library's defaults: add_prefix_space true, use_regex true.
    MLAKV_ASSIGN_OR_RETURN(step.add_prefix_space,
                           r.boolean(p, "add_prefix_space", std::string(where) + ".add_prefix_space", true));
    MLAKV_ASSIGN_OR_RETURN(const bool use_regex, r.boolean(p, "use_regex", std::string(where) + ".use_regex", true));
    if (use_regex) {
      MLAKV_ASSIGN_OR_RETURN(Regex re, Regex::compile(tok::kGpt2Pattern, false, "GPT-2 regex"));
      step.regex = std::move(re);
    }
    steps->push_back(std::move(step));
    return Status::Ok();
  }
  if (type == "Split") {
    step.type = PreTokStep::Type::kSplit;
    auto pat = p.find("pattern");
    const std::string pwhere = std::string(where) + ".pattern";
    if (pat == p.end() || !pat->is_object() || pat->size() != 1) {
      return r.bad(pwhere, "an object with one key, String or Regex");
    }
    const bool literal = pat->begin().key() == "String";
    if (!literal && pat->begin().key() != "Regex") return r.bad(pwhere, "{\"String\": ...} or {\"Regex\": ...}");
    if (!pat->begin().value().is_string()) return r.bad(pwhere + "." + pat->begin().key(), "a string");
    const std::string text = pat->begin().value().get<std::string>();
    if (text.empty()) return r.bad(pwhere, "a non-empty pattern");
    MLAKV_ASSIGN_OR_RETURN(Regex re, Regex::compile(text, literal, fmt::format("{}: {}", r.source, pwhere)));
    step.regex = std::move(re);
    MLAKV_ASSIGN_OR_RETURN(step.behavior, read_behavior(r, p, where));
    MLAKV_ASSIGN_OR_RETURN(step.invert, r.boolean(p, "invert", std::string(where) + ".invert", false));
    steps->push_back(std::move(step));
    return Status::Ok();
  }
  return r.unsupported(where, fmt::format("pre_tokenizer type {} (supported: Sequence, Split, ByteLevel)", shown(type)));
}

// ---- the BPE model ----
Status read_model(const Reader& r, const json& m, TokenizerImpl* t) {
  if (!m.is_object()) return r.bad("model", "an object");
  if (auto it = m.find("type"); it != m.end()) {
    if (!it->is_string()) return r.bad("model.type", "a string");
    if (it->get<std::string>() != "BPE") {
      return r.unsupported("model.type", fmt::format("model {} (only BPE)", shown(it->get<std::string>())));
    }
  }
  if (auto it = m.find("dropout"); it != m.end() && !it->is_null()) {
    return r.unsupported("model.dropout", "BPE dropout (random merges; inference tokenizers have null)");
  }
  MLAKV_ASSIGN_OR_RETURN(const bool byte_fallback, r.boolean(m, "byte_fallback", "model.byte_fallback", false));
  if (byte_fallback) return r.unsupported("model.byte_fallback", "byte_fallback true (<0xNN> tokens)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (auto it = m.find(key); it != m.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
      return r.unsupported(fmt::format("model.{}", key), fmt::format("a {}", key));
    }
  }
  MLAKV_ASSIGN_OR_RETURN(t->bpe.ignore_merges, r.boolean(m, "ignore_merges", "model.ignore_merges", false));
  MLAKV_ASSIGN_OR_RETURN(t->bpe.fuse_unk, r.boolean(m, "fuse_unk", "model.fuse_unk", false));

  auto vit = m.find("vocab");
  if (vit == m.end() || !vit->is_object()) return r.bad("model.vocab", "an object {token: id}");
  if (vit->empty()) return r.bad("model.vocab", "non-empty");
  std::unordered_map<int32_t, const std::string*> by_id;
  by_id.reserve(vit->size());
  t->bpe.vocab.reserve(vit->size());
  for (auto it = vit->begin(); it != vit->end(); ++it) {
    const json& v = it.value();
    // The message is built only on failure: formatting 129k names would dominate loading.
    const bool id_ok = v.is_number_unsigned() && v.get<uint64_t>() < static_cast<uint64_t>(kMaxTokenizerVocab);
    if (!id_ok) MLAKV_RETURN_IF_ERROR(r.id(v, fmt::format("model.vocab[{}]", shown(it.key()))).status());
    const auto id = static_cast<int32_t>(v.get<uint64_t>());
    auto [pos, inserted] = by_id.emplace(id, &it.key());
    if (!inserted) {
      return data_loss(fmt::format("{}: model.vocab gives id {} to both {} and {}", r.source, id, shown(*pos->second),
                                   shown(it.key())));
    }
    t->bpe.vocab.emplace(it.key(), id);
  }
  int32_t max_id = 0;
  for (const auto& [id, tok] : by_id) max_id = std::max(max_id, id);
  t->model_tokens.assign(static_cast<std::size_t>(max_id) + 1, std::string());
  t->has_model_token.assign(static_cast<std::size_t>(max_id) + 1, 0);
  for (const auto& [id, tok] : by_id) {
    t->model_tokens[id] = *tok;
    t->has_model_token[id] = 1;
  }

  if (auto it = m.find("unk_token"); it != m.end() && !it->is_null()) {
    if (!it->is_string()) return r.bad("model.unk_token", "a string or null");
    auto u = t->bpe.vocab.find(it->get<std::string>());
    if (u == t->bpe.vocab.end()) {
      return data_loss(fmt::format("{}: model.unk_token {} is not in model.vocab", r.source, shown(it->get<std::string>())));
    }
    t->bpe.unk_id = u->second;
  }

  auto mit = m.find("merges");
  if (mit == m.end() || !mit->is_array()) return r.bad("model.merges", "an array");
  t->bpe.merges.reserve(mit->size());
  auto lookup = [&](const std::string& s, std::size_t i, const std::string& a, const std::string& b) -> StatusOr<int32_t> {
    auto it = t->bpe.vocab.find(s);
    if (it == t->bpe.vocab.end()) {
      return data_loss(fmt::format("{}: model.merges[{}] {}: {} is not in model.vocab", r.source, i,
                                   shown(a + " " + b), shown(s)));
    }
    return it->second;
  };
  for (std::size_t i = 0; i < mit->size(); ++i) {
    const json& e = (*mit)[i];
    std::string a;
    std::string b;
    if (e.is_string()) {  // legacy "a b"
      const std::string& s = e.get_ref<const std::string&>();
      const std::size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return r.bad(fmt::format("model.merges[{}]", i), fmt::format("\"a b\" (two tokens, one space), got {}", shown(s)));
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return r.bad(fmt::format("model.merges[{}]", i), "a string \"a b\" or a pair [\"a\", \"b\"]");
    }
    MLAKV_ASSIGN_OR_RETURN(const int32_t ia, lookup(a, i, a, b));
    MLAKV_ASSIGN_OR_RETURN(const int32_t ib, lookup(b, i, a, b));
    MLAKV_ASSIGN_OR_RETURN(const int32_t merged, lookup(a + b, i, a, b));
    // A pair listed twice keeps its later rank, as the library's HashMap collect does.
    t->bpe.merges[tok::Bpe::pair_key(ia, ib)] = {static_cast<int32_t>(i), merged};
  }
  return Status::Ok();
}

// ---- added tokens ----
Status read_added_tokens(const Reader& r, const json& arr, TokenizerImpl* t) {
  if (arr.is_null()) return Status::Ok();
  if (!arr.is_array()) return r.bad("added_tokens", "an array");
  for (std::size_t i = 0; i < arr.size(); ++i) {
    const json& e = arr[i];
    const std::string where = fmt::format("added_tokens[{}]", i);
    if (!e.is_object()) return r.bad(where, "an object");
    AddedToken a;
    auto id = e.find("id");
    if (id == e.end()) return r.bad(where + ".id", "present");
    MLAKV_ASSIGN_OR_RETURN(a.id, r.id(*id, where + ".id"));
    auto content = e.find("content");
    if (content == e.end() || !content->is_string() || content->get_ref<const std::string&>().empty()) {
      return r.bad(where + ".content", "a non-empty string");
    }
    a.content = content->get<std::string>();
    MLAKV_ASSIGN_OR_RETURN(a.special, r.boolean(e, "special", where + ".special", false));
    MLAKV_ASSIGN_OR_RETURN(a.single_word, r.boolean(e, "single_word", where + ".single_word", false));
    MLAKV_ASSIGN_OR_RETURN(a.lstrip, r.boolean(e, "lstrip", where + ".lstrip", false));
    MLAKV_ASSIGN_OR_RETURN(a.rstrip, r.boolean(e, "rstrip", where + ".rstrip", false));
    MLAKV_ASSIGN_OR_RETURN(a.normalized, r.boolean(e, "normalized", where + ".normalized", !a.special));
    const auto index = static_cast<int32_t>(t->added.size());
    if (auto it = t->added_by_content.find(a.content); it != t->added_by_content.end()) {
      return data_loss(fmt::format("{}: {} repeats the content {} of added_tokens[{}]", r.source, where,
                                   shown(a.content), it->second));
    }
    if (auto it = t->added_by_id.find(a.id); it != t->added_by_id.end()) {
      return data_loss(fmt::format("{}: {} repeats id {} of added_tokens[{}]", r.source, where, a.id, it->second));
    }
    // An added token that is also a model token must keep that token's id; its id must
    // not belong to another model token.
    if (auto it = t->bpe.vocab.find(a.content); it != t->bpe.vocab.end() && it->second != a.id) {
      return data_loss(fmt::format("{}: {} {} has id {} but model.vocab gives it id {}", r.source, where,
                                   shown(a.content), a.id, it->second));
    }
    if (static_cast<std::size_t>(a.id) < t->has_model_token.size() && t->has_model_token[a.id] &&
        t->model_tokens[a.id] != a.content) {
      return data_loss(fmt::format("{}: {} {} has id {}, which model.vocab gives to {}", r.source, where,
                                   shown(a.content), a.id, shown(t->model_tokens[a.id])));
    }
    t->added_by_content.emplace(a.content, index);
    t->added_by_id.emplace(a.id, index);
    // The normalizers mlakv accepts are the identity, so a normalized token's pattern is
    // its content; the two matchers still run in the library's order (non-normalized
    // tokens on the raw text first, then normalized ones on what is left).
    (a.normalized ? t->normalized_matcher : t->raw_matcher).add(a.content, index);
    t->added.push_back(std::move(a));
  }
  return Status::Ok();
}

// ---- post-processor ----
Status read_post_processor(const Reader& r, const json& p, std::string_view where, TokenizerImpl* t) {
  if (p.is_null()) return Status::Ok();
  MLAKV_ASSIGN_OR_RETURN(const std::string type, r.type_of(p, where));
  if (type == "Sequence") {
    auto it = p.find("processors");
    if (it == p.end() || !it->is_array()) return r.bad(std::string(where) + ".processors", "an array");
    for (std::size_t i = 0; i < it->size(); ++i) {
      MLAKV_RETURN_IF_ERROR(read_post_processor(r, (*it)[i], fmt::format("{}.processors[{}]", where, i), t));
    }
    return Status::Ok();
  }
  if (type == "ByteLevel") return Status::Ok();  // offsets only: no ids added
  if (type != "TemplateProcessing") {
    return r.unsupported(where, fmt::format("post_processor type {} (supported: TemplateProcessing, ByteLevel, "
                                            "Sequence)",
                                            shown(type)));
  }
  auto single = p.find("single");
  const std::string swhere = std::string(where) + ".single";
  if (single == p.end() || !single->is_array()) return r.bad(swhere, "an array");
  auto specials = p.find("special_tokens");
  if (specials == p.end() || !specials->is_object()) return r.bad(std::string(where) + ".special_tokens", "an object");
  std::vector<int32_t> before;
  std::vector<int32_t> after;
  bool seen_a = false;
  for (std::size_t i = 0; i < single->size(); ++i) {
    const json& piece = (*single)[i];
    const std::string pw = fmt::format("{}[{}]", swhere, i);
    if (!piece.is_object() || piece.size() != 1) return r.bad(pw, "{\"SpecialToken\": ...} or {\"Sequence\": ...}");
    const std::string& kind = piece.begin().key();
    const json& body = piece.begin().value();
    if (!body.is_object() || !body.contains("id") || !body["id"].is_string()) return r.bad(pw + ".id", "a string");
    const std::string name = body["id"].get<std::string>();
    if (kind == "Sequence") {
      if (name != "A") return r.unsupported(pw, fmt::format("sequence {} in the single template (only A)", shown(name)));
      if (seen_a) return r.bad(swhere, "a template naming $A once");
      seen_a = true;
    } else if (kind == "SpecialToken") {
      auto st = specials->find(name);
      if (st == specials->end() || !st->is_object() || !st->contains("ids") || !(*st)["ids"].is_array()) {
        return data_loss(fmt::format("{}: {} names {}, which {}.special_tokens does not define with ids", r.source, pw,
                                     shown(name), where));
      }
      for (const json& v : (*st)["ids"]) {
        MLAKV_ASSIGN_OR_RETURN(const int32_t id, r.id(v, fmt::format("{}.special_tokens[{}].ids", where, shown(name))));
        (seen_a ? after : before).push_back(id);
      }
    } else {
      return r.bad(pw, "{\"SpecialToken\": ...} or {\"Sequence\": ...}");
    }
  }
  if (!seen_a) return r.bad(swhere, "a template containing $A");
  // A later template wraps the output of the earlier ones.
  t->prefix.insert(t->prefix.begin(), before.begin(), before.end());
  t->suffix.insert(t->suffix.end(), after.begin(), after.end());
  return Status::Ok();
}

// bos_token / eos_token of tokenizer_config.json: a string, {"content": ...} or null.
Status read_config_token(const Reader& r, const json& cfg, const char* key, const TokenizerImpl& t,
                         std::optional<int32_t>* out) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return Status::Ok();
  std::string content;
  if (it->is_string()) {
    content = it->get<std::string>();
  } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    content = (*it)["content"].get<std::string>();
  } else {
    return r.bad(key, "a string, {\"content\": ...} or null");
  }
  if (auto a = t.added_by_content.find(content); a != t.added_by_content.end()) {
    *out = t.added[a->second].id;
    return Status::Ok();
  }
  if (auto v = t.bpe.vocab.find(content); v != t.bpe.vocab.end()) {
    *out = v->second;
    return Status::Ok();
  }
  return data_loss(fmt::format("{}: {} {} is not a token of the tokenizer", r.source, key, shown(content)));
}

}  // namespace

StatusOr<std::shared_ptr<TokenizerImpl>> parse_tokenizer_json(std::string_view text, std::string_view source,
                                                              std::string_view config_text,
                                                              std::string_view config_source) {
  MLAKV_ASSIGN_OR_RETURN(const json j, parse_json(text, source));
  const Reader r{source};
  auto t = std::make_shared<TokenizerImpl>();
  t->kind = Tokenizer::Kind::kBpe;
  t->source = std::string(source);

  for (const char* key : {"truncation", "padding"}) {
    if (auto it = j.find(key); it != j.end() && !it->is_null()) {
      return r.unsupported(key, fmt::format("{} (mlakv encodes whole texts; set it to null)", key));
    }
  }
  auto model = j.find("model");
  if (model == j.end()) return r.bad("model", "present");
  MLAKV_RETURN_IF_ERROR(read_model(r, *model, t.get()));
  if (auto it = j.find("normalizer"); it != j.end()) MLAKV_RETURN_IF_ERROR(read_normalizer(r, *it, "normalizer"));
  if (auto it = j.find("pre_tokenizer"); it != j.end()) {
    MLAKV_RETURN_IF_ERROR(read_pre_tokenizer(r, *it, "pre_tokenizer", &t->pre));
  }
  if (auto it = j.find("added_tokens"); it != j.end()) MLAKV_RETURN_IF_ERROR(read_added_tokens(r, *it, t.get()));
  {
    auto it = j.find("decoder");
    if (it == j.end() || it->is_null()) return r.unsupported("decoder", "a missing or null decoder (only ByteLevel)");
    MLAKV_ASSIGN_OR_RETURN(const std::string type, r.type_of(*it, "decoder"));
    if (type != "ByteLevel") return r.unsupported("decoder", fmt::format("decoder type {} (only ByteLevel)", shown(type)));
  }

  int64_t vocab = static_cast<int64_t>(t->model_tokens.size());
  for (const AddedToken& a : t->added) vocab = std::max<int64_t>(vocab, int64_t{a.id} + 1);
  t->vocab_size = static_cast<int32_t>(vocab);

  if (auto it = j.find("post_processor"); it != j.end()) {
    MLAKV_RETURN_IF_ERROR(read_post_processor(r, *it, "post_processor", t.get()));
  }
  for (const int32_t id : t->prefix) {
    if (id >= t->vocab_size) {
      return data_loss(fmt::format("{}: post_processor adds id {}, outside the vocab of {}", source, id, t->vocab_size));
    }
  }
  for (const int32_t id : t->suffix) {
    if (id >= t->vocab_size) {
      return data_loss(fmt::format("{}: post_processor adds id {}, outside the vocab of {}", source, id, t->vocab_size));
    }
  }

  if (!config_text.empty()) {
    MLAKV_ASSIGN_OR_RETURN(const json cfg, parse_json(config_text, config_source));
    const Reader cr{config_source};
    MLAKV_RETURN_IF_ERROR(read_config_token(cr, cfg, "bos_token", *t, &t->bos));
    MLAKV_RETURN_IF_ERROR(read_config_token(cr, cfg, "eos_token", *t, &t->eos));
  }
  return t;
}

}  // namespace mlakv
