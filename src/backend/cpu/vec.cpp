#include "backend/cpu/vec.h"

#include <bit>
#include <cstring>

namespace deltaserve::vec {

namespace {
constexpr int kLanes = 16;
inline float bf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }
inline float reduce(const float* acc) {
  float s = 0.f;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}
}  // namespace

DS_VEC_CLONES float dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  float s = reduce(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

DS_VEC_CLONES float dot_bf16(const float* a, const uint16_t* x, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * bf16(x[i + j]);
  float s = reduce(acc);
  for (; i < n; ++i) s += a[i] * bf16(x[i]);
  return s;
}

DS_VEC_CLONES void axpy_bf16(float* y, float alpha, const uint16_t* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * bf16(x[i]);
}

DS_VEC_CLONES float sum_squares(const float* a, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * a[i + j];
  float s = reduce(acc);
  for (; i < n; ++i) s += a[i] * a[i];
  return s;
}

DS_VEC_CLONES void axpy(float* y, float alpha, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

DS_VEC_CLONES void scale(float* y, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

namespace {
// R query rows against one key block: the rows share each key row's loads, R x kKeyBlock / lanes
// independent FMA chains; each row's sums as for one row.
template <int R>
[[gnu::always_inline]] inline void scores_rows(const float* q, const float* kt, int hd, float scale, float* s) {
  float a[R][kKeyBlock] = {};
  for (int d = 0; d < hd; ++d) {
    const float* k = kt + int64_t(d) * kKeyBlock;
    float x[R];
    for (int r = 0; r < R; ++r) x[r] = q[int64_t(r) * hd + d];
    for (int j = 0; j < kKeyBlock; ++j)
      for (int r = 0; r < R; ++r) a[r][j] += x[r] * k[j];
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kKeyBlock; ++j) s[int64_t(r) * kKeyBlock + j] = a[r][j] * scale;
}
}  // namespace

DS_VEC_CLONES void scores_block(const float* q, int rows, const float* kt, int hd, float scale, float* s) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) scores_rows<4>(q + int64_t(r) * hd, kt, hd, scale, s + int64_t(r) * kKeyBlock);
  for (; r + 2 <= rows; r += 2) scores_rows<2>(q + int64_t(r) * hd, kt, hd, scale, s + int64_t(r) * kKeyBlock);
  for (; r < rows; ++r) scores_rows<1>(q + int64_t(r) * hd, kt, hd, scale, s + int64_t(r) * kKeyBlock);
}

namespace {
// scores_rows with the keys in place: R rows against n keys of stride ldk.
template <int R>
[[gnu::always_inline]] inline void scores_strided_rows(const float* q, const float* k, int64_t ldk, int n, int hd,
                                                       float scale, float* s) {
  float a[R][kKeyBlock] = {};
  for (int d = 0; d < hd; ++d) {
    float x[R];
    for (int r = 0; r < R; ++r) x[r] = q[int64_t(r) * hd + d];
    for (int j = 0; j < n; ++j) {
      const float kj = k[j * ldk + d];
      for (int r = 0; r < R; ++r) a[r][j] += x[r] * kj;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < n; ++j) s[int64_t(r) * kKeyBlock + j] = a[r][j] * scale;
}
}  // namespace

DS_VEC_CLONES void scores_strided(const float* q, int rows, const float* k, int64_t ldk, int n, int hd, float scale,
                                  float* s) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) scores_strided_rows<4>(q + int64_t(r) * hd, k, ldk, n, hd, scale, s + int64_t(r) * kKeyBlock);
  for (; r + 2 <= rows; r += 2) scores_strided_rows<2>(q + int64_t(r) * hd, k, ldk, n, hd, scale, s + int64_t(r) * kKeyBlock);
  for (; r < rows; ++r) scores_strided_rows<1>(q + int64_t(r) * hd, k, ldk, n, hd, scale, s + int64_t(r) * kKeyBlock);
}

namespace {
// out[j] = exp(y[j]) for kLanes lanes, y clamped to [-87, 88]: y = k ln 2 + f, k = round(y / ln 2)
// (by the 1.5 x 2^23 trick: adding it leaves k in the low mantissa bits), f in [-ln2/2, ln2/2];
// exp(f) by its degree-6 Taylor polynomial (relative error < 2e-7), 2^k by the exponent bits.
// Branch-free with a fixed trip count, so that it vectorises.
inline void exp_lanes(const float* y_in, float* out) {
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;
  constexpr int32_t kRoundBits = 0x4B400000;  // the bits of kRound
  float f[kLanes], kr[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    float y = y_in[j] < -87.0f ? -87.0f : y_in[j];
    y = y > 88.0f ? 88.0f : y;
    kr[j] = y * kLog2e + kRound;
    const float k = kr[j] - kRound;
    f[j] = (y - k * kLn2Hi) - k * kLn2Lo;
  }
  int32_t bits[kLanes];
  std::memcpy(bits, kr, sizeof bits);
  for (int j = 0; j < kLanes; ++j) bits[j] = (bits[j] - kRoundBits + 127) << 23;
  float scale[kLanes];
  std::memcpy(scale, bits, sizeof scale);
  for (int j = 0; j < kLanes; ++j) {
    float v = 1.0f / 720;
    v = v * f[j] + 1.0f / 120;
    v = v * f[j] + 1.0f / 24;
    v = v * f[j] + 1.0f / 6;
    v = v * f[j] + 0.5f;
    v = v * f[j] + 1.0f;
    out[j] = (v * f[j] + 1.0f) * scale[j];
  }
}
}  // namespace

