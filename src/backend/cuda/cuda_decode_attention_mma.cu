// Split-KV decode / verification attention on tensor cores (flash-decoding with mma.sync), for
// bf16 and fp8 KV caches. Reference: backend/cpu/cpu_attention.cpp; qk_prep_kernel
// (cuda_attention.cu) has normalised and rotated q into q_scratch [T, nh, HD] (f32) and written
// this step's k, v into the paged cache, or (AttnArgs::dec_fused_prep) the kernel does both itself.
//
// Grid (sequence, kv head, split). A block serves every query row that reads this KV head: the
// G heads of the GQA group for each of the sequence's tokens in the batch (1 for decode, k + 1
// for an MTP verification), so the keys are read from HBM once per (sequence, kv head), not once
// per token. Query row q = token * G + head; 8 rows per m-tile (MT <= 4 tiles, 32 rows).
//
// Precision trick: an m16n8k16 tile has 16 rows; the block uses 8 query rows per tile and puts
// the bf16 "hi" part of each row in rows 0-7 and the bf16 remainder ("lo" = x - hi) in rows 8-15.
// A thread's accumulator fragment holds row r and row r + 8, so S = Q_hi K^T + Q_lo K^T is one add
// in registers: q keeps 16 significant bits; K and V are exact in bf16 (bf16 cache, or fp8 widened
// to bf16 exactly). The same for P · V: P_hi in rows 0-7, P_lo in rows 8-15. So the result is as
// close to the f32 reference as the CUDA-core kernel's, at tensor-core speed.
//
// Keys: tiles of BN keys (a split's range is whole tiles), STAGES-deep cp.async pipeline into
// shared memory (bf16 tiles; fp8 tiles land raw and the block widens them into one bf16 tile).
// Warp w computes m-tile w % MT over its share of the tile's keys (KG = warps / MT key groups,
// 16 keys a step): S = Q K^T (ldmatrix of K rows), online softmax in the exp2 domain on the
// fragments, O += P V (ldmatrix.trans of V rows), O (16 x HD f32) in registers. At the end the
// warps of an m-tile merge through shared memory and the block writes the gated output (one
// split) or its partial (max in natural log, sum, unnormalised o) for the combine kernel.
//
// Graph safety: the split count depends on the batch shape only; each split's key range is
// computed on the device from the sequence's last position (>= dec_min_keys keys per split).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_decode_out.cuh"
#include "backend/cuda/cuda_kv.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_launch.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_qk_prep.cuh"

