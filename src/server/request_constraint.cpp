#include "server/request_constraint.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace deltaserve {

namespace {
// An id that indexes a row of `vocab` logits. Ids from configs and requests are checked where they
// are read; this keeps one that was not from writing outside the row.
constexpr bool in_vocab(int64_t id, int64_t vocab) { return id >= 0 && id < vocab; }
}  // namespace

RequestConstraint::RequestConstraint(std::shared_ptr<const ConstraintPlan> plan) : plan_(std::move(plan)) {
  if (plan_->grammar) {
    matcher_.emplace(plan_->grammar);
    if (!plan_->grammar_after) started_at_ = 0;
  }
}

bool RequestConstraint::is_end(TokenId t) const {
  return std::find(plan_->end_ids.begin(), plan_->end_ids.end(), t) != plan_->end_ids.end();
}

bool RequestConstraint::active(int n_generated) const {
  return started_at_ >= 0 || !plan_->logit_bias.empty() || !plan_->allowed_ids.empty() || !plan_->bad_words.empty() ||
         n_generated < plan_->min_tokens;
}

void RequestConstraint::ban_bad_words(float* logits, int64_t vocab) const {
  // A bad word's last token is banned when the tokens before it were just generated.
  for (const auto& word : plan_->bad_words) {
    const size_t k = word.size() - 1;
    if (history_.size() < k) continue;
    if (std::equal(word.begin(), word.begin() + static_cast<long>(k), history_.end() - static_cast<long>(k)) &&
        in_vocab(word.back(), vocab))
      logits[word.back()] = -INFINITY;
  }
}

void RequestConstraint::apply(float* logits, int64_t vocab, int n_generated) {
  const ConstraintPlan& p = *plan_;
  for (const auto& [id, bias] : p.logit_bias)
    if (in_vocab(id, vocab)) logits[id] += bias;
  if (!p.allowed_ids.empty()) {
    saved_.clear();
    for (TokenId id : p.allowed_ids)
      if (in_vocab(id, vocab)) saved_.emplace_back(id, logits[id]);
    std::fill(logits, logits + vocab, -INFINITY);
    for (const auto& [id, v] : saved_) logits[id] = v;
  }
  ban_bad_words(logits, vocab);
  const bool grammar_on = started_at_ >= 0 && matcher_;
  const bool grammar_must_end = grammar_on && (matcher_->must_end() || matcher_->is_terminated());
  const bool ban_end = n_generated < p.min_tokens && !grammar_must_end;
  if (ban_end) {
    for (TokenId id : p.end_ids)
      if (in_vocab(id, vocab)) logits[id] = -INFINITY;
  }
  if (!grammar_on) {
    check_exhausted(logits, vocab, n_generated, nullptr, ban_end);
    return;
  }
  const TokenBitset& mask = matcher_->next_token_mask();
  // Request stop ids end a complete match like EOS does.
  saved_.clear();
  if (matcher_->can_end())
    for (TokenId id : p.end_ids)
      if (in_vocab(id, vocab) && !(id < mask.size() && mask.test(id))) saved_.emplace_back(id, logits[id]);
  const std::vector<uint64_t>& words = mask.words();
  const int64_t covered = std::min<int64_t>(vocab, mask.size());
  for (int64_t w = 0; w * 64 < covered; ++w) {
    const uint64_t bits = words[static_cast<size_t>(w)];
    const int64_t base = w * 64;
    const int64_t end = std::min<int64_t>(base + 64, covered);
    if (bits == ~uint64_t{0}) continue;
    if (bits == 0) {
      std::fill(logits + base, logits + end, -INFINITY);
      continue;
    }
    for (int64_t i = base; i < end; ++i)
      if (!((bits >> (i - base)) & 1u)) logits[i] = -INFINITY;
  }
  for (int64_t i = covered; i < vocab; ++i) logits[i] = -INFINITY;
  for (const auto& [id, v] : saved_) logits[id] = v;
  check_exhausted(logits, vocab, n_generated, &mask, ban_end);
}

void RequestConstraint::check_exhausted(float* logits, int64_t vocab, int n_generated, const TokenBitset* mask,
                                        bool ban_end) {
  const ConstraintPlan& p = *plan_;
  bool any = false;
  if (!mask) {
    // Without a grammar only allowed ids can empty the row (bad words and min_tokens remove a few).
    if (p.allowed_ids.empty()) return;
    for (TokenId id : p.allowed_ids) any = any || (in_vocab(id, vocab) && logits[id] > -INFINITY);
  } else {
    // The grammar's mask always leaves a token or an end; only the other rules can take them all.
    if (p.allowed_ids.empty() && p.bad_words.empty() && !ban_end) return;
    const std::vector<uint64_t>& words = mask->words();
    for (size_t w = 0; w < words.size() && !any; ++w) {
      for (uint64_t bits = words[w]; bits && !any; bits &= bits - 1) {
        const int64_t id = static_cast<int64_t>(w * 64) + std::countr_zero(bits);
        any = in_vocab(id, vocab) && logits[id] > -INFINITY;
      }
    }
    for (TokenId id : p.end_ids) any = any || (in_vocab(id, vocab) && logits[id] > -INFINITY);
  }
  if (any) {
    if (exhausted_row_ == n_generated) exhausted_row_ = -1;
    return;
  }
  exhausted_row_ = n_generated;
  if (!p.end_ids.empty() && in_vocab(p.end_ids.front(), vocab)) logits[p.end_ids.front()] = 0.0f;
}

