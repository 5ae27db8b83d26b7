#include "tokenizer/detokenizer.h"

#include "tokenizer/unicode.h"

namespace deltaserve {

std::string IncrementalDetokenizer::take_stable() {
  // Cut where the lossy decoding of the prefix can no longer change: before a trailing truncated
  // sequence. Decoding prefix and rest separately then equals decoding the whole.
  const std::size_t n = utf8_stable_prefix(pending_);
  std::string out;
  append_utf8_lossy(out, std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string IncrementalDetokenizer::push(TokenId id) {
  tokenizer_.append_token_bytes(id, skip_special_, pending_);
  return take_stable();
}

std::string IncrementalDetokenizer::push(std::span<const TokenId> ids) {
  for (TokenId id : ids) tokenizer_.append_token_bytes(id, skip_special_, pending_);
  return take_stable();
}

std::string IncrementalDetokenizer::flush() {
  std::string out;
  append_utf8_lossy(out, pending_);
  pending_.clear();
  return out;
}

}  // namespace deltaserve
