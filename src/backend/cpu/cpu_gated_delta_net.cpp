// Gated DeltaNet on the CPU (reference for the CUDA kernels). Matches HF Qwen3_5GatedDeltaNet:
// causal depthwise conv1d over [q|k|v] with the sequence's conv state, SiLU, L2-normalised q and k
// (eps 1e-6), q *= Dk^-0.5, beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), the
// sequential delta rule per value head on an f32 state, then gated RMSNorm with silu(z).
// With a bf16 recurrent state (--mamba-ssm-dtype bfloat16) a run works on an f32 copy of the
// head's state and stores it rounded at its end (and at a checkpoint); within a run it stays f32.
//
// State layout (each backend's own, kernels.h): recurrent [slot, Hv, ...] holds each head's S as
// [Dk, Dv] (row d is key dim d; the CUDA kernels keep Sᵀ): each product of the rule is then a sum
// of rows with the value dims in vector lanes (cpu_delta_rule.h), and one pass per token writes the
// previous token's update and reads the next token's products. conv [slot, K-1, conv_dim] holds
// the last K-1 pre-conv inputs, oldest first, as rows a token's conv reads in place.
//
// Speculative verification defers the state (BatchMeta::state_defer): the run reads the slot's
// state, works on copies, and keeps its raw inputs in the slot's pending rows; gdn_commit replays
// the accepted ones through the same two phases (conv, delta rule) into the live state.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_delta_rule.h"
#include "backend/cpu/cpu_gdn_kernels.h"
#include "backend/cpu/vec.h"

