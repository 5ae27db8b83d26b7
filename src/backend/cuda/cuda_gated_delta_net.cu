// Gated DeltaNet on CUDA. Reference: backend/cpu/cpu_gated_delta_net.cpp (same formulas, f32).
//
//   1. conv:   a thread per (channel, run of tokens): causal depthwise conv over the inputs (the slot's
//              conv state before the run), SiLU -> conv_out [T, conv_dim]; then one thread per
//              (sequence, channel) moves the last K-1 inputs into the state (a deferred
//              verification run keeps its inputs in the pending rows instead).
//   2. prep:   per token: L2-normalise q (times Dk^-0.5) and k in place in conv_out; beta = sigmoid(b)
//              and decay = exp(-exp(A_log) * softplus(a + dt_bias)) per value head -> gb.
//   3. delta:  S *= decay; δ = (v - S·k)·beta; S += δ k; o = S·q per token, in order, per
//              (sequence, value head, row jv of Sᵀ). Long runs (prefill): one thread owns a row
//              (Dk floats in registers). Decode/verification: a row is spread over Dk/4 lanes
//              (coalesced state traffic). Writes o (pre-norm) into out; a deferred run does not
//              store its state.
//              Long runs with Dk == Dv in {64, 128}: the chunked rule on tensor cores instead
//              (cuda_gdn_chunked_mma.cu), o in conv_out's value columns.
//   4. norm:   gated RMSNorm over Dv with silu(z) into out.
//
// Decode (one token per sequence, nothing deferred): steps 1-4 for a value head in one block
// (gdn_decode_kernel), one launch per layer.
//
// Commit (speculative rollback): gdn_commit_kernel replays a sequence's accepted tokens from its
// pending rows with the same arithmetic (conv, prep, rows-over-lanes recurrence), for all layers
// in one launch; gdn_commit_window_kernel then moves the conv windows.
#include <atomic>
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_gdn.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_launch.h"

namespace deltaserve::cuda {

namespace {

constexpr int kMaxConv = 8;

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Rows of Sᵀ spread over lanes (rows_kernel, decode, commit): LPR lanes hold a row, C pieces of 4
// floats each (piece c of lane li: columns 4 * (li + c * LPR)); a dot product with a row is the sum
// over its lanes. A piece's products sum in one fma chain and a lane's pieces add before the lanes'
// butterfly, so C = 2 over LPR lanes gives the bits of C = 1 over 2 * LPR lanes: that butterfly's
// first step adds the same two pieces.
template <int LPR>
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int o = LPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float dot4(float4 s, float4 k) {
  return fmaf(s.w, k.w, fmaf(s.z, k.z, fmaf(s.y, k.y, s.x * k.x)));
}
template <int C>
__device__ __forceinline__ float lane_dot(const float4 (&S)[C], const float4 (&k)[C]) {
  float p = dot4(S[0], k[0]);
#pragma unroll
  for (int c = 1; c < C; ++c) p += dot4(S[c], k[c]);
  return p;
}

// One token over NR such rows: S *= decay; δ = (v - S·k)·β; S += δ k.
template <int LPR, int NR, int C>
__device__ __forceinline__ void delta_update(float4 (&S)[NR][C], const float (&v)[NR], const float4 (&k)[C],
                                             float beta, float decay) {
  float p[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      S[r][c].x *= decay; S[r][c].y *= decay; S[r][c].z *= decay; S[r][c].w *= decay;
    }
    p[r] = lane_dot<C>(S[r], k);
  }
#pragma unroll
  for (int r = 0; r < NR; ++r) p[r] = row_sum<LPR>(p[r]);
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    const float delta = (v[r] - p[r]) * beta;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      S[r][c].x = fmaf(delta, k[c].x, S[r][c].x); S[r][c].y = fmaf(delta, k[c].y, S[r][c].y);
      S[r][c].z = fmaf(delta, k[c].z, S[r][c].z); S[r][c].w = fmaf(delta, k[c].w, S[r][c].w);
    }
  }
}

// The same, then the token's output o = S·q per row (summed over the row's lanes).
template <int LPR, int NR, int C>
__device__ __forceinline__ void delta_token(float4 (&S)[NR][C], const float (&v)[NR], const float4 (&q)[C],
                                            const float4 (&k)[C], float beta, float decay, float (&o)[NR]) {
  delta_update<LPR, NR, C>(S, v, k, beta, decay);
#pragma unroll
  for (int r = 0; r < NR; ++r) o[r] = row_sum<LPR>(lane_dot<C>(S[r], q));
}

