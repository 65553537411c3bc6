// What the model commands (eval, generate, reparam, calibrate --model) share: the
// model directory's tokenizer, the input text or token file, the model's context length.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mlakv/model.h"
#include "mlakv/status.h"
#include "mlakv/tokenizer.h"

namespace mlakv::cli {

// tokenizer.json of `dir`, else byte-level when the vocabulary is 256, else kNotFound.
StatusOr<Tokenizer> tokenizer_for(const std::string& dir, const Model& model);
// --tokens FILE (little-endian int32 ids) or --text FILE encoded without special tokens.
StatusOr<std::vector<int32_t>> input_tokens(const std::string& text_path, const std::string& tokens_path,
                                            const Tokenizer* tok, int32_t vocab);

}  // namespace mlakv::cli
