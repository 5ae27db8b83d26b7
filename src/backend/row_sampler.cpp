#include "backend/row_sampler.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/vec.h"

namespace deltaserve {

void keep_top_k(const float* logits, int64_t vocab, int64_t k, float scale, std::vector<std::pair<float, int32_t>>& heap) {
  heap.clear();
  for (int64_t i = 0; i < vocab; ++i) {
    const std::pair<float, int32_t> c{logits[i] * scale, static_cast<int32_t>(i)};
    if (static_cast<int64_t>(heap.size()) < k) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), by_logit);
    } else if (by_logit(c, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), by_logit);
      heap.back() = c;
      std::push_heap(heap.begin(), heap.end(), by_logit);
    }
  }
}

// The window of candidates: every token whose scaled logit is within delta of the max, widened
// until it provably holds the top-k / top-p / min-p answer (see kept()).
void RowSampler::window(const float* logits, int64_t vocab, const SampleRow& r, int64_t k, float mx, double z_all) {
  const float inv_t = r.inv_temperature;
  float delta = 16.0f;
  if (r.min_p > 0.0f) delta = std::max(delta, -std::log(r.min_p) + 1.0f);
  for (;;) {
    const float thr = mx - delta;
    const bool all = !(thr > -INFINITY) || delta > 1e30f;
    cand_.clear();
    for (int64_t i = 0; i < vocab; ++i) {
      const float l = logits[i] * inv_t;
      if (all || l >= thr) cand_.emplace_back(l, static_cast<int32_t>(i));
    }
    bool enough = all || static_cast<int64_t>(cand_.size()) == vocab;
    if (!enough && k < vocab) enough = static_cast<int64_t>(cand_.size()) >= k;
    if (!enough && k == vocab) {
      if (r.min_p > 0.0f) {
        enough = true;  // delta reaches past the min-p floor
      } else if (r.top_p < 1.0f) {
        double mass = 0;
        for (const auto& c : cand_) mass += std::exp(c.first - mx);
        enough = mass / z_all >= double(r.top_p) + 1e-6;
      }
    }
    if (enough) return;
    delta *= 4.0f;
    if (delta > 1e4f) delta = INFINITY;
  }
}

const std::vector<std::pair<float, int32_t>>& RowSampler::kept(const float* logits, int64_t vocab, const SampleRow& r) {
  // The result is the sorted prefix of the vocabulary (by scaled logit, ties by id) that survives
  // top-k, top-p and min-p, normalised. Sorting all V tokens (248k for Qwen3.6) costs milliseconds
  // per row, so only a window of the highest logits (scaled logit >= max - delta) is collected and
  // sorted, and it is widened until it provably holds the answer:
  //   top-k: the window has at least k tokens (the window is a prefix of the sorted order);
  //   min-p: the window reaches down to the min-p floor (every kept token is inside it);
  //   top-p: the window's mass (under the same normaliser) reaches top_p.
  const float inv_t = r.inv_temperature;
  const int64_t k = (r.top_k > 0 && r.top_k < vocab) ? r.top_k : vocab;
  constexpr int64_t kHeapTopK = 256;
  float mx = -INFINITY;
  double z_all = 0;  // normaliser over the whole vocabulary: needed when top-k keeps everything
  auto normalise_all = [&] {
    if (k == vocab)
      for (int64_t i = 0; i < vocab; ++i) z_all += std::exp(logits[i] * inv_t - mx);
  };
  if (k <= kHeapTopK) {
    // Small top-k (Qwen's default is 20): one pass with a k-element heap whose front is the
    // worst kept token; almost every logit is rejected by one comparison.
    keep_top_k(logits, vocab, k, inv_t, cand_);
    for (const auto& c : cand_) mx = std::max(mx, c.first);
    normalise_all();
  } else {
    for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, logits[i] * inv_t);
    normalise_all();
    window(logits, vocab, r, k, mx, z_all);
  }
  if (k < static_cast<int64_t>(cand_.size())) {
    std::nth_element(cand_.begin(), cand_.begin() + k, cand_.end(), by_logit);
    cand_.resize(k);
  }
  std::sort(cand_.begin(), cand_.end(), by_logit);
  double sum = 0;
  if (k == vocab) {
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
  if (r.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < cand_.size(); ++i) {
      cum += cand_[i].first;
      if (cum >= r.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (r.min_p > 0.0f) {
    const float floor = r.min_p * cand_.front().first;
    size_t i = 1;
    while (i < keep && cand_[i].first >= floor) ++i;
    keep = i;
  }
  cand_.resize(keep);
  double s = 0;
  for (auto& c : cand_) s += c.first;
  for (auto& c : cand_) c.first = static_cast<float>(c.first / s);
  return cand_;
}

int32_t RowSampler::argmax(const float* logits, int64_t vocab) { return static_cast<int32_t>(vec::argmax(logits, vocab)); }

namespace {

// The largest scaled logit and the softmax normaliser over the whole vocabulary.
std::pair<float, double> max_and_normaliser(const float* logits, int64_t vocab, float inv_t) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, logits[i] * inv_t);
  double z = 0;
  for (int64_t i = 0; i < vocab; ++i) z += std::exp(logits[i] * inv_t - mx);
  return {mx, z};
}

}  // namespace

