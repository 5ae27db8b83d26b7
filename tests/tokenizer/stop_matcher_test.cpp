// Stop strings across arbitrary piece boundaries.
#include "tokenizer/stop_matcher.h"

#include <gtest/gtest.h>

#include <random>

namespace deltaserve {
namespace {

struct Streamed {
  std::string text;
  bool stopped = false;
  int stop_idx = -1;
};

Streamed run(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopMatcher m(stops);
  Streamed s;
  for (const auto& p : pieces) {
    auto out = m.push(p);
    s.text += out.text;
    if (out.stopped) {
      s.stopped = true;
      s.stop_idx = out.stop_idx;
      return s;
    }
  }
  s.text += m.flush();
  return s;
}

TEST(StopMatcher, StopInsideOnePiece) {
  auto s = run({"END"}, {"hello END world"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "hello ");
  EXPECT_EQ(s.stop_idx, 0);
}

TEST(StopMatcher, StopAcrossPieces) {
  auto s = run({"</answer>"}, {"the answer is 4</", "ans", "wer>", " trailing"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "the answer is 4");
}

TEST(StopMatcher, HoldsBackPossiblePrefixThenReleasesIt) {
  StopMatcher m({"\n\nUser:"});
  auto a = m.push("line\n");
  EXPECT_EQ(a.text, "line");  // "\n" may start the stop string
  auto b = m.push("\nUs");
  EXPECT_EQ(b.text, "");
  auto c = m.push("ed it");  // "\n\nUse" + "d" diverges: everything is released
  EXPECT_FALSE(c.stopped);
  EXPECT_EQ(c.text, "\n\nUsed it");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, FlushReturnsHeldText) {
  auto s = run({"STOP"}, {"abc ST"});
  EXPECT_FALSE(s.stopped);
  EXPECT_EQ(s.text, "abc ST");
}

TEST(StopMatcher, EarliestOfSeveralStops) {
  auto s = run({"world", "lo w"}, {"hel", "lo world"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "hel");
  EXPECT_EQ(s.stop_idx, 1);
}

TEST(StopMatcher, OverlappingPrefixes) {
  // "aab" inside "aaab": the held suffix must be re-examined, not just its first candidate.
  auto s = run({"aab"}, {"a", "a", "a", "b", "c"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "a");
}

TEST(StopMatcher, MultibyteStopString) {
  auto s = run({"。\n"}, {"日本語", "\xE3\x80", "\x82", "\nrest"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "日本語");
}

TEST(StopMatcher, IgnoresInputAfterStop) {
  StopMatcher m({"x"});
  EXPECT_TRUE(m.push("axb").stopped);
  auto after = m.push("more");
  EXPECT_TRUE(after.stopped);
  EXPECT_EQ(after.text, "");
}

TEST(StopMatcher, NoStopStringsPassesThrough) {
  auto s = run({}, {"a", "b"});
  EXPECT_EQ(s.text, "ab");
  auto e = run({""}, {"a", "b"});
  EXPECT_EQ(e.text, "ab");
}

TEST(StopMatcher, RandomSplitsAgreeWithWholeTextSearch) {
  // Any split of the text into pieces gives the same result as searching the whole text.
  std::mt19937 rng(3);
  const std::vector<std::string> stops = {"abca", "bb", "cab"};
  for (int i = 0; i < 3000; ++i) {
    std::string text;
    const int n = std::uniform_int_distribution<int>(0, 20)(rng);
    for (int k = 0; k < n; ++k) text.push_back("abc"[rng() % 3]);
    std::size_t first = std::string::npos;
    for (const auto& s : stops) first = std::min(first, text.find(s));
    std::vector<std::string> pieces;
    for (std::size_t k = 0; k < text.size();) {
      const std::size_t len = 1 + rng() % 4;
      pieces.push_back(text.substr(k, len));
      k += len;
    }
    const auto s = run(stops, pieces);
    ASSERT_EQ(s.stopped, first != std::string::npos) << text;
    ASSERT_EQ(s.text, first == std::string::npos ? text : text.substr(0, first)) << text;
  }
}

// min_tokens: unchecked text never ends a match, but a stop string that starts in it and ends in
// checked text does.
TEST(StopMatcher, UncheckedTextIsEmittedButNotMatched) {
  StopMatcher m({"END"});
  auto a = m.push("x END yEN", /*match=*/false);
  EXPECT_FALSE(a.stopped);
  EXPECT_EQ(a.text, "x END y");  // "EN" held back: it may grow into "END"
  auto b = m.push("D z");
  EXPECT_TRUE(b.stopped);
  EXPECT_EQ(b.text, "");
  StopMatcher n({"END"});
  EXPECT_EQ(n.push("END", false).text, "END");
  auto c = n.push(" more END");
  EXPECT_TRUE(c.stopped);
  EXPECT_EQ(c.text, " more ");
}

}  // namespace
}  // namespace deltaserve
