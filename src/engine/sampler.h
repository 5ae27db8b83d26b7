// Sampler: logits row -> token on the host, per sequence. Greedy at temperature 0; otherwise
// penalties, temperature, top-k, top-p, min-p, then a draw from the sequence's own RNG (so a
// seeded request gives the same output whatever else is in the batch).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "backend/kernels.h"
#include "backend/row_sampler.h"
#include "engine/events.h"
#include "engine/sampling_params.h"
#include "engine/token_constraint.h"

namespace deltaserve {

// Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): the draft token d was drawn
// from q. Accept it with probability min(1, p(d)/q(d)); otherwise draw from norm(max(0, p - q)).
// The token that comes out is distributed exactly as p. p is overwritten on rejection.
struct SpecDecision {
  bool accepted = false;
  int32_t token = 0;
};
SpecDecision speculative_accept(std::vector<float>& p, const std::vector<float>& q, int32_t d,
                                std::mt19937_64& rng);

// A non-greedy row's settings for Kernels::sample_rows / RowSampler, with the uniform u (rounded
// to the float SampleRow carries, in both places).
SampleRow sample_row(const SamplingParams& p, double u);

class Sampler {
 public:
  explicit Sampler(int64_t vocab) : vocab_(vocab) {}
  // prompt/generated feed the penalties; lp (optional) receives the sampled token's logprob and
  // the top alternatives (log-softmax of the raw logits, as vLLM reports by default).
  int32_t sample(const float* logits, const SamplingParams& p, std::span<const int32_t> prompt,
                 std::span<const int32_t> generated, std::mt19937_64& rng, TokenLogprob* lp);

  // sample() with the uniform draw given (u in [0, 1); ignored when greedy): the token
  // Kernels::sample_rows picks on the CPU for the same row, settings and u (the same RowSampler).
  int32_t sample_u(const float* logits, const SamplingParams& p, std::span<const int32_t> prompt,
                   std::span<const int32_t> generated, double u, TokenLogprob* lp);
  // The penalties of p over prompt/generated as Kernels::sample_rows entries of `row`, appended to out.
  void penalty_entries(const SamplingParams& p, std::span<const int32_t> prompt, std::span<const int32_t> generated,
                       int32_t row, std::vector<PenaltyEntry>& out);

  // Logprob of `token` under the raw logits plus the top_n alternatives.
  void logprobs(const float* logits, int32_t token, int top_n, TokenLogprob* lp) {
    fill_logprobs(logits, token, top_n, lp);
  }
  // The row to sample from: `logits` itself, or (a sequence with an active TokenConstraint) a copy
  // in this sampler's buffer that the constraint masked and biased. Valid until the next call.
  const float* constrain(const float* logits, TokenConstraint* c, int n_generated);
  // Draws from a probability vector over the vocabulary.
  int32_t draw(const std::vector<float>& probs, std::mt19937_64& rng);

  // The processed distribution (after penalties/temperature/top-k/top-p/min-p) as probabilities
  // over the vocabulary; speculative sampling needs it explicitly. Greedy gives a one-hot.
  void distribution(const float* logits, const SamplingParams& p, std::span<const int32_t> prompt,
                    std::span<const int32_t> generated, std::vector<float>& probs);

 private:
  void apply_penalties(const SamplingParams& p, std::span<const int32_t> prompt,
                       std::span<const int32_t> generated);
  void fill_logprobs(const float* logits, int32_t token, int top_n, TokenLogprob* lp);

  int64_t vocab_;
  std::vector<float> work_;                     // [vocab] processed logits
  std::vector<float> constrained_;              // [vocab] a constrained row
  RowSampler row_;                              // temperature, top-k/p, min-p and the draw
  std::vector<std::pair<float, int32_t>> heap_; // fill_logprobs' top alternatives
  std::vector<int32_t> sorted_, gen_sorted_;
  std::vector<PenaltyEntry> pen_;
};

}  // namespace deltaserve
