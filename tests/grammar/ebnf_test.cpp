#include "grammar/ebnf.h"

#include "grammar_test_util.h"

namespace deltaserve {
namespace {

using testing::byte_vocab;
using testing::compile_or_die;
using testing::matches;

struct EbnfCase {
  const char* grammar;
  std::vector<const char*> accept;
  std::vector<const char*> reject;
};

TEST(Ebnf, AcceptsAndRejects) {
  const std::vector<EbnfCase> cases = {
      {R"G(root ::= "yes" | "no")G", {"yes", "no"}, {"y", "yesno", ""}},
      {R"G(root ::= answer ("," answer)*
          answer ::= [0-9]+ | "none"   # a comment
      )G", {"1", "12,none,3"}, {",", "1,", "1,,2"}},
      // Recursion: balanced parentheses.
      {R"G(root ::= "(" root ")" root | "")G", {"", "()", "(())()", "((()))"}, {"(", "())", ")("}},
      // JSON-like recursive values.
      {R"G(root ::= value
          value ::= "[" (value ("," value)*)? "]" | [a-z]+)G", {"[]", "[a,[b,c],[]]", "abc"}, {"[a,]", "[", "[a]]"}},
      {R"G(root ::= 'single' "\t" [\x41-\x43]{2} "\u00e9")G", {"single\tABé", "single\tCCé"}, {"single\tADé"}},
      {R"G(root ::= [^"\\]* "!")G", {"abc!", "!", "中!"}, {"a\"!", "a\\!"}},
      {R"G(root ::= ("a"? "b"){2,3})G", {"bb", "abab", "bbb", "abbab"}, {"b", "bbbb"}},
      {R"G(root ::= x{0,2} y
          x ::= "x"
          y ::= "y"
      )G", {"y", "xy", "xxy"}, {"xxxy"}},
      // Rules defined after use, names with dashes and dots.
      {R"G(root ::= my-rule.a my-rule.a
          my-rule.a ::= "ok")G", {"okok"}, {"ok"}},
      // Right recursion (not left) is fine.
      {R"G(root ::= "a" root | "b")G", {"b", "ab", "aaab"}, {"a", "ba"}},
  };
  auto vocab = byte_vocab();
  for (const auto& c : cases) {
    auto g = compile_or_die(grammar_from_ebnf(c.grammar), vocab);
    ASSERT_TRUE(g) << c.grammar;
    for (const char* s : c.accept) EXPECT_TRUE(matches(g, s)) << c.grammar << " should match '" << s << "'";
    for (const char* s : c.reject) EXPECT_FALSE(matches(g, s)) << c.grammar << " should not match '" << s << "'";
  }
}

// Found by review (stop 55): a surrogate pair escape gave the model CESU-8 bytes (invalid UTF-8)
// to write. Two escapes of a pair are one character.
TEST(Ebnf, SurrogatePairEscapesAreOneCharacter) {
  auto g = compile_or_die(grammar_from_ebnf(R"G(root ::= "\ud83d\ude00" [\ud83d\ude01-\ud83d\ude02])G"), byte_vocab());
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, "\xf0\x9f\x98\x80\xf0\x9f\x98\x81"));
  EXPECT_TRUE(matches(g, "\xf0\x9f\x98\x80\xf0\x9f\x98\x82"));
  EXPECT_FALSE(matches(g, "\xed\xa0\xbd\xed\xb8\x80\xf0\x9f\x98\x81"));
}

TEST(Ebnf, ErrorsNameTheProblem) {
  const std::vector<std::pair<const char*, const char*>> parse_errors = {
      {R"G(start ::= "a")G", "no 'root' rule"},
      {R"G(root ::= missing)G", "rule 'missing' is used"},
      {R"G(root ::= "a"
          root ::= "b")G", "defined twice"},
      {R"G(root ::= "abc)G", "unterminated string"},
      {R"G(root ::= [abc)G", "missing ']'"},
      {R"G(root ::= ("a")G", "missing ')'"},
      {R"G(root := "a")G", "expected '::='"},
      {R"G(root ::= "a"{3,1})G", "m < n"},
      {R"G(root ::= [z-a])G", "out of order"},
      {R"G(root ::= "\ud83d")G", "lone surrogate"},
      {R"G(root ::= "\ude00\ud83d")G", "lone surrogate"},
      {R"G(root ::= "\U0000D800")G", "surrogate"},
  };
  for (const auto& [text, what] : parse_errors) {
    auto g = grammar_from_ebnf(text);
    ASSERT_FALSE(g.is_ok()) << text;
    EXPECT_NE(g.status().message().find(what), std::string::npos) << text << ": " << g.status().message();
  }
  // Compile-time errors: left recursion, a grammar matching nothing.
  auto vocab = byte_vocab();
  for (const auto& [text, what] : std::vector<std::pair<const char*, const char*>>{
           {R"G(root ::= root "a" | "b")G", "left-recursive"},
           {R"G(root ::= expr
               expr ::= term | expr "+" term
               term ::= [0-9])G", "'expr' is left-recursive"},
           {R"G(root ::= opt root "x" | "y"
               opt ::= "z"?)G", "left-recursive"},
           {R"G(root ::= "a" root)G", "matches no string"}}) {
    auto g = grammar_from_ebnf(text);
    ASSERT_TRUE(g.is_ok()) << g.status().message();
    auto c = CompiledGrammar::compile(*g, vocab);
    ASSERT_FALSE(c.is_ok()) << text;
    EXPECT_NE(c.status().message().find(what), std::string::npos) << c.status().message();
  }
}

TEST(Ebnf, MasksMatchBruteForceWithRecursion) {
  // Multi-byte tokens that cross rule boundaries exercise the "pop" walks.
  auto vocab = byte_vocab({"()", "(()", "))", ")(", "[a", "a,", ",[", "]]", "],", "ab", "abc,", "[]", "a]", "ok"});
  for (const char* text : {R"G(root ::= "(" root ")" root | "")G",
                           R"G(root ::= value
                              value ::= "[" (value ("," value)*)? "]" | [a-c]+)G",
                           R"G(root ::= item+
                              item ::= "(" item* ")" | "ok")G"}) {
    auto g = compile_or_die(grammar_from_ebnf(text), vocab);
    ASSERT_TRUE(g);
    EXPECT_GT(testing::check_masks_by_walking(g, 10, 16, 11), 10) << text;
  }
}

}  // namespace
}  // namespace deltaserve
