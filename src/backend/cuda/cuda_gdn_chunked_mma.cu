// Gated DeltaNet over long runs (prefill) on tensor cores: the chunked delta rule (the WY / UT form
// of delta_chunked_kernel in cuda_gated_delta_net.cu). Every product is a TF32 mma: 3xTF32
// (f32-accurate) in exact mode, one TF32 product of rounded operands by default (GdnArgs::tf32_parts).
// With C = 32 tokens per chunk, g_i the decays, gamma_i = g_1 ... g_i, Gam_ij = gamma_i / gamma_j,
// beta_i the gates and S0 [Dv x Dk] the state before the chunk:
//   T = (I + A)^-1, A_ij = beta_i (k_i . k_j) Gam_ij (j < i)       unit lower triangular [C x C]
//   W = T diag(beta gamma) K [C x Dk],  U' = T diag(beta) V [C x Dv]  no S0: every chunk at once
//   M_ij = (q_i . k_j) Gam_ij (j <= i)                               [C x C]
//   U = U' - W S0^T,  o_i = gamma_i S0 q_i + sum_j M_ij u_j,
//   S_end = gamma_L S0 + sum_j (gamma_L / gamma_j) u_j k_j^T.
// Two kernels:
//   prep:  a block per (chunk, value head), all chunks of the batch at once: A, T, M, W and U'.
//          W goes into `out` (its [T, Hv*Dv] rows are free until the gated norm; Dk == Dv), U' over
//          V in conv_out's value columns, M into chunk_m.
//   state: a block per (sequence, value head, 32 value dims) walks its chunks in order: per chunk
//          X = W S0^T and Y = Q S0^T (one [64 x Dk] x [Dk x 32] product), U = U' - X,
//          o = gamma Y + M U (written over U'; gated_norm_kernel reads it there) and the new state
//          (a [32 x C] x [C x Dk] product). A prefix-cache checkpoint ends a chunk early, so the
//          state after that token exists; a deferred run reads its state and does not store it.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_gdn.cuh"
#include "backend/cuda/cuda_launch.h"
#include "backend/cuda/cuda_mma.cuh"

