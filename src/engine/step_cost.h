// StepCost: what a step costs, learnt from the steps the engine ran, so that a step that carries
// a prefill chunk beside running decodes stays within a few decode steps (the inter-token gap of
// every running request is that step's length). A step with n prefill tokens beside decode rows
// costs about d + a + b n:
//   d  a decode step: moving average over steps with no prefill tokens (the batch of the moment);
//   b  a prefill token: moving average over steps with at least `large_chunk` prefill tokens, of
//      (step - d if it also decoded) / n (a large chunk amortises the step's fixed costs);
//   a  what a prefill chunk adds besides its tokens (another kernel path, no graph): moving
//      average over smaller mixed steps of step - d - b n, at least 0.
// mixed_prefill_tokens(ratio) is the n for which such a step lasts `ratio` decode steps, in whole
// blocks, at least one block, at most `cap`; `cap` until d and b have been seen. Pure arithmetic
// over what it is told (the engine times its steps): deterministic in tests.
#pragma once

namespace deltaserve {

class StepCost {
 public:
  // large_chunk: the fewest prefill tokens of a step that times b (the engine: half its step
  // budget, at most 1024).
  explicit StepCost(int large_chunk = 1024) : large_chunk_(large_chunk) {}

  // One finished step: its prefill tokens, its decode rows, its wall time.
  void observe(int prefill_tokens, int decode_rows, double seconds);

  // Prefill tokens for a step that also decodes (see above).
  int mixed_prefill_tokens(double ratio, int block, int cap) const;

  double decode_step_s() const { return decode_s_; }           // d; 0: not seen yet
  double prefill_token_s() const { return prefill_token_s_; }  // b; 0: not seen yet
  double chunk_overhead_s() const { return overhead_s_; }      // a

 private:
  static constexpr double kWeight = 0.25;  // of the newest step in each average
  int large_chunk_;
  double decode_s_ = 0, prefill_token_s_ = 0, overhead_s_ = 0;
};

}  // namespace deltaserve
