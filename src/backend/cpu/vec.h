// Small f32 vector helpers for the CPU ops (attention, GDN, norms). Written with independent
// per-lane accumulators so the compiler vectorises them without -ffast-math; DS_VEC_CLONES builds
// AVX-512, AVX2+FMA and baseline versions of a function and picks one at run time.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define DS_VEC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DS_VEC_CLONES
#endif

namespace deltaserve::vec {

float dot(const float* a, const float* b, int64_t n);
float sum_squares(const float* a, int64_t n);
// y += alpha * x
void axpy(float* y, float alpha, const float* x, int64_t n);
// y = y * s
void scale(float* y, float s, int64_t n);
// The same with x stored as bf16 (the upper halves of f32s): dot(a, x) and y += alpha * x.
float dot_bf16(const float* a, const uint16_t* x, int64_t n);
void axpy_bf16(float* y, float alpha, const uint16_t* x, int64_t n);

// Attention over a block of kKeyBlock keys, for a tile of up to kQueryTile tokens x the query
// heads of one KV head (cpu_attention.cpp; model/step_memory.cpp sizes its scratch):
inline constexpr int kKeyBlock = 32;
inline constexpr int kQueryTile = 64;
// Keys go in parts of kKeyPart positions, each its own online softmax, merged in order; a tile of
// at most kInPlaceRows rows reads its keys in place, and with fewer tiles than threads its parts
// run on different threads (their max, sum and output [kInPlaceRows, hd + 2] in a shared slot).
inline constexpr int kKeyPart = 2048;
inline constexpr int kInPlaceRows = 8;
// Per-thread floats of the tile's buffers: queries, a part's outputs and the merged outputs
// [R, hd] each, a key block transposed and its values [hd, kKeyBlock] each, scores
// [R, kKeyBlock], a part's and the merged max and sum [R] each, one widened key [hd];
// R = kQueryTile x query heads per KV head.
inline constexpr int64_t attention_tile_floats(int64_t group, int64_t hd) {
  const int64_t R = int64_t(kQueryTile) * group;
  return 3 * R * hd + 2 * hd * kKeyBlock + R * kKeyBlock + 4 * R + hd;
}
// Floats of the parts' slot: fewer tiles than threads, each with up to ceil(context / kKeyPart) parts.
inline constexpr int64_t attention_parts_floats(int64_t threads, int64_t max_context, int64_t hd) {
  return threads * ((max_context + kKeyPart - 1) / kKeyPart) * kInPlaceRows * (hd + 2);
}
// s[r * kKeyBlock + j] = scale * sum_d q[r * hd + d] * kt[d * kKeyBlock + j] for r < rows
// (q: rows of head_dim hd; kt: the key block transposed, [hd, kKeyBlock]).
void scores_block(const float* q, int rows, const float* kt, int hd, float scale, float* s);
// The same sums with the keys read in place, n <= kKeyBlock rows of stride ldk (k: key 0):
// s[r * kKeyBlock + j] = scale * sum_d q[r * hd + d] * k[j * ldk + d], for r < rows, j < n; each
// sum in the order scores_block takes it, so the bits are the same. For a few query rows (decode),
// where transposing a key block would cost more than its scores.
void scores_strided(const float* q, int rows, const float* k, int64_t ldk, int n, int hd, float scale, float* s);
// p[j] = exp(p[j] - m) for j < kKeyBlock, p[j] - m clamped to [-87, 0] (relative error < 3e-7).
void exp_block(float* p, float m);
// The GDN causal conv (cpu_gated_delta_net.cpp) works on blocks of kConvCols channels; per thread
// it keeps a block of the taps transposed, [K, kConvCols].
inline constexpr int64_t kConvCols = 256;
inline constexpr int64_t conv_tile_floats(int64_t K) { return K * kConvCols; }
// The GDN delta rule (cpu_gated_delta_net.cpp) per thread: a copy of a head's state [Dk, Dv], two
// tokens' q, k [Dk] and delta [Dv], and one product [Dv]; a whole number of cache lines.
inline constexpr int64_t delta_rule_floats(int64_t Dk, int64_t Dv) {
  return (Dk * Dv + 4 * Dk + 3 * Dv + 15) / 16 * 16;
}
// A causal depthwise conv row: o[c] = sum over q < K, in order, of w[q * ldw + c] * x[q][c], for c < n
// (x: the K input rows, oldest first; w: the taps transposed, [K, ldw]).
void conv_row(float* o, const float* const* x, const float* w, int64_t ldw, int K, int64_t n);
// The first index of the largest of x[0..n) (NaNs skipped; 0 when every one is NaN), as
// Kernels::argmax_rows promises: the largest by lanes, then the first element equal to it.
int64_t argmax(const float* x, int64_t n);
// o[i] = silu(g[i]) * u[i] for i < n (u == nullptr: silu(g[i]); o may be g).
void silu_mul(float* o, const float* g, const float* u, int64_t n);
// o[d] += sum_j p[j] * v[j][d] for j < n, d < hd (v: the value rows, in place or widened).
void weighted_rows(float* o, const float* p, const float* const* v, int n, int hd);

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace deltaserve::vec
