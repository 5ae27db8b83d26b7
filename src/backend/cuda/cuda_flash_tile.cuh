// What the two prefill attention kernels share (cuda_flash_attention.cu by mma.sync,
// cuda_flash_attention_wgmma.cu by wgmma): both hold a key tile's scores S and the output O in the
// mma.sync accumulator layout (per warp 16 rows; a thread holds rows g and g + 8, a row's columns
// spread over its quad's 4 lanes), so the online softmax and the epilogue are one piece of code.
// Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_launch.h"

namespace deltaserve::cuda {

// The (sequence s, token tile) of block index idx, over the batch's sequences cut into tiles of bt
// tokens, each sequence's last (longest) tiles first: returns s; *tile is the tile within it.
__device__ __forceinline__ int flash_block_tile(const AttnArgs& a, int idx, int bt, int* tile) {
  for (int s = 0;; ++s) {
    const int nt = (a.seq_start[s + 1] - a.seq_start[s] + bt - 1) / bt;
    if (idx < nt || s == a.n_seqs - 1) {
      *tile = nt - 1 - idx;
      return s;
    }
    idx -= nt;
  }
}

// The online softmax of a thread's two rows: running maxima (log2 units) and per-lane partial sums.
struct FlashRows {
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
};

// One key tile of NT_S n-tiles of 8 keys from j0: the causal mask (key against the rows' query
// positions qpos0 / qpos1), scores scaled by sl2 (the softmax scale in log2 units), the rows' new
// maxima (O and l rescaled when one grew; skipped when no row of the warp's did, rare after the
// first tiles), and sc turned into the unnormalised probabilities exp2(s - m).
template <int NT_S, int NT_O>
__device__ __forceinline__ void flash_softmax_tile(float (&sc)[NT_S][4], float (&o)[NT_O][4], FlashRows& r, int j0,
                                                   int tig, int qpos0, int qpos1, float sl2) {
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int n = 0; n < NT_S; ++n) {
    const int key = j0 + n * 8 + 2 * tig;
    sc[n][0] = key <= qpos0 ? sc[n][0] * sl2 : -INFINITY;
    sc[n][1] = key + 1 <= qpos0 ? sc[n][1] * sl2 : -INFINITY;
    sc[n][2] = key <= qpos1 ? sc[n][2] * sl2 : -INFINITY;
    sc[n][3] = key + 1 <= qpos1 ? sc[n][3] * sl2 : -INFINITY;
    mx0 = fmaxf(mx0, fmaxf(sc[n][0], sc[n][1]));
    mx1 = fmaxf(mx1, fmaxf(sc[n][2], sc[n][3]));
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  // Key 0 is in tile 0 and never masked, so m is finite from the first tile on.
  const float mn0 = fmaxf(r.m0, mx0), mn1 = fmaxf(r.m1, mx1);
  if (__any_sync(0xffffffffu, mn0 > r.m0 || mn1 > r.m1)) {
    const float c0 = exp2f(r.m0 - mn0), c1 = exp2f(r.m1 - mn1);  // 0 on the first tile (m = -inf)
    r.l0 *= c0;
    r.l1 *= c1;
#pragma unroll
    for (int n = 0; n < NT_O; ++n) {
      o[n][0] *= c0;
      o[n][1] *= c0;
      o[n][2] *= c1;
      o[n][3] *= c1;
    }
  }
  r.m0 = mn0;
  r.m1 = mn1;
  float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
  for (int n = 0; n < NT_S; ++n) {
    sc[n][0] = exp2f(sc[n][0] - mn0);
    sc[n][1] = exp2f(sc[n][1] - mn0);
    sc[n][2] = exp2f(sc[n][2] - mn1);
    sc[n][3] = exp2f(sc[n][3] - mn1);
    rs0 += sc[n][0] + sc[n][1];
    rs1 += sc[n][2] + sc[n][3];
  }
  r.l0 += rs0;  // per-lane partial sums; flash_store_rows adds up the quad's
  r.l1 += rs1;
}

// The epilogue of a thread's rows t_row and t_row + 8 (tokens; those past t_last are not stored) of
// query head h: O / l, the sigmoid output gate, f32 stores into a.out.
template <int HD>
__device__ __forceinline__ void flash_store_rows(const AttnArgs& a, const float (&o)[HD / 8][4], FlashRows r, int t_row,
                                                 int t_last, int h, int tig) {
  r.l0 += __shfl_xor_sync(0xffffffffu, r.l0, 1);
  r.l0 += __shfl_xor_sync(0xffffffffu, r.l0, 2);
  r.l1 += __shfl_xor_sync(0xffffffffu, r.l1, 1);
  r.l1 += __shfl_xor_sync(0xffffffffu, r.l1, 2);
  const float inv0 = 1.0f / r.l0, inv1 = 1.0f / r.l1;
  const int nh = a.n_heads, q_width = a.output_gate ? 2 * HD : HD;
  const int64_t row = int64_t(nh) * q_width + 2 * int64_t(a.n_kv_heads) * HD;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int t = t_row + 8 * half;
    if (t > t_last) continue;
    const float inv = half ? inv1 : inv0;
    float* dst = a.out + int64_t(t) * nh * HD + int64_t(h) * HD;
    const float* gate = a.qkv + int64_t(t) * row + int64_t(h) * q_width + HD;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      const int d = n * 8 + 2 * tig;
      float2 v = make_float2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
      if (a.output_gate) {
        const float2 gv = *reinterpret_cast<const float2*>(gate + d);
        v.x *= 1.0f / (1.0f + expf(-gv.x));
        v.y *= 1.0f / (1.0f + expf(-gv.y));
      }
      *reinterpret_cast<float2*>(dst + d) = v;
    }
  }
}

}  // namespace deltaserve::cuda
