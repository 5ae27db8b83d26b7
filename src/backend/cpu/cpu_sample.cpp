// Kernels::sample_rows on the CPU: the reference the device kernel is tested against. Plain and
// slow on purpose: every row's vocabulary is sorted. The engine's host path (engine/sampler.h)
// computes the same thing over a window of the highest logits.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace deltaserve {

void CpuKernels::sample_rows(Tensor logits, const Tensor& rows, const Tensor& penalties, Tensor out) {
  const int64_t R = logits.rows(), V = logits.cols();
  DS_CHECK(logits.dtype == DType::F32 && out.dtype == DType::I32 && out.numel() >= R, "sample_rows shapes");
  DS_CHECK(rows.nbytes() >= static_cast<std::size_t>(R) * sizeof(SampleRow), "sample_rows: ", R, " rows of settings");
  const auto* pen = static_cast<const PenaltyEntry*>(penalties.data);
  const int64_t n_pen = static_cast<int64_t>(penalties.nbytes() / sizeof(PenaltyEntry));
  for (int64_t e = 0; e < n_pen; ++e) {
    const PenaltyEntry& p = pen[e];
    DS_CHECK(p.row >= 0 && p.row < R && p.token >= 0 && p.token < V, "penalty entry out of range");
    float& l = logits.f32()[int64_t(p.row) * V + p.token];
    if (p.rep != 1.f) l = l > 0 ? l / p.rep : l * p.rep;
    l -= p.sub;
  }
  const auto* settings = static_cast<const SampleRow*>(rows.data);
  std::vector<std::pair<float, int32_t>> c(static_cast<std::size_t>(V));
  for (int64_t r = 0; r < R; ++r) {
    const SampleRow& sr = settings[r];
    const float* x = logits.f32() + r * V;
    if (sr.inv_temperature == 0.f) {
      out.i32()[r] = static_cast<int32_t>(std::max_element(x, x + V) - x);
      continue;
    }
    for (int64_t i = 0; i < V; ++i) c[i] = {x[i] * sr.inv_temperature, static_cast<int32_t>(i)};
    std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    const int64_t k = sr.top_k > 0 && sr.top_k < V ? sr.top_k : V;
    const float mx = c[0].first;
    double z = 0;
    std::vector<double> p(static_cast<std::size_t>(k));
    for (int64_t j = 0; j < k; ++j) z += (p[j] = std::exp(double(c[j].first) - double(mx)));
    int64_t keep = k;
    if (sr.top_p < 1.f) {
      double cum = 0;
      for (int64_t j = 0; j < k; ++j) {
        cum += p[j];
        if (cum >= double(sr.top_p) * z) {
          keep = j + 1;
          break;
        }
      }
    }
    if (sr.min_p > 0.f) {
      int64_t j = 1;
      while (j < keep && p[j] >= double(sr.min_p) * p[0]) ++j;
      keep = j;
    }
    // Inverse CDF in token-id order over the kept set.
    std::vector<std::pair<int32_t, double>> kept;
    kept.reserve(static_cast<std::size_t>(keep));
    double mass = 0;
    for (int64_t j = 0; j < keep; ++j) {
      kept.emplace_back(c[j].second, p[j]);
      mass += p[j];
    }
    std::sort(kept.begin(), kept.end());
    const double target = double(sr.u) * mass;
    double cum = 0;
    int32_t tok = kept.back().first;
    for (const auto& [id, w] : kept) {
      cum += w;
      if (target < cum) {
        tok = id;
        break;
      }
    }
    out.i32()[r] = tok;
  }
}

}  // namespace deltaserve
