#include "core/untrusted_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "mlakv/untrusted.h"

namespace mlakv::json_util {

using nlohmann::json;

int nesting_depth(std::string_view text, int limit) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) break;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

StatusOr<json> parse(std::string_view text, std::string_view source, const ParseOptions& o) {
  auto fail = [&](std::string msg) { return Status(o.code, std::move(msg)); };
  if (nesting_depth(text, o.max_depth) > o.max_depth) {
    return fail(fmt::format("{}: JSON nests deeper than {} levels", source, o.max_depth));
  }
  std::set<std::string, std::less<>> top_keys;
  bool dup = false;
  bool too_deep = false;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    // Second line of defence (the pre-scan already bounds the depth).
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= o.max_depth) {
      too_deep = true;
    }
    if (o.duplicate_key != nullptr && event == json::parse_event_t::key && depth == 1 && !dup) {
      if (const auto* key = parsed.get_ptr<const std::string*>(); key != nullptr && !top_keys.insert(*key).second) {
        dup = true;
        *o.duplicate_key = *key;
      }
    }
    return !too_deep;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), on_event, /*allow_exceptions=*/false);
  } catch (const std::exception& e) {  // allocation failure or a library invariant: keep it inside
    return fail(fmt::format("{}: cannot parse JSON: {}", source, e.what()));
  }
  if (too_deep) return fail(fmt::format("{}: JSON nests deeper than {} levels", source, o.max_depth));
  if (j.is_discarded()) return fail(fmt::format("{}: not valid JSON", source));
  if (o.require_object && !j.is_object()) {
    return fail(fmt::format("{}: top level must be a JSON object, got {}", source, j.type_name()));
  }
  if (!dup && o.duplicate_key != nullptr) o.duplicate_key->clear();
  return j;
}

std::string shown(const json& v) {
  try {
    return escape_untrusted(v.dump(-1, ' ', false, json::error_handler_t::replace));
  } catch (const std::exception&) {
    return "(unprintable value)";
  }
}

}  // namespace mlakv::json_util