namespace deltaserve::cuda {

namespace {

constexpr int C = kGdnChunk;
constexpr int kStateDv = 32;  // value dims (state rows) per state block

struct ChunkRef {
  int s, c0, L;  // sequence, first token (local), length
};

// The b-th chunk of the batch: sequences in order, each cut into chunks as the state kernel walks
// it (gdn_chunk_len). False past the last chunk.
__device__ bool find_chunk(const GdnArgs& a, int b, ChunkRef* r) {
  for (int s = 0; s < a.n_seqs; ++s) {
    const int n = a.seq_start[s + 1] - a.seq_start[s];
    const int ck = gdn_checkpoint(a, s);
    const bool cut = ck >= 0 && ck < n;
    const int n1 = cut ? ck / C + 1 : 0;  // chunks up to and including the checkpoint token
    const int nc = cut ? n1 + (n - ck - 1 + C - 1) / C : (n + C - 1) / C;
    if (b < nc) {
      const int c0 = !cut || b < n1 ? b * C : ck + 1 + (b - n1) * C;
      *r = ChunkRef{s, c0, gdn_chunk_len(c0, n, ck)};
      return true;
    }
    b -= nc;
  }
  return false;
}

constexpr int kThreads = 256;  // 8 warps per block, both kernels

template <int D>
constexpr std::size_t prep_smem_bytes() {
  // Q, K [C][D+4] | V [C][D+8] | A, T, Tg, Tb [C][C+4] | log gamma, beta [C]
  return (std::size_t(2) * C * (D + 4) + std::size_t(C) * (D + 8) + std::size_t(4) * C * (C + 4) + 2 * C) * 4;
}

// P: TF32 parts per product (GdnArgs::tf32_parts: 3 exact, 1 default).
template <int D, int P>
__global__ void __launch_bounds__(kThreads) gdn_chunk_prep_kernel(GdnArgs a, int64_t conv_dim) {
  constexpr int LQ = D + 4, LV = D + 8, LC = C + 4;  // strides: conflict-free fragment reads
  extern __shared__ __align__(16) float sm[];
  float* Qs = sm;            // [C][LQ]
  float* Ks = Qs + C * LQ;   // [C][LQ]
  float* Vs = Ks + C * LQ;   // [C][LV]
  float* As = Vs + C * LV;   // [C][LC]: A, strictly lower
  float* Ts = As + C * LC;   // [C][LC]: T = (I + A)^-1
  float* Tg = Ts + C * LC;   // [C][LC]: T diag(beta gamma) (first: A21 T11, 16 x 16)
  float* Tb = Tg + C * LC;   // [C][LC]: T diag(beta)
  float* glg = Tb + C * LC;  // [C]: log gamma_i
  float* bet = glg + C;      // [C]: beta_i
  __shared__ ChunkRef ref;
  __shared__ int found;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int hv = blockIdx.y;
  if (tid == 0) found = find_chunk(a, blockIdx.x, &ref);
  __syncthreads();
  if (!found) return;
  const int L = ref.L, tb = a.seq_start[ref.s] + ref.c0;  // tb: the chunk's first token
  const int hk = hv / (a.Hv / a.Hk);
  const int64_t key_dim = int64_t(a.Hk) * D, value_dim = int64_t(a.Hv) * D;
  {
    const int d4 = tid % (D / 4);
    for (int r = tid / (D / 4); r < C; r += kThreads / (D / 4)) {
      float4 q = make_float4(0.f, 0.f, 0.f, 0.f), k = q, v = q;
      if (r < L) {
        const float* c = a.conv_out + int64_t(tb + r) * conv_dim;
        q = reinterpret_cast<const float4*>(c + int64_t(hk) * D)[d4];
        k = reinterpret_cast<const float4*>(c + key_dim + int64_t(hk) * D)[d4];
        v = reinterpret_cast<const float4*>(c + 2 * key_dim + int64_t(hv) * D)[d4];
      }
      *reinterpret_cast<float4*>(Qs + r * LQ + 4 * d4) = q;
      *reinterpret_cast<float4*>(Ks + r * LQ + 4 * d4) = k;
      *reinterpret_cast<float4*>(Vs + r * LV + 4 * d4) = v;
    }
  }
  if (warp == 0) {
    // log gamma and beta for the products here; gamma_i and gamma_L / gamma_i for the state kernel.
    float beta;
    const float lg = gdn_chunk_log_gamma(a, tb, hv, L, lane, &beta);
    const float lg_last = __shfl_sync(0xffffffffu, lg, L - 1);
    glg[lane] = lg;
    bet[lane] = beta;
    if (lane < L) {
      float* row = a.chunk_m + (int64_t(tb + lane) * a.Hv + hv) * kGdnChunkRow;
      row[C] = expf(lg);
      row[C + 1] = expf(lg_last - lg);
    }
  }
  __syncthreads();
  // K K^T (warps with warp & 3 < 2) and Q K^T (the others): rows 16 (warp & 1) .. + 15, columns
  // 16 (warp >> 2) .. + 15.
  {
    const int r0 = 16 * (warp & 1), n0 = 16 * (warp >> 2);
    const bool kk = (warp & 3) < 2;
    float acc[2][4] = {};
    mma_tf32xn<P, 2, D / 8, LQ, 1, 1, LQ>(acc, (kk ? Ks : Qs) + r0 * LQ, Ks + n0 * LQ);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = r0 + g + 8 * (e >> 1), j = n0 + 8 * nt + 2 * t4 + (e & 1);
        const float G = j <= i ? expf(glg[i] - glg[j]) : 0.f;  // Gam_ij <= 1
        if (kk) As[i * LC + j] = j < i ? bet[i] * acc[nt][e] * G : 0.f;
        else if (i < L) a.chunk_m[(int64_t(tb + i) * a.Hv + hv) * kGdnChunkRow + j] = acc[nt][e] * G;
      }
  }
  __syncthreads();
  // T = (I + A)^-1 by 16 x 16 blocks: warps 0 and 1 invert the diagonal blocks (a column per lane:
  // T_ic = -sum_{c<=j<i} A_ij T_jc), then T21 = -T22 (A21 T11) by all threads.
  if (warp < 2 && lane < 16) {
    const int o = 16 * warp;
    float tcol[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float acc = i == lane ? 1.f : 0.f;
      if (i > lane) {
#pragma unroll
        for (int j = 0; j < i; ++j) acc -= As[(o + i) * LC + o + j] * tcol[j];  // tcol[j] = 0 for j < lane
      }
      tcol[i] = acc;
      Ts[(o + i) * LC + o + lane] = acc;
      Ts[(o + i) * LC + 16 - o + lane] = 0.f;  // T12 = 0 (and T21, overwritten below)
    }
  }
  __syncthreads();
  const int bi = tid >> 4, bc = tid & 15;  // a 16 x 16 block's element per thread
  {
    float x = 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) x += As[(16 + bi) * LC + j] * Ts[j * LC + bc];
    Tg[bi * LC + bc] = x;  // A21 T11
  }
  __syncthreads();
  {
    float x = 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) x += Ts[(16 + bi) * LC + 16 + j] * Tg[j * LC + bc];
    Ts[(16 + bi) * LC + bc] = -x;
  }
  __syncthreads();
  for (int e = tid; e < C * C; e += kThreads) {
    const int i = e / C, j = e % C;
    const float tv = Ts[i * LC + j];
    Tg[i * LC + j] = tv * bet[j] * expf(glg[j]);
    Tb[i * LC + j] = tv * bet[j];
  }
  __syncthreads();
  // W = Tg K and U' = Tb V: rows 16 (warp & 1) .. + 15, columns D/4 (warp >> 1) .. + D/4 - 1.
  {
    constexpr int NT = D / 32;
    const int r0 = 16 * (warp & 1), n0 = (D / 4) * (warp >> 1);
    float w[NT][4] = {}, u[NT][4] = {};
    mma_tf32xn<P, NT, C / 8, LC, 1, LQ, 1>(w, Tg + r0 * LC, Ks + n0);
    mma_tf32xn<P, NT, C / 8, LC, 1, LV, 1>(u, Tb + r0 * LC, Vs + n0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = r0 + g + 8 * h;
      if (i >= L) continue;
      float* wd = a.out + int64_t(tb + i) * value_dim + int64_t(hv) * D + n0 + 2 * t4;
      float* ud = a.conv_out + int64_t(tb + i) * conv_dim + 2 * key_dim + int64_t(hv) * D + n0 + 2 * t4;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        *reinterpret_cast<float2*>(wd + 8 * nt) = make_float2(w[nt][2 * h], w[nt][2 * h + 1]);
        *reinterpret_cast<float2*>(ud + 8 * nt) = make_float2(u[nt][2 * h], u[nt][2 * h + 1]);
      }
    }
  }
}

