// Kernels::sample_rows on the CPU: the penalties in place, then each row through RowSampler, the
// pipeline the engine's host sampler runs too (the same token for the same row, settings and u).
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
    apply_penalty(logits.f32()[int64_t(p.row) * V + p.token], p);
  }
  const auto* settings = static_cast<const SampleRow*>(rows.data);
  for (int64_t r = 0; r < R; ++r) out.i32()[r] = row_sampler_.draw(logits.f32() + r * V, V, settings[r]);
}

}  // namespace deltaserve
