// Kernels: one virtual per op family. Every op exists on every backend; the CPU version
// (backend/cpu/) is the reference the others are tested against.
//
// Conventions: activations are in Backend::activation_dtype() (f32 on the CPU); small parameter
// vectors (norm weights, conv weights, A, dt_bias) are f32; matmul weights are LinearWeight.
// Zero-centred RMSNorm weights are stored as (1 + w) at load, so every norm here is x̂ · w.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace deltaserve {

// Per-row settings of Kernels::sample_rows (24 bytes; a tensor of them is DType::I32 [R, 6]).
struct SampleRow {
  float inv_temperature = 0.f;  // 0: greedy (argmax)
  int32_t top_k = 0;            // <= 0 or >= V: off
  float top_p = 1.f;            // 1: off
  float min_p = 0.f;            // 0: off
  float u = 0.f;                // the uniform draw in [0, 1)
  int32_t reserved = 0;
};
// A penalty on one token of one row: logit = (logit > 0 ? logit / rep : logit * rep) - sub
// (repetition penalty over prompt + output, then OpenAI's frequency * count + presence).
struct PenaltyEntry {
  int32_t row = 0;
  int32_t token = 0;
  float rep = 1.f;
  float sub = 0.f;
};
static_assert(sizeof(SampleRow) == 24 && sizeof(PenaltyEntry) == 16);

// A matmul weight [n, k] in a backend-private layout. out = x · wᵀ.
class LinearWeight {
 public:
  virtual ~LinearWeight() = default;
  virtual int64_t n() const = 0;
  virtual int64_t k() const = 0;
  virtual std::size_t nbytes() const = 0;
};

// Per-forward batch metadata. Sequence s owns token rows [seq_start[s], seq_start[s+1]); its
// tokens sit at consecutive positions ending at context_len[s] - 1. Host arrays are always valid
// (the CPU reads them; GPU backends size launches from them); the d_* tensors mirror them on the
// device (on the CPU they view the same memory).
struct BatchMeta {
  int n_tokens = 0;
  int n_seqs = 0;
  const int32_t* positions = nullptr;    // [n_tokens]
  const int32_t* seq_start = nullptr;    // [n_seqs + 1]
  const int32_t* context_len = nullptr;  // [n_seqs] KV length after this step
  const int32_t* block_table = nullptr;  // [n_seqs, max_blocks] KV block ids, -1 = unused
  const int32_t* state_slot = nullptr;   // [n_seqs] GDN state slot
  int max_blocks = 0;
  int block_size = 0;
  int max_seq_tokens = 0;                // longest token run of one sequence in this batch
  int max_context = 0;                   // largest context_len
  // Speculative verification (state_defer[s] = 1): GDN layers read sequence s's state but leave
  // it as it was, and keep the raw inputs of its tokens (pre-conv [q|k|v], b, a) in the slot's
  // pending rows instead; after acceptance, Kernels::gdn_commit replays the accepted tokens into
  // the live state. nullptr: no sequence defers.
  const int32_t* state_defer = nullptr;  // [n_seqs] host
  // Prefix-cache checkpoints: sequence s saves its GDN state (conv window and recurrent state)
  // after token checkpoint_at[s] of its run (-1: none) into slot checkpoint_slot[s]. A deferred
  // run saves none (gdn_commit does, from the same fields of its batch). nullptr: none this step.
  const int32_t* checkpoint_at = nullptr;    // [n_seqs] host
  const int32_t* checkpoint_slot = nullptr;  // [n_seqs] host
  Tensor d_positions, d_seq_start, d_context_len, d_block_table, d_state_slot, d_state_defer;  // i32 mirrors
  Tensor d_checkpoint_at, d_checkpoint_slot;
};

// KV storage of one attention layer: [n_blocks, block_size, n_kv_heads, head_dim] each, in the
// cache dtype (k.dtype == v.dtype): F32, BF16, F8E4M3 or F8E5M2. Every backend reads and writes
// each of them. Per-layer scales (fp8 caches; 1 otherwise): attention stores a key x as
// convert(x * (1/k_scale)) and reads it back as stored * k_scale (likewise v with v_scale), where
// 1/k_scale is rounded to f32 once. Conversions round to nearest even and saturate at the
// format's largest finite value (core/dtype.h).
struct KvLayerView {
  Tensor k;
  Tensor v;
  float k_scale = 1.f;
  float v_scale = 1.f;
};

