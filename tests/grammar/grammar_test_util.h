// Shared helpers for the grammar tests: byte vocabularies, compile-or-fail, full-string matching
// and the brute-force mask (every token tried with accept_token + rollback).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_matcher.h"

namespace deltaserve::testing {

// Token 0 is EOS; then every single byte 1..255 (ids 1..255), then `extra` multi-byte tokens.
inline std::shared_ptr<const TokenVocabulary> byte_vocab(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> bytes = {"<eos>"};
  for (int b = 1; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const auto& e : extra) bytes.push_back(e);
  std::vector<uint8_t> special(bytes.size(), 0);
  special[0] = 1;
  return TokenVocabulary::create(std::move(bytes), std::move(special), {0});
}

inline std::shared_ptr<const CompiledGrammar> compile_or_die(const Result<Grammar>& g,
                                                              std::shared_ptr<const TokenVocabulary> vocab) {
  EXPECT_TRUE(g.is_ok()) << g.status().message();
  if (!g.is_ok()) return nullptr;
  auto c = CompiledGrammar::compile(*g, std::move(vocab));
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  return c.is_ok() ? *c : nullptr;
}

// Does the grammar match `text` exactly?
inline bool matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept_string(text) && m.can_end();
}

// Brute force: the tokens accept_token takes from the matcher's current state.
inline std::vector<int32_t> brute_mask(GrammarMatcher& m) {
  std::vector<int32_t> out;
  const int32_t n = m.grammar().vocab().size();
  for (int32_t id = 0; id < n; ++id) {
    if (m.accept_token(id)) {
      out.push_back(id);
      m.rollback(1);
    }
  }
  return out;
}

// Random walks through the grammar (tokens drawn from the mask), checking the mask against brute
// force at every step. Returns the number of states checked.
inline int check_masks_by_walking(const std::shared_ptr<const CompiledGrammar>& g, int walks, int max_steps,
                                  uint64_t seed) {
  std::mt19937_64 rng(seed);
  int checked = 0;
  for (int w = 0; w < walks; ++w) {
    GrammarMatcher m(g);
    for (int step = 0; step < max_steps && !m.is_terminated(); ++step) {
      std::vector<int32_t> fast = m.next_token_mask().ids();
      std::vector<int32_t> slow = brute_mask(m);
      EXPECT_EQ(fast, slow) << "walk " << w << " step " << step;
      ++checked;
      if (fast != slow || fast.empty()) return checked;
      // Prefer longer tokens half the time, so walks get somewhere.
      int32_t pick = fast[std::uniform_int_distribution<size_t>(0, fast.size() - 1)(rng)];
      if (rng() % 2) {
        for (int32_t id : fast)
          if (m.grammar().vocab().bytes(id).size() > m.grammar().vocab().bytes(pick).size() && rng() % 3 == 0) pick = id;
      }
      EXPECT_TRUE(m.accept_token(pick));
    }
  }
  return checked;
}

}  // namespace deltaserve::testing
