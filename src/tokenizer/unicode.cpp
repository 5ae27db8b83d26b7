#include "tokenizer/unicode.h"

#include <utf8proc.h>

namespace deltaserve {

Utf8Step utf8_step(std::string_view s, std::size_t pos) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  Utf8Step r;
  const unsigned char b0 = byte(pos);
  if (b0 < 0x80) return {b0, 1, true, false};
  int need;                            // continuation bytes after b0
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // > U+10FFFF
  } else {
    return {0, 1, false, false};
  }
  std::size_t i = pos + 1;
  for (int k = 0; k < need; ++k, ++i) {
    if (i >= s.size()) {
      r.len = static_cast<std::uint8_t>(i - pos);
      r.truncated = true;
      return r;
    }
    const unsigned char b = byte(i);
    const unsigned char l = k == 0 ? lo : 0x80, h = k == 0 ? hi : 0xBF;
    if (b < l || b > h) {
      r.len = static_cast<std::uint8_t>(i - pos);
      return r;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, static_cast<std::uint8_t>(need + 1), true, false};
}

bool is_valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path: eight bytes at a time.
    while (i + 8 <= s.size()) {
      std::uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step st = utf8_step(s, i);
    if (!st.valid) return false;
    i += st.len;
  }
  return true;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

void append_utf8_lossy(std::string& out, std::string_view bytes) {
  std::size_t i = 0, run = 0;  // [run, i) is valid and not yet copied
  while (i < bytes.size()) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step st = utf8_step(bytes, i);
    if (st.valid) {
      i += st.len;
      continue;
    }
    out.append(bytes.substr(run, i - run));
    append_utf8(out, kReplacementChar);
    i += st.len;
    run = i;
  }
  out.append(bytes.substr(run));
}

std::size_t utf8_stable_prefix(std::string_view bytes) {
  // Only the last (up to) 4 bytes can hold a truncated sequence; find where it would start.
  const std::size_t n = bytes.size();
  const std::size_t from = n > 4 ? n - 4 : 0;
  std::size_t i = from;
  // Re-synchronise: skip continuation bytes, which cannot start a sequence. The lossy decoding of
  // bytes before a lead byte does not depend on what follows that lead byte.
  while (i < n && (static_cast<unsigned char>(bytes[i]) & 0xC0) == 0x80) ++i;
  while (i < n) {
    const Utf8Step st = utf8_step(bytes, i);
    if (st.truncated) return i;
    i += st.len;
  }
  return n;
}

bool is_unicode_whitespace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_unicode_alphanumeric(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

namespace {

struct ByteTables {
  std::array<char32_t, 256> to_unicode{};
  std::array<std::int16_t, 324> to_byte{};  // every mapped code point is < 256 + 68
  ByteTables() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_unicode[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_unicode[b]] = static_cast<std::int16_t>(b);
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}

}  // namespace

const std::array<char32_t, 256>& byte_to_unicode() { return byte_tables().to_unicode; }

int unicode_to_byte(char32_t cp) {
  const auto& t = byte_tables().to_byte;
  return cp < t.size() ? t[cp] : -1;
}

bool byte_level_decode(std::string_view token, std::string& out) {
  out.clear();
  std::size_t i = 0;
  while (i < token.size()) {
    const Utf8Step st = utf8_step(token, i);
    if (!st.valid) return false;
    const int b = unicode_to_byte(st.cp);
    if (b < 0) return false;
    out.push_back(static_cast<char>(b));
    i += st.len;
  }
  return true;
}

}  // namespace deltaserve
