// Gated attention on the CPU over the paged KV cache (reference for the CUDA kernels).
// Matches HF Qwen3_5Attention / Qwen3Attention: per-head q/k RMSNorm, RoPE on the first
// rotary_dim dims in rotate-half layout (inv_freq computed in f32 as transformers does), causal
// softmax with scale head_dim^-0.5, GQA, and o *= sigmoid(gate) when the output gate is on.
//
// KV cache dtypes (kernels.h, KvLayerView): f32, bf16, fp8 e4m3 / e5m2. k and v are computed in
// f32, stored as convert(x * (1/scale)) and read back as stored * scale; the scales are folded
// out of the inner loops (into the softmax scale and the output weights). bf16 rows are read by
// vectorised dot / axpy; fp8 rows are first widened into a per-thread f32 row (table lookup).
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vec.h"
#include "core/dtype.h"

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

// dst[i] = convert(x[i] * inv_scale) in the cache dtype.
void store_row(DType dt, void* dst, const float* x, int n, float inv_scale) {
  switch (dt) {
    case DType::F32: {
      float* d = static_cast<float*>(dst);
      for (int i = 0; i < n; ++i) d[i] = x[i] * inv_scale;
      return;
    }
    case DType::BF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = f32_to_bf16(x[i] * inv_scale);
      return;
    }
    case DType::F8E4M3: {
      uint8_t* d = static_cast<uint8_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = f32_to_f8e4m3(x[i] * inv_scale);
      return;
    }
    case DType::F8E5M2: {
      uint8_t* d = static_cast<uint8_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = f32_to_f8e5m2(x[i] * inv_scale);
      return;
    }
    default: DS_CHECK(false, "KV cache dtype ", dtype_name(dt));
  }
}

// Reading a stored row (unscaled values): dot(q, row) and o += w * row. fp8 rows are widened into
// `tmp` (head_dim floats) first.
template <DType DT>
float dot_row(const float* q, const void* row, int n, float* tmp) {
  if constexpr (DT == DType::F32) {
    (void)tmp;
    return vec::dot(q, static_cast<const float*>(row), n);
  } else if constexpr (DT == DType::BF16) {
    (void)tmp;
    return vec::dot_bf16(q, static_cast<const uint16_t*>(row), n);
  } else {
    const auto& table = DT == DType::F8E4M3 ? kF8E4M3ToF32 : kF8E5M2ToF32;
    const uint8_t* r = static_cast<const uint8_t*>(row);
    for (int i = 0; i < n; ++i) tmp[i] = table[r[i]];
    return vec::dot(q, tmp, n);
  }
}
template <DType DT>
void axpy_row(float* o, float w, const void* row, int n, float* tmp) {
  if constexpr (DT == DType::F32) {
    (void)tmp;
    vec::axpy(o, w, static_cast<const float*>(row), n);
  } else if constexpr (DT == DType::BF16) {
    (void)tmp;
    vec::axpy_bf16(o, w, static_cast<const uint16_t*>(row), n);
  } else {
    const auto& table = DT == DType::F8E4M3 ? kF8E4M3ToF32 : kF8E5M2ToF32;
    const uint8_t* r = static_cast<const uint8_t*>(row);
    for (int i = 0; i < n; ++i) tmp[i] = table[r[i]];
    vec::axpy(o, w, tmp, n);
  }
}

}  // namespace

void CpuKernels::attention(const AttentionParams& p, const Tensor& qkv, const KvLayerView& kv,
                           const BatchMeta& meta, Tensor out) {
  switch (kv.k.dtype) {
    case DType::F32: attention_impl<DType::F32>(p, qkv, kv, meta, out); return;
    case DType::BF16: attention_impl<DType::BF16>(p, qkv, kv, meta, out); return;
    case DType::F8E4M3: attention_impl<DType::F8E4M3>(p, qkv, kv, meta, out); return;
    case DType::F8E5M2: attention_impl<DType::F8E5M2>(p, qkv, kv, meta, out); return;
    default: DS_CHECK(false, "attention: unsupported KV cache dtype ", dtype_name(kv.k.dtype));
  }
}

