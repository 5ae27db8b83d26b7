// AVX-512 scores of a few query rows against keys read in place (cpu_attention.cpp's decode tiles).
// Built with -mavx512f (CMakeLists.txt); called only where the CPU has the x86-64-v4 set, whose
// clone of vec::scores_block it must match bit for bit.
//
// Keys go 16 at a time: 16 key rows x 16 dims are loaded and transposed in registers (unpack,
// shuffle within 128-bit lanes, then across lanes), so that each dim's 16 keys form one vector,
// and every row's score vector takes that dim by one FMA, dims in order from zero: the sum
// vec::scores_block computes with the keys transposed through memory.
#include <immintrin.h>

#include "backend/cpu/cpu_attention_kernels.h"

#if !defined(__AVX512F__)
#error "cpu_attention_avx512.cpp must be compiled with -mavx512f"
#endif

namespace deltaserve::cpu {

namespace {

// In place: r[i] (row i, 16 floats) becomes column i of the 16 x 16 block.
inline void transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane L: rows i, i+1 interleaved, columns 4L..4L+3
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // u[i + c], lane L: column 4L + c of rows i .. i+3
    u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {  // column 4L + c: lane L of u[c], u[4 + c], u[8 + c], u[12 + c]
    const __m512 x0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), x1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
    const __m512 y0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
    const __m512 y1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_f32x4(x0, y0, 0x88);
    r[4 + c] = _mm512_shuffle_f32x4(x0, y0, 0xDD);
    r[8 + c] = _mm512_shuffle_f32x4(x1, y1, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(x1, y1, 0xDD);
  }
}

template <int R>
void scores16(const float* q, const float* k, int64_t ldk, int n, int hd, float scale, float* s, int64_t lds) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int d0 = 0; d0 < hd; d0 += 16) {
    __m512 col[16];
    for (int j = 0; j < 16; ++j) col[j] = j < n ? _mm512_loadu_ps(k + j * ldk + d0) : _mm512_setzero_ps();
    transpose16(col);
    for (int j = 0; j < 16; ++j)
      for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[int64_t(r) * hd + d0 + j]), col[j], acc[r]);
  }
  const __mmask16 valid = static_cast<__mmask16>((1u << n) - 1u);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(s + int64_t(r) * lds, valid, _mm512_mul_ps(acc[r], sc));
}

}  // namespace

void scores_in_place_avx512(const float* q, int rows, const float* k, int64_t ldk, int n, int hd, float scale,
                            float* s, int64_t lds) {
  using Fn = void (*)(const float*, const float*, int64_t, int, int, float, float*, int64_t);
  static constexpr Fn kByRows[8] = {scores16<1>, scores16<2>, scores16<3>, scores16<4>,
                                    scores16<5>, scores16<6>, scores16<7>, scores16<8>};
  for (int j0 = 0; j0 < n; j0 += 16) {
    const int m = n - j0 < 16 ? n - j0 : 16;
    for (int r = 0; r < rows; r += 8)  // up to 8 rows share each transposed block
      kByRows[(rows - r < 8 ? rows - r : 8) - 1](q + int64_t(r) * hd, k + j0 * ldk, ldk, m, hd, scale,
                                                  s + r * lds + j0, lds);
  }
}

}  // namespace deltaserve::cpu
