#include "mlakv/untrusted.h"

#include <fmt/format.h>

namespace mlakv {
namespace {

// Length of the valid UTF-8 sequence at s[i] (1-4), or 0 when invalid (overlong forms,
// surrogates and code points past U+10FFFF are invalid).
std::size_t utf8_length(std::string_view s, std::size_t i, uint32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  std::size_t n;
  uint32_t min;
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  } else if ((b0 & 0xE0) == 0xC0) {
    n = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

std::string escape_untrusted(std::string_view s, std::size_t max_bytes) {
  const std::string_view shown = s.substr(0, std::min(s.size(), max_bytes));
  std::string out;
  out.reserve(shown.size() + 8);
  for (std::size_t i = 0; i < shown.size();) {
    uint32_t cp = 0;
    const std::size_t n = utf8_length(shown, i, cp);
    if (n == 0) {  // invalid (or cut at max_bytes): escape this byte alone
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(shown[i]));
      ++i;
      continue;
    }
    if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += fmt::format("\\x{:02x}", cp);
    } else if (cp >= 0x80 && cp <= 0x9F) {  // C1 controls (0xC2 0x9B is CSI)
      for (std::size_t k = 0; k < n; ++k) out += fmt::format("\\x{:02x}", static_cast<unsigned char>(shown[i + k]));
    } else {
      out.append(shown.substr(i, n));
    }
    i += n;
  }
  if (s.size() > max_bytes) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

std::string quote_untrusted(std::string_view s, std::size_t max_bytes) {
  return "'" + escape_untrusted(s, max_bytes) + "'";
}

}  // namespace mlakv
