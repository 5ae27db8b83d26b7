#include "grammar/grammar_matcher.h"

#include <thread>

#include "grammar/ebnf.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "grammar_test_util.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve {
namespace {

using testing::byte_vocab;
using testing::compile_or_die;

std::shared_ptr<const TokenVocabulary> tiny_coder_vocab() {
  static std::shared_ptr<const TokenVocabulary> v = [] {
    auto tok = Tokenizer::load(std::string(DELTASERVE_SOURCE_DIR) + "/models/tiny-coder");
    EXPECT_TRUE(tok.is_ok()) << tok.status().message();
    std::vector<std::string> bytes;
    std::vector<uint8_t> special;
    for (int32_t id = 0; id < tok->vocab_size(); ++id) {
      bytes.push_back(tok->token_text(id));
      special.push_back(tok->is_special(id) ? 1 : 0);
    }
    return TokenVocabulary::create(std::move(bytes), std::move(special), {8183, 8185});
  }();
  return v;
}

TEST(TokenVocabulary, TrieHoldsEveryTextTokenOnce) {
  auto v = tiny_coder_vocab();
  std::vector<int> seen(static_cast<size_t>(v->size()), 0);
  std::string prefix;
  std::vector<std::string> path = {""};
  for (int32_t i = 1; i < v->n_nodes(); ++i) {
    const int32_t d = v->node_depth(i);
    path.resize(static_cast<size_t>(d));
    path.push_back(path.back() + static_cast<char>(v->node_byte(i)));
    EXPECT_LE(v->subtree_end(i), v->n_nodes());
    EXPECT_GT(v->subtree_end(i), i);
    for (int32_t id : v->node_tokens(i)) {
      EXPECT_EQ(v->bytes(id), path.back());
      ++seen[static_cast<size_t>(id)];
    }
  }
  for (int32_t id = 0; id < v->size(); ++id) {
    const bool text = !v->is_special(id) && !v->is_eos(id) && !v->bytes(id).empty();
    EXPECT_EQ(seen[static_cast<size_t>(id)], text ? 1 : 0) << id;
  }
  EXPECT_TRUE(v->is_eos(8185));
}

TEST(GrammarMatcher, AcceptRollbackAndEos) {
  auto g = compile_or_die(grammar_from_regex("ab|abc"), byte_vocab({"ab", "bc"}));
  ASSERT_TRUE(g);
  const int32_t kAB = 256, kBC = 257, kEos = 0;
  GrammarMatcher m(g);
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.accept_token(kEos));
  EXPECT_FALSE(m.accept_token('b'));
  EXPECT_TRUE(m.accept_token(kAB));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.next_token_mask().test(kEos));
  EXPECT_TRUE(m.next_token_mask().test('c'));
  EXPECT_FALSE(m.next_token_mask().test(kBC));
  EXPECT_TRUE(m.accept_token('c'));
  EXPECT_TRUE(m.must_end());
  EXPECT_EQ(m.next_token_mask().ids(), std::vector<int32_t>{kEos});
  EXPECT_TRUE(m.accept_token(kEos));
  EXPECT_TRUE(m.is_terminated());
  EXPECT_FALSE(m.accept_token('c'));
  m.rollback(2);  // back to after "ab"
  EXPECT_EQ(m.n_accepted(), 1);
  EXPECT_FALSE(m.is_terminated());
  EXPECT_TRUE(m.accept_token('c'));
  m.rollback(5);  // more than accepted: back to the start
  EXPECT_EQ(m.n_accepted(), 0);
  EXPECT_TRUE(m.accept_token('a'));
  EXPECT_TRUE(m.accept_token(kBC));
}

TEST(GrammarMatcher, SpecialTokensNeverMatchText) {
  std::vector<std::string> bytes = {"<eos>", "a", "<tag>"};
  auto vocab = TokenVocabulary::create(bytes, {1, 0, 1}, {0});
  auto g = compile_or_die(grammar_from_regex("a*<tag>"), vocab);
  ASSERT_TRUE(g);
  GrammarMatcher m(g);
  EXPECT_FALSE(m.accept_token(2));        // special: not the text "<tag>"
  EXPECT_TRUE(m.accept_string("a<tag>"));  // the text itself is fine
  EXPECT_TRUE(m.can_end());
}

TEST(GrammarMatcher, MasksOnTinyCoderVocabularyMatchBruteForce) {
  auto vocab = tiny_coder_vocab();
  std::vector<Result<Grammar>> grammars;
  grammars.push_back(grammar_from_json_schema_text(
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"tags":{"type":"array","items":{"enum":["a","bc"]}},"n":{"type":"integer","minimum":-5,"maximum":500}},"required":["name","n"]})"));
  grammars.push_back(json_object_grammar());
  grammars.push_back(grammar_from_regex("(def|class) [a-z_]+\\((self)?\\):"));
  grammars.push_back(grammar_from_ebnf(R"G(root ::= "(" root ")" root | "x" | "")G"));
  int total = 0;
  for (auto& g : grammars) {
    auto c = compile_or_die(g, vocab);
    ASSERT_TRUE(c);
    total += testing::check_masks_by_walking(c, 3, 14, 1);
  }
  EXPECT_GT(total, 40);
}

