// StepCost: what a step costs, learnt from the steps the engine ran, so that a step that carries
// a prefill chunk beside running decodes stays within a few decode steps (the inter-token gap of
// every running request is that step's length):
//   d  a decode step: moving average over steps with no prefill tokens (the batch of the moment);
//   b  a prefill token as such steps run it: moving average over steps with at least 16 prefill
//      tokens of (step - d if it also decoded) / tokens. A small chunk's fixed costs (another
//      kernel path beside the decode rows, no graph) are spread over its tokens, so b is the
//      marginal cost of the chunks the budget actually makes.
// mixed_prefill_tokens(ratio) = (ratio - 1) d / b: the prefill tokens that take (ratio - 1) decode
// steps, in whole blocks, at least one block, at most `cap`; `cap` until d and b have been seen.
// Where fixed costs alone exceed (ratio - 1) d the budget falls to a block; the scheduler's
// backlog rule (SchedulerConfig::mixed_backlog_steps) keeps prefill moving then. Pure arithmetic
// over what it is told (the engine times its steps): deterministic in tests.
#pragma once

#include <cstdint>

namespace deltaserve {

class StepCost {
 public:
  static constexpr int kMinPrefillTokens = 16;  // fewer: a step's fixed costs swamp its tokens

  // One finished step: its prefill tokens, its decode rows, its wall time. setup_count: the
  // backend's one-time set-up so far (Backend::setup_count); a step during which it moved (a GEMM
  // algorithm timed: 0.1 s or more on a 17 ms step) is no sample of what steps cost and is skipped.
  void observe(int prefill_tokens, int decode_rows, double seconds, uint64_t setup_count = 0);

  // Prefill tokens for a step that also decodes (see above).
  int mixed_prefill_tokens(double ratio, int block, int cap) const;

  double decode_step_s() const { return decode_s_; }           // d; 0: not seen yet
  double prefill_token_s() const { return prefill_token_s_; }  // b; 0: not seen yet

 private:
  static constexpr double kWeight = 0.25;  // of the newest step in each average
  double decode_s_ = 0, prefill_token_s_ = 0;
  uint64_t setup_count_ = 0;
};

}  // namespace deltaserve
