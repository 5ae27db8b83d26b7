// ConstraintPlan: everything a request asks of the sampler beyond SamplingParams: a grammar
// (structured output, forced tool calls), logit_bias, allowed_token_ids, bad_words and
// min_tokens. make() gives each sequence its own RequestConstraint, the engine's TokenConstraint.
//
// Order in apply(): bias, allowed ids, bad words, min_tokens (end tokens banned), then the grammar
// mask. The grammar wins a conflict: when it only allows ending, min_tokens does not ban the end.
// When the rules together leave no token at all, the row allows only the first end id and the
// constraint reports the position (exhausted_at): the engine ends the request with an error there,
// rather than a token no rule allows being drawn.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "engine/token_constraint.h"
#include "grammar/grammar_matcher.h"
#include "tokenizer/token_id.h"

namespace deltaserve {

struct ConstraintPlan {
  std::shared_ptr<const CompiledGrammar> grammar;
  std::optional<TokenId> grammar_after;            // the grammar starts after this token (</think>)
  std::vector<std::pair<TokenId, float>> logit_bias;
  std::vector<TokenId> allowed_ids;                // sorted; empty = every token
  std::vector<std::vector<TokenId>> bad_words;     // token sequences never completed
  int min_tokens = 0;
  std::vector<TokenId> end_ids;                    // EOS + stop_token_ids (banned before min_tokens)

  bool empty() const {
    return !grammar && logit_bias.empty() && allowed_ids.empty() && bad_words.empty() && min_tokens == 0;
  }
};

class RequestConstraint final : public TokenConstraint {
 public:
  explicit RequestConstraint(std::shared_ptr<const ConstraintPlan> plan);

  bool active(int n_generated) const override;
  void apply(float* logits, int64_t vocab, int n_generated) override;
  // Grammar without allowed_token_ids: the grammar's mask is applied while copying (only the
  // allowed logits are read), then the rest as apply() does.
  void apply_from(const float* src, float* dst, int64_t vocab, int n_generated) override;
  bool accept(int32_t token) override;
  void rollback(int n) override;
  int exhausted_at() const override { return exhausted_taken_; }

  bool grammar_started() const { return started_at_ >= 0; }
  const GrammarMatcher* matcher() const { return matcher_ ? &*matcher_ : nullptr; }

 private:
  bool is_end(TokenId t) const;

  std::shared_ptr<const ConstraintPlan> plan_;
  std::optional<GrammarMatcher> matcher_;
  std::vector<TokenId> history_;  // accepted tokens
  std::vector<uint8_t> fed_;      // per accepted token: the matcher took it
  int started_at_ = -1;           // history size when the grammar started (-1: not yet)
  void ban_bad_words(float* logits, int64_t vocab) const;
  // After the rules (mask: the grammar's, or null): if no token is left, allow the first end id and
  // note the position.
  void check_exhausted(float* logits, int64_t vocab, int n_generated, const TokenBitset* mask, bool ban_end);
  int exhausted_row_ = -1;    // position of the last applied row that had no token left
  int exhausted_taken_ = -1;  // position of an accepted token drawn from such a row
  std::vector<std::pair<TokenId, float>> saved_;  // scratch
};

std::shared_ptr<TokenConstraint> make_constraint(const std::shared_ptr<const ConstraintPlan>& plan);

}  // namespace deltaserve