TEST(GrammarMatcher, ConcurrentMatchersShareCachesSafely) {
  auto vocab = tiny_coder_vocab();
  auto c = compile_or_die(json_object_grammar(), vocab);
  ASSERT_TRUE(c);
  const std::vector<std::string> prefixes = {"{\"a\": [1, {\"b\": \"x", "{\"k\": {\"k\": {\"k\": tr", "{ \"z\": nul",
                                             "{\"q\": [[[], {}], \"s\\n"};
  // Reference masks from one thread.
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prefixes) {
    GrammarMatcher m(c);
    ASSERT_TRUE(m.accept_string(p)) << p;
    want.push_back(testing::brute_mask(m));
  }
  auto fresh = compile_or_die(json_object_grammar(), vocab);
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      int good = 0;
      for (int rep = 0; rep < 3; ++rep) {
        for (size_t i = 0; i < prefixes.size(); ++i) {
          GrammarMatcher m(fresh);
          if (!m.accept_string(prefixes[(i + static_cast<size_t>(t)) % prefixes.size()])) continue;
          good += m.next_token_mask().ids() == want[(i + static_cast<size_t>(t)) % prefixes.size()];
        }
      }
      ok[static_cast<size_t>(t)] = good;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(ok[static_cast<size_t>(t)], 12) << "thread " << t;
}

TEST(GrammarMatcher, StateMaskCacheIsReused) {
  auto c = compile_or_die(grammar_from_json_schema_text(R"({"type":"array","items":{"type":"string"}})"), tiny_coder_vocab());
  ASSERT_TRUE(c);
  for (int i = 0; i < 3; ++i) {
    GrammarMatcher m(c);
    ASSERT_TRUE(m.accept_string("[\"abc"));
    EXPECT_GT(m.next_token_mask().count(), 1000);
  }
  auto st = c->masks().stats();
  EXPECT_GE(st.state_hits, 2);
  EXPECT_GE(st.local_masks, 1);
}

// Found by review (stop 55): a long grammar cached a vocabulary-sized mask for every node it
// visited, for the grammar's life (15 MB per 4,000 tokens at 8k tokens of vocabulary; 31 KB a mask
// at 248k). Past GrammarLimits::max_local_mask_bytes, masks are computed and dropped: the same
// masks, within the budget.
TEST(GrammarMatcher, LocalMaskCacheStaysWithinItsBudget) {
  auto g = grammar_from_regex("[\\s\\S]{300}b");
  ASSERT_TRUE(g.is_ok());
  GrammarLimits limits;
  limits.max_local_mask_bytes = 8 * 1024;
  auto c = CompiledGrammar::compile(*g, tiny_coder_vocab(), limits);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  GrammarMatcher m(*c);
  for (int i = 0; i < 40; ++i) {
    ASSERT_EQ(m.next_token_mask().ids(), testing::brute_mask(m)) << "step " << i;
    ASSERT_TRUE(m.accept_string("x")) << "step " << i;
  }
  const auto st = (*c)->masks().stats();
  EXPECT_LE(st.local_bytes, 8 * 1024);
  EXPECT_GE(st.local_masks, 1);
}

TEST(CompiledGrammar, SizeLimitIsAnError) {
  GrammarLimits limits;
  limits.max_nfa_states = 1000;
  auto g = grammar_from_regex("[a-z]{5000}");
  ASSERT_TRUE(g.is_ok());
  auto c = CompiledGrammar::compile(*g, byte_vocab(), limits);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("too large"), std::string::npos);
}

// Nested counted repetitions are small NFAs with n^2 DFA nodes of ~n NFA states each: past the
// step budget they are an error (it took minutes at n = 200), below it they compile exactly.
TEST(CompiledGrammar, NestedRepetitionPastTheStepBudgetIsAnError) {
  auto big = grammar_from_regex("(a{1,200}){1,200}");
  ASSERT_TRUE(big.is_ok());
  auto c = CompiledGrammar::compile(*big, byte_vocab());
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("too complex"), std::string::npos) << c.status().message();
  auto small = compile_or_die(grammar_from_regex("(a{1,40}){1,40}"), byte_vocab());
  ASSERT_NE(small, nullptr);
  EXPECT_TRUE(testing::matches(small, std::string(1600, 'a')));
  EXPECT_FALSE(testing::matches(small, std::string(1601, 'a')));
  GrammarLimits tight;
  tight.max_subset_steps = 1000;
  EXPECT_FALSE(CompiledGrammar::compile(*grammar_from_regex("(a{1,40}){1,40}"), byte_vocab(), tight).is_ok());
}

}  // namespace
}  // namespace deltaserve
