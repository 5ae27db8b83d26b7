// UTF-8 helpers, byte-level alphabet and the pre-tokenizer's whitespace rewrite.
#include "tokenizer/unicode.h"

#include <gtest/gtest.h>

#include "tokenizer/pretokenizer.h"

namespace deltaserve {
namespace {

std::string lossy(std::string_view s) {
  std::string out;
  append_utf8_lossy(out, s);
  return out;
}

TEST(Unicode, LossyReplacesMaximalSubparts) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(lossy("abc"), "abc");
  EXPECT_EQ(lossy("\x80"), fffd);
  EXPECT_EQ(lossy("\xE2\x82"), fffd);  // truncated: one replacement
  EXPECT_EQ(lossy("\xE2\x82"
                  "a"),
            fffd + "a");
  EXPECT_EQ(lossy("\xF0\x9F\x98"), fffd);
  EXPECT_EQ(lossy("\xC0\xAF"), fffd + fffd);             // overlong lead is invalid alone
  EXPECT_EQ(lossy("\xED\xA0\x80"), fffd + fffd + fffd);  // surrogate
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // > U+10FFFF
  EXPECT_EQ(lossy("\xE2\x82\xAC"), "\xE2\x82\xAC");
}

TEST(Unicode, StablePrefixStopsBeforeTruncatedTail) {
  EXPECT_EQ(utf8_stable_prefix("abc"), 3u);
  EXPECT_EQ(utf8_stable_prefix("ab\xE2\x82"), 2u);
  EXPECT_EQ(utf8_stable_prefix("ab\xE2\x82\xAC"), 5u);
  EXPECT_EQ(utf8_stable_prefix("\xF0\x9F\x98"), 0u);
  EXPECT_EQ(utf8_stable_prefix("a\x80"), 2u);  // invalid, but already determined
  EXPECT_EQ(utf8_stable_prefix("a\xE2\x41"), 3u);
}

TEST(Unicode, ByteLevelAlphabetIsABijection) {
  std::string spelled, back;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = byte_to_unicode()[b];
    EXPECT_EQ(unicode_to_byte(cp), b);
    spelled.clear();
    append_utf8(spelled, cp);
    ASSERT_TRUE(byte_level_decode(spelled, back));
    EXPECT_EQ(back, std::string(1, static_cast<char>(b)));
  }
  EXPECT_EQ(byte_to_unicode()[' '], U'\u0120');           // "Ġ"
  EXPECT_EQ(byte_to_unicode()['\n'], U'\u010A');          // "Ċ"
  EXPECT_FALSE(byte_level_decode("\xE4\xB8\x80", back));  // U+4E00 is not in the alphabet
}

TEST(PreTokenizer, WhitespaceClassesFollowOniguruma) {
  const std::string r = rewrite_whitespace_classes(R"(\s+(?!\S)|[^\s\p{L}]|\\s|[\]\s])");
  EXPECT_EQ(r.find("\\s"), r.find("\\\\s") + 1);  // only the escaped backslash + 's' remains
  EXPECT_EQ(r.find("\\S"), std::string::npos);
  // \Q...\E is a literal and stays untouched.
  const std::string ws = rewrite_whitespace_classes(R"(\s)");
  EXPECT_EQ(rewrite_whitespace_classes(R"(a\Q\s[\E\s)"), R"(a\Q\s[\E)" + ws);
  auto pt = PreTokenizer::create({"\\s+|\\S+"});
  ASSERT_TRUE(pt.is_ok());
  std::vector<std::string_view> pieces;
  // U+180E is not White_Space (PCRE2 would call it a space); U+0085 is.
  pt->split(
      "a\xE1\xA0\x8E"
      "b\xC2\x85"
      "c",
      pieces);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0],
            "a\xE1\xA0\x8E"
            "b");
  EXPECT_EQ(pieces[1], "\xC2\x85");
}

TEST(PreTokenizer, BadRegexIsAnError) {
  auto pt = PreTokenizer::create({"(unclosed"});
  ASSERT_FALSE(pt.is_ok());
  EXPECT_NE(pt.status().message().find("regex"), std::string::npos);
}

}  // namespace
}  // namespace deltaserve
