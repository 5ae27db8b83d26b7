// MtpDrafter: proposes draft tokens with the model's MTP head (NEXTN). After a step it
//   1. catches up: for every continuing sequence's newly computed positions p, the MTP head takes
//      (t_{p+1}, h_p) (the main model's final hidden) and writes its KV layer; the last row of a
//      sequence that sampled gives its first draft;
//   2. chains: step j feeds the previous draft and the previous MTP hidden at the next position,
//      until each sequence has its k drafts (fewer near the context or max_tokens limit).
// Drafts go to the DraftStore; greedy requests take the MTP argmax, sampling requests draw from
// the processed MTP distribution q (kept for speculative sampling). When every drafting sequence
// takes the raw argmax (greedy, no penalties, no constraint), the device picks the drafts and only
// their ids come back (ModelRunner::Fetch::Argmax), not a vocabulary of logits per draft.
#pragma once

#include <span>
#include <vector>

#include "engine/model_runner.h"
#include "engine/sampling_pool.h"
#include "engine/scheduler.h"
#include "engine/spec/draft_store.h"

namespace deltaserve {

class MtpDrafter {
 public:
  MtpDrafter(ModelRunner& runner, DraftStore& store, SamplingPool& pool, int k, int64_t context_length);

  // items/outputs: the step just run (after Scheduler::update). Finished sequences are skipped.
  void propose(std::span<const ScheduledItem> items, std::span<const StepOutput> outputs, Scheduler& scheduler);

 private:
  // False (nothing drafted) when no token is left to draft: with a token map
  // (--speculative-token-map) every token a constraint allows may lie outside it.
  bool add_draft(Sequence& s, const float* logits, Sampler& sampler);
  // Whether s's drafts are the raw argmax of the MTP logits (the device can pick them).
  static bool drafts_raw_argmax(const Sequence& s);
  int64_t budget(const Sequence& s) const;
  // Keeps chain entry i where keep(i), compacted in place, its MTP hidden row next being row(i).
  template <typename Keep, typename Row>
  void keep_chains(Keep keep, Row row);

  ModelRunner& runner_;
  DraftStore& store_;
  SamplingPool& pool_;
  int k_;
  int64_t context_length_;
  // Per-step scratch, reserved once.
  std::vector<RunItem> items_;
  std::vector<int32_t> rows_;
  std::vector<Sequence*> drafting_;
  std::vector<Sequence*> chain_;
  std::vector<int32_t> chain_rows_;
  std::vector<int> chain_left_;
  std::vector<uint8_t> drafted_;  // per chain_ index: add_draft's answer this chain step
};

}  // namespace deltaserve
