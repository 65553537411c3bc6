// Quoting bytes that came from a file (tensor names, JSON keys and strings, shard
// names, paths) in messages. A name may hold terminal escape sequences (ESC ] 0 ;
// retitles the terminal, ESC [ 2 J clears it), or invalid UTF-8; printed raw, an
// error message would act on the user's terminal. Every message that quotes file
// content passes it through these helpers (docs/security.md).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace mlakv {

// Longest untrusted text a message shows; longer text is cut and its size given.
inline constexpr std::size_t kMaxQuotedBytes = 160;

// `s` with C0 controls (0x00-0x1f), DEL (0x7f), C1 controls (U+0080-U+009F) and bytes
// that are not valid UTF-8 written as \xNN (\n, \t, \r as themselves escaped: \n \t
// \r). Valid printable UTF-8 is kept. Past `max_bytes` of input the text is cut and
// "... (N bytes)" appended.
std::string escape_untrusted(std::string_view s, std::size_t max_bytes = kMaxQuotedBytes);

// escape_untrusted(s) in single quotes: 'model.layers.0.\x1b[2J'.
std::string quote_untrusted(std::string_view s, std::size_t max_bytes = kMaxQuotedBytes);

}  // namespace mlakv