// Sequence of token t (seq_start is sorted; n_seqs is small).
__device__ __forceinline__ int seq_of(const GdnArgs& a, int t) {
  int lo = 0, hi = a.n_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (a.seq_start[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Pre-conv input jj of sequence s (local index; negative = from the slot's conv state, which
// holds the last K-1 inputs before this run, oldest first).
__device__ __forceinline__ float conv_input(const GdnArgs& a, const float* st, int t0, int jj, int64_t c, int64_t row) {
  return jj >= 0 ? a.proj[int64_t(t0 + jj) * row + c] : st[a.K - 1 + jj];
}

// A thread per channel c (blockIdx.x, threadIdx.x) and run of tt consecutive tokens (blockIdx.y):
// the causal conv needs only inputs, so tokens are independent; the weights stay in registers and
// the sequence of each token follows from the previous one. A checkpoint token also saves the
// window after it.
__global__ void conv_tokens_kernel(GdnArgs a, int64_t conv_dim, int64_t row, int tt) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= conv_dim) return;
  const int K = a.K, Km1 = K - 1;
  float w[kMaxConv];
#pragma unroll
  for (int q = 0; q < kMaxConv; ++q) w[q] = q < K ? a.conv_weight[c * K + q] : 0.f;
  const int t_begin = blockIdx.y * tt, t_end = min(t_begin + tt, a.n_tokens);
  if (t_begin >= t_end) return;
  int s = seq_of(a, t_begin);
  int t0 = a.seq_start[s];
  const float* st = a.conv_state + (int64_t(a.state_slot[s]) * conv_dim + c) * Km1;
  for (int t = t_begin; t < t_end; ++t) {
    while (t >= a.seq_start[s + 1]) {  // the next (non-empty) sequence
      ++s;
      t0 = a.seq_start[s];
      st = a.conv_state + (int64_t(a.state_slot[s]) * conv_dim + c) * Km1;
    }
    const int j = t - t0;
    float acc = 0.f;
#pragma unroll
    for (int q = 0; q < kMaxConv; ++q)
      if (q < K) acc += w[q] * conv_input(a, st, t0, j - Km1 + q, c, row);
    a.conv_out[int64_t(t) * conv_dim + c] = silu(acc);
    if (a.ckpt_at && a.ckpt_at[s] == j && !gdn_deferred(a, s)) {  // the window after token j
      float* ck = a.conv_state + (int64_t(a.ckpt_slot[s]) * conv_dim + c) * Km1;
      for (int q = 0; q < Km1; ++q) ck[q] = conv_input(a, st, t0, j - Km1 + 1 + q, c, row);
    }
  }
}

// One thread per (sequence, channel), after conv_tokens_kernel: the conv state becomes the last
// K-1 inputs of the run.
__global__ void conv_state_kernel(GdnArgs a, int64_t conv_dim, int64_t row) {
  pdl_wait();  // launched by PDL in a chain (GdnArgs::pdl_chain)
  pdl_trigger();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= int64_t(a.n_seqs) * conv_dim) return;
  const int s = static_cast<int>(i / conv_dim);
  const int64_t c = i - int64_t(s) * conv_dim;
  const int t0 = a.seq_start[s], n = a.seq_start[s + 1] - t0;
  const int Km1 = a.K - 1;
  if (gdn_deferred(a, s)) {  // keep the raw inputs; the window stays as it was
    float* pend = a.pending + int64_t(a.state_slot[s]) * a.pending_depth * (conv_dim + 2 * a.Hv);
    for (int j = 0; j < n; ++j) pend[int64_t(j) * (conv_dim + 2 * a.Hv) + c] = a.proj[int64_t(t0 + j) * row + c];
    return;
  }
  float* st = a.conv_state + (int64_t(a.state_slot[s]) * conv_dim + c) * Km1;
  float win[kMaxConv];
#pragma unroll
  for (int q = 0; q < kMaxConv; ++q)
    if (q < Km1) win[q] = conv_input(a, st, t0, n - Km1 + q, c, row);
#pragma unroll
  for (int q = 0; q < kMaxConv; ++q)
    if (q < Km1) st[q] = win[q];
}

__global__ void prep_kernel(GdnArgs a, int64_t conv_dim, int64_t row) {
  pdl_wait();  // launched by PDL in a chain (GdnArgs::pdl_chain)
  pdl_trigger();
  const int t = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  const int Hk = a.Hk, Dk = a.Dk;
  const int64_t key_dim = int64_t(Hk) * Dk;
  float* c = a.conv_out + int64_t(t) * conv_dim;
  const float q_scale = 1.0f / sqrtf(float(Dk));
  for (int item = warp; item < 2 * Hk; item += nw) {
    const bool is_q = item < Hk;
    float* v = c + (is_q ? int64_t(item) * Dk : key_dim + int64_t(item - Hk) * Dk);
    float ss = 0.f;
    for (int d = lane; d < Dk; d += 32) ss += v[d] * v[d];
    ss = warp_sum(ss);
    const float n = (is_q ? q_scale : 1.0f) / sqrtf(ss + 1e-6f);
    for (int d = lane; d < Dk; d += 32) v[d] *= n;
  }
  const float* pr = a.proj + int64_t(t) * row;
  const int64_t value_dim = int64_t(a.Hv) * a.Dv;
  float* pend = nullptr;  // a deferred run's pending row for this token (b, a after conv_dim)
  if (a.defer) {
    const int s = seq_of(a, t);
    if (a.defer[s])
      pend = a.pending + (int64_t(a.state_slot[s]) * a.pending_depth + (t - a.seq_start[s])) * (conv_dim + 2 * a.Hv) +
             conv_dim;
  }
  for (int hv = threadIdx.x; hv < a.Hv; hv += blockDim.x) {
    if (pend) {
      pend[hv] = pr[conv_dim + value_dim + hv];
      pend[a.Hv + hv] = pr[conv_dim + value_dim + a.Hv + hv];
    }
    const float b = pr[conv_dim + value_dim + hv];
    const float x = pr[conv_dim + value_dim + a.Hv + hv] + a.dt_bias[hv];
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    a.gb[(int64_t(t) * a.Hv + hv) * 2 + 0] = 1.0f / (1.0f + expf(-b));
    a.gb[(int64_t(t) * a.Hv + hv) * 2 + 1] = expf(a.neg_exp_a[hv] * sp);
  }
}

template <int DK>
__global__ void __launch_bounds__(32) delta_kernel(GdnArgs a, int64_t conv_dim) {
  const int s = blockIdx.x / a.Hv, hv = blockIdx.x % a.Hv;
  const int jv = blockIdx.y * blockDim.x + threadIdx.x;  // blockDim.x divides Dv (no idle rows)
  const int hk = hv / (a.Hv / a.Hk);
  const int Dv = a.Dv;
  const int64_t key_dim = int64_t(a.Hk) * DK, value_dim = int64_t(a.Hv) * Dv;
  const int32_t slot = a.state_slot[s];
  const int64_t head_state = int64_t(Dv) * DK;
  const int64_t Srow = state_head(slot, a.Hv, hv, head_state) + int64_t(jv) * DK;  // element offset
  float S[DK];
#pragma unroll
  for (int d = 0; d < DK; d += 4) {
    const float4 v = load_state4(a.rec_state, a.rec_bf16, Srow + d);
    S[d] = v.x; S[d + 1] = v.y; S[d + 2] = v.z; S[d + 3] = v.w;
  }
  // q and k of the current token, staged in shared memory: reading them from global memory inside
  // the unrolled loops let the compiler hoist all the loads and spill the state row.
  __shared__ float4 q4[DK / 4], k4[DK / 4];
  const int t0 = a.seq_start[s], t1 = a.seq_start[s + 1];
  const int ck_j = gdn_checkpoint(a, s);
  for (int t = t0; t < t1; ++t) {
    const float* c = a.conv_out + int64_t(t) * conv_dim;
    __syncthreads();  // previous token's q/k consumed
    for (int i = threadIdx.x; i < DK / 4; i += blockDim.x) {
      q4[i] = reinterpret_cast<const float4*>(c + int64_t(hk) * DK)[i];
      k4[i] = reinterpret_cast<const float4*>(c + key_dim + int64_t(hk) * DK)[i];
    }
    __syncthreads();
    const float v = c[2 * key_dim + int64_t(hv) * Dv + jv];
    const float beta = a.gb[(int64_t(t) * a.Hv + hv) * 2 + 0];
    const float decay = a.gb[(int64_t(t) * a.Hv + hv) * 2 + 1];
    float p0 = 0.f, p1 = 0.f, p2 = 0.f, p3 = 0.f;
#pragma unroll
    for (int d = 0; d < DK; d += 4) {
      if (d % 32 == 0) asm volatile("" ::: "memory");  // bound load hoisting (register pressure)
      const float4 k = k4[d / 4];
      S[d] *= decay; S[d + 1] *= decay; S[d + 2] *= decay; S[d + 3] *= decay;
      p0 = fmaf(S[d], k.x, p0); p1 = fmaf(S[d + 1], k.y, p1);
      p2 = fmaf(S[d + 2], k.z, p2); p3 = fmaf(S[d + 3], k.w, p3);
    }
    const float delta = (v - ((p0 + p1) + (p2 + p3))) * beta;
    p0 = p1 = p2 = p3 = 0.f;
#pragma unroll
    for (int d = 0; d < DK; d += 4) {
      if (d % 32 == 0) asm volatile("" ::: "memory");
      const float4 k = k4[d / 4];
      const float4 q = q4[d / 4];
      S[d] = fmaf(delta, k.x, S[d]); S[d + 1] = fmaf(delta, k.y, S[d + 1]);
      S[d + 2] = fmaf(delta, k.z, S[d + 2]); S[d + 3] = fmaf(delta, k.w, S[d + 3]);
      p0 = fmaf(S[d], q.x, p0); p1 = fmaf(S[d + 1], q.y, p1);
      p2 = fmaf(S[d + 2], q.z, p2); p3 = fmaf(S[d + 3], q.w, p3);
    }
    a.out[int64_t(t) * value_dim + int64_t(hv) * Dv + jv] = (p0 + p1) + (p2 + p3);
    if (t - t0 == ck_j) {
      const int64_t ck = state_head(a.ckpt_slot[s], a.Hv, hv, head_state) + int64_t(jv) * DK;
#pragma unroll
      for (int d = 0; d < DK; d += 4)
        store_state4(a.rec_state, a.rec_bf16, ck + d, make_float4(S[d], S[d + 1], S[d + 2], S[d + 3]));
    }
  }
  if (gdn_deferred(a, s)) return;
#pragma unroll
  for (int d = 0; d < DK; d += 4)
    store_state4(a.rec_state, a.rec_bf16, Srow + d, make_float4(S[d], S[d + 1], S[d + 2], S[d + 3]));
}

// Decode and verification (a few tokens per sequence): the same recurrence with rows spread
// over lanes, so the state streams through coalesced 16-byte loads. LPR = DK/4 lanes hold one
// row of Sᵀ (4 floats each); a warp holds NR rows per group of lanes; dot products are sums over
// the LPR lanes of a row. The thread-per-row kernel above reads each row as one thread's 512 bytes
// (uncoalesced) and is kept for long runs of tokens, where its serial loop wins.
template <int DK, int NR>
__global__ void __launch_bounds__(128) delta_rows_kernel(GdnArgs a, int64_t conv_dim) {
  constexpr int LPR = DK / 4;              // lanes per row
  constexpr int RPW = 32 / LPR;            // rows per warp per register slot
  constexpr int ROWS_PER_WARP = RPW * NR;
  const int s = blockIdx.x / a.Hv, hv = blockIdx.x % a.Hv;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int sub = lane / LPR, li = lane % LPR;
  const int hk = hv / (a.Hv / a.Hk);
  const int Dv = a.Dv;
  const int64_t key_dim = int64_t(a.Hk) * DK, value_dim = int64_t(a.Hv) * Dv;
  const int32_t slot = a.state_slot[s];
  const int64_t head_state = int64_t(Dv) * DK;
  const int row0 = (blockIdx.y * (blockDim.x >> 5) + warp) * ROWS_PER_WARP;
  const int64_t Shead = state_head(slot, a.Hv, hv, head_state);  // element offset
  int jv[NR];
  bool ok[NR];
  float4 S[NR][1];
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    jv[r] = row0 + r * RPW + sub;
    ok[r] = jv[r] < Dv;
    S[r][0] = ok[r] ? load_state4(a.rec_state, a.rec_bf16, Shead + int64_t(jv[r]) * DK + 4 * li)
                 : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  // The state loads above go before the wait: no kernel of this layer's op writes the recurrent
  // state before this one (conv, window and prep write conv_out, gb, windows and pending rows),
  // and the step's metadata was uploaded before it; all else is read after.
  pdl_wait();  // cuda_pdl.cuh: a small kernel waits, then lets the next one launch
  pdl_trigger();
  const int t0 = a.seq_start[s], t1 = a.seq_start[s + 1];
  const int ck_j = gdn_checkpoint(a, s);
  // Token t's inputs are loaded while token t-1 is computed: a run of prefill tokens is a serial
  // chain, and without the prefetch each step waits for its loads (~2 L2 round trips).
  struct In {
    float4 q[1], k[1];
    float beta, decay;
    float v[NR];
  };
  auto load = [&](int t) {
    In in;
    const float* c = a.conv_out + int64_t(t) * conv_dim;
    in.q[0] = reinterpret_cast<const float4*>(c + int64_t(hk) * DK)[li];
    in.k[0] = reinterpret_cast<const float4*>(c + key_dim + int64_t(hk) * DK)[li];
    in.beta = a.gb[(int64_t(t) * a.Hv + hv) * 2 + 0];
    in.decay = a.gb[(int64_t(t) * a.Hv + hv) * 2 + 1];
#pragma unroll
    for (int r = 0; r < NR; ++r) in.v[r] = ok[r] ? c[2 * key_dim + int64_t(hv) * Dv + jv[r]] : 0.f;
    return in;
  };
  In next = load(t0 < t1 ? t0 : 0);
  for (int t = t0; t < t1; ++t) {
    const In cur = next;
    if (t + 1 < t1) next = load(t + 1);
    float p[NR];
    delta_token<LPR, NR, 1>(S, cur.v, cur.q, cur.k, cur.beta, cur.decay, p);
#pragma unroll
    for (int r = 0; r < NR; ++r)
      if (ok[r] && li == 0) a.out[int64_t(t) * value_dim + int64_t(hv) * Dv + jv[r]] = p[r];
    if (t - t0 == ck_j) {
      const int64_t ck = state_head(a.ckpt_slot[s], a.Hv, hv, head_state);
#pragma unroll
      for (int r = 0; r < NR; ++r)
        if (ok[r]) store_state4(a.rec_state, a.rec_bf16, ck + int64_t(jv[r]) * DK + 4 * li, S[r][0]);
    }
  }
  if (gdn_deferred(a, s)) return;
#pragma unroll
  for (int r = 0; r < NR; ++r)
    if (ok[r]) store_state4(a.rec_state, a.rec_bf16, Shead + int64_t(jv[r]) * DK + 4 * li, S[r][0]);
}

// Decode (one token per sequence, nothing deferred): a whole GDN layer in one launch. Block
// (sequence s, value head hv) does what conv_tokens_kernel, conv_state_kernel, prep_kernel,
// delta_rows_kernel and gated_norm_kernel do for that head, in their arithmetic order (bit-equal
// results): the conv of q and k (key head hk) and of the head's Dv value channels over the slot's
// window and the token, SiLU, the L2 norms and gates; the recurrence with rows over lanes (NR rows
// per group of DK/(4C) lanes, C pieces of 4 floats a lane, the warps walking the head's row groups;
// any C gives the same bits, see row_sum); the gated RMSNorm.
// Clusters (GdnArgs::decode_cluster = CL > 1, sm_90): CL blocks share a head, each taking Dv / CL
// of its rows (their value channels, recurrence and outputs; each convolves q and k itself); the
// gated norm's sum of squares reads the other blocks' rows of o from their shared memory, in the
// one-block order. At batch 1 a block per head leaves 84 of the H200's 132 SMs idle and moves a
// head's whole state through one SM.
// Windows: a value channel belongs to one block, which moves its window. q and k are read by the
// Hv/Hk x CL blocks of a key head; the last of them to finish reading (head_count, reset by it)
// moves their windows. Before pdl_wait it reads only what no kernel of this step writes before it:
// the slot of s (uploaded before the step), the conv weights and windows, the gates' constants,
// the norm weight, and the first row group of the state (written by this layer's own kernel of an
// earlier step, by a commit or a slot copy, never by the GEMV just before it), so their latency
// hides behind that GEMV's tail; after it, only the projection row (which that GEMV wrote).
template <int DK, int NR, int C>
__global__ void __launch_bounds__(1024) gdn_decode_kernel(GdnArgs a, int64_t conv_dim, int64_t row) {
  constexpr int LPR = DK / (4 * C), RPW = 32 / LPR, ROWS_PER_WARP = RPW * NR;
  extern __shared__ __align__(16) float dsm[];
  // GdnArgs::decode_stage (resolved by the launcher: 1 or 0): the block's rows of the state in
  // shared memory first ([RB, DK] in the state's dtype, RB = Dv / CL as below; one bulk copy issued
  // before the PDL wait, sm_90), so that all of them are in flight at once, not a group a warp; the
  // recurrence then reads them from there. (Computed here from a.Dv / a.decode_cluster rather than
  // from RB: the order ptxas sees moves spills between the layouts, untimed; RESULTS, stop 44.)
  const bool stage = a.decode_stage;
  const int stage_floats = stage ? a.Dv / a.decode_cluster * DK / (a.rec_bf16 ? 2 : 1) : 0;
  float* qk_s = dsm + stage_floats;  // [2*DK]: q | k after conv, SiLU and norm
  float* v_s = qk_s + 2 * DK;     // [Dv]: v after conv and SiLU
  float* o_s = v_s + a.Dv;        // [Dv]: the recurrence's output (pre-norm)
  __shared__ float gate_s[2];     // beta, decay
  __shared__ float inv_s;
  __shared__ int last_s;
  __shared__ uint64_t stage_bar;
  // A cluster of CL = a.decode_cluster blocks per (sequence, value head) (sm_90): block rank c owns
  // the head's value rows [row0, row0 + RB).
  const int CL = a.decode_cluster, head = blockIdx.x / CL, c_rank = blockIdx.x % CL;
  const int s = head / a.Hv, hv = head % a.Hv;
  const int r = a.Hv / a.Hk, hk = hv / r;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
  const int sub = lane / LPR, li = lane % LPR;
  const int Dv = a.Dv, K = a.K, Km1 = K - 1;
  const int RB = Dv / CL, row0 = c_rank * RB;
  const int64_t key_dim = int64_t(a.Hk) * DK, value_dim = int64_t(a.Hv) * Dv;
  const int32_t slot = a.state_slot[s];
  const int64_t head_state = int64_t(Dv) * DK;
  const int64_t Shead = state_head(slot, a.Hv, hv, head_state);  // element offset
  const int n_groups = (RB + ROWS_PER_WARP - 1) / ROWS_PER_WARP;
  int jv[NR];
  bool ok[NR];
  float4 S[NR][C];
  auto load_group = [&](int g) {  // from the state, or its staged rows
#pragma unroll
    for (int q = 0; q < NR; ++q) {
      jv[q] = row0 + g * ROWS_PER_WARP + q * RPW + sub;
      ok[q] = jv[q] < row0 + RB;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int64_t e = int64_t(jv[q]) * DK + 4 * (li + c * LPR);
        S[q][c] = !ok[q] ? make_float4(0.f, 0.f, 0.f, 0.f)
                  : stage ? load_state4(dsm, a.rec_bf16, e - int64_t(row0) * DK)
                          : load_state4(a.rec_state, a.rec_bf16, Shead + e);
      }
    }
  };
  if (a.l2_next != nullptr && a.positions[a.seq_start[s]] < a.l2_next_max_keys)
    l2_prefetch_share(a.l2_next, a.l2_next_bytes);
  if (stage) {
    if (threadIdx.x == 0) {
      const int elem = a.rec_bf16 ? 2 : 4;
      bulk_copy_start(dsm, static_cast<const char*>(a.rec_state) + (Shead + int64_t(row0) * DK) * elem,
                      static_cast<uint32_t>(int64_t(RB) * DK * elem), &stage_bar);
    }
  } else if (warp < n_groups) {
    load_group(warp);
  }
  // Also before the wait: this thread's first channel (i = threadIdx.x) of the conv, its window and
  // weights; the gates' constants; the norm weight of output dim threadIdx.x. After the wait the
  // block reads only the projection row (in L2: the GEMV before just wrote it).
  // Channel i of this block: q, k of key head hk, then the value channels of its rows of head hv.
  auto channel = [&](int i) -> int64_t {
    return i < DK ? int64_t(hk) * DK + i : i < 2 * DK ? key_dim + int64_t(hk) * DK + (i - DK)
                                                      : 2 * key_dim + int64_t(hv) * Dv + row0 + (i - 2 * DK);
  };
  // (Convs of up to kPreConv taps; longer ones load it all after the wait.)
  constexpr int kPreConv = 4;
  const int n_ch = 2 * DK + RB;
  const bool pre = K <= kPreConv;
  const int i0 = pre ? int(threadIdx.x) : n_ch;  // the first channel taken before the wait, if any
  const bool has0 = i0 < n_ch;
  const int64_t c0 = has0 ? channel(i0) : 0;
  const bool ckpt = a.ckpt_at && a.ckpt_at[s] == 0;
  const float* st0 = a.conv_state + (int64_t(slot) * conv_dim + c0) * Km1;
  float win0[kPreConv], cw0[kPreConv];
#pragma unroll
  for (int q = 0; q < kPreConv; ++q) {
    win0[q] = has0 && q < Km1 ? st0[q] : 0.f;
    cw0[q] = has0 && q < K ? a.conv_weight[c0 * K + q] : 0.f;
  }
  const bool gate_thread = threadIdx.x == blockDim.x - 1;
  const float dt_bias = gate_thread ? a.dt_bias[hv] : 0.f, neg_exp_a = gate_thread ? a.neg_exp_a[hv] : 0.f;
  const int d0 = row0 + threadIdx.x;  // this thread's output dim
  const bool has_d = int(threadIdx.x) < RB;
  const float norm_d = has_d ? a.norm[d0] : 0.f;
  pdl_wait();  // cuda_pdl.cuh: a small kernel waits, then lets the next one launch
  pdl_trigger();
  const int t = a.seq_start[s];
  const float* pr = a.proj + int64_t(t) * row;
  const float x0 = has0 ? pr[c0] : 0.f;
  const float z_d = has_d ? pr[conv_dim + int64_t(hv) * Dv + d0] : 0.f;
  // 1. Conv + SiLU (conv_prep's order); the value channels' windows move here.
  auto conv_out = [&](int i, const auto& win, const auto& cw, float x) {  // win, cw: float[N]
    constexpr int N = sizeof(win) / sizeof(float);
    float acc = 0.f;
#pragma unroll
    for (int q = 0; q < N; ++q) {  // the window's taps, then the token's (tap Km1)
      if (q < Km1) acc += cw[q] * win[q];
      else if (q == Km1) acc += cw[q] * x;
    }
    if (i < 2 * DK) qk_s[i] = silu(acc);
    else v_s[row0 + i - 2 * DK] = silu(acc);
  };
  // The window after the token: into the slot (and the checkpoint slot).
  auto move_window = [&](int64_t c, const auto& win, float x) {  // win: float[N]
    constexpr int N = sizeof(win) / sizeof(float);
    float* st = a.conv_state + (int64_t(slot) * conv_dim + c) * Km1;
    float* ck = ckpt ? a.conv_state + (int64_t(a.ckpt_slot[s]) * conv_dim + c) * Km1 : nullptr;
#pragma unroll
    for (int q = 0; q < N; ++q) {
      if (q < Km1) {
        const float v = q + 1 < Km1 ? win[q + 1] : x;
        st[q] = v;
        if (ck) ck[q] = v;
      }
    }
  };
  if (has0) {
    conv_out(i0, win0, cw0, x0);
    if (i0 >= 2 * DK) move_window(c0, win0, x0);
  }
  for (int i = pre ? i0 + blockDim.x : threadIdx.x; i < n_ch; i += blockDim.x) {  // the rest, if any
    const int64_t c = channel(i);
    const float* st = a.conv_state + (int64_t(slot) * conv_dim + c) * Km1;
    float win[kMaxConv], cw[kMaxConv];
#pragma unroll
    for (int q = 0; q < kMaxConv; ++q) {
      win[q] = q < Km1 ? st[q] : 0.f;
      cw[q] = q < K ? a.conv_weight[c * K + q] : 0.f;
    }
    const float x = pr[c];
    conv_out(i, win, cw, x);
    if (i >= 2 * DK) move_window(c, win, x);
  }
  if (gate_thread) {  // the gates of head hv (prep_kernel's arithmetic)
    const float b = pr[conv_dim + value_dim + hv];
    const float x = pr[conv_dim + value_dim + a.Hv + hv] + dt_bias;
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    gate_s[0] = 1.0f / (1.0f + expf(-b));
    gate_s[1] = expf(neg_exp_a * sp);
  }
  __syncthreads();  // every q/k window of this block read
  // The Hv/Hk x CL blocks of key head hk count themselves past reading its q/k windows; the result
  // is used at the end, so the atomic's latency overlaps the rest of the kernel.
  const int readers = r * CL;
  int* cnt = readers > 1 ? a.head_count + int64_t(s) * a.Hk + hk : nullptr;
  int before = 0;
  if (readers > 1 && threadIdx.x == 0) before = atomicAdd(cnt, 1);
  // 2. L2 norms of q and k (prep_kernel's order: a warp per vector).
  for (int item = warp; item < 2; item += n_warps) {
    float* v = qk_s + item * DK;
    float ss = 0.f;
    for (int d = lane; d < DK; d += 32) ss += v[d] * v[d];
    ss = warp_sum(ss);
    const float n = (item == 0 ? 1.0f / sqrtf(float(DK)) : 1.0f) / sqrtf(ss + 1e-6f);
    for (int d = lane; d < DK; d += 32) v[d] *= n;
  }
  __syncthreads();
  // 3. The recurrence (delta_rows_kernel's arithmetic for one token).
  float4 q4[C], k4[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    q4[c] = reinterpret_cast<const float4*>(qk_s)[li + c * LPR];
    k4[c] = reinterpret_cast<const float4*>(qk_s + DK)[li + c * LPR];
  }
  const float beta = gate_s[0], decay = gate_s[1];
  const int64_t ckS = ckpt ? state_head(a.ckpt_slot[s], a.Hv, hv, head_state) : -1;
  if (stage && warp < n_groups) bulk_copy_wait(&stage_bar);  // (the __syncthreads above follow its start)
  for (int g = warp; g < n_groups; g += n_warps) {
    if (stage || g != warp) load_group(g);
    float v[NR], p[NR];
#pragma unroll
    for (int q = 0; q < NR; ++q) v[q] = ok[q] ? v_s[jv[q]] : 0.f;
    delta_token<LPR, NR, C>(S, v, q4, k4, beta, decay, p);
#pragma unroll
    for (int q = 0; q < NR; ++q) {
      if (ok[q] && li == 0) o_s[jv[q]] = p[q];
      if (ok[q]) {
#pragma unroll
        for (int c = 0; c < C; ++c)
          store_state4(a.rec_state, a.rec_bf16, Shead + int64_t(jv[q]) * DK + 4 * (li + c * LPR), S[q][c]);
        if (ckS >= 0) {
#pragma unroll
          for (int c = 0; c < C; ++c)
            store_state4(a.rec_state, a.rec_bf16, ckS + int64_t(jv[q]) * DK + 4 * (li + c * LPR), S[q][c]);
        }
      }
    }
  }
  __syncthreads();
  auto move_qk_windows = [&] {  // the last reader of key head hk's windows moves them
    if (has0 && i0 < 2 * DK) move_window(c0, win0, x0);  // the window read before the wait
    for (int i = pre ? i0 + blockDim.x : threadIdx.x; i < 2 * DK; i += blockDim.x) {
      const int64_t c = channel(i);
      const float* st = a.conv_state + (int64_t(slot) * conv_dim + c) * Km1;
      float win[kMaxConv];
#pragma unroll
      for (int q = 0; q < kMaxConv; ++q) win[q] = q < Km1 ? st[q] : 0.f;
      move_window(c, win, pr[c]);
    }
  };
  // 4. Gated RMSNorm (gated_norm_kernel's order; a cluster's blocks read each other's rows of o
  // from shared memory), then the q/k windows if this block is the last reader.
  if (CL > 1) cluster_sync();  // every block's rows of o written
  if (warp == 0) {
    float ss = 0.f;
    for (int d = lane; d < Dv; d += 32) {
      const float v = CL > 1 ? ld_cluster_f32(o_s + d, d / RB) : o_s[d];
      ss += v * v;
    }
    ss = warp_sum(ss);
    if (lane == 0) inv_s = 1.0f / sqrtf(ss / float(Dv) + a.eps);
  }
  if (threadIdx.x == 0) {
    const bool last = readers == 1 || before == readers - 1;
    if (last && readers > 1) *cnt = 0;
    last_s = last;
  }
  __syncthreads();
  if (CL > 1) cluster_arrive();  // done reading the others' shared memory
  const float inv = inv_s;
  const float* z = pr + conv_dim + int64_t(hv) * Dv;
  float* o = a.out + int64_t(t) * value_dim + int64_t(hv) * Dv;
  if (has_d) o[d0] = o_s[d0] * inv * norm_d * silu(z_d);
  for (int d = d0 + blockDim.x; d < row0 + RB; d += blockDim.x) o[d] = o_s[d] * inv * a.norm[d] * silu(z[d]);
  if (last_s) move_qk_windows();
  if (CL > 1) cluster_wait();  // the others are done reading this block's shared memory
}

