// TokenConstraint: per-sequence logits processing attached to a request by the server (a grammar
// for structured output or forced tool calls, logit_bias, allowed_token_ids, bad words,
// min_tokens). The engine knows only this interface; the server implements it
// (server/request_constraint.h).
//
// The engine, on the sampling path of a sequence that has one (plain samples, every verification
// row, every MTP draft):
//   if (c.active(n)) c.apply(row_copy, vocab, n);   // n: tokens after the prompt, drafts included
//   ... sample from row_copy ...
//   c.accept(token);                                 // the token the sequence took
// and after drafting, c.rollback(k) for the k drafts, so that the constraint's state always
// follows the sequence's accepted tokens. Called from one thread at a time per sequence.
#pragma once

#include <cstdint>

namespace deltaserve {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Whether the next token (the n_generated-th after the prompt) needs apply().
  virtual bool active(int n_generated) const = 0;
  // Masks (-inf) and biases the logits of the next token in place. `vocab`: row length.
  virtual void apply(float* logits, int64_t vocab, int n_generated) = 0;
  // The same into dst from src (the raw row stays as it is, for logprobs). An implementation may
  // fuse the copy with its mask; by default: copy, then apply.
  virtual void apply_from(const float* src, float* dst, int64_t vocab, int n_generated) {
    for (int64_t i = 0; i < vocab; ++i) dst[i] = src[i];
    apply(dst, vocab, n_generated);
  }
  // The sequence took `token`. False: the token breaks the constraint (the engine ends the
  // sequence with an error; it cannot happen for tokens sampled from an applied row).
  virtual bool accept(int32_t token) = 0;
  // Forgets the last n accepted tokens (drafts that verification rejected or that were undone).
  virtual void rollback(int n) = 0;
  // Where the rules left no token at all (allowed_token_ids, bad words, min_tokens and a grammar
  // that exclude each other): the generated-token index of the accepted token drawn from such a
  // row, else -1. The engine then ends the sequence with an error before that token.
  virtual int exhausted_at() const { return -1; }
};

}  // namespace deltaserve
