#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "util/status.h"

namespace deltaserve {

void Sampler::apply_penalties(const SamplingParams& p, std::span<const int32_t> prompt,
                              std::span<const int32_t> generated) {
  if (p.repetition_penalty != 1.0f) {
    // vLLM/HF: over prompt and generated tokens, divide positive logits, multiply negative ones.
    sorted_.assign(prompt.begin(), prompt.end());
    sorted_.insert(sorted_.end(), generated.begin(), generated.end());
    std::sort(sorted_.begin(), sorted_.end());
    sorted_.erase(std::unique(sorted_.begin(), sorted_.end()), sorted_.end());
    for (int32_t t : sorted_) {
      float& l = work_[t];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    // OpenAI: over generated tokens, logit -= frequency * count + presence * (count > 0).
    sorted_.assign(generated.begin(), generated.end());
    std::sort(sorted_.begin(), sorted_.end());
    for (size_t i = 0; i < sorted_.size();) {
      size_t j = i;
      while (j < sorted_.size() && sorted_[j] == sorted_[i]) ++j;
      work_[sorted_[i]] -= p.frequency_penalty * float(j - i) + p.presence_penalty;
      i = j;
    }
  }
}

void Sampler::candidates(const SamplingParams& p) {
  const float inv_t = 1.0f / p.temperature;
  cand_.clear();
  const int64_t k = (p.top_k > 0 && p.top_k < vocab_) ? p.top_k : vocab_;
  for (int64_t i = 0; i < vocab_; ++i) cand_.emplace_back(work_[i] * inv_t, static_cast<int32_t>(i));
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  if (k < vocab_) {
    std::nth_element(cand_.begin(), cand_.begin() + k, cand_.end(), by_logit);
    cand_.resize(k);
  }
  std::sort(cand_.begin(), cand_.end(), by_logit);
  const float mx = cand_.front().first;
  double sum = 0;
  for (auto& c : cand_) {
    c.first = std::exp(c.first - mx);
    sum += c.first;
  }
  for (auto& c : cand_) c.first = static_cast<float>(c.first / sum);
  size_t keep = cand_.size();
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < cand_.size(); ++i) {
      cum += cand_[i].first;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    const float floor = p.min_p * cand_.front().first;
    size_t i = 1;
    while (i < keep && cand_[i].first >= floor) ++i;
    keep = i;
  }
  cand_.resize(keep);
  double s = 0;
  for (auto& c : cand_) s += c.first;
  for (auto& c : cand_) c.first = static_cast<float>(c.first / s);
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
    std::vector<std::pair<float, int32_t>>& tmp = cand_;
    tmp.clear();
    for (int64_t i = 0; i < vocab_; ++i) tmp.emplace_back(logits[i], static_cast<int32_t>(i));
    const int64_t n = std::min<int64_t>(top_n, vocab_);
    std::partial_sort(tmp.begin(), tmp.begin() + n, tmp.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    for (int64_t i = 0; i < n; ++i) lp->top.emplace_back(tmp[i].second, tmp[i].first - lse);
  }
}

int32_t Sampler::sample(const float* logits, const SamplingParams& p, std::span<const int32_t> prompt,
                        std::span<const int32_t> generated, std::mt19937_64& rng, TokenLogprob* lp) {
  work_.assign(logits, logits + vocab_);
  apply_penalties(p, prompt, generated);
  int32_t token;
  if (p.temperature <= 0.0f || p.top_k == 1) {
    token = static_cast<int32_t>(std::max_element(work_.begin(), work_.end()) - work_.begin());
  } else {
    candidates(p);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    double r = u(rng), cum = 0;
    token = cand_.back().second;
    for (const auto& c : cand_) {
      cum += c.first;
      if (r < cum) {
        token = c.second;
        break;
      }
    }
  }
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
  work_.assign(logits, logits + vocab_);
  apply_penalties(p, prompt, generated);
  probs.assign(vocab_, 0.0f);
  if (p.temperature <= 0.0f || p.top_k == 1) {
    probs[std::max_element(work_.begin(), work_.end()) - work_.begin()] = 1.0f;
    return;
  }
  candidates(p);
  for (const auto& c : cand_) probs[c.second] = c.first;
}

}  // namespace deltaserve
