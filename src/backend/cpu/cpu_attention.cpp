// Gated attention on the CPU over the paged KV cache (reference for the CUDA kernels).
// Matches HF Qwen3_5Attention / Qwen3Attention: per-head q/k RMSNorm, RoPE on the first
// rotary_dim dims in rotate-half layout (inv_freq computed in f32 as transformers does), causal
// softmax with scale head_dim^-0.5, GQA, and o *= sigmoid(gate) when the output gate is on.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vec.h"

namespace deltaserve {

namespace {

void norm_head(float* x, const float* w, int d, float eps) {
  float inv = 1.0f / std::sqrt(vec::sum_squares(x, d) / float(d) + eps);
  for (int i = 0; i < d; ++i) x[i] = x[i] * inv * w[i];
}

void rope_head(float* x, int rotary_dim, const float* inv_freq, int32_t pos) {
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    float angle = float(pos) * inv_freq[i];
    float c = std::cos(angle), s = std::sin(angle);
    float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c - x2 * s;
    x[i + half] = x2 * c + x1 * s;
  }
}

}  // namespace

void CpuKernels::attention(const AttentionParams& p, const Tensor& qkv, const KvLayerView& kv,
                           const BatchMeta& meta, Tensor out) {
  const int nh = p.n_heads, nkv = p.n_kv_heads, hd = p.head_dim;
  const int q_width = p.output_gate ? 2 * hd : hd;  // per head in the projection
  const int64_t q_cols = int64_t(nh) * q_width, kv_cols = int64_t(nkv) * hd;
  const int64_t row = q_cols + 2 * kv_cols;
  DS_CHECK(qkv.cols() == row && qkv.rows() == meta.n_tokens, "attention qkv ", qkv.shape_string());
  DS_CHECK(out.cols() == int64_t(nh) * hd, "attention out ", out.shape_string());
  DS_CHECK(p.rotary_dim <= 512 && p.rotary_dim % 2 == 0, "rotary_dim");

  std::array<float, 256> inv_freq{};
  for (int i = 0; i < p.rotary_dim / 2; ++i)
    inv_freq[i] = 1.0f / std::pow(p.rope_theta, float(2 * i) / float(p.rotary_dim));

  const int T = meta.n_tokens, bs = meta.block_size;
  // Token -> sequence index.
  std::vector<int32_t>& tok_seq = scratch_i32(0, T);
  for (int s = 0; s < meta.n_seqs; ++s)
    for (int t = meta.seq_start[s]; t < meta.seq_start[s + 1]; ++t) tok_seq[t] = s;

  auto cache_row = [&](const Tensor& cache, int s, int32_t pos, int kvh) {
    int32_t block = meta.block_table[int64_t(s) * meta.max_blocks + pos / bs];
    DS_CHECK(block >= 0, "no KV block for position ", pos);
    return cache.f32() + ((int64_t(block) * bs + pos % bs) * nkv + kvh) * hd;
  };

  // Phase A: normalise + rotate q into scratch, k into the cache; copy v into the cache.
  float* q_all = scratch_f32(0, int64_t(T) * nh * hd);
  pool_.parallel_for(T, 1, [&](int, int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* r = qkv.f32() + t * row;
      const int s = tok_seq[t];
      const int32_t pos = meta.positions[t];
      for (int h = 0; h < nh; ++h) {
        float* q = q_all + (t * nh + h) * hd;
        std::copy_n(r + int64_t(h) * q_width, hd, q);
        norm_head(q, p.q_norm.f32(), hd, p.eps);
        rope_head(q, p.rotary_dim, inv_freq.data(), pos);
      }
      for (int h = 0; h < nkv; ++h) {
        float* k = cache_row(kv.k, s, pos, h);
        std::copy_n(r + q_cols + int64_t(h) * hd, hd, k);
        norm_head(k, p.k_norm.f32(), hd, p.eps);
        rope_head(k, p.rotary_dim, inv_freq.data(), pos);
        std::copy_n(r + q_cols + kv_cols + int64_t(h) * hd, hd, cache_row(kv.v, s, pos, h));
      }
    }
  });

  // Phase B: causal attention per (token, head).
  const int group = nh / nkv;
  const int max_ctx = meta.max_context;
  float* scores_all = scratch_f32(1, int64_t(pool_.n_threads()) * (max_ctx + 16));
  pool_.parallel_for(int64_t(T) * nh, 1, [&](int tid, int64_t i0, int64_t i1) {
    float* scores = scores_all + int64_t(tid) * (max_ctx + 16);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / nh;
      const int h = static_cast<int>(i % nh), kvh = h / group, s = tok_seq[t];
      const int32_t n_ctx = meta.positions[t] + 1;
      const float* q = q_all + (t * nh + h) * hd;
      float mx = -INFINITY;
      for (int32_t j = 0; j < n_ctx; ++j) {
        scores[j] = vec::dot(q, cache_row(kv.k, s, j, kvh), hd) * p.scale;
        mx = std::max(mx, scores[j]);
      }
      float sum = 0.f;
      for (int32_t j = 0; j < n_ctx; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
      }
      float* o = out.f32() + t * (int64_t(nh) * hd) + int64_t(h) * hd;
      std::fill_n(o, hd, 0.f);
      const float inv = 1.0f / sum;
      for (int32_t j = 0; j < n_ctx; ++j) vec::axpy(o, scores[j] * inv, cache_row(kv.v, s, j, kvh), hd);
      if (p.output_gate) {
        const float* gate = qkv.f32() + t * row + int64_t(h) * q_width + hd;
        for (int d = 0; d < hd; ++d) o[d] *= vec::sigmoid(gate[d]);
      }
    }
  });
}

}  // namespace deltaserve
