// GPT-2's byte <-> unicode map (the ByteLevel pre-tokenizer and decoder): printable
// Latin-1 bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) map to themselves, the other
// 68 bytes to U+0100.. in byte order, so every byte is one visible character.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace mlakv::tok {

struct ByteLevelMap {
  std::array<std::string, 256> byte_to_utf8;  // byte -> the UTF-8 of its character
  std::array<int16_t, 324> cp_to_byte;        // code point (< 324) -> byte, or -1
};

const ByteLevelMap& byte_level_map();

// Appends the byte-level spelling of `bytes`.
void byte_level_encode(std::string_view bytes, std::string& out);
// Appends the bytes a byte-level token spells; false (and nothing appended) when the
// token holds a character outside the map (the decoder then uses the token's own UTF-8).
bool byte_level_decode(std::string_view token, std::string& out);

// GPT-2's pre-tokenizer regex, used by ByteLevel { use_regex: true }.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace mlakv::tok