// ---- chunked delta rule (prefill) ------------------------------------------------------------
// The same recurrence over chunks of kChunk tokens (the WY / UT form; f32 on CUDA cores). Within a
// chunk, with g_i the decays, gamma_i = g_1 ... g_i (from cumulative log decays), Gam_ij =
// gamma_i / gamma_j, and S0 the state before the chunk (rows = value dims):
//   u_i = beta_i (v_i - g_i S_{i-1} k_i)  =>  (I + A) U = R,  A_ij = beta_i (k_i.k_j) Gam_ij (j < i),
//   R_i = beta_i (v_i - gamma_i S0 k_i);  U = T R with T = (I + A)^-1 (unit lower triangular),
//   o_i = gamma_i S0 q_i + sum_{j<=i} (q_i.k_j) Gam_ij u_j,
//   S_end = gamma_L S0 + sum_j (gamma_L / gamma_j) u_j k_j^T.
// The sequential kernels take one dependent step per token over a state row; here the serial
// chain is one step per chunk and each step is small matrix products in shared memory. A block
// owns (sequence, value head, 32 value dims): the rows of S it updates are its own; the K-only
// parts (A, T, the masked Q K^T) are recomputed by each of a head's Dv / 32 blocks. A chunk ends
// early at a prefix-cache checkpoint so that the state after that token exists.
constexpr int kChunk = kGdnChunk;
constexpr int kDvb = 32;    // value dims per block

