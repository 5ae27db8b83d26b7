// StepCost: what a step costs, learnt from the steps the engine ran, so that a step that carries
// a prefill chunk beside running decodes stays within a few decode steps (the inter-token latency
// of every running request is that step's length).
//   - a decode step: moving average over steps with no prefill tokens (the batch of the moment);
//   - a prefill token: moving average over steps with at least 16 prefill tokens, of
//     (step - the decode step, if the step also decoded) / prefill tokens.
// mixed_prefill_tokens(ratio) is the prefill budget that keeps such a step at about `ratio`
// decode steps: (ratio - 1) decode steps' worth of prefill tokens, in whole blocks, at least one
// block, at most `cap`; `cap` until both costs have been seen. Pure arithmetic over what it is
// told (the engine times its steps): deterministic in tests.
#pragma once

namespace deltaserve {

class StepCost {
 public:
  // One finished step: its prefill tokens, its decode rows, its wall time.
  void observe(int prefill_tokens, int decode_rows, double seconds);

  // Prefill tokens for a step that also decodes (see above).
  int mixed_prefill_tokens(double ratio, int block, int cap) const;

  double decode_step_s() const { return decode_s_; }           // 0: not seen yet
  double prefill_token_s() const { return prefill_token_s_; }  // 0: not seen yet

 private:
  static constexpr double kWeight = 0.25;  // of the newest step in each average
  static constexpr int kMinPrefillTokens = 16;  // fewer: the step's fixed costs dominate
  double decode_s_ = 0, prefill_token_s_ = 0;
};

}  // namespace deltaserve
