// UTF-8 helpers of the tokenizer room: validation (RFC 3629: no overlongs, no
// surrogates, nothing past U+10FFFF), decoding one character, encoding a code point.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mlakv::tok {

inline constexpr std::size_t kValidUtf8 = static_cast<std::size_t>(-1);

// The byte offset of the first byte that does not start or continue a valid UTF-8
// sequence, or kValidUtf8 when the whole text is valid.
std::size_t first_invalid_utf8(std::string_view text);

// Length in bytes of the character starting at s[i] (the text is valid UTF-8).
inline std::size_t utf8_char_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// The code point starting at s[i] (valid UTF-8, i < s.size()).
uint32_t decode_utf8_at(std::string_view s, std::size_t i);
// Offset of the character that ends at s[end) (valid UTF-8, end > 0).
std::size_t utf8_prev_char_start(std::string_view s, std::size_t end);

void append_utf8(std::string& out, uint32_t cp);

}  // namespace mlakv::tok