namespace deltaserve {

namespace {

// A run of n tokens of one sequence: where its raw inputs are. Token j's pre-conv [q|k|v] starts
// at qkv(j); its b and a at ba(j) (a, Hv floats after b).
struct GdnRun {
  const float* base;   // row of token 0
  int64_t row;         // floats between tokens
  int64_t ba_offset;   // b's column in a row
  int n;
  const float* qkv(int j) const { return base + int64_t(j) * row; }
  const float* ba(int j) const { return base + int64_t(j) * row + ba_offset; }
};

// Phase 1's work for one run: its inputs, window, outputs and checkpoint.
struct ConvJob {
  GdnRun run;
  float* window = nullptr;       // [K-1, conv_dim]: the run's K-1 inputs before token 0, oldest first
  bool keep_window = false;      // a deferred run leaves the window as it was
  float* out = nullptr;          // [run.n, conv_dim]: SiLU(conv) of each token
  int ckpt_j = -1;               // the window after this token ..
  float* ckpt_window = nullptr;  // .. into this [K-1, conv_dim]
};

// Phase 1's parallel work items: up to kConvRows tokens of one run x up to kConvCols channels.
constexpr int kConvRows = 32;
using vec::kConvCols;

// Floats of phase 1's scratch: per thread, vec::conv_tile_floats.
int64_t conv_scratch_floats(const GdnParams& p, int n_threads) {
  return int64_t(n_threads) * vec::conv_tile_floats(p.conv_kernel);
}

// Phase 1 for n_jobs runs (job_of(s): ConvJob): SiLU(causal conv) of every token, a row of a
// channel block at a time (vec::conv_row): token j's inputs are tokens j-K+1 .. j of its run,
// those before the run from its window. The item holding a run's first tokens reads the window;
// it then writes the window after the run (and a checkpoint's), which depend only on the old
// window and the run's inputs. tmp: conv_scratch_floats; units: scratch for the items.
template <class JobOf>
void conv_phase(ThreadPool& pool, const GdnParams& p, int n_jobs, const JobOf& job_of, float* tmp,
                std::vector<int32_t>& units) {
  const int K = p.conv_kernel, Km1 = K - 1;
  const int64_t cd = p.conv_dim();
  DS_CHECK(K >= 1 && K <= 16, "conv kernel of ", K, " taps");
  const int64_t n_col_blocks = (cd + kConvCols - 1) / kConvCols;
  // units: each run's length (job_of is asked once per run), then the items, 3 ints each.
  if (units.size() < static_cast<size_t>(n_jobs)) units.resize(static_cast<size_t>(n_jobs));
  int64_t n_units = 0;
  int max_n = 0;
  for (int s = 0; s < n_jobs; ++s) {
    const int n = job_of(s).run.n;
    units[s] = n;
    n_units += (n + kConvRows - 1) / kConvRows * n_col_blocks;
    max_n = std::max(max_n, n);
  }
  if (units.size() < static_cast<size_t>(n_jobs + 3 * n_units)) units.resize(static_cast<size_t>(n_jobs + 3 * n_units));
  const int32_t* run_n = units.data();
  int32_t* item = units.data() + n_jobs;
  // Rows of tokens outermost, then channel blocks, then runs: a decode step's items (one token per
  // run) come block by block, so a thread transposes a block's taps once for all of its runs; a
  // long run's items go row chunk by row chunk, each thread reading whole token rows.
  for (int j0 = 0, u = 0; j0 < max_n; j0 += kConvRows)
    for (int64_t b = 0; b < n_col_blocks; ++b)
      for (int s = 0; s < n_jobs; ++s) {
        if (j0 >= run_n[s]) continue;
        item[3 * u] = s;
        item[3 * u + 1] = j0;
        item[3 * u + 2] = static_cast<int32_t>(b * kConvCols);
        ++u;
      }
  const float* cw = p.conv_weight.f32();  // [cd, K]
  pool.parallel_for(n_units, 1, [&](int tid, int64_t u0, int64_t u1) {
    float* wt = tmp + int64_t(tid) * vec::conv_tile_floats(K);  // [K, nc]: the taps, transposed
    int64_t wt_c0 = -1;                                         // the block wt holds
    for (int64_t u = u0; u < u1; ++u) {
      const ConvJob job = job_of(item[3 * u]);
      const int j0 = item[3 * u + 1], j1 = std::min(job.run.n, j0 + kConvRows);
      const int64_t c0 = item[3 * u + 2], nc = std::min(kConvCols, cd - c0);
      if (c0 != wt_c0)
        for (int64_t c = 0; c < nc; ++c)
          for (int q = 0; q < K; ++q) wt[q * nc + c] = cw[(c0 + c) * K + q];
      wt_c0 = c0;
      // Token t's inputs: its row of the run, or before the run (t < 0) the window's row t + K-1.
      auto input = [&](int t) { return t >= 0 ? job.run.qkv(t) + c0 : job.window + int64_t(t + Km1) * cd + c0; };
      const float* x[16];
      for (int j = j0; j < j1; ++j) {
        for (int q = 0; q < K; ++q) x[q] = input(j - Km1 + q);
        float* o = job.out + int64_t(j) * cd + c0;
        vec::conv_row(o, x, wt, nc, K, nc);
        vec::silu_mul(o, o, nullptr, nc);
      }
      if (j0 != 0) continue;
      // The window after token e: inputs e-K+2 .. e. Row w comes from the old window's row w + e + 1
      // or from the run, so the live window can be rewritten in place, rows in order (the
      // checkpoint's first, while the old rows are all there).
      auto window_after = [&](int e, float* dst) {  // dst: [Km1, cd]
        for (int w = 0; w < Km1; ++w) std::memmove(dst + int64_t(w) * cd + c0, input(e - Km1 + 1 + w), nc * sizeof(float));
      };
      if (job.ckpt_window) window_after(job.ckpt_j, job.ckpt_window);
      if (!job.keep_window) window_after(job.run.n - 1, job.window);
    }
  });
}

// One head's recurrent state in the cache, S [Dk, Dv] (kernels.h: the CPU's layout): f32 or bf16
// elements.
struct HeadState {
  void* p = nullptr;
  bool bf16 = false;
  // S (f32) into the cache, rounded when it holds bf16.
  void store(const float* S, int64_t n) const {
    if (!bf16) {
      std::copy_n(S, n, static_cast<float*>(p));
      return;
    }
    uint16_t* h = static_cast<uint16_t*>(p);
    for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(S[i]);
  }
  void load(float* S, int64_t n) const {
    if (!bf16) {
      std::copy_n(static_cast<const float*>(p), n, S);
      return;
    }
    const uint16_t* h = static_cast<const uint16_t*>(p);
    for (int64_t i = 0; i < n; ++i) S[i] = bf16_to_f32(h[i]);
  }
};
// Head hv of slot `slot` in a recurrent state tensor [slots, Hv, Dv, Dk].
HeadState head_state_of(const Tensor& rec, int64_t slot, int hv) {
  const int64_t head = rec.dim(2) * rec.dim(3);
  const int64_t off = (slot * rec.dim(1) + hv) * head * static_cast<int64_t>(dtype_size(rec.dtype));
  return {static_cast<char*>(rec.data) + off, rec.dtype == DType::BF16};
}

}  // namespace

void cpu::delta_pass_portable(float* S, int Dk, int Dv, const float* kp, float g, const float* delta, const float* ka,
                              float ga, float* a, const float* qo, float* o) {
  cpu::delta_pass<simd::VecScalarN<1>>(S, Dk, Dv, kp, g, delta, ka, ga, a, qo, o);
}

namespace {

// delta_pass (cpu_delta_rule.h) by the widest kernel this CPU and Dv allow.
void delta_pass_any(float* S, int Dk, int Dv, const float* kp, float g, const float* delta, const float* ka, float ga,
                    float* a, const float* qo, float* o) {
#if defined(DELTASERVE_X86_KERNELS)
  static const bool v4 = __builtin_cpu_supports("x86-64-v4"), v3 = __builtin_cpu_supports("x86-64-v3");
  if (v4 && Dv % 16 == 0) return cpu::delta_pass_avx512(S, Dk, Dv, kp, g, delta, ka, ga, a, qo, o);
  if (v3 && Dv % 8 == 0) return cpu::delta_pass_avx2(S, Dk, Dv, kp, g, delta, ka, ga, a, qo, o);
#endif
  cpu::delta_pass_portable(S, Dk, Dv, kp, g, delta, ka, ga, a, qo, o);
}

// A thread's buffers for delta_head: a copy of the state and one token's vectors.
struct DeltaBufs {
  float* S;              // [Dk, Dv]
  float *q[2], *k[2];    // [Dk] each: token j's in [j % 2]
  float *delta[2];       // [Dv] each
  float* a;              // [Dv]
  static DeltaBufs at(float* p, int Dk, int Dv) {
    DeltaBufs b;
    b.S = p;
    p += int64_t(Dk) * Dv;
    for (int i = 0; i < 2; ++i) b.q[i] = p, b.k[i] = p + Dk, b.delta[i] = p + 2 * Dk, p += 2 * Dk + Dv;
    b.a = p;
    return b;
  }
};

// Phase 2 for one (run, value head hv): the delta rule over the run's tokens on the state S
// [Dk, Dv] (f32) in place:
//   S_j = g_j S_{j-1} + k_j ⊗ δ_j,  δ_j = β_j (v_j - (g_j S_{j-1}) k_j),  o_j = S_j q_j.
// Pass j (j = 0 .. n) writes token j-1's update into S, then reads from it both (g_j S_{j-1}) k_j
// (token j's δ) and o_{j-1}; so each token costs one load and one store of the state. o_out(j) (nullptr:
// no output) receives token j's pre-norm output [Dv]; the state after token ckpt_j is stored to
// ckpt_out. The products sum over d in order, the same for a token whatever run it is in.
template <typename OutFn>
void delta_head(const GdnParams& p, const GdnRun& r, int hv, const float* conv_out, float* S, const DeltaBufs& b,
                OutFn&& o_out, int ckpt_j = -1, HeadState ckpt_out = {}) {
  const int Hk = p.n_k_heads, Dk = p.k_head_dim, Dv = p.v_head_dim;
  const int64_t key_dim = int64_t(Hk) * Dk, conv_dim = p.conv_dim();
  const int hk = hv / (p.n_v_heads / Hk);
  const float q_scale = 1.0f / std::sqrt(float(Dk));
  const float neg_a = p.neg_exp_a.f32()[hv], dt_bias = p.dt_bias.f32()[hv];
  float g_prev = 0.f;
  for (int j = 0; j <= r.n; ++j) {
    const int cur = j % 2, prev = 1 - cur;
    float *q = b.q[cur], *k = b.k[cur];
    float beta = 0.f, g = 0.f;
    if (j < r.n) {
      const float* c = conv_out + int64_t(j) * conv_dim;
      std::copy_n(c + int64_t(hk) * Dk, Dk, q);
      std::copy_n(c + key_dim + int64_t(hk) * Dk, Dk, k);
      const float qn = q_scale / std::sqrt(vec::sum_squares(q, Dk) + 1e-6f);
      const float kn = 1.0f / std::sqrt(vec::sum_squares(k, Dk) + 1e-6f);
      for (int d = 0; d < Dk; ++d) {
        q[d] *= qn;
        k[d] *= kn;
      }
      beta = vec::sigmoid(r.ba(j)[hv]);
      g = std::exp(neg_a * vec::softplus(r.ba(j)[p.n_v_heads + hv] + dt_bias));
    }
    float* o = j > 0 ? o_out(j - 1) : nullptr;
    delta_pass_any(S, Dk, Dv, j > 0 ? b.k[prev] : nullptr, g_prev, b.delta[prev], j < r.n ? k : nullptr, g, b.a,
                   o ? b.q[prev] : nullptr, o);
    if (j > 0 && j - 1 == ckpt_j) ckpt_out.store(S, int64_t(Dk) * Dv);
    if (j < r.n) {
      const float* v = conv_out + int64_t(j) * conv_dim + 2 * key_dim + int64_t(hv) * Dv;
      for (int jv = 0; jv < Dv; ++jv) b.delta[cur][jv] = (v[jv] - b.a[jv]) * beta;
      g_prev = g;
    }
  }
}

// Where sequence s of a batch saves its checkpoint: (token index, conv window, slot).
struct StateCheckpoint {
  int j = -1;
  float* conv = nullptr;  // [K-1, conv_dim] of the slot
  int64_t slot = -1;
  HeadState head(const StateLayerView& state, int hv) const {
    return slot < 0 ? HeadState{} : head_state_of(state.recurrent, slot, hv);
  }
};
StateCheckpoint checkpoint_of(const BatchMeta& meta, const StateLayerView& state, int s) {
  if (!meta.checkpoint_at || meta.checkpoint_at[s] < 0) return {};
  const int64_t slot = meta.checkpoint_slot[s];
  const int64_t conv = state.conv.numel() / state.conv.dim(0);
  return {meta.checkpoint_at[s], state.conv.f32() + slot * conv, slot};
}

}  // namespace

void CpuKernels::gated_delta_net(const GdnParams& p, const Tensor& proj, const StateLayerView& state,
                                 const BatchMeta& meta, Tensor out) {
  const int Hv = p.n_v_heads, Dk = p.k_head_dim, Dv = p.v_head_dim;
  const int K = p.conv_kernel, Km1 = K - 1;
  const int64_t value_dim = p.value_dim(), conv_dim = p.conv_dim();
  const int64_t row = p.proj_dim(), prow = conv_dim + 2LL * Hv;
  const int T = meta.n_tokens;
  DS_CHECK(proj.cols() == row && proj.rows() == T, "gdn proj ", proj.shape_string());
  DS_CHECK(out.cols() == value_dim && out.rows() == T, "gdn out ", out.shape_string());
  auto deferred = [&](int s) { return meta.state_defer != nullptr && meta.state_defer[s] != 0; };
  auto run_of = [&](int s) {
    const int t0 = meta.seq_start[s];
    return GdnRun{proj.f32() + int64_t(t0) * row, row, conv_dim + value_dim, meta.seq_start[s + 1] - t0};
  };
  // A deferred run keeps its raw inputs in the slot's pending rows (and leaves the state as it was).
  for (int s = 0; s < meta.n_seqs; ++s) {
    if (!deferred(s)) continue;
    const GdnRun r = run_of(s);
    DS_CHECK(r.n <= state.pending_depth, "deferred GDN run of ", r.n, " tokens; pending rows hold ",
             state.pending_depth);
    float* pend = state.pending.f32() + int64_t(meta.state_slot[s]) * state.pending_depth * prow;
    for (int j = 0; j < r.n; ++j) {
      std::memcpy(pend + j * prow, r.qkv(j), conv_dim * sizeof(float));
      std::memcpy(pend + j * prow + conv_dim, r.ba(j), 2 * Hv * sizeof(float));
    }
  }

  // Phase 1: causal conv + SiLU of every token; updates the conv state (unless deferred).
  float* conv_out = scratch_f32(0, int64_t(T) * conv_dim);  // [T, conv_dim]
  conv_phase(
      pool_, p, meta.n_seqs,
      [&](int s) {
        const StateCheckpoint ck = deferred(s) ? StateCheckpoint{} : checkpoint_of(meta, state, s);
        return ConvJob{run_of(s), state.conv.f32() + int64_t(meta.state_slot[s]) * conv_dim * Km1, deferred(s),
                       conv_out + int64_t(meta.seq_start[s]) * conv_dim, ck.j, ck.conv};
      },
      scratch_f32(1, conv_scratch_floats(p, pool_.n_threads())), scratch_i32(0, 0));

  // Phase 2: the delta rule per (sequence, value head), tokens in order, then the gated RMSNorm.
  const int64_t head_state = int64_t(Dk) * Dv, per_thread = vec::delta_rule_floats(Dk, Dv);
  float* tmp_all = scratch_f32(1, int64_t(pool_.n_threads()) * per_thread);
  pool_.parallel_for(int64_t(meta.n_seqs) * Hv, 1, [&](int tid, int64_t i0, int64_t i1) {
    const DeltaBufs b = DeltaBufs::at(tmp_all + int64_t(tid) * per_thread, Dk, Dv);
    for (int64_t i = i0; i < i1; ++i) {
      const int s = static_cast<int>(i / Hv), hv = static_cast<int>(i % Hv);
      const GdnRun r = run_of(s);
      if (r.n == 0) continue;
      // The state in place (f32), or a copy (a deferred run leaves it; bf16 is stored after).
      const HeadState live = head_state_of(state.recurrent, meta.state_slot[s], hv);
      float* S = static_cast<float*>(live.p);
      if (deferred(s) || live.bf16) {
        live.load(b.S, head_state);
        S = b.S;
      }
      const int t0 = meta.seq_start[s];
      const StateCheckpoint ck = deferred(s) ? StateCheckpoint{} : checkpoint_of(meta, state, s);
      delta_head(p, r, hv, conv_out + int64_t(t0) * conv_dim, S, b,
                 [&](int j) { return out.f32() + int64_t(t0 + j) * value_dim + int64_t(hv) * Dv; }, ck.j,
                 ck.head(state, hv));
      if (live.bf16 && !deferred(s)) live.store(S, head_state);
      // Gated RMSNorm over Dv with silu(z).
      for (int j = 0; j < r.n; ++j) {
        float* o = out.f32() + int64_t(t0 + j) * value_dim + int64_t(hv) * Dv;
        const float* z = r.qkv(j) + conv_dim + int64_t(hv) * Dv;
        const float inv = 1.0f / std::sqrt(vec::sum_squares(o, Dv) / float(Dv) + p.eps);
        const float* nw = p.norm.f32();
        for (int jv = 0; jv < Dv; ++jv) o[jv] = o[jv] * inv * nw[jv] * vec::silu(z[jv]);
      }
    }
  });
}

void CpuKernels::gdn_commit(std::span<const GdnLayerRef> layers, const BatchMeta& commit) {
  for (const GdnLayerRef& ref : layers) {
    const GdnParams& p = *ref.params;
    const StateLayerView& state = *ref.state;
    const int Hv = p.n_v_heads, Dk = p.k_head_dim, Dv = p.v_head_dim, K = p.conv_kernel, Km1 = K - 1;
    const int64_t conv_dim = p.conv_dim(), prow = conv_dim + 2LL * Hv, head_state = int64_t(Dk) * Dv;
    auto run_of = [&](int s) {
      const int n = commit.seq_start[s + 1] - commit.seq_start[s];
      DS_CHECK(n >= 0 && n <= state.pending_depth, "commit of ", n, " tokens; pending rows hold ", state.pending_depth);
      return GdnRun{state.pending.f32() + int64_t(commit.state_slot[s]) * state.pending_depth * prow, prow,
                    conv_dim, n};
    };
    // Phase 1 reads each window before replacing it; conv outputs of a sequence's tokens at
    // rows seq_start[s] + j.
    float* conv_out = scratch_f32(0, int64_t(std::max(commit.n_tokens, 1)) * conv_dim);
    conv_phase(
        pool_, p, commit.n_seqs,
        [&](int s) {
          const StateCheckpoint ck = checkpoint_of(commit, state, s);
          return ConvJob{run_of(s), state.conv.f32() + int64_t(commit.state_slot[s]) * conv_dim * Km1, false,
                         conv_out + int64_t(commit.seq_start[s]) * conv_dim, ck.j, ck.conv};
        },
        scratch_f32(1, conv_scratch_floats(p, pool_.n_threads())), scratch_i32(0, 0));
    const int64_t per_thread = vec::delta_rule_floats(Dk, Dv);
    float* tmp_all = scratch_f32(1, int64_t(pool_.n_threads()) * per_thread);
    pool_.parallel_for(int64_t(commit.n_seqs) * Hv, 1, [&](int tid, int64_t i0, int64_t i1) {
      const DeltaBufs b = DeltaBufs::at(tmp_all + int64_t(tid) * per_thread, Dk, Dv);
      for (int64_t i = i0; i < i1; ++i) {
        const int s = static_cast<int>(i / Hv), hv = static_cast<int>(i % Hv);
        const GdnRun r = run_of(s);
        if (r.n == 0) continue;
        const HeadState live = head_state_of(state.recurrent, commit.state_slot[s], hv);
        float* S = static_cast<float*>(live.p);
        if (live.bf16) {
          live.load(b.S, head_state);
          S = b.S;
        }
        const StateCheckpoint ck = checkpoint_of(commit, state, s);
        delta_head(p, r, hv, conv_out + int64_t(commit.seq_start[s]) * conv_dim, S, b,
                   [](int) -> float* { return nullptr; }, ck.j, ck.head(state, hv));
        if (live.bf16) live.store(S, head_state);
      }
    });
  }
}

}  // namespace deltaserve