DS_VEC_CLONES void exp_block(float* p, float m) {
  static_assert(kKeyBlock % kLanes == 0);
  for (int i = 0; i < kKeyBlock; i += kLanes) {
    float y[kLanes];
    for (int j = 0; j < kLanes; ++j) y[j] = p[i + j] - m > 0.0f ? 0.0f : p[i + j] - m;
    exp_lanes(y, p + i);
  }
}

DS_VEC_CLONES int64_t argmax(const float* x, int64_t n) {
  float m[kLanes];
  for (int j = 0; j < kLanes; ++j) m[j] = -INFINITY;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];  // (a NaN never wins)
  float best = -INFINITY;
  for (int j = 0; j < kLanes; ++j) best = m[j] > best ? m[j] : best;
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  for (int64_t k = 0; k < n; ++k)
    if (x[k] == best) return k;
  return 0;  // every element NaN
}

DS_VEC_CLONES void silu_mul(float* o, const float* g, const float* u, int64_t n) {
  // Each block's inputs are read into locals before its outputs are stored, and the u == nullptr
  // case is a loop of its own: with o == g (in place) or a select per lane, GCC kept this scalar.
  int64_t i = 0;
  if (u) {
    for (; i + kLanes <= n; i += kLanes) {
      float x[kLanes], w[kLanes], y[kLanes], e[kLanes];
      for (int j = 0; j < kLanes; ++j) x[j] = g[i + j], w[j] = u[i + j], y[j] = -x[j];
      exp_lanes(y, e);
      for (int j = 0; j < kLanes; ++j) o[i + j] = x[j] / (1.0f + e[j]) * w[j];
    }
  } else {
    for (; i + kLanes <= n; i += kLanes) {
      float x[kLanes], y[kLanes], e[kLanes];
      for (int j = 0; j < kLanes; ++j) x[j] = g[i + j], y[j] = -x[j];
      exp_lanes(y, e);
      for (int j = 0; j < kLanes; ++j) o[i + j] = x[j] / (1.0f + e[j]) * 1.0f;
    }
  }
  for (; i < n; ++i) o[i] = silu(g[i]) * (u ? u[i] : 1.0f);
}

DS_VEC_CLONES void weighted_rows(float* __restrict o, const float* __restrict p, const float* const* v, int n, int hd) {
  int j = 0;
  // Four value rows per pass over o (fewer loads and stores of it), then two, then one.
  for (; j + 4 <= n; j += 4) {
    const float w0 = p[j], w1 = p[j + 1], w2 = p[j + 2], w3 = p[j + 3];
    const float* __restrict v0 = v[j];
    const float* __restrict v1 = v[j + 1];
    const float* __restrict v2 = v[j + 2];
    const float* __restrict v3 = v[j + 3];
    for (int d = 0; d < hd; ++d) o[d] += (w0 * v0[d] + w1 * v1[d]) + (w2 * v2[d] + w3 * v3[d]);
  }
  for (; j + 2 <= n; j += 2) {
    const float w0 = p[j], w1 = p[j + 1];
    const float* __restrict v0 = v[j];
    const float* __restrict v1 = v[j + 1];
    for (int d = 0; d < hd; ++d) o[d] += w0 * v0[d] + w1 * v1[d];
  }
  for (; j < n; ++j) {
    const float w0 = p[j];
    const float* __restrict v0 = v[j];
    for (int d = 0; d < hd; ++d) o[d] += w0 * v0[d];
  }
}

// Products and sums rounded separately (no FMA), as the scalar loop it replaced: with FMAs the
// random-weight qwen35-tiny fixture measured 2.01e-3 at one position against its 2e-3 logit
// tolerance (model_fixture_test).
#if defined(__clang__)
#define DS_NO_FP_CONTRACT
#else
#define DS_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#endif
DS_NO_FP_CONTRACT DS_VEC_CLONES void conv_row(float* __restrict o, const float* const* x, const float* __restrict w,
                                              int64_t ldw, int K, int64_t n) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  const float* __restrict x0 = x[0];
  for (int64_t c = 0; c < n; ++c) o[c] = w[c] * x0[c];
  for (int q = 1; q < K; ++q) {
    const float* __restrict xq = x[q];
    const float* __restrict wq = w + q * ldw;
    for (int64_t c = 0; c < n; ++c) o[c] += wq[c] * xq[c];
  }
}

}  // namespace deltaserve::vec
