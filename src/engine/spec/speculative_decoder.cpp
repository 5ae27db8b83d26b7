#include "engine/spec/speculative_decoder.h"

namespace deltaserve {

int SpeculativeDecoder::verify(Sequence& s, int row, Sampler& sampler, std::vector<float>& probs,
                               std::vector<TokenLogprob>* lps) const {
  const auto drafts = store_.drafts(s);
  const int k = static_cast<int>(drafts.size());
  const bool greedy = s.params.greedy();
  for (int a = 0; a < k; ++a) {
    const float* logits = runner_.logits(row + a);
    const float* row_c = sampler.constrain(logits, s.constraint.get(), s.n_generated());  // drafts were masked too
    const int32_t d = drafts[a];
    bool accept;
    int32_t alt;
    if (greedy) {
      alt = sampler.sample(row_c, s.params, s.prompt(), s.generated(), s.rng, nullptr);
      accept = alt == d;
    } else {
      sampler.distribution(row_c, s.params, s.prompt(), s.generated(), probs);
      const SpecDecision dec = speculative_accept(probs, store_.q(s, a), d, s.rng);
      accept = dec.accepted;
      alt = dec.token;
    }
    if (lps) sampler.logprobs(logits, accept ? d : alt, s.params.top_logprobs, &lps->emplace_back());
    s.tokens.push_back(accept ? d : alt);
    s.constraint_took(s.tokens.back());
    if (!accept) return a;
  }
  // Every draft accepted: the bonus token comes from the last row.
  TokenLogprob lp;
  const float* raw = runner_.logits(row + k);
  const float* row_c = sampler.constrain(raw, s.constraint.get(), s.n_generated());
  const int32_t bonus = sampler.sample(row_c, s.params, s.prompt(), s.generated(), s.rng, lps && row_c == raw ? &lp : nullptr);
  if (lps && row_c != raw) sampler.logprobs(raw, bonus, s.params.top_logprobs, &lp);  // logprobs stay raw
  s.tokens.push_back(bonus);
  s.constraint_took(bonus);
  if (lps) lps->push_back(std::move(lp));
  return k;
}

int SpeculativeDecoder::verify_argmax(Sequence& s, int row) const {
  const auto drafts = store_.drafts(s);
  const int k = static_cast<int>(drafts.size());
  for (int a = 0; a < k; ++a) {
    const int32_t t = runner_.token(row + a);
    s.tokens.push_back(t);
    if (t != drafts[a]) return a;
  }
  s.tokens.push_back(runner_.token(row + k));  // every draft accepted: the bonus token
  return k;
}

void SpeculativeDecoder::finish_step(std::span<const ScheduledItem> items, std::span<const StepOutput> outputs,
                                     Scheduler& scheduler) {
  // Rollback: a verification left its sequence's GDN state as it was before the step; the last
  // token and the accepted drafts now become the state.
  commits_.clear();
  for (size_t i = 0; i < items.size(); ++i) {
    Sequence& s = *items[i].seq;
    if (outputs[i].n_accepted < 0) continue;
    // A finished sequence's state is done with, but a block its kept tokens completed still gets
    // its checkpoint for the prefix cache, as a plain decode step saves it. Kept: this step's tokens
    // up to the finishing one (update() cut n_computed there; the step began n_emit + 1 tokens
    // before the end of s.tokens).
    const bool finished = s.status == SeqStatus::Finished;
    const int n = finished ? s.n_computed - (static_cast<int>(s.tokens.size()) - outputs[i].n_emit - 1)
                           : outputs[i].n_accepted + 1;
    if (n <= 0) continue;
    const CommitCheckpoint ck = scheduler.commit_checkpoint(s, n);  // prefix cache: the rolling checkpoint
    if (finished && ck.slot < 0) continue;
    commits_.push_back(StateCommit{s.slot, n, ck.at, ck.slot});
  }
  runner_.commit_state(commits_);
  drafter_.propose(items, outputs, scheduler);
}

}  // namespace deltaserve