// GDN state of one linear-attention layer.
struct StateLayerView {
  Tensor conv;           // [n_slots, conv_dim, K-1]       f32: last K-1 pre-conv inputs, oldest first;
                         //   per slot the backend's layout: CUDA [conv_dim, K-1], CPU [K-1, conv_dim]
  Tensor recurrent;      // [n_slots, Hv, Dv, Dk]          f32 (or bf16); per head the backend's layout:
                         //   CUDA Sᵀ [Dv, Dk] (row j = value dim j), CPU S [Dk, Dv] (row d = key dim d)
  // Speculative verification (BatchMeta::state_defer): raw inputs of a deferred run's tokens,
  // row (slot * pending_depth + j) = token j's [pre-conv q|k|v (conv_dim) | b (Hv) | a (Hv)].
  Tensor pending;        // [n_slots * pending_depth, conv_dim + 2*Hv] f32 (empty without speculation)
  int pending_depth = 0; // tokens of one verification run (1 + drafts) at most
};

struct GdnParams;

// One GDN layer for Kernels::gdn_commit.
struct GdnLayerRef {
  const GdnParams* params = nullptr;
  const StateLayerView* state = nullptr;
};

struct AttentionParams {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int rotary_dim = 0;      // RoPE on the first rotary_dim dims (rotate-half layout)
  float rope_theta = 1e4f;
  bool output_gate = false;  // Qwen3.5: q_proj rows are [q | gate] per head; o *= sigmoid(gate)
  float eps = 1e-6f;
  Tensor q_norm;           // [head_dim] f32
  Tensor k_norm;           // [head_dim] f32
  float scale = 0.f;       // softmax scale (head_dim^-0.5)
  // The matmul that reads this op's output (o_proj): a backend may start moving its weights while
  // the op runs (CUDA, one row: its first bytes into L2). Null: none.
  const LinearWeight* then = nullptr;
};

struct GdnParams {
  int n_k_heads = 0;   // Hk
  int n_v_heads = 0;   // Hv
  int k_head_dim = 0;  // Dk
  int v_head_dim = 0;  // Dv
  int conv_kernel = 0; // K
  float eps = 1e-6f;   // gated RMSNorm eps
  Tensor conv_weight;  // [conv_dim, K] f32
  Tensor neg_exp_a;    // [Hv] f32: -exp(A_log)
  Tensor dt_bias;      // [Hv] f32
  Tensor norm;         // [Dv] f32 (plain weight)
  const LinearWeight* then = nullptr;  // the matmul that reads the output (out_proj), as AttentionParams::then
  int64_t conv_dim() const { return 2LL * n_k_heads * k_head_dim + int64_t(n_v_heads) * v_head_dim; }
  int64_t value_dim() const { return int64_t(n_v_heads) * v_head_dim; }
  // Columns of the fused input projection: [qkv (conv_dim) | z (value_dim) | b (Hv) | a (Hv)].
  int64_t proj_dim() const { return conv_dim() + value_dim() + 2LL * n_v_heads; }
};

class Kernels {
 public:
  virtual ~Kernels() = default;

  // out[t] = table[ids[t] - first_row]. table [V_r, H] bf16/f32 (rows first_row .. first_row + V_r
  // of a vocabulary of `vocab`; vocab 0 = V_r); ids [T] i32; out [T, H]. A vocabulary-parallel
  // shard (tensor parallelism) writes zeros for ids of other ranks' rows; an id outside
  // [0, vocab) is a caller bug.
  virtual void embed(const Tensor& table, const Tensor& ids, Tensor out, int64_t first_row = 0,
                     int64_t vocab = 0) = 0;

  // dst[:, dst_col .. dst_col + width) = src[:, src_col .. src_col + width). src [R, Cs] f32;
  // dst [R, Cd] f32 (one rank's vocabulary-parallel logits into the full rows; a rank's input
  // columns of a row-parallel matmul).
  virtual void copy_columns(const Tensor& src, int64_t src_col, Tensor dst, int64_t dst_col, int64_t width) = 0;

  // dst[r, c] = index[c] >= 0 ? src[r, index[c]] : fill. src [R, M] f32; index [W] i32 (device
  // memory, each entry -1 or < M); dst [R, W] f32. The MTP drafts' logits over a token map
  // (--speculative-token-map) spread into full vocabulary rows, -inf elsewhere.
  virtual void gather_columns(const Tensor& src, const Tensor& index, Tensor dst, float fill) = 0;