template <int DK>
constexpr std::size_t chunked_smem_bytes() {
  // Q, K [C][DK+4] | S [DVB][DK+4] | V [C][DVB] | A, T, M, X(R), Y, U [C][C+1] | gamma, beta, kscale, log gamma [C]
  return (std::size_t(2) * kChunk * (DK + 4) + std::size_t(kDvb) * (DK + 4) + std::size_t(kChunk) * kDvb +
          std::size_t(6) * kChunk * (kChunk + 1) + 4 * kChunk) * 4;
}

template <int DK>
__global__ void __launch_bounds__(128, 2) delta_chunked_kernel(GdnArgs a, int64_t conv_dim) {
  constexpr int C = kChunk, DV = kDvb, LDK = DK + 4, LDC = C + 1;
  static_assert(C == 32 && DV == 32, "thread mappings assume 32 x 32 tiles and 128 threads");
  extern __shared__ __align__(16) float sm[];
  float* Qs = sm;                   // [C][LDK]
  float* Ks = Qs + C * LDK;         // [C][LDK]
  float* Ss = Ks + C * LDK;         // [DV][LDK]: this block's rows of the state
  float* Vs = Ss + DV * LDK;        // [C][DV]
  float* Am = Vs + C * DV;          // [C][LDC]: A (strictly lower)
  float* Tm = Am + C * LDC;         // [C][LDC]: T = (I + A)^-1
  float* Mm = Tm + C * LDC;         // [C][LDC]: (q_i.k_j) Gam_ij, j <= i
  float* Xs = Mm + C * LDC;         // [C][LDC]: K S0^T, then R
  float* Ys = Xs + C * LDC;         // [C][LDC]: Q S0^T, then gamma_i Q S0^T
  float* Us = Ys + C * LDC;         // [C][LDC]: U
  float* gam = Us + C * LDC;        // [C]: gamma_i
  float* bet = gam + C;             // [C]: beta_i
  float* ksc = bet + C;             // [C]: gamma_L / gamma_i
  float* glg = ksc + C;             // [C]: log gamma_i
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int s = blockIdx.x / a.Hv, hv = blockIdx.x % a.Hv, dv0 = blockIdx.y * DV;
  const int hk = hv / (a.Hv / a.Hk), Dv = a.Dv;
  const int64_t key_dim = int64_t(a.Hk) * DK, value_dim = int64_t(a.Hv) * Dv;
  const int64_t head_state = int64_t(Dv) * DK;
  const int32_t slot = a.state_slot[s];
  const int64_t Sg = state_head(slot, a.Hv, hv, head_state) + int64_t(dv0) * DK;  // [DV][DK], element offset
  const int t0 = a.seq_start[s], n = a.seq_start[s + 1] - t0;
  const bool defer = gdn_deferred(a, s);
  const int ck_j = gdn_checkpoint(a, s);

  for (int i = tid; i < DV * DK / 4; i += blockDim.x) {
    const int v = i / (DK / 4), d4 = i % (DK / 4);
    *reinterpret_cast<float4*>(Ss + v * LDK + 4 * d4) = load_state4(a.rec_state, a.rec_bf16, Sg + int64_t(v) * DK + 4 * d4);
  }
  // Thread tiles: rows i = tid / 4 of a chunk, columns c = tid % 4 + 4 r (r < 8): conflict-free
  // float4 reads of padded rows.
  const int ti = tid >> 2, tc = tid & 3;
  for (int c0 = 0; c0 < n; ) {
    const int L = gdn_chunk_len(c0, n, ck_j);
    __syncthreads();  // the previous chunk's reads of Q, K, V, U are done
    // Load q, k (zero rows past L), v, beta; decays -> gamma by a warp scan of their logs.
    for (int i = tid; i < C * DK / 4; i += blockDim.x) {
      const int r = i / (DK / 4), d4 = i % (DK / 4);
      float4 q = make_float4(0.f, 0.f, 0.f, 0.f), k = q;
      if (r < L) {
        const float* c = a.conv_out + int64_t(t0 + c0 + r) * conv_dim;
        q = reinterpret_cast<const float4*>(c + int64_t(hk) * DK)[d4];
        k = reinterpret_cast<const float4*>(c + key_dim + int64_t(hk) * DK)[d4];
      }
      *reinterpret_cast<float4*>(Qs + r * LDK + 4 * d4) = q;
      *reinterpret_cast<float4*>(Ks + r * LDK + 4 * d4) = k;
    }
    for (int i = tid; i < C * DV; i += blockDim.x) {
      const int r = i / DV, v = i % DV;
      Vs[i] = r < L ? a.conv_out[int64_t(t0 + c0 + r) * conv_dim + 2 * key_dim + int64_t(hv) * Dv + dv0 + v] : 0.f;
    }
    if (warp == 0) {
      const bool ok = lane < L;
      float beta;
      const float lg = gdn_chunk_log_gamma(a, t0 + c0, hv, L, lane, &beta);
      const float lg_last = __shfl_sync(0xffffffffu, lg, L - 1);
      gam[lane] = expf(lg);
      bet[lane] = beta;
      ksc[lane] = ok ? expf(lg_last - lg) : 0.f;
      glg[lane] = lg;
    }
    __syncthreads();
    // A, M (row ti, columns tc + 4r) and X = K S0^T, Y = Q S0^T (row ti, value dims tc + 4r).
    {
      const float gi = glg[ti], bi = bet[ti];
      float gj[8];
#pragma unroll
      for (int r = 0; r < 8; ++r) gj[r] = glg[tc + 4 * r];
      float kk[8], qk[8], x[8], y[8];
#pragma unroll
      for (int r = 0; r < 8; ++r) kk[r] = qk[r] = x[r] = y[r] = 0.f;
      const float* qi = Qs + ti * LDK;
      const float* ki = Ks + ti * LDK;
#pragma unroll 2
      for (int d = 0; d < DK; d += 4) {
        const float4 q4 = *reinterpret_cast<const float4*>(qi + d);
        const float4 k4 = *reinterpret_cast<const float4*>(ki + d);
#pragma unroll
        for (int r = 0; r < 8; ++r) {
          const float4 kj = *reinterpret_cast<const float4*>(Ks + (tc + 4 * r) * LDK + d);
          const float4 sv = *reinterpret_cast<const float4*>(Ss + (tc + 4 * r) * LDK + d);
          kk[r] += k4.x * kj.x + k4.y * kj.y + k4.z * kj.z + k4.w * kj.w;
          qk[r] += q4.x * kj.x + q4.y * kj.y + q4.z * kj.z + q4.w * kj.w;
          x[r] += k4.x * sv.x + k4.y * sv.y + k4.z * sv.z + k4.w * sv.w;
          y[r] += q4.x * sv.x + q4.y * sv.y + q4.z * sv.z + q4.w * sv.w;
        }
      }
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const int j = tc + 4 * r;
        const float e = j <= ti ? expf(gi - gj[r]) : 0.f;  // Gam_ij, <= 1
        Am[ti * LDC + j] = j < ti ? bi * kk[r] * e : 0.f;
        Mm[ti * LDC + j] = qk[r] * e;
        Xs[ti * LDC + j] = x[r];
        Ys[ti * LDC + j] = y[r];
      }
    }
    __syncthreads();
    if (warp == 0) {
      // T = (I + A)^-1, column `lane` in registers: T_ic = -sum_{c<=j<i} A_ij T_jc.
      float tcol[C];
#pragma unroll
      for (int i = 0; i < C; ++i) {
        float acc = i == lane ? 1.f : 0.f;
        if (i > lane) {
#pragma unroll
          for (int j = 0; j < i; ++j) acc -= Am[i * LDC + j] * tcol[j];  // tcol[j] = 0 for j < lane
        }
        tcol[i] = acc;
        Tm[i * LDC + lane] = acc;
      }
    } else {
      // R = beta_i (v_i - gamma_i X_i), and gamma_i Y_i, by the other three warps.
      for (int i = tid - 32; i < C * DV; i += blockDim.x - 32) {
        const int r = i / DV, v = i % DV;
        Xs[r * LDC + v] = bet[r] * (Vs[r * DV + v] - gam[r] * Xs[r * LDC + v]);
        Ys[r * LDC + v] *= gam[r];
      }
    }
    __syncthreads();
    // U = T R (row ti, value dims tc + 4r).
    {
      float u[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int j = 0; j <= ti; ++j) {
        const float tij = Tm[ti * LDC + j];
#pragma unroll
        for (int r = 0; r < 8; ++r) u[r] += tij * Xs[j * LDC + tc + 4 * r];
      }
#pragma unroll
      for (int r = 0; r < 8; ++r) Us[ti * LDC + tc + 4 * r] = u[r];
    }
    __syncthreads();
    // Outputs: o_i = gamma_i Y_i + sum_{j<=i} M_ij u_j (row ti, value dims tc + 4r).
    if (ti < L) {
      float o[8];
#pragma unroll
      for (int r = 0; r < 8; ++r) o[r] = Ys[ti * LDC + tc + 4 * r];
      for (int j = 0; j <= ti; ++j) {
        const float mij = Mm[ti * LDC + j];
#pragma unroll
        for (int r = 0; r < 8; ++r) o[r] += mij * Us[j * LDC + tc + 4 * r];
      }
      float* dst = a.out + int64_t(t0 + c0 + ti) * value_dim + int64_t(hv) * Dv + dv0;
#pragma unroll
      for (int r = 0; r < 8; ++r) dst[tc + 4 * r] = o[r];
    }
    // State: S_v = gamma_L S_v + sum_i U_iv ksc_i k_i; thread: value dims 2 (tid / 8) + {0, 1},
    // key dims 4 (tid % 8) + 32 m.
    {
      const int v0 = 2 * (tid >> 3), dg = 4 * (tid & 7);
      const float gl = gam[L - 1];
      float4 acc[2][DK / 32];
#pragma unroll
      for (int w = 0; w < 2; ++w)
#pragma unroll
        for (int m = 0; m < DK / 32; ++m) {
          const float4 sv = *reinterpret_cast<const float4*>(Ss + (v0 + w) * LDK + dg + 32 * m);
          acc[w][m] = make_float4(gl * sv.x, gl * sv.y, gl * sv.z, gl * sv.w);
        }
      for (int i = 0; i < L; ++i) {
        const float c0v = Us[i * LDC + v0] * ksc[i], c1v = Us[i * LDC + v0 + 1] * ksc[i];
#pragma unroll
        for (int m = 0; m < DK / 32; ++m) {
          const float4 k4 = *reinterpret_cast<const float4*>(Ks + i * LDK + dg + 32 * m);
          acc[0][m].x += c0v * k4.x; acc[0][m].y += c0v * k4.y; acc[0][m].z += c0v * k4.z; acc[0][m].w += c0v * k4.w;
          acc[1][m].x += c1v * k4.x; acc[1][m].y += c1v * k4.y; acc[1][m].z += c1v * k4.z; acc[1][m].w += c1v * k4.w;
        }
      }
      const bool ckpt = c0 + L - 1 == ck_j;
      const int64_t ckg = ckpt ? state_head(a.ckpt_slot[s], a.Hv, hv, head_state) + int64_t(dv0) * DK : 0;
#pragma unroll
      for (int w = 0; w < 2; ++w)
#pragma unroll
        for (int m = 0; m < DK / 32; ++m) {
          *reinterpret_cast<float4*>(Ss + (v0 + w) * LDK + dg + 32 * m) = acc[w][m];
          if (ckpt) store_state4(a.rec_state, a.rec_bf16, ckg + int64_t(v0 + w) * DK + dg + 32 * m, acc[w][m]);
        }
    }
    c0 += L;
  }
  if (defer) return;
  __syncthreads();
  for (int i = tid; i < DV * DK / 4; i += blockDim.x) {
    const int v = i / (DK / 4), d4 = i % (DK / 4);
    store_state4(a.rec_state, a.rec_bf16, Sg + int64_t(v) * DK + 4 * d4, *reinterpret_cast<const float4*>(Ss + v * LDK + 4 * d4));
  }
}

