// Deterministic random text for property tests: mixed scripts, combining marks, emoji sequences,
// whitespace runs, digits and punctuation, plus arbitrary (often invalid) byte strings.
#pragma once

#include <random>
#include <string>

#include "tokenizer/unicode.h"

namespace deltaserve::testing {

inline char32_t random_code_point(std::mt19937& rng) {
  struct Range {
    char32_t lo, hi;
  };
  static constexpr Range kRanges[] = {
      {'a', 'z'},          {'A', 'Z'},       {'0', '9'},         {'!', '/'},
      {':', '@'},          {0xC0, 0x17F},    {0x300, 0x36F},     {0x391, 0x3C9},
      {0x400, 0x44F},      {0x5D0, 0x5EA},   {0x620, 0x64A},     {0x900, 0x97F},
      {0xE01, 0xE3A},      {0x1100, 0x11FF}, {0x3040, 0x30FF},   {0x4E00, 0x9FFF},
      {0xAC00, 0xD7A3},    {0xFF01, 0xFF5E}, {0x1F300, 0x1F64F}, {0x1F3FB, 0x1F3FF},
      {0x10000, 0x10FFFF}, {0x80, 0xFFFF},
  };
  static constexpr char32_t kSpaces[] = {' ',  ' ',    ' ',    '\t',   '\n',   '\n',   '\r', 0xA0,
                                         0x85, 0x2003, 0x3000, 0x200D, 0xFE0F, 0x180E, 0x1C};
  std::uniform_int_distribution<int> kind(0, 9);
  const int k = kind(rng);
  if (k < 3)
    return kSpaces[std::uniform_int_distribution<std::size_t>(0, std::size(kSpaces) - 1)(rng)];
  const Range r =
      kRanges[std::uniform_int_distribution<std::size_t>(0, std::size(kRanges) - 1)(rng)];
  char32_t cp = std::uniform_int_distribution<char32_t>(r.lo, r.hi)(rng);
  if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';  // surrogates are not encodable
  return cp;
}

inline std::string random_unicode_string(std::mt19937& rng, int max_chars) {
  std::string s;
  const int n = std::uniform_int_distribution<int>(0, max_chars)(rng);
  for (int i = 0; i < n; ++i) {
    const char32_t cp = random_code_point(rng);
    // Sometimes repeat a character to make runs (spaces, digits, punctuation).
    const int reps = std::uniform_int_distribution<int>(0, 7)(rng) == 0 ? 5 : 1;
    for (int r = 0; r < reps; ++r) append_utf8(s, cp);
  }
  return s;
}

inline std::string random_bytes(std::mt19937& rng, int max_len) {
  std::string s;
  const int n = std::uniform_int_distribution<int>(0, max_len)(rng);
  for (int i = 0; i < n; ++i) {
    // Bias towards UTF-8 lead/continuation bytes so truncated and overlong sequences are common.
    const int k = std::uniform_int_distribution<int>(0, 3)(rng);
    const int lo = k == 0 ? 0x00 : k == 1 ? 0x80 : k == 2 ? 0xC0 : 0x00;
    const int hi = k == 0 ? 0x7F : k == 1 ? 0xBF : 0xFF;
    s.push_back(static_cast<char>(std::uniform_int_distribution<int>(lo, hi)(rng)));
  }
  return s;
}

}  // namespace deltaserve::testing
