// Small CPU ops: embedding, RMSNorm, SwiGLU, row gather.
// Reference semantics: HF Qwen3_5RMSNorm / Qwen3RMSNorm (f32 compute), Qwen3MLP act.
#include <algorithm>
#include <limits>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vec.h"

namespace deltaserve {

void CpuKernels::embed(const Tensor& table, const Tensor& ids, Tensor out, int64_t first_row, int64_t vocab) {
  const int64_t rows = table.dim(0), h = table.dim(1), n = ids.numel();
  if (vocab == 0) vocab = rows;
  DS_CHECK(out.rows() == n && out.cols() == h, "embed shapes");
  for (int64_t t = 0; t < n; ++t) {
    const int64_t full_id = ids.i32()[t];
    DS_CHECK(full_id >= 0 && full_id < vocab, "token id ", full_id, " out of range");
    float* dst = out.f32() + t * h;
    const int64_t id = full_id - first_row;
    if (id < 0 || id >= rows) {  // another rank's row
      std::memset(dst, 0, static_cast<std::size_t>(h) * sizeof(float));
      continue;
    }
    if (table.dtype == DType::BF16) {
      const uint16_t* src = table.u16() + int64_t(id) * h;
      for (int64_t i = 0; i < h; ++i) dst[i] = bf16_to_f32(src[i]);
    } else {
      std::memcpy(dst, table.f32() + int64_t(id) * h, h * sizeof(float));
    }
  }
}

void CpuKernels::copy_columns(const Tensor& src, int64_t src_col, Tensor dst, int64_t dst_col, int64_t width) {
  const int64_t rows = src.rows();
  DS_CHECK(dst.rows() == rows && src_col >= 0 && dst_col >= 0 && src_col + width <= src.cols() &&
               dst_col + width <= dst.cols(),
           "copy_columns shapes");
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst.f32() + r * dst.cols() + dst_col, src.f32() + r * src.cols() + src_col,
                static_cast<std::size_t>(width) * sizeof(float));
}

void CpuKernels::gather_columns(const Tensor& src, const Tensor& index, Tensor dst, float fill) {
  // src may have no columns (a tensor-parallel rank with none of the map's tokens): rows from dim 0.
  const int64_t rows = src.dim(0), m = src.cols(), w = dst.cols();
  DS_CHECK(src.ndim == 2 && dst.rows() == rows && index.numel() == w && index.dtype == DType::I32, "gather_columns shapes");
  const int32_t* idx = index.i32();
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src.f32() + r * m;
    float* d = dst.f32() + r * w;
    for (int64_t c = 0; c < w; ++c) d[c] = idx[c] >= 0 ? s[idx[c]] : fill;
  }
}

void CpuKernels::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out,
                          int64_t out_stride) {
  const int64_t rows = x.rows(), d = x.cols();
  if (out_stride == 0) out_stride = d;
  DS_CHECK(weight.numel() == d, "rms_norm weight size");
  const float* w = weight.f32();
  auto body = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x.f32() + r * d;
      float* o = out.f32() + r * out_stride;
      float inv = 1.0f / std::sqrt(vec::sum_squares(xr, d) / float(d) + eps);
      for (int64_t i = 0; i < d; ++i) o[i] = xr[i] * inv * w[i];
    }
  };
  if (rows * d < 65536) body(0, rows);
  else pool_.parallel_for(rows, 8, [&](int, int64_t a, int64_t b) { body(a, b); });
}

void CpuKernels::silu_mul(const Tensor& gate_up, Tensor out) {
  const int64_t rows = gate_up.rows(), inter = out.cols();
  DS_CHECK(gate_up.cols() == 2 * inter, "silu_mul shapes");
  auto body = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = gate_up.f32() + r * 2 * inter;
      const float* u = g + inter;
      float* o = out.f32() + r * inter;
      vec::silu_mul(o, g, u, inter);
    }
  };
  if (rows * inter < 65536) body(0, rows);
  else pool_.parallel_for(rows, 4, [&](int, int64_t a, int64_t b) { body(a, b); });
}

void CpuKernels::argmax_rows(const Tensor& x, Tensor out) {
  const int64_t rows = x.rows(), v = x.cols();
  DS_CHECK(out.numel() >= rows && out.dtype == DType::I32, "argmax_rows shapes");
  for (int64_t r = 0; r < rows; ++r) {
    // The first index of the largest number (NaNs are skipped; 0 when the row has none), as on CUDA.
    out.i32()[r] = static_cast<int32_t>(vec::argmax(x.f32() + r * v, v));
  }
}

void CpuKernels::gather_rows(const Tensor& src, const int32_t* rows, int n_rows, Tensor dst) {
  const int64_t d = src.cols();
  DS_CHECK(dst.cols() == d && dst.rows() >= n_rows, "gather_rows shapes");
  for (int i = 0; i < n_rows; ++i) {
    DS_CHECK(rows[i] >= 0 && rows[i] < src.rows(), "gather row out of range");
    std::memcpy(dst.f32() + int64_t(i) * d, src.f32() + int64_t(rows[i]) * d, d * sizeof(float));
  }
}

}  // namespace deltaserve