namespace deltaserve::cuda {

namespace {

constexpr int kMaxWarps = 4;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared memory: the pipeline (STAGES bf16 K/V tiles of BN padded rows; for fp8, STAGES raw tiles
// + one bf16 tile), reused after the loop by the warps' merge ([warps][8][HD + 2] floats).
constexpr std::size_t mma_tile_bytes(int hd, int bn) { return std::size_t(2) * bn * (hd + 8) * 2; }
constexpr std::size_t mma_pipe_bytes(int hd, int bn, int stages, int elem_bytes) {
  const std::size_t pipe = elem_bytes == 2 ? stages * mma_tile_bytes(hd, bn)
                                           : stages * std::size_t(2) * bn * hd * elem_bytes + mma_tile_bytes(hd, bn);
  const std::size_t merge = std::size_t(kMaxWarps) * 8 * (hd + 2) * 4;
  return pipe > merge ? pipe : merge;
}
// + the ring of (stages + 1) tables of each key's cache row (block id * block_size + offset).
constexpr std::size_t mma_smem_bytes(int hd, int bn, int stages, int elem_bytes) {
  return mma_pipe_bytes(hd, bn, stages, elem_bytes) + std::size_t(stages + 1) * bn * 4;
}

__device__ __forceinline__ uint32_t hi_lo_bf16(float x0, float x1, uint32_t* lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(h);
  *lo = pack_bf16(x0 - hf.x, x1 - hf.y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <int HD, KvType KV, int BN, int STAGES>
__global__ void __launch_bounds__(32 * kMaxWarps, 1) decode_mma_kernel(AttnArgs a) {
  using St = KvStorage<KV>;
  constexpr bool kRaw = KV != KvType::BF16;  // fp8: raw tiles, widened into one bf16 tile
  constexpr int LD = HD + 8;                 // padded bf16 row (16 bytes of skew)
  constexpr int CPR = HD * int(sizeof(St)) / 16;  // 16-byte chunks per cache row
  constexpr int EPC = 16 / int(sizeof(St));       // cache elements per chunk
  constexpr int KT = HD / 16;                     // k-steps of S = Q K^T
  constexpr int NT = HD / 8;                      // n-tiles of O
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* tiles = reinterpret_cast<uint16_t*>(smem);  // bf16 [STAGES or 1][K, V][BN][LD]
  unsigned char* raw = smem + (kRaw ? mma_tile_bytes(HD, BN) : 0);  // fp8 [STAGES][K, V][BN][HD]
  // Cache rows of the keys of tile t in row_tab[t % (STAGES + 1)] (-1: past the split), filled a
  // tile before its copies are issued, so the block-table reads never stall the copies.
  int32_t* row_tab = reinterpret_cast<int32_t*>(smem + mma_pipe_bytes(HD, BN, STAGES, int(sizeof(St))));

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, nthreads = blockDim.x;
  const int s = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int MT = a.dec_mma_mt, KG = a.dec_mma_kg;
  const int mt = warp % MT, kg = warp / MT;
  const int nh = a.n_heads, nkv = a.n_kv_heads, G = nh / nkv, bs = a.block_size;
  const int t0 = a.seq_start[s], n_s = a.seq_start[s + 1] - t0;
  const int n_keys = a.positions[t0 + n_s - 1] + 1;  // positions increase within a sequence
  int per = (n_keys + a.n_split - 1) / a.n_split;
  per = max(per, a.dec_min_keys);
  per = (per + BN - 1) / BN * BN;
  const int j_begin = split * per;
  const int j_end = min(n_keys, j_begin + per);
  const int n_tiles = j_end > j_begin ? (j_end - j_begin + BN - 1) / BN : 0;
  const int32_t* bt = a.block_table + int64_t(s) * a.max_blocks;
  const St* kc = static_cast<const St*>(a.k_cache);
  const St* vc = static_cast<const St*>(a.v_cache);

  // This thread's query row (fragment row lane / 4 of its warp's m-tile): token i, head g.
  const int qrow = mt * 8 + (lane >> 2);
  const int tok = qrow / G, g = qrow % G;
  const bool row_ok = tok < n_s;
  const int my_pos = row_ok ? a.positions[t0 + tok] : -1;  // keys <= my_pos are visible

  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m = -INFINITY, l = 0.f;  // this row's running max (log2 domain) and this thread's share of the sum

  // Threads 0 .. BN-1 read key tid of tile it's block-table entry (fetch_row) and, an iteration
  // later, store its cache row (store_row): the read's latency hides behind a tile of compute.
  auto fetch_row = [&](int it) -> int32_t {
    const int j = j_begin + it * BN + tid;
    return tid < BN && it < n_tiles && j < j_end ? bt[j / bs] * bs + j % bs : -1;
  };
  auto store_row = [&](int it, int32_t row) {
    if (tid < BN && it < n_tiles) row_tab[(it % (STAGES + 1)) * BN + tid] = row;
  };
  // Tile `it` into pipeline buffer it % STAGES, zeros past j_end. A thread copies one 16-byte
  // column c of a row's K and V, every (nthreads / CPR)-th row: one row-table read and one
  // address per two copies (the copy issue, not the math, bounds this kernel at batch 1).
  const int col = tid % CPR, row_step = nthreads / CPR;  // nthreads is a multiple of CPR (<= 32)
  auto load_tile = [&](int it) {
    const int b = it % STAGES;
    const int32_t* rows = row_tab + (it % (STAGES + 1)) * BN;
    for (int row = tid / CPR; row < BN; row += row_step) {
      const int32_t cr = rows[row];
      const int64_t off = (int64_t(cr) * nkv + kvh) * HD + col * EPC;
      const int bytes = cr >= 0 ? 16 : 0;
      uint32_t dk, dv;
      if constexpr (kRaw) {
        dk = smem_u32(raw + ((std::size_t(b) * 2) * BN + row) * HD * sizeof(St) + col * 16);
        dv = dk + BN * HD * sizeof(St);
      } else {
        dk = smem_u32(tiles + ((std::size_t(b) * 2) * BN + row) * LD + col * 8);
        dv = dk + BN * LD * 2;
      }
      cp_async16(dk, cr >= 0 ? kc + off : kc, bytes);
      cp_async16(dv, cr >= 0 ? vc + off : vc, bytes);
    }
  };

  // Before the wait (pdl_wait): the step's metadata (uploaded before it), the block table, and the
  // first tiles' keys when they all precede this step's first position (written by an earlier
  // step, never by a kernel of this one), so their latency hides behind the kernels before.
  if (n_keys <= a.l2_next_max_keys) l2_prefetch_share(a.l2_next, a.l2_next_bytes);
#pragma unroll
  for (int p = 0; p < STAGES; ++p) store_row(p, fetch_row(p));
  __syncthreads();
  const int first_new = a.positions[t0];
  int issued = 0;  // tiles (or empty groups) committed before the wait, in order
#pragma unroll
  for (int p = 0; p < STAGES - 1; ++p) {
    if (p < n_tiles && min(j_end, j_begin + (p + 1) * BN) > first_new) break;
    if (p < n_tiles) load_tile(p);
    cp_async_commit();
    ++issued;
  }
  pdl_wait();  // cuda_pdl.cuh: a small kernel waits, then lets the next one launch
  pdl_trigger();  // (a GEMV: it starts streaming its weights)
  // qk_prep's work (AttnArgs::dec_fused_prep) in a part of shared memory the pipeline does not use
  // before its loop (the last stage's tile; for fp8 the widened tile): first the keys and values of
  // this step's positions in this split's range (a warp per token; no other block reads them),
  // before the tiles that hold them are copied; then every query row of the block, [rows][HD] f32.
  float* prep = reinterpret_cast<float*>(kRaw ? smem : smem + std::size_t(STAGES - 1) * mma_tile_bytes(HD, BN));
  const int q_width = a.output_gate ? 2 * HD : HD;
  const int64_t q_cols = int64_t(nh) * q_width, kv_cols = int64_t(nkv) * HD;
  if (a.dec_fused_prep) {
    for (int i = warp; i < n_s; i += nthreads / 32) {
      const int32_t pos = a.positions[t0 + i];
      const int32_t block = pos >= j_begin && pos < j_end ? bt[pos / bs] : -1;
      if (block < 0) continue;
      const int64_t cache_row = ((int64_t(block) * bs + pos % bs) * nkv + kvh) * HD;
      const float* r = a.qkv + int64_t(t0 + i) * (q_cols + 2 * kv_cols) + q_cols + int64_t(kvh) * HD;
      St* kd = const_cast<St*>(kc) + cache_row;
      norm_rope_row(r, a.k_norm, HD, a.rotary_dim / 2, a.inv_freq, pos, a.eps, prep + warp * HD, lane,
                    [&](int d, float o) { kd[d] = kv_encode<KV>(o * a.k_inv_scale); });
      St* vd = const_cast<St*>(vc) + cache_row;
      for (int d = lane; d < HD; d += 32) vd[d] = kv_encode<KV>(r[kv_cols + d] * a.v_inv_scale);
    }
    __syncthreads();  // the new cache rows stored before their tiles' copies; prep free again
  }
#pragma unroll
  for (int p = 0; p < STAGES - 1; ++p) {
    if (p < issued) continue;
    if (p < n_tiles) load_tile(p);
    cp_async_commit();
  }
  if (a.dec_fused_prep) {
    for (int r = warp; r < n_s * G; r += nthreads / 32) {
      const float* src = a.qkv + int64_t(t0 + r / G) * (q_cols + 2 * kv_cols) + int64_t(kvh * G + r % G) * q_width;
      float* row = prep + std::size_t(r) * HD;
      norm_rope_row(src, a.q_norm, HD, a.rotary_dim / 2, a.inv_freq, a.positions[t0 + r / G], a.eps, row, lane,
                    [&](int d, float o) { row[d] = o; });
    }
    __syncthreads();  // (the first tile copied into prep's space comes after the loop's first barrier)
  }
  // Q fragments: hi in rows 0-7 (a0, a2), lo in rows 8-15 (a1, a3), pre-scaled into the exp2 domain.
  uint32_t qf[KT][4];
  {
    const float qs = a.scale * a.k_scale * kLog2e;
    const float* qp = a.dec_fused_prep
                          ? prep + std::size_t(row_ok ? qrow : 0) * HD + 2 * (lane & 3)
                          : a.q_scratch + (int64_t(t0 + (row_ok ? tok : 0)) * nh + kvh * G + g) * HD + 2 * (lane & 3);
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float2 x = row_ok ? *reinterpret_cast<const float2*>(qp + kk * 16 + half * 8) : make_float2(0.f, 0.f);
        uint32_t lo;
        qf[kk][2 * half] = hi_lo_bf16(x.x * qs, x.y * qs, &lo);
        qf[kk][2 * half + 1] = lo;
      }
    }
  }
  const int steps_per_warp = BN / 16 / KG;  // 16-key steps of each warp per tile
  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile `it` landed for every thread; tile it - 1 fully consumed
    if (it + STAGES - 1 < n_tiles) load_tile(it + STAGES - 1);  // its rows: filled an iteration ago
    cp_async_commit();
    const int32_t ahead_row = fetch_row(it + STAGES);  // stored at the end of this iteration
    const uint16_t* Kt;
    if constexpr (kRaw) {
      // Widen the raw fp8 tile into the bf16 tile (exact: fp8 values are bf16 values).
      const unsigned char* rb = raw + std::size_t(it % STAGES) * 2 * BN * HD;
      for (int idx = tid; idx < 2 * BN * HD / 8; idx += nthreads) {
        const int row = idx / (HD / 8), c8 = idx % (HD / 8);  // row over [K, V] x BN
        const uint2 w = *reinterpret_cast<const uint2*>(rb + std::size_t(row) * HD + c8 * 8);
        const uint32_t ww[2] = {w.x, w.y};
        float f[8];
        kv_decode_words<KV, 2>(ww, f);
        uint4 out;
        out.x = pack_bf16(f[0], f[1]);
        out.y = pack_bf16(f[2], f[3]);
        out.z = pack_bf16(f[4], f[5]);
        out.w = pack_bf16(f[6], f[7]);
        *reinterpret_cast<uint4*>(tiles + std::size_t(row) * LD + c8 * 8) = out;
      }
      __syncthreads();
      Kt = tiles;
    } else {
      Kt = tiles + std::size_t(it % STAGES) * 2 * BN * LD;
    }
    const uint16_t* Vt = Kt + BN * LD;
    const int j0 = j_begin + it * BN;
    for (int st = 0; st < steps_per_warp; ++st) {
      const int kb = (kg * steps_per_warp + st) * 16;  // first key of this step within the tile
      if (j0 + kb >= j_end) break;                      // warp-uniform
      // S = Q K^T for 16 keys: two n-tiles of 8 keys.
      float sacc[2][4], sacc2[2][4];  // even / odd k-steps: two independent mma chains per n-tile
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) sacc[n][e] = sacc2[n][e] = 0.f;
      {
        const int krow = kb + (lane & 7) + ((lane >> 4) << 3);
        const uint32_t kaddr = smem_u32(Kt + std::size_t(krow) * LD + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int kk = 0; kk < KT; kk += 2) {
          uint32_t b0, b1, b2, b3, c0, c1, c2, c3;
          ldsm_x4(kaddr + kk * 32, b0, b1, b2, b3);
          ldsm_x4(kaddr + (kk + 1) * 32, c0, c1, c2, c3);
          mma_bf16(sacc[0], qf[kk], b0, b1);
          mma_bf16(sacc[1], qf[kk], b2, b3);
          mma_bf16(sacc2[0], qf[kk + 1], c0, c1);
          mma_bf16(sacc2[1], qf[kk + 1], c2, c3);
        }
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) sacc[n][e] += sacc2[n][e];
      }
      // Scores of row lane/4: keys kb + 8n + 2(lane&3) + e; hi + lo halves summed.
      float sc[2][2];
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = j0 + kb + 8 * n + 2 * (lane & 3) + e;
          const float v = sacc[n][e] + sacc[n][e + 2];
          sc[n][e] = (j < j_end && j <= my_pos) ? v : -INFINITY;
          mx = fmaxf(mx, sc[n][e]);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m, mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet
      const float corr = exp2f(m - m_use);                  // 0 while m = -inf
      float p[2][2];
      float psum = 0.f;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          p[n][e] = exp2f(sc[n][e] - m_use);
          psum += p[n][e];
        }
      l = l * corr + psum;
      m = m_new;
      if (__any_sync(0xffffffffu, corr != 1.f)) {  // a row's maximum grew (rare after the first keys)
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          o[n][0] *= corr;
          o[n][1] *= corr;
          o[n][2] *= corr;
          o[n][3] *= corr;
        }
      }
      // P as the A operand: hi in rows 0-7, lo in rows 8-15; k = the 16 keys.
      uint32_t pa[4];
      pa[0] = hi_lo_bf16(p[0][0], p[0][1], &pa[1]);
      pa[2] = hi_lo_bf16(p[1][0], p[1][1], &pa[3]);
      // O += P V: V rows (keys) via ldmatrix.trans, two n-tiles of 8 dims per load.
      const int vrow = kb + (lane & 7) + (((lane >> 3) & 1) << 3);
      const uint32_t vaddr = smem_u32(Vt + std::size_t(vrow) * LD + ((lane >> 4) << 3));
#pragma unroll
      for (int dn = 0; dn < HD / 16; ++dn) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(vaddr + dn * 32, b0, b1, b2, b3);
        mma_bf16(o[2 * dn], pa, b0, b1);
        mma_bf16(o[2 * dn + 1], pa, b2, b3);
      }
    }
    store_row(it + STAGES, ahead_row);  // into tile it - 1's slot (its copies long issued)
  }
  cp_async_wait_all();
  __syncthreads();  // the pipeline's shared memory is free for the merge

  // Per warp: l over the quad, O = hi part + lo part; then the m-tile's warps merge.
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  float* s_buf = reinterpret_cast<float*>(smem);  // [warps][8][HD + 2]: m, l, o[HD]
  {
    float* rowp = s_buf + (std::size_t(warp) * 8 + (lane >> 2)) * (HD + 2);
    if ((lane & 3) == 0) {
      rowp[0] = m;
      rowp[1] = l;
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const int d = 8 * n + 2 * (lane & 3);
      rowp[2 + d] = o[n][0] + o[n][2];
      rowp[2 + d + 1] = o[n][1] + o[n][3];
    }
  }
  __syncthreads();
  for (int idx = tid; idx < MT * 8 * HD; idx += nthreads) {
    const int r = idx / HD, d = idx % HD;  // r: query row of the block (m-tile r / 8)
    const int ti = r / G, h = kvh * G + r % G;
    if (ti >= n_s) continue;
    float M = -INFINITY;
    for (int k = 0; k < KG; ++k) {
      const float* w = s_buf + (std::size_t(k * MT + r / 8) * 8 + r % 8) * (HD + 2);
      if (w[1] > 0.f) M = fmaxf(M, w[0]);
    }
    float L = 0.f, O = 0.f;
    for (int k = 0; k < KG; ++k) {
      const float* w = s_buf + (std::size_t(k * MT + r / 8) * 8 + r % 8) * (HD + 2);
      if (w[1] > 0.f) {
        const float f = exp2f(w[0] - M);
        L += f * w[1];
        O += f * w[2 + d];
      }
    }
    write_decode_result<HD>(a, t0 + ti, h, split, d, M * kLn2, L, O);  // M: log2 -> natural log
  }
}

