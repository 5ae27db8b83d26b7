// Streaming decode: push generated token ids, get the text they complete. Text is only emitted up
// to the last complete UTF-8 character (a truncated sequence at the end is held back), so the
// concatenation of everything returned, including flush(), equals Tokenizer::decode of all ids.
#pragma once

#include <span>
#include <string>

#include "tokenizer/tokenizer.h"

namespace deltaserve {

class IncrementalDetokenizer {
 public:
  // Keeps a (cheap, shared) copy of `tokenizer`.
  explicit IncrementalDetokenizer(Tokenizer tokenizer, bool skip_special = false)
      : tokenizer_(std::move(tokenizer)), skip_special_(skip_special) {}

  // Returns the newly completed text (possibly empty); never ends inside a UTF-8 character.
  std::string push(TokenId id);
  std::string push(std::span<const TokenId> ids);
  // End of stream: returns the held-back bytes (a truncated sequence becomes U+FFFD) and resets.
  std::string flush();
  // Bytes held back waiting for the rest of a UTF-8 character (0 to 3).
  std::size_t n_pending_bytes() const { return pending_.size(); }

 private:
  std::string take_stable();

  Tokenizer tokenizer_;
  bool skip_special_;
  std::string pending_;  // token bytes not yet returned
};

}  // namespace deltaserve
