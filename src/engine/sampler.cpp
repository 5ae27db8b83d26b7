#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "util/status.h"

namespace deltaserve {

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
  for (const PenaltyEntry& e : pen_) {
    float& l = work_[e.token];
    if (e.rep != 1.0f) l = l > 0 ? l / e.rep : l * e.rep;
    l -= e.sub;
  }
}

// The window of candidates: every token whose scaled logit is within delta of the max, widened
// until it provably holds the top-k / top-p / min-p answer (see candidates()).
void Sampler::window(const float* logits, const SamplingParams& p, int64_t k, float inv_t, float mx, double z_all) {
  float delta = 16.0f;
  if (p.min_p > 0.0f) delta = std::max(delta, -std::log(p.min_p) + 1.0f);
  for (;;) {
    const float thr = mx - delta;
    const bool all = !(thr > -INFINITY) || delta > 1e30f;
    cand_.clear();
    for (int64_t i = 0; i < vocab_; ++i) {
      const float l = logits[i] * inv_t;
      if (all || l >= thr) cand_.emplace_back(l, static_cast<int32_t>(i));
    }
    bool enough = all || static_cast<int64_t>(cand_.size()) == vocab_;
    if (!enough && k < vocab_) enough = static_cast<int64_t>(cand_.size()) >= k;
    if (!enough && k == vocab_) {
      if (p.min_p > 0.0f) {
        enough = true;  // delta reaches past the min-p floor
      } else if (p.top_p < 1.0f) {
        double mass = 0;
        for (const auto& c : cand_) mass += std::exp(c.first - mx);
        enough = mass / z_all >= double(p.top_p) + 1e-6;
      }
    }
    if (enough) return;
    delta *= 4.0f;
    if (delta > 1e4f) delta = INFINITY;
  }
}

void Sampler::candidates(const float* logits, const SamplingParams& p) {
  // The result is the sorted prefix of the vocabulary (by scaled logit, ties by id) that survives
  // top-k, top-p and min-p, normalised. Sorting all V tokens (248k for Qwen3.6) costs milliseconds
  // per row, so only a window of the highest logits (scaled logit >= max - delta) is collected and
  // sorted, and it is widened until it provably holds the answer:
  //   top-k: the window has at least k tokens (the window is a prefix of the sorted order);
  //   min-p: the window reaches down to the min-p floor (every kept token is inside it);
  //   top-p: the window's mass (under the same normaliser) reaches top_p.
  const float inv_t = 1.0f / p.temperature;
  const int64_t k = (p.top_k > 0 && p.top_k < vocab_) ? p.top_k : vocab_;
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  constexpr int64_t kHeapTopK = 256;
  float mx = -INFINITY;
  double z_all = 0;  // normaliser over the whole vocabulary: needed when top-k keeps everything
  auto normalise_all = [&] {
    if (k == vocab_)
      for (int64_t i = 0; i < vocab_; ++i) z_all += std::exp(logits[i] * inv_t - mx);
  };
  if (k <= kHeapTopK) {
    // Small top-k (Qwen's default is 20): one pass with a k-element heap whose front is the
    // worst kept token; almost every logit is rejected by one comparison.
    cand_.clear();
    for (int64_t i = 0; i < vocab_; ++i) {
      const std::pair<float, int32_t> c{logits[i] * inv_t, static_cast<int32_t>(i)};
      if (static_cast<int64_t>(cand_.size()) < k) {
        cand_.push_back(c);
        std::push_heap(cand_.begin(), cand_.end(), by_logit);
      } else if (by_logit(c, cand_.front())) {
        std::pop_heap(cand_.begin(), cand_.end(), by_logit);
        cand_.back() = c;
        std::push_heap(cand_.begin(), cand_.end(), by_logit);
      }
    }
    for (const auto& c : cand_) mx = std::max(mx, c.first);
    normalise_all();
  } else {
    for (int64_t i = 0; i < vocab_; ++i) mx = std::max(mx, logits[i] * inv_t);
    normalise_all();
    window(logits, p, k, inv_t, mx, z_all);
  }
  if (k < static_cast<int64_t>(cand_.size())) {
    std::nth_element(cand_.begin(), cand_.begin() + k, cand_.end(), by_logit);
    cand_.resize(k);
  }
  std::sort(cand_.begin(), cand_.end(), by_logit);
  double sum = 0;
  if (k == vocab_) {
    sum = z_all;
    for (auto& c : cand_) c.first = std::exp(c.first - mx);
  } else {
    for (auto& c : cand_) {
      c.first = std::exp(c.first - mx);
      sum += c.first;
    }
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
    // The top_n logits without sorting the vocabulary: a heap whose front is the worst kept.
    const auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::vector<std::pair<float, int32_t>>& heap = cand_;
    heap.clear();
    const size_t n = static_cast<size_t>(std::min<int64_t>(top_n, vocab_));
    for (int64_t i = 0; i < vocab_; ++i) {
      const std::pair<float, int32_t> c{logits[i], static_cast<int32_t>(i)};
      if (heap.size() < n) {
        heap.push_back(c);
        std::push_heap(heap.begin(), heap.end(), better);
      } else if (better(c, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), better);
        heap.back() = c;
        std::push_heap(heap.begin(), heap.end(), better);
      }
    }
    std::sort_heap(heap.begin(), heap.end(), better);
    for (const auto& c : heap) lp->top.emplace_back(c.second, c.first - lse);
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
  if (p.greedy()) {
    token = static_cast<int32_t>(std::max_element(src, src + vocab_) - src);
  } else {
    // Inverse CDF in token-id order over the kept set (Kernels::sample_rows draws the same way).
    candidates(src, p);
    std::sort(cand_.begin(), cand_.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    double cum = 0;
    token = cand_.back().second;
    for (const auto& c : cand_) {
      cum += c.first;
      if (u < cum) {
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
    probs[std::max_element(src, src + vocab_) - src] = 1.0f;
    return;
  }
  candidates(src, p);
  for (const auto& c : cand_) probs[c.second] = c.first;
}

}  // namespace deltaserve