template <DType DT>
void CpuKernels::attention_impl(const AttentionParams& p, const Tensor& qkv, const KvLayerView& kv,
                                const BatchMeta& meta, Tensor out) {
  const int nh = p.n_heads, nkv = p.n_kv_heads, hd = p.head_dim;
  const int q_width = p.output_gate ? 2 * hd : hd;  // per head in the projection
  const int64_t q_cols = int64_t(nh) * q_width, kv_cols = int64_t(nkv) * hd;
  const int64_t row = q_cols + 2 * kv_cols;
  DS_CHECK(qkv.cols() == row && qkv.rows() == meta.n_tokens, "attention qkv ", qkv.shape_string());
  DS_CHECK(out.cols() == int64_t(nh) * hd, "attention out ", out.shape_string());
  DS_CHECK(p.rotary_dim <= 512 && p.rotary_dim % 2 == 0, "rotary_dim");
  DS_CHECK(kv.v.dtype == DT, "attention: K and V caches differ in dtype");
  DS_CHECK(kv.k_scale > 0.f && kv.v_scale > 0.f, "attention: KV scales must be positive");

  std::array<float, 256> inv_freq{};
  for (int i = 0; i < p.rotary_dim / 2; ++i)
    inv_freq[i] = 1.0f / std::pow(p.rope_theta, float(2 * i) / float(p.rotary_dim));

  const int T = meta.n_tokens, bs = meta.block_size;
  // Token -> sequence index.
  std::vector<int32_t>& tok_seq = scratch_i32(0, T);
  for (int s = 0; s < meta.n_seqs; ++s)
    for (int t = meta.seq_start[s]; t < meta.seq_start[s + 1]; ++t) tok_seq[t] = s;

  constexpr std::size_t esize = dtype_size(DT);
  auto cache_row = [&](const Tensor& cache, int s, int32_t pos, int kvh) {
    int32_t block = meta.block_table[int64_t(s) * meta.max_blocks + pos / bs];
    DS_CHECK(block >= 0, "no KV block for position ", pos);
    return static_cast<char*>(cache.data) + ((int64_t(block) * bs + pos % bs) * nkv + kvh) * hd * esize;
  };
  const float k_inv = 1.0f / kv.k_scale, v_inv = 1.0f / kv.v_scale;

  // Phase A: normalise + rotate q into scratch and k into a per-thread row stored into the cache;
  // store v into the cache.
  const int n_threads = pool_.n_threads();
  float* q_all = scratch_f32(0, int64_t(T) * nh * hd + int64_t(n_threads) * hd);
  float* k_tmp_all = q_all + int64_t(T) * nh * hd;
  pool_.parallel_for(T, 1, [&](int tid, int64_t t0, int64_t t1) {
    float* k = k_tmp_all + int64_t(tid) * hd;
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
        std::copy_n(r + q_cols + int64_t(h) * hd, hd, k);
        norm_head(k, p.k_norm.f32(), hd, p.eps);
        rope_head(k, p.rotary_dim, inv_freq.data(), pos);
        store_row(DT, cache_row(kv.k, s, pos, h), k, hd, k_inv);
        store_row(DT, cache_row(kv.v, s, pos, h), r + q_cols + kv_cols + int64_t(h) * hd, hd, v_inv);
      }
    }
  });

  // Phase B: causal attention per (token, head). Scores use the stored keys (times k_scale, folded
  // into the softmax scale); the output sums stored values (times v_scale, folded into weights).
  const int group = nh / nkv;
  const int max_ctx = meta.max_context;
  const int64_t per_thread = max_ctx + 16 + hd;  // scores | a widened fp8 row
  float* scores_all = scratch_f32(1, int64_t(n_threads) * per_thread);
  const float score_scale = p.scale * kv.k_scale;
  pool_.parallel_for(int64_t(T) * nh, 1, [&](int tid, int64_t i0, int64_t i1) {
    float* scores = scores_all + int64_t(tid) * per_thread;
    float* tmp = scores + max_ctx + 16;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / nh;
      const int h = static_cast<int>(i % nh), kvh = h / group, s = tok_seq[t];
      const int32_t n_ctx = meta.positions[t] + 1;
      const float* q = q_all + (t * nh + h) * hd;
      float mx = -INFINITY;
      for (int32_t j = 0; j < n_ctx; ++j) {
        scores[j] = dot_row<DT>(q, cache_row(kv.k, s, j, kvh), hd, tmp) * score_scale;
        mx = std::max(mx, scores[j]);
      }
      float sum = 0.f;
      for (int32_t j = 0; j < n_ctx; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
      }
      float* o = out.f32() + t * (int64_t(nh) * hd) + int64_t(h) * hd;
      std::fill_n(o, hd, 0.f);
      const float inv = 1.0f / sum * kv.v_scale;
      for (int32_t j = 0; j < n_ctx; ++j) axpy_row<DT>(o, scores[j] * inv, cache_row(kv.v, s, j, kvh), hd, tmp);
      if (p.output_gate) {
        const float* gate = qkv.f32() + t * row + int64_t(h) * q_width + hd;
        for (int d = 0; d < hd; ++d) o[d] *= vec::sigmoid(gate[d]);
      }
    }
  });
}

}  // namespace deltaserve