template <int D, bool PF>
constexpr std::size_t state_smem_bytes() {
  // S [32][D+4] | W, Q [C][D+4] (two of each with PF) | K [C][D+8] | M [C][C+4] | U [C][32+8]
  return (std::size_t(kStateDv) * (D + 4) + std::size_t(PF ? 4 : 2) * C * (D + 4) + std::size_t(C) * (D + 8) +
          std::size_t(C) * (C + 4) + std::size_t(C) * (kStateDv + 8)) *
         4;
}

// PF: the next chunk's W and Q are fetched while this chunk computes (two buffers: 112 KB of shared
// memory at D = 128, two blocks per SM on sm_90; sm_86 runs PF = false). K, M and U' are fetched at
// the chunk's start and land while X and Y are computed.
template <int D, bool PF, int P>
__global__ void __launch_bounds__(kThreads, 2) gdn_chunk_state_kernel(GdnArgs a, int64_t conv_dim) {
  constexpr int DV = kStateDv, LQ = D + 4, LK = D + 8, LC = kGdnChunkRow, LU = DV + 8, NB = PF ? 2 : 1;
  static_assert(LC == C + 4, "M rows: C products, gamma_i, gamma_L / gamma_i, 2 spare");
  extern __shared__ __align__(16) float sm[];
  float* Ss = sm;                // [DV][LQ]: this block's rows of the state
  float* Wb = Ss + DV * LQ;      // [NB][C][LQ]
  float* Qb = Wb + NB * C * LQ;  // [NB][C][LQ]
  float* Ks = Qb + NB * C * LQ;  // [C][LK]: K, rows scaled by gamma_L / gamma_i once loaded
  float* Ms = Ks + C * LK;       // [C][LC]: chunk_m rows (M_i, gamma_i at C, gamma_L / gamma_i at C + 1)
  float* Us = Ms + C * LC;       // [C][LU]: U' (this block's value dims), then U in place
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int s = blockIdx.x / a.Hv, hv = blockIdx.x % a.Hv, dv0 = blockIdx.y * DV;
  const int hk = hv / (a.Hv / a.Hk);
  const int64_t key_dim = int64_t(a.Hk) * D, value_dim = int64_t(a.Hv) * D, head_state = int64_t(D) * D;
  const int64_t vcol = 2 * key_dim + int64_t(hv) * D + dv0;  // this block's value columns in conv_out
  const int64_t Sg = state_head(a.state_slot[s], a.Hv, hv, head_state) + int64_t(dv0) * D;  // [DV][D], element offset
  const int t0 = a.seq_start[s], n = a.seq_start[s + 1] - t0;
  const int ck = gdn_checkpoint(a, s);
  constexpr int kRowStep = kThreads / (D / 4);
  const int d4 = tid % (D / 4), rr = tid / (D / 4);  // this thread's 16-byte column and first row of a load
  // W and Q rows of the chunk at c0 (length L) into buffer b; rows past the chunk: zeros.
  auto fetch_wq = [&](int c0, int L, int b) {
    for (int r = rr; r < C; r += kRowStep) {
      const int64_t tr = t0 + c0 + min(r, L - 1);
      const int bytes = r < L ? 16 : 0;
      cp_async16(smem_u32(Wb + (b * C + r) * LQ + 4 * d4), a.out + tr * value_dim + int64_t(hv) * D + 4 * d4, bytes);
      cp_async16(smem_u32(Qb + (b * C + r) * LQ + 4 * d4), a.conv_out + tr * conv_dim + int64_t(hk) * D + 4 * d4,
                 bytes);
    }
    cp_async_commit();
  };
  for (int v = rr; v < DV; v += kRowStep)
    *reinterpret_cast<float4*>(Ss + v * LQ + 4 * d4) = load_state4(a.rec_state, a.rec_bf16, Sg + int64_t(v) * D + 4 * d4);
  // Warp roles: xr = 16 (warp & 1) rows and xc = 16 (warp >> 2) value dims of X = W S0^T (warp & 3 < 2)
  // or of Y = Q S0^T and o (the others); state rows 16 (warp & 1) and key dims D/4 (warp >> 1) of S.
  const bool wx = (warp & 3) < 2;
  const int xr = 16 * (warp & 1), xc = 16 * (warp >> 2), sk = (D / 4) * (warp >> 1);
  if (PF && n > 0) fetch_wq(0, gdn_chunk_len(0, n, ck), 0);
  for (int c0 = 0, buf = 0; c0 < n; buf ^= NB - 1) {
    const int L = gdn_chunk_len(c0, n, ck), tb = t0 + c0;
    __syncthreads();  // the previous chunk's reads are done and its state is in Ss
    if (!PF) fetch_wq(c0, L, 0);
    // K, M and U'; rows past the chunk: zeros.
    for (int r = rr; r < C; r += kRowStep) {
      const int64_t tr = tb + min(r, L - 1);
      cp_async16(smem_u32(Ks + r * LK + 4 * d4), a.conv_out + tr * conv_dim + key_dim + int64_t(hk) * D + 4 * d4,
                 r < L ? 16 : 0);
    }
    for (int i = tid; i < C * LC / 4; i += kThreads) {
      const int r = i / (LC / 4), c4 = i % (LC / 4);
      const int64_t tr = tb + min(r, L - 1);
      cp_async16(smem_u32(Ms + r * LC + 4 * c4), a.chunk_m + (tr * a.Hv + hv) * LC + 4 * c4, r < L ? 16 : 0);
    }
    {
      const int r = tid / (DV / 4), c4 = tid % (DV / 4);  // C * DV / 4 == kThreads
      const int64_t tr = tb + min(r, L - 1);
      cp_async16(smem_u32(Us + r * LU + 4 * c4), a.conv_out + tr * conv_dim + vcol + 4 * c4, r < L ? 16 : 0);
    }
    cp_async_commit();
    if (PF) {  // the next chunk's W and Q (an empty group after the last chunk keeps the counts uniform)
      const int c1 = c0 + L;
      if (c1 < n) fetch_wq(c1, gdn_chunk_len(c1, n, ck), buf ^ 1);
      else cp_async_commit();
    }
    // This chunk's W and Q are in.
    if (PF) cp_async_wait<2>();
    else cp_async_wait<1>();
    __syncthreads();
    float xy[2][4] = {};
    mma_tf32xn<P, 2, D / 8, LQ, 1, 1, LQ, true>(xy, (wx ? Wb : Qb) + (buf * C + xr) * LQ, Ss + xc * LQ);
    // K, M and U' are in.
    if (PF) cp_async_wait<1>();
    else cp_async_wait<0>();
    __syncthreads();
    for (int r = rr; r < C; r += kRowStep) {  // K rows times gamma_L / gamma_i
      float4* k4 = reinterpret_cast<float4*>(Ks + r * LK + 4 * d4);
      const float f = Ms[r * LC + C + 1];
      const float4 k = *k4;
      *k4 = make_float4(k.x * f, k.y * f, k.z * f, k.w * f);
    }
    if (wx) {
      // U = U' - X in place (rows past the chunk: U' and X are 0).
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = xr + g + 8 * h;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          float2* u = reinterpret_cast<float2*>(Us + i * LU + xc + 8 * nt + 2 * t4);
          const float2 p = *u;
          *u = make_float2(p.x - xy[nt][2 * h], p.y - xy[nt][2 * h + 1]);
        }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) xy[nt][e] *= Ms[(xr + g + 8 * (e >> 1)) * LC + C];  // gamma_i Y_i
    }
    __syncthreads();  // U and the scaled K are in
    if (!wx) {
      // o = gamma Y + M U, over U' in conv_out.
      mma_tf32xn<P, 2, C / 8, LC, 1, LU, 1, true>(xy, Ms + xr * LC, Us + xc);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = xr + g + 8 * h;
        if (i >= L) continue;
        float* od = a.conv_out + int64_t(tb + i) * conv_dim + vcol + xc + 2 * t4;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
          *reinterpret_cast<float2*>(od + 8 * nt) = make_float2(xy[nt][2 * h], xy[nt][2 * h + 1]);
      }
    }
    // S = gamma_L S0 + U^T (K scaled): state rows xr .. xr + 15, key dims sk .. sk + D/4 - 1.
    constexpr int NT = D / 32;
    const float gl = Ms[(L - 1) * LC + C];
    float sacc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[nt][e] = gl * Ss[(xr + g + 8 * (e >> 1)) * LQ + sk + 8 * nt + 2 * t4 + (e & 1)];
    mma_tf32xn<P, NT, C / 8, 1, LU, LK, 1>(sacc, Us + xr, Ks + sk);
    __syncthreads();  // every warp's reads of S0 are done
    const int64_t ckg = c0 + L - 1 == ck ? state_head(a.ckpt_slot[s], a.Hv, hv, head_state) + int64_t(dv0) * D : -1;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int v = xr + g + 8 * h;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int d = sk + 8 * nt + 2 * t4;
        const float2 val = make_float2(sacc[nt][2 * h], sacc[nt][2 * h + 1]);
        *reinterpret_cast<float2*>(Ss + v * LQ + d) = val;
        if (ckg >= 0) store_state2(a.rec_state, a.rec_bf16, ckg + int64_t(v) * D + d, val);
      }
    }
    c0 += L;
  }
  cp_async_wait<0>();
  if (gdn_deferred(a, s)) return;
  __syncthreads();
  for (int v = rr; v < DV; v += kRowStep)
    store_state4(a.rec_state, a.rec_bf16, Sg + int64_t(v) * D + 4 * d4, *reinterpret_cast<const float4*>(Ss + v * LQ + 4 * d4));
}

