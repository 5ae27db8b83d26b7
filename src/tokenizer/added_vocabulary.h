// Added tokens (tokenizer.json `added_tokens`): matched in the text before pre-tokenization, like
// HF `tokenizers` AddedVocabulary. Matching is leftmost-longest over all added tokens; a match is
// then rejected for single_word when glued to a word character, and widened over neighbouring
// whitespace for lstrip/rstrip. Tokens with normalized=false are matched in the raw text, those
// with normalized=true in the normalized text (second pass).
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/token_id.h"

namespace deltaserve {

struct AddedToken {
  std::string content;
  TokenId id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

class AddedVocabulary {
 public:
  // A piece of the input: an added token (`id` >= 0) or text to tokenize further (`id` == -1).
  struct Segment {
    std::size_t begin, end;
    TokenId id;
  };

  // `match_text` is the content to match: the normalized content for normalized tokens.
  void add(const AddedToken& token, std::string match_text);

  // Splits `text` using the tokens of one pass (normalized or not). With parse_special false,
  // special tokens are found but left as text (HF `encode_special_tokens`), so they still mask
  // overlapping non-special ones, as in HF.
  void split(std::string_view text, bool normalized_pass, bool parse_special,
             std::vector<Segment>& out) const;

  bool has_normalized_tokens() const { return !passes_[1].patterns.empty(); }

 private:
  struct Pattern {
    std::string text;
    AddedToken token;
  };
  struct Pass {
    std::vector<Pattern> patterns;       // sorted by first byte, then longest first
    std::array<bool, 256> first_byte{};  // some pattern starts with this byte
  };
  Pass passes_[2];  // [0]: normalized=false, [1]: normalized=true
};

}  // namespace deltaserve
