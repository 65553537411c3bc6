// Reads a Hugging Face config.json into an MLA ModelConfig, following transformers
// 5.23. The conventions, and the transformers files they were checked against, are
// listed at the top of src/weights/hf_config.cc. Both conventions found in the wild
// are accepted:
//   - `rope_theta` + `rope_scaling` {type|rope_type, factor, ...} (published
//     DeepSeek / Kimi / GLM checkpoints);
//   - `rope_parameters` {rope_type, rope_theta, factor, ...} (transformers 5).
// When both are present, a non-empty `rope_scaling` wins, as in transformers.
// hidden_size, num_hidden_layers, num_attention_heads, kv_lora_rank, qk_nope_head_dim
// and qk_rope_head_dim are required. Other absent keys take the defaults of that
// model_type's transformers config class; unknown model types must also give
// q_lora_rank (null = plain q_proj) and v_head_dim. A multimodal wrapper's text_config
// is read when the top level has no kv_lora_rank.
// Errors name the source and the field ("rope_scaling.factor"): kInvalidArgument for
// invalid JSON or malformed, missing or out-of-range fields; kUnimplemented for rope
// types (or combinations) mlakv cannot represent; kNotFound / kIoError from the file.
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
