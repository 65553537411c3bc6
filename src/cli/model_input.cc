#include "cli/model_input.h"

#include <fmt/format.h>

#include <filesystem>

#include "mlakv/file_io.h"

namespace mlakv::cli {

namespace fs = std::filesystem;

constexpr uint64_t kMaxTextBytes = uint64_t{1} << 30;

StatusOr<Tokenizer> tokenizer_for(const std::string& dir, const Model& model) {
  if (fs::exists(fs::path(dir) / "tokenizer.json")) return Tokenizer::load(dir);
  if (model.vocab_size() == 256) return Tokenizer::byte_level();
  return not_found(fmt::format("{}: no tokenizer.json, and the vocabulary ({} ids) is not byte-level; "
                               "give pre-tokenized input with --tokens FILE",
                               dir, model.vocab_size()));
}

StatusOr<std::vector<int32_t>> input_tokens(const std::string& text_path, const std::string& tokens_path,
                                            const Tokenizer* tok, int32_t vocab) {
  if (!tokens_path.empty()) return read_token_file(tokens_path, vocab);
  MLAKV_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, io::read_file(text_path, kMaxTextBytes));
  if (bytes.size() > kMaxTextBytes) return invalid_argument(fmt::format("{}: larger than 1 GiB", text_path));
  if (bytes.empty()) return invalid_argument(fmt::format("{}: the text is empty", text_path));
  if (!tok) return invalid_argument("--text needs a tokenizer (the model directory has none): use --tokens");
  MLAKV_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                         tok->encode(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), false));
  return ids;
}

}  // namespace mlakv::cli
