// UTF-8 helpers and the GPT-2 byte-level alphabet. Invalid input is handled the way Python's
// `bytes.decode(errors="replace")` and Rust's `String::from_utf8_lossy` do it (one U+FFFD per
// maximal subpart of an ill-formed sequence), because that is what HF decoding produces.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deltaserve {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// One step of UTF-8 decoding at `pos`.
struct Utf8Step {
  char32_t cp = 0;       // the code point when `valid`
  std::uint8_t len = 0;  // bytes consumed: the sequence, or the maximal ill-formed subpart (>= 1)
  bool valid = false;
  bool truncated = false;  // ill-formed only because the input ended (more bytes could complete it)
};
Utf8Step utf8_step(std::string_view s, std::size_t pos);

bool is_valid_utf8(std::string_view s);
void append_utf8(std::string& out, char32_t cp);
// Appends `bytes` with every maximal ill-formed subpart replaced by U+FFFD.
void append_utf8_lossy(std::string& out, std::string_view bytes);
// Length of the longest prefix of `bytes` whose lossy decoding cannot change whatever bytes follow:
// everything except a trailing sequence that is truncated (at most 3 bytes).
std::size_t utf8_stable_prefix(std::string_view bytes);

// Unicode White_Space property (what Rust's char::is_whitespace and Oniguruma's \s use).
bool is_unicode_whitespace(char32_t cp);
// General category L* or N* (Rust's char::is_alphanumeric).
bool is_unicode_alphanumeric(char32_t cp);

// GPT-2 byte-level alphabet: each byte maps to a printable code point (bytes 0x21-0x7E,
// 0xA1-0xAC, 0xAE-0xFF map to themselves; the others to U+0100 upwards, in byte order).
const std::array<char32_t, 256>& byte_to_unicode();
// The byte that code point `cp` stands for, or -1 if `cp` is not in the alphabet.
int unicode_to_byte(char32_t cp);
// Byte-level token string (as in tokenizer.json vocab/merges) -> raw bytes. Returns false if a
// character is outside the alphabet (`out` is then unspecified).
bool byte_level_decode(std::string_view token, std::string& out);

}  // namespace deltaserve
