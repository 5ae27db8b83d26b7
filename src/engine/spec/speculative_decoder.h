// SpeculativeDecoder: MTP (NEXTN) speculative decoding, the three parts of a step the Engine hands
// to it:
//   feed()        what a sequence with drafts feeds: [last token, d_1 .. d_k] (verification);
//   verify()      accept drafts against the target logits (greedy match, or speculative sampling
//                 with the exact target distribution) and append the tokens that stand;
//   finish_step() rollback (the accepted tokens of each verification become the GDN state:
//                 ModelRunner::commit_state) and drafting for the next step (MtpDrafter).
// KV rollback is only a shorter length: rejected positions are overwritten later.
#pragma once

#include <span>
#include <vector>

#include "engine/model_runner.h"
#include "engine/sampling_pool.h"
#include "engine/scheduler.h"
#include "engine/spec/draft_store.h"
#include "engine/spec/mtp_drafter.h"

namespace deltaserve {

class SpeculativeDecoder {
 public:
  SpeculativeDecoder(ModelRunner& runner, SamplingPool& pool, int k, int n_slots, int64_t context_length)
      : runner_(runner), store_(n_slots, k), drafter_(runner, store_, pool, k, context_length) {
    commits_.reserve(static_cast<size_t>(n_slots));
  }
  int k() const { return store_.k(); }
  std::span<const int32_t> feed(const Sequence& s) const { return store_.feed(s); }

  // Target logits rows row .. row + n_drafts hold the model's predictions after [last, d_1 ..].
  // Appends the accepted drafts and one more token (the correction, or the bonus after all k)
  // to s.tokens, and their logprobs when lps is set; returns the drafts accepted.
  int verify(Sequence& s, int row, Sampler& sampler, std::vector<float>& probs, std::vector<TokenLogprob>* lps) const;
  // verify() for a greedy sequence without penalties, constraint or logprobs after a
  // Fetch::Argmax run: runner.token(row + a) is the target's argmax after d_a.
  int verify_argmax(Sequence& s, int row) const;

  // After Scheduler::update: GDN state of the accepted tokens, then the next drafts.
  void finish_step(std::span<const ScheduledItem> items, std::span<const StepOutput> outputs, Scheduler& scheduler);

 private:
  ModelRunner& runner_;
  DraftStore store_;
  MtpDrafter drafter_;
  std::vector<StateCommit> commits_;
};

}  // namespace deltaserve