int32_t RowSampler::draw_untruncated(const float* logits, int64_t vocab, const SampleRow& r) {
  // Temperature alone: the inverse CDF in token-id order over the whole vocabulary, after the max
  // and the normaliser; nothing sorted (kept() would sort all of it: ~100 ms a row at 248k).
  const float inv_t = r.inv_temperature;
  const auto [mx, z] = max_and_normaliser(logits, vocab, inv_t);
  const double target = double(r.u) * z;
  double cum = 0;
  int64_t last = -1;  // the last token of probability above 0: where rounding leaves u past the total
  for (int64_t i = 0; i < vocab; ++i) {
    const double e = std::exp(logits[i] * inv_t - mx);
    if (e <= 0) continue;
    cum += e;
    last = i;
    if (target < cum) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last >= 0 ? last : argmax(logits, vocab));
}

bool RowSampler::untruncated(const SampleRow& r, int64_t vocab) {
  return (r.top_k <= 0 || r.top_k >= vocab) && !(r.top_p < 1.0f) && !(r.min_p > 0.0f);
}

void RowSampler::probabilities(const float* logits, int64_t vocab, const SampleRow& r, float* probs) {
  if (!untruncated(r, vocab)) {
    std::fill(probs, probs + vocab, 0.0f);
    for (const auto& c : kept(logits, vocab, r)) probs[c.second] = c.first;
    return;
  }
  const float inv_t = r.inv_temperature;
  const auto [mx, z] = max_and_normaliser(logits, vocab, inv_t);
  for (int64_t i = 0; i < vocab; ++i) probs[i] = static_cast<float>(std::exp(logits[i] * inv_t - mx) / z);
}

int32_t RowSampler::draw(const float* logits, int64_t vocab, const SampleRow& r) {
  if (r.inv_temperature == 0.f) return argmax(logits, vocab);
  if (untruncated(r, vocab)) return draw_untruncated(logits, vocab, r);
  kept(logits, vocab, r);
  // Inverse CDF in token-id order over the kept set.
  std::sort(cand_.begin(), cand_.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  const double u = r.u;
  double cum = 0;
  for (const auto& c : cand_) {
    cum += c.first;
    if (u < cum) return c.second;
  }
  // Rounding left u at or past the total: the last token that can be drawn. The kept set can hold
  // tokens of probability 0 (masked: fewer allowed than top-k), which must never come out.
  for (auto it = cand_.rbegin(); it != cand_.rend(); ++it)
    if (it->first > 0.0f) return it->second;
  return cand_.back().second;
}

}  // namespace deltaserve
