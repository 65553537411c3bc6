// The one parser entry for JSON read from disk (config.json, quantization_config,
// outer-scale files, safetensors headers, model.safetensors.index.json). Parsing is
// bounded before anything recursive runs: the nesting depth is checked by a linear
// pre-scan and again by the parser callback, so no later walk (copy, dump, compare)
// can exhaust the stack; exceptions (allocation, library invariants) stay inside.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "mlakv/status.h"

namespace mlakv::json_util {

// Deepest { / [ nesting accepted anywhere (real files nest at most ~6 deep).
inline constexpr int kMaxJsonDepth = 32;

struct ParseOptions {
  StatusCode code = StatusCode::kInvalidArgument;  // the code of every parse error
  int max_depth = kMaxJsonDepth;
  bool require_object = true;  // the top level must be an object
  // When set, receives the first top-level key that appears twice ("" when none):
  // nlohmann keeps only the last one, which would hide a conflicting entry.
  std::string* duplicate_key = nullptr;
};

// Deepest { / [ nesting of `text` (string contents skipped); stops counting once past
// `limit`, so the result is at most limit + 1.
int nesting_depth(std::string_view text, int limit);

// Parses `text`; errors name `source` ("config.json: JSON nests deeper than 32 levels",
// "...: not valid JSON", "...: top level must be a JSON object, got array").
StatusOr<nlohmann::json> parse(std::string_view text, std::string_view source, const ParseOptions& options = {});

// A JSON value's text for an error message: at most kMaxQuotedBytes, invalid UTF-8
// replaced, control characters escaped (mlakv/untrusted.h). Never throws.
std::string shown(const nlohmann::json& v);

}  // namespace mlakv::json_util
