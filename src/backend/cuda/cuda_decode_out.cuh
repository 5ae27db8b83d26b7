// The last write of a split-KV decode / verification attention kernel, shared by the CUDA-core
// (cuda_decode_attention.cu) and tensor-core (cuda_decode_attention_mma.cu) kernels. Included by
// .cu files only.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_launch.h"

namespace deltaserve::cuda {

// Element d of (token t, query head h) from its split: with the context split, the split's
// partial (M = its max score in natural-log units, L = Σ e^(s - M), O = Σ e^(s - M) v[d]) for
// the combine kernel; with one split, the output O / L. Both times the layer's v scale; the
// output also times the sigmoid gate when the layer has one.
template <int HD>
__device__ __forceinline__ void write_decode_result(const AttnArgs& a, int t, int h, int split, int d, float M,
                                                    float L, float O) {
  const int nh = a.n_heads;
  if (a.n_split > 1) {
    const int64_t pi = (int64_t(t) * nh + h) * a.n_split + split;
    if (d == 0) {
      a.part_ml[pi * 2] = M;
      a.part_ml[pi * 2 + 1] = L;
    }
    a.part_o[pi * HD + d] = O * a.v_scale;
    return;
  }
  float v = O / L * a.v_scale;
  if (a.output_gate) {
    const int64_t qkv_row = int64_t(nh) * 2 * HD + 2 * int64_t(a.n_kv_heads) * HD;
    const float gt = a.qkv[int64_t(t) * qkv_row + int64_t(h) * 2 * HD + HD + d];
    v *= 1.0f / (1.0f + expf(-gt));
  }
  a.out[(int64_t(t) * nh + h) * HD + d] = v;
}

}  // namespace deltaserve::cuda
