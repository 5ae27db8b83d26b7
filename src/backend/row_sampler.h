// RowSampler: one logits row -> one token under a SampleRow's settings (temperature, top-k, top-p,
// min-p and the uniform u). The one host implementation of that pipeline: the engine's Sampler
// and the CPU's Kernels::sample_rows both call it, so a draw is the same bits in either place
// (the CUDA kernel is tested against the textbook pipeline, tests/ops/sample_reference.h).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "backend/kernels.h"

namespace deltaserve {

// A PenaltyEntry on its token's logit (both samplers apply them so).
inline void apply_penalty(float& logit, const PenaltyEntry& e) {
  if (e.rep != 1.f) logit = logit > 0 ? logit / e.rep : logit * e.rep;
  logit -= e.sub;
}

// The k best of (logits[i] * scale, i) over i < vocab (larger first, ties by the lower id) into
// `heap`, a heap whose front is the worst kept: almost every logit is rejected by one comparison.
// std::sort_heap(heap, by_logit) sorts it best first.
inline bool by_logit(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}
void keep_top_k(const float* logits, int64_t vocab, int64_t k, float scale, std::vector<std::pair<float, int32_t>>& heap);

class RowSampler {
 public:
  // The kept set of a non-greedy row (r.inv_temperature > 0): (probability, token) sorted by
  // probability (ties by id), after top-k, top-p and min-p, normalised. Valid until the next call.
  const std::vector<std::pair<float, int32_t>>& kept(const float* logits, int64_t vocab, const SampleRow& r);

  // The token: the argmax when r.inv_temperature == 0, else the inverse CDF of the kept set in
  // token-id order at r.u.
  int32_t draw(const float* logits, int64_t vocab, const SampleRow& r);
  // The greedy pick, as Kernels::argmax_rows makes it: the first largest, NaNs skipped.
  static int32_t argmax(const float* logits, int64_t vocab);
  // The distribution draw() samples from (non-greedy r) as probabilities over the vocabulary.
  void probabilities(const float* logits, int64_t vocab, const SampleRow& r, float* probs);
  // Neither top-k, top-p nor min-p cuts anything: the whole vocabulary under the temperature.
  static bool untruncated(const SampleRow& r, int64_t vocab);

 private:
  // draw() with no top-k, top-p or min-p: in token-id order, nothing sorted.
  int32_t draw_untruncated(const float* logits, int64_t vocab, const SampleRow& r);
  // Fills cand_ with the tokens whose scaled logit is within a delta of mx that provably holds
  // the top-k / top-p / min-p result (unsorted, unnormalised).
  void window(const float* logits, int64_t vocab, const SampleRow& r, int64_t k, float mx, double z_all);

  std::vector<std::pair<float, int32_t>> cand_;  // (scaled logit, then probability; token)
};

}  // namespace deltaserve
