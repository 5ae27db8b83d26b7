#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "util/status.h"

namespace deltaserve {

SampleRow sample_row(const SamplingParams& p, double u) {
  SampleRow r;
  r.inv_temperature = 1.0f / p.temperature;
  r.top_k = p.top_k;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  // u in [0, 1) as a double can round to 1.0f; a draw must see u < 1 (no running total exceeds 1).
  r.u = std::min(static_cast<float>(u), std::nextafter(1.0f, 0.0f));
  return r;
}

void Sampler::penalty_entries(const SamplingParams& p, std::span<const int32_t> prompt,
                              std::span<const int32_t> generated, int32_t row, std::vector<PenaltyEntry>& out) {
  const bool rep = p.repetition_penalty != 1.0f;
  if (!rep && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) return;
  // OpenAI: over generated tokens, logit -= frequency * count + presence (count > 0). vLLM/HF
  // (first): over prompt and generated tokens, divide positive logits, multiply negative ones.
  gen_sorted_.assign(generated.begin(), generated.end());
  std::sort(gen_sorted_.begin(), gen_sorted_.end());
  sorted_.assign(gen_sorted_.begin(), gen_sorted_.end());
  if (rep) {
    sorted_.insert(sorted_.end(), prompt.begin(), prompt.end());
    std::sort(sorted_.begin(), sorted_.end());
  }
  sorted_.erase(std::unique(sorted_.begin(), sorted_.end()), sorted_.end());
  size_t g = 0;
  for (int32_t t : sorted_) {
    size_t n = 0;
    while (g < gen_sorted_.size() && gen_sorted_[g] < t) ++g;
    while (g < gen_sorted_.size() && gen_sorted_[g] == t) ++g, ++n;
    const float sub = n > 0 ? p.frequency_penalty * float(n) + p.presence_penalty : 0.0f;
    if (rep || sub != 0.0f) out.push_back(PenaltyEntry{row, t, p.repetition_penalty, sub});
  }
}

void Sampler::apply_penalties(const SamplingParams& p, std::span<const int32_t> prompt,
                              std::span<const int32_t> generated) {
  pen_.clear();
  penalty_entries(p, prompt, generated, 0, pen_);
  for (const PenaltyEntry& e : pen_) apply_penalty(work_[e.token], e);
}

void Sampler::fill_logprobs(const float* logits, int32_t token, int top_n, TokenLogprob* lp) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < vocab_; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab_; ++i) sum += std::exp(double(logits[i] - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  lp->token = token;
  lp->logprob = logits[token] - lse;
  lp->top.clear();
  if (top_n > 0) {
    // The top_n logits without sorting the vocabulary (x * 1.0f is x: the raw logits).
    keep_top_k(logits, vocab_, std::min<int64_t>(top_n, vocab_), 1.0f, heap_);
    std::sort_heap(heap_.begin(), heap_.end(), by_logit);
    for (const auto& c : heap_) lp->top.emplace_back(c.second, c.first - lse);
  }
}

int32_t Sampler::sample(const float* logits, const SamplingParams& p, std::span<const int32_t> prompt,
                        std::span<const int32_t> generated, std::mt19937_64& rng, TokenLogprob* lp) {
  const double u = p.greedy() ? 0.0 : std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  return sample_u(logits, p, prompt, generated, u, lp);
}

int32_t Sampler::sample_u(const float* logits, const SamplingParams& p, std::span<const int32_t> prompt,
                          std::span<const int32_t> generated, double u, TokenLogprob* lp) {
  const bool penalties = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  int32_t token;
  const float* src = logits;  // the raw row unless penalties change it (no 1 MB copy per row)
  if (penalties) {
    work_.assign(logits, logits + vocab_);
    apply_penalties(p, prompt, generated);
    src = work_.data();
  }
  // Kernels::sample_rows draws the same way (RowSampler), given the uniform as the same float.
  token = p.greedy() ? RowSampler::argmax(src, vocab_) : row_.draw(src, vocab_, sample_row(p, u));
  if (lp) fill_logprobs(logits, token, p.top_logprobs, lp);
  return token;
}

SpecDecision speculative_accept(std::vector<float>& p, const std::vector<float>& q, int32_t d,
                                std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  if (q[d] > 0 && u(rng) < std::min(1.0, double(p[d]) / double(q[d]))) return {true, d};
  double mass = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] = std::max(0.0f, p[i] - q[i]);
    mass += p[i];
  }
  if (mass <= 0) return {false, d};  // p == q up to rounding: d was fine after all
  const double r = u(rng) * mass;
  double cum = 0;
  int32_t last = d;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    cum += p[i];
    last = static_cast<int32_t>(i);
    if (r < cum) break;
  }
  return {false, last};
}

const float* Sampler::constrain(const float* logits, TokenConstraint* c, int n_generated) {
  if (!c || !c->active(n_generated)) return logits;
  constrained_.resize(static_cast<size_t>(vocab_));
  c->apply_from(logits, constrained_.data(), vocab_, n_generated);
  return constrained_.data();
}

int32_t Sampler::draw(const std::vector<float>& probs, std::mt19937_64& rng) {
  double total = 0;
  for (float x : probs) total += x;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double r = u(rng) * total;
  double cum = 0;
  int32_t last = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(probs.size()); ++i) {
    if (probs[i] <= 0) continue;
    cum += probs[i];
    last = static_cast<int32_t>(i);
    if (r < cum) return last;
  }
  return last;
}

void Sampler::distribution(const float* logits, const SamplingParams& p, std::span<const int32_t> prompt,
                           std::span<const int32_t> generated, std::vector<float>& probs) {
  const float* src = logits;
  if (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    work_.assign(logits, logits + vocab_);
    apply_penalties(p, prompt, generated);
    src = work_.data();
  }
  probs.assign(vocab_, 0.0f);
  if (p.greedy()) {
    probs[RowSampler::argmax(src, vocab_)] = 1.0f;
    return;
  }
  row_.probabilities(src, vocab_, sample_row(p, 0.0), probs.data());
}

}  // namespace deltaserve