// The recurrence's o (pre-norm) rows are o_in [T, o_stride] (out itself, or conv_out's value
// columns after the tensor-core chunked kernel); the normed result goes to out. A warp per (token
// blockIdx.x, value head): blocks of kNormWarps heads along blockIdx.y, so that a decode step's
// heads run side by side (one block looping over a token's 48 heads took ~15 us).
constexpr int kNormWarps = 8;

__global__ void __launch_bounds__(32 * kNormWarps) gated_norm_kernel(GdnArgs a, int64_t conv_dim, int64_t row,
                                                                      const float* o_in, int64_t o_stride) {
  pdl_wait();  // cuda_pdl.cuh: a small kernel waits, then lets the next one launch
  pdl_trigger();  // (a GEMV: it starts streaming its weights)
  const int t = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int Dv = a.Dv;
  const int64_t value_dim = int64_t(a.Hv) * Dv;
  for (int hv = blockIdx.y * kNormWarps + warp; hv < a.Hv; hv += kNormWarps * gridDim.y) {
    const float* oi = o_in + int64_t(t) * o_stride + int64_t(hv) * Dv;
    float* o = a.out + int64_t(t) * value_dim + int64_t(hv) * Dv;
    const float* z = a.proj + int64_t(t) * row + conv_dim + int64_t(hv) * Dv;
    float ss = 0.f;
    for (int d = lane; d < Dv; d += 32) ss += oi[d] * oi[d];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / float(Dv) + a.eps);
    for (int d = lane; d < Dv; d += 32) o[d] = oi[d] * inv * a.norm[d] * silu(z[d]);
  }
}