template <int D, bool PF, int P>
void launch_state(const GdnArgs& a, int64_t conv_dim, cudaStream_t st) {
  gdn_chunk_state_kernel<D, PF, P>
      <<<dim3(static_cast<unsigned>(a.n_seqs * a.Hv), static_cast<unsigned>(D / kStateDv)), kThreads,
         state_smem_bytes<D, PF>(), st>>>(a, conv_dim);
  DS_CUDA_LAUNCH_CHECK();
}

// Per device, once for (D, P): the shared-memory opt-ins, and whether the fetching-ahead state kernel
// keeps two blocks per SM (sm_90; not sm_86).
template <int D, int P>
bool state_prefetch_fits() {
  constexpr std::size_t pf_smem = state_smem_bytes<D, true>();
  static std::atomic<int> plan[kMaxDevices];  // 0: unset, 1: single buffers, 2: fetch ahead
  std::atomic<int>& p = plan[current_device()];
  if (p.load() == 0) {
    DS_CUDA_CHECK(cudaFuncSetAttribute(gdn_chunk_prep_kernel<D, P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(prep_smem_bytes<D>())));
    DS_CUDA_CHECK(cudaFuncSetAttribute(gdn_chunk_state_kernel<D, false, P>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(state_smem_bytes<D, false>())));
    int blocks = 0;
    const bool pf = pf_smem <= std::size_t(device_smem_optin()) &&
                    cudaFuncSetAttribute(gdn_chunk_state_kernel<D, true, P>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(pf_smem)) == cudaSuccess &&
                    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, gdn_chunk_state_kernel<D, true, P>,
                                                                  kThreads, pf_smem) == cudaSuccess &&
                    blocks >= 2;
    (void)cudaGetLastError();  // a refused opt-in leaves no error behind
    p.store(pf ? 2 : 1);
  }
  return p.load() == 2;
}