  // out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * w. x [R, D]; w [D] f32.
  // out_stride: elements between output rows (0 = D), so two norms can fill halves of one row.
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out,
                        int64_t out_stride = 0) = 0;

  // out (= or +=) x · wᵀ. x [T, K]; out [T, N].
  virtual void matmul(const Tensor& x, const LinearWeight& w, Tensor out, bool accumulate = false) = 0;

  // out = silu(gu[:, :I]) * gu[:, I:]. gu [T, 2I]; out [T, I].
  virtual void silu_mul(const Tensor& gate_up, Tensor out) = 0;

  // A matmul whose input first goes through RMSNorm (x, scratch [T, K]) or SiLU-mul (gate_up
  // [T, 2K], scratch [T, K]): out (=|+=) f(x) · wᵀ. These defaults run f into scratch, then the
  // matmul; a backend may fold f into the matmul instead (CUDA: the 1-row GEMV, where the norm and
  // SiLU-mul kernels would be launches of their own every layer), leaving scratch unwritten.
  virtual void rms_norm_matmul(const Tensor& x, const Tensor& weight, float eps, const LinearWeight& w, Tensor out,
                               bool accumulate, Tensor scratch) {
    rms_norm(x, weight, eps, scratch);
    matmul(scratch, w, out, accumulate);
  }
  virtual void silu_mul_matmul(const Tensor& gate_up, const LinearWeight& w, Tensor out, bool accumulate,
                               Tensor scratch) {
    silu_mul(gate_up, scratch);
    matmul(scratch, w, out, accumulate);
  }

  // A SwiGLU MLP: out (=|+=) silu_mul(rms_norm(x) · gate_upᵀ) · downᵀ. x [T, H]; scratch: normed
  // [T, H], gu [T, 2I], act [T, I]. This default is the two calls above (f32 intermediates); a
  // backend may keep them in a narrower dtype in the same buffers (CUDA, prefill chunks in the bf16
  // mode: gate_up's output and the SiLU-mul in bf16, as vLLM/SGLang keep them).
  virtual void mlp(const Tensor& x, const Tensor& norm, float eps, const LinearWeight& gate_up,
                   const LinearWeight& down, Tensor out, bool accumulate, Tensor normed, Tensor gu, Tensor act) {
    rms_norm_matmul(x, norm, eps, gate_up, gu, false, normed);
    silu_mul_matmul(gu, down, out, accumulate, act);
  }

  // Gated attention core after the fused projection.
  //   qkv [T, n_heads*head_dim*(gate?2:1) + 2*n_kv_heads*head_dim]: [q(+gate) | k | v]
  // Applies q/k norm and partial RoPE, writes k, v into the paged cache at each token's position,
  // attends causally over the sequence's whole context, applies the output gate. out [T, n_heads*head_dim].
  virtual void attention(const AttentionParams& p, const Tensor& qkv, const KvLayerView& kv,
                         const BatchMeta& meta, Tensor out) = 0;

  // Gated DeltaNet core after the fused projection.
  //   proj [T, proj_dim()]: [qkv | z | b | a]. Causal conv (with the slot's conv state), SiLU,
  //   L2-norm q and k, q *= Dk^-0.5, gating, delta-rule recurrence on the slot's state, gated
  //   RMSNorm with silu(z). out [T, value_dim()].
  virtual void gated_delta_net(const GdnParams& p, const Tensor& proj, const StateLayerView& state,
                               const BatchMeta& meta, Tensor out) = 0;

  // out[r] = the first index of the largest value of row r (std::max_element's choice; NaNs are
  // skipped, 0 when a row has no number): greedy sampling on the device. x [R, V] f32; out [R] i32.
  virtual void argmax_rows(const Tensor& x, Tensor out) = 0;

  // One token per row drawn on the device (the engine's steps where every row samples plainly:
  // no logprobs, constraint or speculative verification), so logits never leave the device.
  //   logits [R, V] f32: penalties are applied in place first (entries name distinct (row, token)).
  //   rows [R] SampleRow, penalties [P] PenaltyEntry (device memory; P may be 0); out [R] i32.
  // Semantics (the host Sampler's, engine/sampler.h): s = logit * inv_temperature; keep the top_k
  // highest (ties by lower id), then the shortest prefix (by s descending, ties by id) whose mass
  // reaches top_p of the kept mass, then those with p >= min_p * p_max; draw by inverse CDF in
  // token-id order over the kept set with the uniform u. inv_temperature 0: argmax (lowest id).
  // Every row gets a token, however large its kept set (a flat row's nucleus, top-k in the
  // thousands).
  virtual void sample_rows(Tensor logits, const Tensor& rows, const Tensor& penalties, Tensor out) = 0;

  // dst[i] = src[rows[i]]. src [T, D]; rows [R] i32 (host memory); dst [R, D].
  virtual void gather_rows(const Tensor& src, const int32_t* rows, int n_rows, Tensor dst) = 0;

  // After verification: for every sequence s of `commit` (n_s = seq_start[s+1] - seq_start[s]
  // tokens, slot state_slot[s]), replay the first n_s tokens kept in the slot's pending rows into
  // its live state (conv window and recurrent state) in every layer of `layers`, exactly as a
  // plain run of those tokens would have left it; with checkpoint_at set, the state after that
  // token also goes to checkpoint_slot. Only commit.n_seqs, seq_start, state_slot and the
  // checkpoint fields (host and device) are read. One call per step for all GDN layers (on CUDA: two launches).
  virtual void gdn_commit(std::span<const GdnLayerRef> layers, const BatchMeta& commit) = 0;
};

}  // namespace deltaserve
