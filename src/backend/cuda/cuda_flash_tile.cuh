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

// The key tiles [*begin, *end) of tiles of bn keys that split `split` of n_split scores for query
// rows whose last position is n_keys - 1: the context's tiles cut evenly, each split at least
// min_tiles (the last splits may get none). One split: all of them.
__device__ __forceinline__ void flash_split_tiles(int n_keys, int bn, int n_split, int split, int min_tiles,
                                                  int* begin, int* end) {
  const int n_tiles = (n_keys + bn - 1) / bn;
  int per = (n_tiles + n_split - 1) / n_split;
  per = per > min_tiles ? per : min_tiles;
  const int b = split * per;
  *begin = b < n_tiles ? b : n_tiles;
  *end = b + per < n_tiles ? b + per : n_tiles;
}

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
  // A row sees no key yet (m = -inf) only in a split of the context that starts past its position
  // (with one split, key 0 is in the first tile and never masked): its sums stay 0.
  const float mn0 = fmaxf(r.m0, mx0), mn1 = fmaxf(r.m1, mx1);
  const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
  if (__any_sync(0xffffffffu, mn0 > r.m0 || mn1 > r.m1)) {
    const float c0 = exp2f(r.m0 - mu0), c1 = exp2f(r.m1 - mu1);  // 0 on a row's first keys (m = -inf)
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
    sc[n][0] = exp2f(sc[n][0] - mu0);
    sc[n][1] = exp2f(sc[n][1] - mu0);
    sc[n][2] = exp2f(sc[n][2] - mu1);
    sc[n][3] = exp2f(sc[n][3] - mu1);
    rs0 += sc[n][0] + sc[n][1];
    rs1 += sc[n][2] + sc[n][3];
  }
  r.l0 += rs0;  // per-lane partial sums; flash_store_rows adds up the quad's
  r.l1 += rs1;
}

// The epilogue of a thread's rows t_row and t_row + 8 (tokens; those past t_last are not stored) of
// query head h: O / l, the sigmoid output gate, f32 stores into a.out. With the context split
// (a.n_split > 1), split `split`'s partial instead, as the decode kernels write theirs for
// attn_combine_kernel: max in natural-log units, sum, unnormalised O (zeros for a row that saw
// no key in this split).
template <int HD>
__device__ __forceinline__ void flash_store_rows(const AttnArgs& a, const float (&o)[HD / 8][4], FlashRows r, int t_row,
                                                 int t_last, int h, int tig, int split) {
  r.l0 += __shfl_xor_sync(0xffffffffu, r.l0, 1);
  r.l0 += __shfl_xor_sync(0xffffffffu, r.l0, 2);
  r.l1 += __shfl_xor_sync(0xffffffffu, r.l1, 1);
  r.l1 += __shfl_xor_sync(0xffffffffu, r.l1, 2);
  if (a.n_split > 1) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int t = t_row + 8 * half;
      if (t > t_last) continue;
      const int64_t pi = (int64_t(t) * a.n_heads + h) * a.n_split + split;
      if (tig == 0) {
        a.part_ml[pi * 2] = (half ? r.m1 : r.m0) * 0.6931471805599453f;  // log2 -> natural log
        a.part_ml[pi * 2 + 1] = half ? r.l1 : r.l0;
      }
      float* dst = a.part_o + pi * HD;
#pragma unroll
      for (int n = 0; n < HD / 8; ++n)
        *reinterpret_cast<float2*>(dst + n * 8 + 2 * tig) = make_float2(o[n][2 * half], o[n][2 * half + 1]);
    }
    return;
  }
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
