// AVX2 scores of a few query rows against keys read in place (cpu_attention.cpp's decode tiles).
// Built with -mavx2 -mfma (CMakeLists.txt); called only where the CPU runs vec.cpp's x86-64-v3
// clones, whose vec::scores_block it must match bit for bit.
//
// Keys go 8 at a time: 8 key rows x 8 dims are loaded and transposed in registers (unpack,
// in-lane shuffle, then swapping 128-bit halves), so that each dim's 8 keys form one vector, and
// every row's score vector takes that dim by one FMA, dims in order from zero.
#include <immintrin.h>

#include "backend/cpu/cpu_attention_kernels.h"

#if !defined(__AVX2__) || !defined(__FMA__)
#error "cpu_attention_avx2.cpp must be compiled with -mavx2 -mfma"
#endif

namespace deltaserve::cpu {

namespace {

// In place: r[i] (row i, 8 floats) becomes column i of the 8 x 8 block.
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {  // per 128-bit half H: rows i, i+1 interleaved, columns 4H..4H+3
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // u[i + c], half H: column 4H + c of rows i .. i+3
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {  // column c: the low halves of u[c], u[4 + c]; column 4 + c: the high ones
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

template <int R>
void scores8(const float* q, const float* k, int64_t ldk, int n, int hd, float scale, float* s, int64_t lds) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int d0 = 0; d0 < hd; d0 += 8) {
    __m256 col[8];
    for (int j = 0; j < 8; ++j) col[j] = j < n ? _mm256_loadu_ps(k + j * ldk + d0) : _mm256_setzero_ps();
    transpose8(col);
    for (int j = 0; j < 8; ++j)
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(q[int64_t(r) * hd + d0 + j]), col[j], acc[r]);
  }
  const __m256 sc = _mm256_set1_ps(scale);
  for (int r = 0; r < R; ++r) {
    alignas(32) float v[8];
    _mm256_store_ps(v, _mm256_mul_ps(acc[r], sc));
    for (int j = 0; j < n; ++j) s[int64_t(r) * lds + j] = v[j];
  }
}

}  // namespace

void scores_in_place_avx2(const float* q, int rows, const float* k, int64_t ldk, int n, int hd, float scale,
                          float* s, int64_t lds) {
  using Fn = void (*)(const float*, const float*, int64_t, int, int, float, float*, int64_t);
  static constexpr Fn kByRows[4] = {scores8<1>, scores8<2>, scores8<3>, scores8<4>};
  for (int j0 = 0; j0 < n; j0 += 8) {
    const int m = n - j0 < 8 ? n - j0 : 8;
    for (int r = 0; r < rows; r += 4)  // up to 4 rows share each transposed block (16 ymm registers)
      kByRows[(rows - r < 4 ? rows - r : 4) - 1](q + int64_t(r) * hd, k + j0 * ldk, ldk, m, hd, scale,
                                                  s + r * lds + j0, lds);
  }
}

}  // namespace deltaserve::cpu
