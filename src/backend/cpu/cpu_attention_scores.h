// The decode attention's in-place scores (cpu_attention_kernels.h), written once over a simd.h
// vector type V with a register transpose and included by one file per ISA
// (cpu_attention_avx512.cpp, cpu_attention_avx2.cpp), each built with its own -m flags.
//
// Keys go V::kLanes at a time: kLanes key rows x kLanes dims are loaded and transposed in
// registers, so that each dim's keys form one vector, and every row's score vector takes that dim
// by one FMA, dims in order from zero: the sum vec::scores_block computes with the keys transposed
// through memory, so the bits are the same where vec.cpp's clones use the same FMAs.
//
// Everything stays internal to the including file (anonymous namespace), see simd.h.
#pragma once

#include <cstdint>

#include "backend/cpu/simd.h"

namespace deltaserve::cpu {
namespace {

template <class V, int R>
void scores_tile(const float* q, const float* k, int64_t ldk, int n, int hd, float scale, float* s, int64_t lds) {
  using F = typename V::F;
  constexpr int L = V::kLanes;
  F acc[R];
  for (int r = 0; r < R; ++r) acc[r] = V::zero();
  for (int d0 = 0; d0 < hd; d0 += L) {
    F col[L];
    for (int j = 0; j < L; ++j) col[j] = j < n ? V::load(k + j * ldk + d0) : V::zero();
    V::transpose(col);
    for (int j = 0; j < L; ++j)
      for (int r = 0; r < R; ++r) acc[r] = V::fma(V::bcast(q + int64_t(r) * hd + d0 + j), col[j], acc[r]);
  }
  const F sc = V::bcast(&scale);
  for (int r = 0; r < R; ++r) {
    if (n == L) {
      V::store(s + int64_t(r) * lds, V::mul(acc[r], sc));
      continue;
    }
    float v[L];
    V::store(v, V::mul(acc[r], sc));
    for (int j = 0; j < n; ++j) s[int64_t(r) * lds + j] = v[j];
  }
}

// scores_tile<V, R> for a run-time rows in [1, MaxR].
template <class V, int MaxR, int R = 1>
void scores_rows(int rows, const float* q, const float* k, int64_t ldk, int n, int hd, float scale, float* s,
                 int64_t lds) {
  if constexpr (R <= MaxR) {
    if (rows == R) scores_tile<V, R>(q, k, ldk, n, hd, scale, s, lds);
    else scores_rows<V, MaxR, R + 1>(rows, q, k, ldk, n, hd, scale, s, lds);
  }
}

// s[r * lds + j] = scale * sum_d q[r * hd + d] * k[j * ldk + d] for r < rows, j < n; hd a multiple
// of V::kLanes.
template <class V>
void scores_in_place(const float* q, int rows, const float* k, int64_t ldk, int n, int hd, float scale, float* s,
                     int64_t lds) {
  // Rows sharing each transposed block: their accumulators and the block fill the registers.
  constexpr int kRows = V::kLanes == 16 ? 8 : 4;
  constexpr int L = V::kLanes;
  for (int j0 = 0; j0 < n; j0 += L) {
    const int m = n - j0 < L ? n - j0 : L;
    for (int r = 0; r < rows; r += kRows)
      scores_rows<V, kRows>(rows - r < kRows ? rows - r : kRows, q + int64_t(r) * hd, k + j0 * ldk, ldk, m, hd, scale,
                            s + r * lds + j0, lds);
  }
}

}  // namespace
}  // namespace deltaserve::cpu
