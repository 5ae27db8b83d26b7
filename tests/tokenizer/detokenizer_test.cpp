// Streaming detokenizer: incremental output equals the one-shot decode and never splits a UTF-8
// character.
#include "tokenizer/detokenizer.h"

#include <gtest/gtest.h>

#include "random_text.h"
#include "test_tokenizers.h"

namespace deltaserve::testing {
namespace {

TEST(Detokenizer, HoldsBackSplitCharacters) {
  // The fixture's emoji/CJK texts encode some characters as several byte tokens.
  const auto ref = read_json(qwen3_dir() / "reference.json");
  int held_back = 0;
  for (const auto& c : ref.at("encode")) {
    const std::string text = c.at("text").get<std::string>();
    const auto ids = c.at("ids").get<std::vector<TokenId>>();
    IncrementalDetokenizer detok(qwen3());
    std::string streamed;
    for (TokenId id : ids) {
      const std::string piece = detok.push(id);
      EXPECT_TRUE(is_valid_utf8(piece));
      // Nothing replaced: the text is valid, so a U+FFFD would mean a split character.
      EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos);
      if (!is_valid_utf8(qwen3().token_text(id))) ++held_back;
      streamed += piece;
    }
    streamed += detok.flush();
    EXPECT_EQ(streamed, text);
  }
  EXPECT_GT(held_back, 0) << "fixture has no token that is a partial character";
}

TEST(Detokenizer, RandomIdsMatchOneShotDecode) {
  std::mt19937 rng(42);
  const Tokenizer& tok = qwen3();
  // Single-byte tokens (ids < 256 in byte-level vocabs) make invalid sequences likely.
  std::uniform_int_distribution<TokenId> any_id(0, tok.vocab_size() - 1), low_id(0, 300);
  for (bool skip_special : {false, true}) {
    for (int i = 0; i < 2000; ++i) {
      std::vector<TokenId> ids(
          static_cast<std::size_t>(std::uniform_int_distribution<int>(0, 30)(rng)));
      for (auto& id : ids) id = (rng() & 1) ? any_id(rng) : low_id(rng);
      IncrementalDetokenizer detok(tok, skip_special);
      std::string streamed;
      std::size_t k = 0;
      while (k < ids.size()) {
        // Push one id or a small batch.
        const std::size_t n = std::min<std::size_t>(ids.size() - k, 1 + rng() % 3);
        const std::string piece = detok.push(std::span<const TokenId>(ids.data() + k, n));
        ASSERT_TRUE(is_valid_utf8(piece));
        ASSERT_LT(detok.n_pending_bytes(), 4u);
        streamed += piece;
        k += n;
      }
      streamed += detok.flush();
      ASSERT_EQ(streamed, tok.decode(ids, skip_special)) << "case " << i;
    }
  }
}

TEST(Detokenizer, InvalidBytesDecodeToReplacementCharacters) {
  // Feed arbitrary bytes as single-byte tokens: the stream equals the lossy one-shot decode.
  std::mt19937 rng(5);
  const Tokenizer& tok = qwen3();
  for (int i = 0; i < 500; ++i) {
    const std::string bytes = random_bytes(rng, 24);
    std::vector<TokenId> ids;
    for (char c : bytes) {
      std::string one(1, c), spelled;
      append_utf8(spelled, byte_to_unicode()[static_cast<unsigned char>(c)]);
      const auto id = tok.token_id(spelled);
      ASSERT_TRUE(id.has_value());
      ASSERT_EQ(tok.token_text(*id), one);
      ids.push_back(*id);
    }
    IncrementalDetokenizer detok(tok);
    std::string streamed;
    for (TokenId id : ids) streamed += detok.push(id);
    streamed += detok.flush();
    std::string expected;
    append_utf8_lossy(expected, bytes);
    ASSERT_EQ(streamed, expected);
    ASSERT_EQ(tok.decode(ids), expected);
  }
}

}  // namespace
}  // namespace deltaserve::testing