// ---- commit (speculative rollback) ----------------------------------------------------------
// Block (sequence s, value head hv; layer = blockIdx.z): replays the first n_s tokens of the
// slot's pending rows from the live state, with the arithmetic of the forward: conv_tokens_kernel's
// conv, prep_kernel's norms and gates, delta_rows_kernel's recurrence (rows over lanes). q, k and
// the gates of every token are computed once into shared memory; then the block walks the head's
// rows NR per warp at a time, each group replaying all tokens in registers. It reads the old conv
// window and leaves it: gdn_commit_window_kernel moves it afterwards (every block of a key head
// needs the old window of its q/k channels).
constexpr int kMaxCommit = 9;  // tokens of one verification: 1 + up to 8 drafts

template <int DK, int NR>
__global__ void __launch_bounds__(128) gdn_commit_kernel(GdnCommitArgs a) {
  constexpr int LPR = DK / 4, RPW = 32 / LPR, ROWS_PER_WARP = RPW * NR;
  const GdnCommitLayer L = a.layers[blockIdx.z];
  const int s = blockIdx.x / a.Hv, hv = blockIdx.x % a.Hv;
  const int n = a.seq_start[s + 1] - a.seq_start[s];
  if (n <= 0) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
  const int sub = lane / LPR, li = lane % LPR;
  const int hk = hv / (a.Hv / a.Hk), Dv = a.Dv, K = a.K, Km1 = K - 1;
  const int64_t key_dim = int64_t(a.Hk) * DK, conv_dim = 2 * key_dim + int64_t(a.Hv) * Dv;
  const int64_t prow = conv_dim + 2 * a.Hv;
  const int32_t slot = a.state_slot[s];
  const float* pend = L.pending + int64_t(slot) * a.pending_depth * prow;
  const float* win = L.conv_state + int64_t(slot) * conv_dim * Km1;
  // Raw input i of channel c (i < 0: the window before the run).
  auto input = [&](int64_t c, int i) { return i >= 0 ? pend[int64_t(i) * prow + c] : win[c * Km1 + Km1 + i]; };
  auto conv = [&](int64_t c, int j) {
    float acc = 0.f;
    for (int q = 0; q < K; ++q) acc += L.conv_weight[c * K + q] * input(c, j - Km1 + q);
    return silu(acc);
  };
  // 1. Every token's q | k (conv, SiLU, L2 norm) and beta, decay.
  __shared__ __align__(16) float qk[kMaxCommit][2 * DK];
  __shared__ float gates[kMaxCommit][2];
  for (int j = 0; j < n; ++j)
    for (int i = threadIdx.x; i < 2 * DK; i += blockDim.x)
      qk[j][i] = conv(i < DK ? int64_t(hk) * DK + i : key_dim + int64_t(hk) * DK + (i - DK), j);
  __syncthreads();
  const float q_scale = 1.0f / sqrtf(float(DK));
  for (int item = warp; item < 2 * n; item += n_warps) {  // prep_kernel's norm: a warp per head
    float* v = qk[item / 2] + (item % 2) * DK;
    float ss = 0.f;
    for (int d = lane; d < DK; d += 32) ss += v[d] * v[d];
    ss = warp_sum(ss);
    const float nrm = (item % 2 == 0 ? q_scale : 1.0f) / sqrtf(ss + 1e-6f);
    for (int d = lane; d < DK; d += 32) v[d] *= nrm;
  }
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float b = pend[int64_t(j) * prow + conv_dim + hv];
    const float x = pend[int64_t(j) * prow + conv_dim + a.Hv + hv] + L.dt_bias[hv];
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    gates[j][0] = 1.0f / (1.0f + expf(-b));
    gates[j][1] = expf(L.neg_exp_a[hv] * sp);
  }
  __syncthreads();
  // 2. The recurrence, a group of rows at a time.
  const int64_t head_state = int64_t(Dv) * DK;
  const int64_t Shead = state_head(slot, a.Hv, hv, head_state);  // element offsets
  const int ck_j = a.ckpt_at ? a.ckpt_at[s] : -1;
  const int64_t ck = ck_j >= 0 ? state_head(a.ckpt_slot[s], a.Hv, hv, head_state) : 0;
  for (int row0 = warp * ROWS_PER_WARP; row0 < Dv; row0 += n_warps * ROWS_PER_WARP) {
    int jv[NR];
    bool ok[NR];
    float4 S[NR][1];
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      jv[r] = row0 + r * RPW + sub;
      ok[r] = jv[r] < Dv;
      S[r][0] = ok[r] ? load_state4(L.rec_state, a.rec_bf16, Shead + int64_t(jv[r]) * DK + 4 * li)
                   : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int j = 0; j < n; ++j) {
      const float beta = gates[j][0], decay = gates[j][1];
      const float4 k[1] = {reinterpret_cast<const float4*>(qk[j] + DK)[li]};
      float v[NR];
#pragma unroll
      for (int r = 0; r < NR; ++r) v[r] = ok[r] ? conv(2 * key_dim + int64_t(hv) * Dv + jv[r], j) : 0.f;
      delta_update<LPR, NR, 1>(S, v, k, beta, decay);
      if (j == ck_j) {
#pragma unroll
        for (int r = 0; r < NR; ++r)
          if (ok[r]) store_state4(L.rec_state, a.rec_bf16, ck + int64_t(jv[r]) * DK + 4 * li, S[r][0]);
      }
    }
