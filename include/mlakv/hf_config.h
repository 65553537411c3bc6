// Reads a Hugging Face config.json into an MLA ModelConfig. Both conventions found
// in the wild are accepted:
//   - `rope_theta` + `rope_scaling` {type|rope_type, factor, ...} (published
//     DeepSeek / Kimi / GLM checkpoints);
//   - `rope_parameters` {rope_type, rope_theta, factor, ...} (transformers 5).
// Missing optional fields take the defaults transformers uses for that model_type.
#pragma once

#include <string>
#include <string_view>

#include "mlakv/model_config.h"
#include "mlakv/status.h"

namespace mlakv {

// `source` names the config in error messages (a path).
StatusOr<ModelConfig> parse_hf_config(std::string_view json_text, std::string_view source);
// `path` is a config.json file or a directory holding one.
StatusOr<ModelConfig> load_hf_config(const std::string& path);

}  // namespace mlakv