namespace {
// kMaskAdd[byte][k]: 0 where bit k of the byte is set, -inf where it is not.
struct MaskAddTable {
  float v[256][8];
  MaskAddTable() {
    for (int b = 0; b < 256; ++b)
      for (int k = 0; k < 8; ++k) v[b][k] = (b >> k) & 1 ? 0.0f : -INFINITY;
  }
};
const MaskAddTable kMaskAddTable;
const auto& kMaskAdd = kMaskAddTable.v;
}  // namespace

void RequestConstraint::apply_from(const float* src, float* dst, int64_t vocab, int n_generated) {
  const ConstraintPlan& p = *plan_;
  const bool grammar_on = started_at_ >= 0 && matcher_;
  if (!grammar_on || !p.allowed_ids.empty()) {
    std::copy(src, src + vocab, dst);
    apply(dst, vocab, n_generated);
    return;
  }
  // 1. The grammar's mask, fused with the copy (masked words are never read).
  const TokenBitset& mask = matcher_->next_token_mask();
  const std::vector<uint64_t>& words = mask.words();
  const int64_t covered = std::min<int64_t>(vocab, mask.size());
  for (int64_t w = 0; w * 64 < covered; ++w) {
    const uint64_t bits = words[static_cast<size_t>(w)];
    const int64_t base = w * 64;
    const int64_t end = std::min<int64_t>(base + 64, covered);
    if (bits == 0) {
      std::fill(dst + base, dst + end, -INFINITY);
    } else if (bits == ~uint64_t{0}) {
      std::copy(src + base, src + end, dst + base);
    } else if (end - base == 64) {
      // Mixed word: 8 bytes of the mask, each adding 0 or -inf to 8 logits (no branch per token,
      // vectorised by the compiler).
      for (int b = 0; b < 8; ++b) {
        const float* add = kMaskAdd[(bits >> (8 * b)) & 0xffu];
        const float* in = src + base + 8 * b;
        float* out = dst + base + 8 * b;
        for (int k = 0; k < 8; ++k) out[k] = in[k] + add[k];
      }
    } else {
      for (int64_t i = base; i < end; ++i) dst[i] = ((bits >> (i - base)) & 1u) ? src[i] : -INFINITY;
    }
  }
  std::fill(dst + covered, dst + vocab, -INFINITY);
  // Request stop ids end a complete match like EOS does.
  if (matcher_->can_end())
    for (TokenId id : p.end_ids)
      if (in_vocab(id, vocab)) dst[id] = src[id];
  // 2. What apply() does before the mask; on -inf entries it changes nothing.
  for (const auto& [id, bias] : p.logit_bias)
    if (in_vocab(id, vocab)) dst[id] += bias;
  ban_bad_words(dst, vocab);
  const bool grammar_must_end = matcher_->must_end() || matcher_->is_terminated();
  const bool ban_end = n_generated < p.min_tokens && !grammar_must_end;
  if (ban_end)
    for (TokenId id : p.end_ids)
      if (in_vocab(id, vocab)) dst[id] = -INFINITY;
  // 3. Bad words and min_tokens may have removed every token the grammar allows.
  check_exhausted(dst, vocab, n_generated, &mask, ban_end);
}

bool RequestConstraint::accept(int32_t token) {
  if (exhausted_row_ == static_cast<int>(history_.size())) {
    // Drawn from a row with no token left (the end id it allowed): the engine ends the sequence
    // here; the grammar is not fed.
    if (exhausted_taken_ < 0) exhausted_taken_ = static_cast<int>(history_.size());
    history_.push_back(token);
    fed_.push_back(0);
    return true;
  }
  uint8_t fed = 0;
  if (started_at_ >= 0 && matcher_) {
    const bool vocab_eos = token < matcher_->grammar().vocab().size() && matcher_->grammar().vocab().is_eos(token);
    if (matcher_->is_terminated()) {
      // After the end only ends follow (speculative drafts past an EOS).
      if (!vocab_eos && !is_end(token)) return false;
    } else if (!vocab_eos && is_end(token)) {
      // A stop id the grammar also allows as text (':' given as a stop id under a JSON schema; apply
      // leaves it in the row) is fed as that text: the engine stops on it all the same, and MTP
      // drafts after it see the grammar where it is. Any other stop id ends a complete match only.
      if (matcher_->accept_token(token)) fed = 1;
      else if (!matcher_->can_end()) return false;
    } else {
      if (!matcher_->accept_token(token)) return false;
      fed = 1;
    }
  }
  history_.push_back(token);
  fed_.push_back(fed);
  if (started_at_ < 0 && matcher_ && plan_->grammar_after && token == *plan_->grammar_after)
    started_at_ = static_cast<int>(history_.size());
  return true;
}

void RequestConstraint::rollback(int n) {
  for (; n > 0 && !history_.empty(); --n) {
    if (fed_.back()) matcher_->rollback(1);
    if (plan_->grammar_after && started_at_ == static_cast<int>(history_.size())) started_at_ = -1;
    history_.pop_back();
    fed_.pop_back();
    if (exhausted_taken_ >= static_cast<int>(history_.size())) exhausted_taken_ = -1;
  }
}

std::shared_ptr<TokenConstraint> make_constraint(const std::shared_ptr<const ConstraintPlan>& plan) {
  if (!plan || plan->empty()) return nullptr;
  return std::make_shared<RequestConstraint>(plan);
}

}  // namespace deltaserve