#pragma unroll
    for (int r = 0; r < NR; ++r)
      if (ok[r]) store_state4(L.rec_state, a.rec_bf16, Shead + int64_t(jv[r]) * DK + 4 * li, S[r][0]);
  }
}

// One thread per (layer, sequence, channel): the window after the replayed tokens.
__global__ void gdn_commit_window_kernel(GdnCommitArgs a, int64_t conv_dim) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= int64_t(a.n_seqs) * conv_dim) return;
  const GdnCommitLayer L = a.layers[blockIdx.y];
  const int s = static_cast<int>(i / conv_dim);
  const int64_t c = i - int64_t(s) * conv_dim;
  const int n = a.seq_start[s + 1] - a.seq_start[s];
  if (n <= 0) return;
  const int Km1 = a.K - 1;
  const int64_t prow = conv_dim + 2 * a.Hv;
  const int32_t slot = a.state_slot[s];
  const float* pend = L.pending + int64_t(slot) * a.pending_depth * prow;
  float* st = L.conv_state + (int64_t(slot) * conv_dim + c) * Km1;
  if (a.ckpt_at && a.ckpt_at[s] >= 0) {  // the window after token ckpt_at, before st changes
    const int e = a.ckpt_at[s] + 1;
    float* ck = L.conv_state + (int64_t(a.ckpt_slot[s]) * conv_dim + c) * Km1;
    for (int q = 0; q < Km1; ++q) {
      const int jj = e - Km1 + q;
      ck[q] = jj >= 0 ? pend[int64_t(jj) * prow + c] : st[Km1 + jj];
    }
  }
  float win[kMaxConv];
#pragma unroll
  for (int q = 0; q < kMaxConv; ++q)
    if (q < Km1) {
      const int jj = n - Km1 + q;
      win[q] = jj >= 0 ? pend[int64_t(jj) * prow + c] : st[Km1 + jj];
    }
#pragma unroll
  for (int q = 0; q < kMaxConv; ++q)
    if (q < Km1) st[q] = win[q];
}

template <int DK>
void run_commit(const GdnCommitArgs& a, cudaStream_t s) {
  constexpr int NR = 4;
  dim3 grid(static_cast<unsigned>(a.n_seqs * a.Hv), 1, static_cast<unsigned>(a.n_layers));
  gdn_commit_kernel<DK, NR><<<grid, 128, 0, s>>>(a);
  DS_CUDA_LAUNCH_CHECK();
}