template <int HD, KvType KV, int BN, int STAGES>
void launch(const AttnArgs& a, cudaStream_t s) {
  constexpr std::size_t smem = mma_smem_bytes(HD, BN, STAGES, int(sizeof(KvStorage<KV>)));
  static std::atomic<bool> configured[kMaxDevices];
  std::atomic<bool>& conf = configured[current_device()];
  if (!conf.load()) {
    DS_CUDA_CHECK(cudaFuncSetAttribute(decode_mma_kernel<HD, KV, BN, STAGES>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    conf.store(true);
  }
  const dim3 grid(static_cast<unsigned>(a.n_seqs), static_cast<unsigned>(a.n_kv_heads),
                  static_cast<unsigned>(a.n_split));
  // By PDL after one of ours: a one-row step's GEMV, or in a chain qk_prep (with the prep folded
  // in, a chain's kernel before this one is cuBLAS's, which PDL does not help: cuda_backend.cpp).
  launch_pdl(a.pdl || (a.pdl_chain && !a.dec_fused_prep), decode_mma_kernel<HD, KV, BN, STAGES>, grid,
             dim3(32 * a.dec_mma_mt * a.dec_mma_kg), smem, s, a);
  DS_CUDA_LAUNCH_CHECK();
}

template <int HD, KvType KV>
void run_hd(const AttnArgs& a, cudaStream_t s) {
  if (a.dec_mma_bn == 64 && a.dec_mma_stages == 3) return launch<HD, KV, 64, 3>(a, s);
  if (a.dec_mma_bn == 64) return launch<HD, KV, 64, 2>(a, s);
  if (a.dec_mma_stages == 4) return launch<HD, KV, 32, 4>(a, s);
  if (a.dec_mma_stages == 3) return launch<HD, KV, 32, 3>(a, s);
  launch<HD, KV, 32, 2>(a, s);
}

template <KvType KV>
void run_kv(const AttnArgs& a, cudaStream_t s) {
  switch (a.head_dim) {
    case 64: run_hd<64, KV>(a, s); break;
    case 128: run_hd<128, KV>(a, s); break;
    case 256: run_hd<256, KV>(a, s); break;
    default: cuda_fail("decode attention (mma)", "head_dim must be 64, 128 or 256", __FILE__, __LINE__);
  }
}

}  // namespace

bool decode_attention_mma_plan(int n_heads, int n_kv_heads, int head_dim, KvType kv, int n_seqs, int max_seq_tokens,
                               const CudaOptions& o, DecodeMmaPlan* plan) {
  if (kv == KvType::F32) return false;  // the f32 cache stays on the CUDA-core kernel (exact)
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) return false;
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || max_seq_tokens < 1) return false;
  const int rows = max_seq_tokens * (n_heads / n_kv_heads);
  if (rows > 8 * kMaxWarps) return false;
  const int elem = kv == KvType::BF16 ? 2 : 1;
  std::size_t limit = static_cast<std::size_t>(device_smem_optin());
  if (o.smem_per_block_cap > 0) limit = std::min(limit, static_cast<std::size_t>(o.smem_per_block_cap));
  // Tiles and depth (measured on the H200, bench_cuda_attention; bench/RESULTS.md): one query row
  // per sequence on few (sequence, kv head) pairs (batch 1: long splits): 64 keys x 3 stages, one
  // 4-warp block per SM with two tiles in flight; many pairs: 32 keys x 2 stages, three 2-warp
  // blocks per SM; verification rows (2+ m-tiles): 32 keys x 3. The options override; shrunk to
  // fit the device's shared memory.
  const int m_tiles = (rows + 7) / 8;
  const bool few_pairs = int64_t(n_seqs) * n_kv_heads * 4 < sm_count(current_device());
  int bn = m_tiles == 1 && few_pairs ? 64 : 32;
  int stages = m_tiles == 1 ? (few_pairs ? 3 : 2) : 3;
  if (o.decode_mma_keys == 32 || o.decode_mma_keys == 64) bn = o.decode_mma_keys;
  if (o.decode_mma_stages >= 2) stages = o.decode_mma_stages;
  stages = std::min(stages, bn == 64 ? 3 : 4);
  if (mma_smem_bytes(head_dim, bn, stages, elem) > limit) stages = 2;
  if (mma_smem_bytes(head_dim, bn, stages, elem) > limit) bn = 32;
  if (mma_smem_bytes(head_dim, bn, stages, elem) > limit) return false;
  plan->m_tiles = m_tiles;
  plan->key_groups = std::max(1, std::min(kMaxWarps / plan->m_tiles, bn / 16));
  plan->keys_per_tile = bn;
  plan->stages = stages;
  return true;
}

