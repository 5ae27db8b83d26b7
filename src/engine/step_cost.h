// StepCost: what a step costs, learnt from the steps the engine ran, so that a step that carries
// a prefill chunk beside running decodes stays within a few decode steps (the inter-token gap of
// every running request is that step's length):
//   d  a decode step: moving average over steps with no prefill tokens (the batch of the moment);
//   b  a prefill token: moving average over steps with at least `large_chunk` prefill tokens, of
//      (step - d if it also decoded) / tokens.
// mixed_prefill_tokens(ratio) = (ratio - 1) d / b: the prefill tokens that take (ratio - 1) decode
// steps, in whole blocks, at least one block, at most `cap`; `cap` until d and b have been seen.
// b comes from large chunks only: a small chunk's fixed costs (another kernel path beside the
// decode rows, no graph) divided over its few tokens would make the next chunk smaller still,
// down to a block (measured on the H200, bench/RESULTS.md, stop 36). Those fixed costs are left
// out of the step's length: on the H200 a mixed step came to ~2.8 decode steps at ratio 2.5.
// Pure arithmetic over what it is told (the engine times its steps): deterministic in tests.
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

 private:
  static constexpr double kWeight = 0.25;  // of the newest step in each average
  int large_chunk_;
  double decode_s_ = 0, prefill_token_s_ = 0;
};

}  // namespace deltaserve
