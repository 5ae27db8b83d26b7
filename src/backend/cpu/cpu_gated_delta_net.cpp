// Gated DeltaNet on the CPU (reference for the CUDA kernels). Matches HF Qwen3_5GatedDeltaNet:
// causal depthwise conv1d over [q|k|v] with the sequence's conv state, SiLU, L2-normalised q and k
// (eps 1e-6), q *= Dk^-0.5, beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), the
// sequential delta rule per value head on an f32 state, then gated RMSNorm with silu(z).
//
// State layout: recurrent [slot, Hv, Dv, Dk] holds Sᵀ (row j is value dim j) so that both the
// read (Sᵀk) and the write (S += k ⊗ δ) walk contiguous rows. conv [slot, conv_dim, K-1] holds the
// last K-1 pre-conv inputs, oldest first.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vec.h"

namespace deltaserve {

void CpuKernels::gated_delta_net(const GdnParams& p, const Tensor& proj, const StateLayerView& state,
                                 const BatchMeta& meta, Tensor out) {
  const int Hk = p.n_k_heads, Hv = p.n_v_heads, Dk = p.k_head_dim, Dv = p.v_head_dim;
  const int K = p.conv_kernel, Km1 = K - 1;
  const int64_t key_dim = int64_t(Hk) * Dk, value_dim = p.value_dim(), conv_dim = p.conv_dim();
  const int64_t row = p.proj_dim();
  const int T = meta.n_tokens;
  DS_CHECK(proj.cols() == row && proj.rows() == T, "gdn proj ", proj.shape_string());
  DS_CHECK(out.cols() == value_dim && out.rows() == T, "gdn out ", out.shape_string());
  const int depth = state.snapshot_depth;
  // Snapshots go to sequences with at most `depth` tokens in this batch (verification runs);
  // longer runs (prefill chunks batched with them) need none.
  auto snapshots_for = [&](int s) {
    return meta.write_snapshots && meta.seq_start[s + 1] - meta.seq_start[s] <= depth;
  };

  // Phase 1: causal conv + SiLU for every (sequence, channel); updates the conv state.
  float* conv_out = scratch_f32(0, int64_t(T) * conv_dim);  // [T, conv_dim]
  const float* cw = p.conv_weight.f32();                    // [conv_dim, K]
  pool_.parallel_for(int64_t(meta.n_seqs) * conv_dim, 64, [&](int, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int s = static_cast<int>(i / conv_dim);
      const int64_t c = i % conv_dim;
      const int32_t slot = meta.state_slot[s];
      float* st = state.conv.f32() + (int64_t(slot) * conv_dim + c) * Km1;
      float window[16];
      DS_CHECK(K <= 16, "conv kernel too wide");
      std::copy_n(st, Km1, window);
      const float* w = cw + c * K;
      const bool snap = snapshots_for(s);
      for (int t = meta.seq_start[s], j = 0; t < meta.seq_start[s + 1]; ++t, ++j) {
        window[Km1] = proj.f32()[int64_t(t) * row + c];
        float acc = 0.f;
        for (int q = 0; q < K; ++q) acc += w[q] * window[q];
        conv_out[int64_t(t) * conv_dim + c] = vec::silu(acc);
        std::copy(window + 1, window + K, window);  // shift: drop the oldest input
        if (snap)
          std::copy_n(window, Km1,
                      state.conv_snap.f32() + ((int64_t(slot) * depth + j) * conv_dim + c) * Km1);
      }
      std::copy_n(window, Km1, st);
    }
  });

  // Phase 2: the delta rule per (sequence, value head), tokens in order.
  const int ratio = Hv / Hk;
  const float q_scale = 1.0f / std::sqrt(float(Dk));
  const int64_t head_state = int64_t(Dv) * Dk;
  float* tmp_all = scratch_f32(1, int64_t(pool_.n_threads()) * (2 * Dk + Dv));
  pool_.parallel_for(int64_t(meta.n_seqs) * Hv, 1, [&](int tid, int64_t i0, int64_t i1) {
    float* q = tmp_all + int64_t(tid) * (2 * Dk + Dv);
    float* k = q + Dk;
    float* o = k + Dk;
    for (int64_t i = i0; i < i1; ++i) {
      const int s = static_cast<int>(i / Hv), hv = static_cast<int>(i % Hv), hk = hv / ratio;
      const int32_t slot = meta.state_slot[s];
      float* S = state.recurrent.f32() + (int64_t(slot) * Hv + hv) * head_state;  // [Dv, Dk]
      const float neg_a = p.neg_exp_a.f32()[hv], dt_bias = p.dt_bias.f32()[hv];
      const bool snap = snapshots_for(s);
      for (int t = meta.seq_start[s], j = 0; t < meta.seq_start[s + 1]; ++t, ++j) {
        const float* c = conv_out + int64_t(t) * conv_dim;
        const float* v = c + 2 * key_dim + int64_t(hv) * Dv;
        std::copy_n(c + int64_t(hk) * Dk, Dk, q);
        std::copy_n(c + key_dim + int64_t(hk) * Dk, Dk, k);
        const float qn = q_scale / std::sqrt(vec::sum_squares(q, Dk) + 1e-6f);
        const float kn = 1.0f / std::sqrt(vec::sum_squares(k, Dk) + 1e-6f);
        for (int d = 0; d < Dk; ++d) {
          q[d] *= qn;
          k[d] *= kn;
        }
        const float* pr = proj.f32() + int64_t(t) * row;
        const float b = pr[conv_dim + value_dim + hv];
        const float a = pr[conv_dim + value_dim + Hv + hv];
        const float beta = vec::sigmoid(b);
        const float decay = std::exp(neg_a * vec::softplus(a + dt_bias));
        for (int jv = 0; jv < Dv; ++jv) {
          float* Sj = S + int64_t(jv) * Dk;
          const float kv_mem = vec::scale_dot(Sj, decay, k, Dk);
          const float delta = (v[jv] - kv_mem) * beta;
          o[jv] = vec::axpy_dot(Sj, delta, k, q, Dk);
        }
        if (snap)
          std::memcpy(state.recurrent_snap.f32() + ((int64_t(slot) * depth + j) * Hv + hv) * head_state,
                      S, head_state * sizeof(float));
        // Gated RMSNorm over Dv with silu(z).
        const float* z = pr + conv_dim + int64_t(hv) * Dv;
        const float inv = 1.0f / std::sqrt(vec::sum_squares(o, Dv) / float(Dv) + p.eps);
        float* dst = out.f32() + int64_t(t) * value_dim + int64_t(hv) * Dv;
        const float* nw = p.norm.f32();
        for (int jv = 0; jv < Dv; ++jv) dst[jv] = o[jv] * inv * nw[jv] * vec::silu(z[jv]);
      }
    }
  });
}

}  // namespace deltaserve
