// The per-head q / k preparation of gated attention, shared by qk_prep_kernel (cuda_attention.cu)
// and the tensor-core decode kernel that does it itself (cuda_decode_attention_mma.cu): the same
// arithmetic in the same order, so both give the same bits. Included by .cu files only.
#pragma once

#include <cstdint>

namespace deltaserve::cuda {

constexpr int kMaxPrepHeadDim = 256;

// One head row by one warp: RMSNorm with weight w (x / sqrt(mean(x²) + eps) * w), then partial
// RoPE (rotate-half over the first 2 * half dims, angle pos * inv_freq[d]); emit(d, value) for
// each dim d < hd (hd <= 256), after every lane has read the normalised row. buf: hd floats of
// shared memory, the warp's own (emit may write it).
template <typename Emit>
__device__ __forceinline__ void norm_rope_row(const float* src, const float* w, int hd, int half,
                                              const float* inv_freq, int32_t pos, float eps, float* buf, int lane,
                                              Emit&& emit) {
  constexpr int NI = kMaxPrepHeadDim / 32;
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) {
      const float v = src[d];
      buf[d] = v;
      ss += v * v;
    }
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv = 1.0f / sqrtf(ss / float(hd) + eps);
  __syncwarp();
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) buf[d] = buf[d] * inv * w[d];
  }
  __syncwarp();
  float out[NI];
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int d = lane + 32 * i;
    if (d >= hd) break;
    float o = buf[d];
    if (d < half) {
      const float ang = float(pos) * inv_freq[d];
      o = buf[d] * cosf(ang) - buf[d + half] * sinf(ang);
    } else if (d < 2 * half) {
      const float ang = float(pos) * inv_freq[d - half];
      o = buf[d] * cosf(ang) + buf[d - half] * sinf(ang);
    }
    out[i] = o;
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) emit(d, out[i]);
  }
  __syncwarp();
}

}  // namespace deltaserve::cuda
