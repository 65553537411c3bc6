#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace mlakv::tok {

namespace {

ByteLevelMap make_map() {
  ByteLevelMap m;
  m.cp_to_byte.fill(-1);
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
    append_utf8(m.byte_to_utf8[b], cp);
    m.cp_to_byte[cp] = static_cast<int16_t>(b);
  }
  return m;
}

}  // namespace

const ByteLevelMap& byte_level_map() {
  static const ByteLevelMap map = make_map();
  return map;
}

void byte_level_encode(std::string_view bytes, std::string& out) {
  const ByteLevelMap& m = byte_level_map();
  for (char c : bytes) out += m.byte_to_utf8[static_cast<unsigned char>(c)];
}

bool byte_level_decode(std::string_view token, std::string& out) {
  const ByteLevelMap& m = byte_level_map();
  const std::size_t start = out.size();
  for (std::size_t i = 0; i < token.size();) {
    const uint32_t cp = decode_utf8_at(token, i);
    i += utf8_char_len(static_cast<unsigned char>(token[i]));
    if (cp >= m.cp_to_byte.size() || m.cp_to_byte[cp] < 0) {
      out.resize(start);
      return false;
    }
    out.push_back(static_cast<char>(m.cp_to_byte[cp]));
  }
  return true;
}

}  // namespace mlakv::tok
