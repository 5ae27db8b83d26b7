// The textbook sampling pipeline for Kernels::sample_rows tests: over a (penalised) logits row,
// scale, sort everything (ties by id), top-k, softmax over the survivors, top-p prefix, min-p
// prefix; then the inverse-CDF draw in token-id order, with how far u lies from the nearest
// boundary of the cumulative distribution (a draw closer than rounding can move a boundary may
// legitimately differ between implementations).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/kernels.h"

namespace deltaserve::test {

// *fragile: the top-p or min-p cut lies within rounding (1e-6) of flipping.
inline std::vector<double> reference_distribution(const float* logits, int64_t V, const SampleRow& r,
                                                  bool* fragile = nullptr) {
  if (fragile) *fragile = false;
  std::vector<double> out(static_cast<std::size_t>(V), 0.0);
  if (r.inv_temperature == 0.f) {
    out[std::max_element(logits, logits + V) - logits] = 1.0;
    return out;
  }
  std::vector<std::pair<double, int32_t>> c;
  c.reserve(static_cast<std::size_t>(V));
  for (int64_t i = 0; i < V; ++i) c.emplace_back(double(logits[i] * r.inv_temperature), int32_t(i));
  std::sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  if (r.top_k > 0 && r.top_k < V) c.resize(static_cast<std::size_t>(r.top_k));
  const double mx = c.front().first;
  double z = 0;
  for (auto& x : c) z += (x.first = std::exp(x.first - mx));
  for (auto& x : c) x.first /= z;
  std::size_t keep = c.size();
  if (r.top_p < 1.0f) {
    double cum = 0;
    for (std::size_t i = 0; i < c.size(); ++i) {
      cum += c[i].first;
      if (cum >= r.top_p) {
        if (fragile && (cum - r.top_p < 1e-6 || r.top_p - (cum - c[i].first) < 1e-6)) *fragile = true;
        keep = i + 1;
        break;
      }
    }
  }
  if (r.min_p > 0.0f) {
    std::size_t i = 1;
    while (i < keep && c[i].first >= r.min_p * c.front().first) ++i;
    if (fragile && i < keep && std::abs(c[i].first - r.min_p * c.front().first) < 1e-6 * c.front().first) *fragile = true;
    if (fragile && i > 1 && std::abs(c[i - 1].first - r.min_p * c.front().first) < 1e-6 * c.front().first) *fragile = true;
    keep = i;
  }
  c.resize(keep);
  double s = 0;
  for (auto& x : c) s += x.first;
  for (auto& x : c) out[x.second] = x.first / s;
  return out;
}

struct ReferenceDraw {
  int32_t token = -1;
  double margin = 0;  // |u - nearest cumulative boundary|
};

inline ReferenceDraw reference_draw(const std::vector<double>& probs, double u) {
  ReferenceDraw d;
  d.margin = 1.0;
  double cum = 0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    cum += probs[i];
    d.margin = std::min(d.margin, std::abs(cum - u));
    if (d.token < 0 && u < cum) d.token = static_cast<int32_t>(i);
  }
  return d;
}

}  // namespace deltaserve::test