template <int D, int P>
void run(const GdnArgs& a, int64_t conv_dim, cudaStream_t st) {
  const bool pf = state_prefetch_fits<D, P>();
  // Each sequence has at most ceil(n / C) + 1 chunks (a checkpoint cuts one in two).
  const int max_chunks = (a.n_tokens + C - 1) / C + 2 * a.n_seqs;
  gdn_chunk_prep_kernel<D, P><<<dim3(static_cast<unsigned>(max_chunks), static_cast<unsigned>(a.Hv)), kThreads,
                                 prep_smem_bytes<D>(), st>>>(a, conv_dim);
  DS_CUDA_LAUNCH_CHECK();
  if (pf && a.chunk_prefetch) launch_state<D, true, P>(a, conv_dim, st);
  else launch_state<D, false, P>(a, conv_dim, st);
}

}  // namespace

bool gdn_uses_chunked_mma(const GdnArgs& a) {
  return a.chunked && a.chunked_mma && a.n_tokens > 8 * a.n_seqs && a.Dk == a.Dv && (a.Dk == 64 || a.Dk == 128);
}

void launch_gdn_chunked_mma(const GdnArgs& a, int64_t conv_dim, cudaStream_t s) {
  const bool x3 = a.tf32_parts == 3;
  if (a.Dk == 64) x3 ? run<64, 3>(a, conv_dim, s) : run<64, 1>(a, conv_dim, s);
  else x3 ? run<128, 3>(a, conv_dim, s) : run<128, 1>(a, conv_dim, s);
}

}  // namespace deltaserve::cuda