template <int DK>
void run_chunked(const GdnArgs& a, int64_t conv_dim, cudaStream_t s) {
  constexpr std::size_t smem = chunked_smem_bytes<DK>();
  static std::atomic<bool> configured[kMaxDevices];
  std::atomic<bool>& conf = configured[current_device()];
  if (!conf.load()) {
    DS_CUDA_CHECK(cudaFuncSetAttribute(delta_chunked_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    conf.store(true);
  }
  dim3 grid(static_cast<unsigned>(a.n_seqs * a.Hv), static_cast<unsigned>(a.Dv / kDvb));
  delta_chunked_kernel<DK><<<grid, 128, smem, s>>>(a, conv_dim);
  DS_CUDA_LAUNCH_CHECK();
}

template <int DK>
void run_delta(const GdnArgs& a, int64_t conv_dim, cudaStream_t s) {
  // Long runs (prefill) of head sizes the chunked kernel has: the chunked delta rule.
  if constexpr (DK == 64 || DK == 128) {
    if (a.chunked && a.n_tokens > 8 * a.n_seqs && a.Dv % kDvb == 0) return run_chunked<DK>(a, conv_dim, s);
  }
  if (a.rows_kernel) {
    // Rows spread over lanes, 4 warps per block. Decode batches hold 4 rows per warp (fewer
    // blocks, each streaming 4 rows at once); long runs (prefill) 1, for more warps in flight.
    const bool prefill = a.n_tokens > 8 * a.n_seqs;
    const int nr = prefill ? 1 : 4;
    const int rows_per_block = 4 * (32 / (DK / 4)) * nr;
    dim3 grid(static_cast<unsigned>(a.n_seqs * a.Hv), static_cast<unsigned>((a.Dv + rows_per_block - 1) / rows_per_block));
    const bool pdl = a.pdl || a.pdl_chain;
    if (prefill) launch_pdl(pdl, delta_rows_kernel<DK, 1>, grid, dim3(128), 0, s, a, conv_dim);
    else launch_pdl(pdl, delta_rows_kernel<DK, 4>, grid, dim3(128), 0, s, a, conv_dim);
    return;
  }
  const int rb = a.Dv < 32 ? a.Dv : 32;  // 32 rows per block: Hv * Dv/32 blocks at decode
  dim3 grid(static_cast<unsigned>(a.n_seqs * a.Hv), static_cast<unsigned>((a.Dv + rb - 1) / rb));
  delta_kernel<DK><<<grid, rb, 0, s>>>(a, conv_dim);
  DS_CUDA_LAUNCH_CHECK();
}

// Whether the fused decode kernel stages its state rows by a bulk copy (sm_90), from the mode
// GdnArgs::decode_stage asks for: a bf16 state by default (1), any with 2, none with 0. Read in
// place, a bf16 state has half an f32 one's bytes in flight and streamed at ~2 TB/s; staged, the
// 27B sampled at 3,141-3,147 tok/s at batch 64 against 2,969-2,984 (983-986 against 960-963 at
// 16); an f32 state staged (64 KB a head, 3 blocks per SM) was slower (2,864 against 2,898;
// bench/RESULTS.md, stop 43).
bool staged_decode(int mode, bool bf16_state, bool sm90) { return sm90 && (mode == 2 || (mode == 1 && bf16_state)); }

template <int DK, int NR, int C>
void launch_decode_as(const GdnArgs& a, int64_t conv_dim, int64_t row, cudaStream_t s) {
  constexpr int rows_per_warp = (32 / (DK / (4 * C))) * NR;
  const int groups = (a.Dv + rows_per_warp - 1) / rows_per_warp;
  // A warp per row group (32 at Dk = Dv = 128: 1024 threads) while the blocks fit two per SM;
  // more blocks than that take 8 warps, each walking four groups, four blocks per SM (H200, 27B:
  // batch 64 2,794 tok/s against 2,741 with 16 warps; batch 16 the same with 8 or 16, 908 with 32;
  // batch 1: 75.2 either way; bench/RESULTS.md, stop 27). GdnArgs::decode_warps forces a count.
  // Clusters (GdnArgs::decode_cluster; 0: 4 while that grid fits two blocks per SM, i.e. batch 1 on
  // the 27B: 75.0 -> 75.5 tok/s, but batch 16 936 -> 863 with 4 and 897 with 2; bench/RESULTS.md,
  // stop 33): each block takes Dv / cluster rows, one group per warp, and enough warps for its conv
  // channels (q, k and its value channels). The largest cluster up to the one asked whose share of
  // rows is a multiple of 32; none before sm_90.
  const int device = current_device();
  const int64_t heads = int64_t(a.n_seqs) * a.Hv, sms = sm_count(device);
  const bool idle_sms = heads * 4 <= 2 * sms;
  int cl = a.decode_cluster > 0 ? std::min(a.decode_cluster, 8) : idle_sms ? 4 : 1;
  while (cl > 1 && a.Dv % (32 * cl) != 0) cl /= 2;
  const bool sm90 = device_attribute(cudaDevAttrComputeCapabilityMajor, device, 0) >= 9;
  if (!sm90) cl = 1;
  GdnArgs c = a;
  c.decode_cluster = cl;
  c.decode_stage = staged_decode(a.decode_stage, a.rec_bf16, sm90) ? 1 : 0;
  const bool many = heads > 2 * sms;
  int warps = a.decode_warps > 0 ? std::min(a.decode_warps, 32) : std::clamp(groups, 2, many ? 8 : 32);
  if (cl > 1 && a.decode_warps <= 0) {
    const int rows = a.Dv / cl, channels = 2 * DK + rows;
    warps = std::clamp(std::max((rows + rows_per_warp - 1) / rows_per_warp, (channels + 31) / 32), 2, 32);
  }
  const std::size_t stage_bytes = c.decode_stage ? std::size_t(a.Dv / cl) * DK * (a.rec_bf16 ? 2 : 4) : 0;
  const std::size_t smem = stage_bytes + (std::size_t(2) * DK + std::size_t(2) * a.Dv) * sizeof(float);
  if (smem > 48 * 1024)  // the opt-in (a staged f32 head of 128 x 128 rows and up)
    DS_CUDA_CHECK(cudaFuncSetAttribute(gdn_decode_kernel<DK, NR, C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  launch_pdl_cluster(a.pdl, cl, gdn_decode_kernel<DK, NR, C>, dim3(static_cast<unsigned>(a.n_seqs * a.Hv * cl)),
                     dim3(32 * warps), smem, s, c, conv_dim, row);
}

// The lane layout (GdnArgs::decode_layout): 8 floats of a row per lane in groups of 2 rows (82, the
// default), or 4 floats in groups of 4 (44). The same bits and bytes in flight; 82 sums a row over
// half the lanes (one shuffle fewer) and takes 1.1% off batch 64 on the 27B (H200 model-only 2,880 /
// 2,887 tok/s against 2,862 / 2,838; 8 floats in groups of 4 rows, 128 registers: 2,482 against
// 2,788 through the engine; batch 1 the same; bench/RESULTS.md, stop 43).
template <int DK>
void launch_decode(const GdnArgs& a, int64_t conv_dim, int64_t row, cudaStream_t s) {
  if (a.decode_layout == 44) return launch_decode_as<DK, 4, 1>(a, conv_dim, row, s);
  return launch_decode_as<DK, 2, 2>(a, conv_dim, row, s);
}

}  // namespace

bool launch_gated_delta_net(const GdnArgs& a, cudaStream_t s) {
  if (a.K > kMaxConv || a.K < 2) return false;
  if (a.Dk != 16 && a.Dk != 32 && a.Dk != 64 && a.Dk != 128) return false;
  if (a.Dv > 32 && a.Dv % 32 != 0) return false;  // delta_kernel: blocks of 32 value rows
  if (a.n_tokens == 0) return true;
  if (gdn_uses_chunked_mma(a) && a.chunk_m == nullptr) return false;
  const int64_t key_dim = int64_t(a.Hk) * a.Dk, value_dim = int64_t(a.Hv) * a.Dv;
  const int64_t conv_dim = 2 * key_dim + value_dim;
  const int64_t row = conv_dim + value_dim + 2LL * a.Hv;
  const int64_t n_seq = int64_t(a.n_seqs) * conv_dim;
  const dim3 norm_grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>((a.Hv + kNormWarps - 1) / kNormWarps));
  if (a.decode && a.Hv % a.Hk == 0 && a.head_count != nullptr) {
    switch (a.Dk) {
      case 16: launch_decode<16>(a, conv_dim, row, s); break;
      case 32: launch_decode<32>(a, conv_dim, row, s); break;
      case 64: launch_decode<64>(a, conv_dim, row, s); break;
      default: launch_decode<128>(a, conv_dim, row, s); break;
    }
    return true;
  }
  // Runs of tt tokens per thread for long runs (16 at 4k+ tokens), one token per thread for decode.
  const int tt = std::clamp(a.n_tokens / 256, 1, 16);
  conv_tokens_kernel<<<dim3(static_cast<unsigned>((conv_dim + 255) / 256), static_cast<unsigned>((a.n_tokens + tt - 1) / tt)),
                       256, 0, s>>>(a, conv_dim, row, tt);
  DS_CUDA_LAUNCH_CHECK();
  // After the conv (which follows a cuBLAS GEMM), the op's kernels by PDL in a chain (pdl_chain).
  launch_pdl(a.pdl_chain, conv_state_kernel, dim3(static_cast<unsigned>((n_seq + 255) / 256)), dim3(256), 0, s, a,
             conv_dim, row);
  launch_pdl(a.pdl_chain, prep_kernel, dim3(static_cast<unsigned>(a.n_tokens)), dim3(256), 0, s, a, conv_dim, row);
  const bool norm_pdl = a.pdl || a.pdl_chain;
  if (gdn_uses_chunked_mma(a)) {
    // Long runs: the chunked rule on tensor cores; o lands in conv_out's value columns.
    launch_gdn_chunked_mma(a, conv_dim, s);
    launch_pdl(norm_pdl, gated_norm_kernel, norm_grid, dim3(32 * kNormWarps), 0, s, a, conv_dim, row,
               static_cast<const float*>(a.conv_out + 2 * key_dim), conv_dim);
    return true;
  }
  switch (a.Dk) {
    case 16: run_delta<16>(a, conv_dim, s); break;
    case 32: run_delta<32>(a, conv_dim, s); break;
    case 64: run_delta<64>(a, conv_dim, s); break;
    default: run_delta<128>(a, conv_dim, s); break;
  }
  launch_pdl(norm_pdl, gated_norm_kernel, norm_grid, dim3(32 * kNormWarps), 0, s, a, conv_dim, row,
             static_cast<const float*>(a.out), value_dim);
  return true;
}

bool launch_gdn_commit(const GdnCommitArgs& a, cudaStream_t s) {
  if (a.K > kMaxConv || a.K < 2 || a.max_tokens > kMaxCommit) return false;
  if (a.Dk != 16 && a.Dk != 32 && a.Dk != 64 && a.Dk != 128) return false;
  if (a.n_seqs == 0 || a.n_layers == 0) return true;
  switch (a.Dk) {
    case 16: run_commit<16>(a, s); break;
    case 32: run_commit<32>(a, s); break;
    case 64: run_commit<64>(a, s); break;
    default: run_commit<128>(a, s); break;
  }
  const int64_t conv_dim = 2 * int64_t(a.Hk) * a.Dk + int64_t(a.Hv) * a.Dv;
  const int64_t n = int64_t(a.n_seqs) * conv_dim;
  gdn_commit_window_kernel<<<dim3(static_cast<unsigned>((n + 255) / 256), static_cast<unsigned>(a.n_layers)), 256, 0,
                             s>>>(a, conv_dim);
  DS_CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace deltaserve::cuda