int decode_attention_mma_splits(int n_seqs, int n_kv_heads, int head_dim, const DecodeMmaPlan& plan,
                                const CudaOptions& o) {
  const int64_t blocks = int64_t(n_seqs) * n_kv_heads;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) (void)cudaGetLastError();
  // Resident blocks per SM: shared memory bound (the pipeline fills most of it at head_dim 256).
  const std::size_t per_block = mma_smem_bytes(head_dim, plan.keys_per_tile, plan.stages, 2) + 1024;
  int per_sm = static_cast<int>(std::size_t(228) * 1024 / per_block);
  per_sm = std::max(1, std::min(per_sm, o.decode_mma_blocks_per_sm > 0 ? o.decode_mma_blocks_per_sm : 4));
  const int64_t target = int64_t(sm_count(dev)) * per_sm;
  if (blocks <= 0 || blocks >= target) return 1;
  return static_cast<int>(std::min<int64_t>(target / blocks, std::max(1, o.decode_max_splits)));
}

void launch_decode_attention_mma(const AttnArgs& a, cudaStream_t s) {
  switch (a.kv_type) {
    case KvType::BF16: run_kv<KvType::BF16>(a, s); break;
    case KvType::E4M3: run_kv<KvType::E4M3>(a, s); break;
    case KvType::E5M2: run_kv<KvType::E5M2>(a, s); break;
    default: cuda_fail("decode attention (mma)", "bf16 or fp8 KV cache only", __FILE__, __LINE__);
  }
}

}  // namespace deltaserve::cuda
