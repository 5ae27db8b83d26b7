// Device helpers shared by the Gated DeltaNet kernels (cuda_gated_delta_net.cu: conv, prep, the
// sequential and CUDA-core chunked recurrences; cuda_gdn_chunked_mma.cu: the tensor-core chunked
// recurrence). Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_launch.h"

namespace deltaserve::cuda {

__device__ __forceinline__ bool gdn_deferred(const GdnArgs& a, int s) { return a.defer && a.defer[s]; }

// The recurrent state in memory: f32, or bf16 (--mamba-ssm-dtype bfloat16: the upper halves of
// f32s, rounded to nearest even on store, as the CPU's f32_to_bf16). Elements i .. i + 3 (i a
// multiple of 4) of the state at `base`; kernels compute on f32 registers either way.
__device__ __forceinline__ float4 load_state4(const void* base, bool bf16, int64_t i) {
  if (!bf16) return *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
  const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(base) + i);
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                     __uint_as_float(u.y & 0xffff0000u));
}
__device__ __forceinline__ void store_state4(void* base, bool bf16, int64_t i, float4 v) {
  if (!bf16) {
    *reinterpret_cast<float4*>(static_cast<float*>(base) + i) = v;
    return;
  }
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&lo);
  u.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(base) + i) = u;
}
// Elements i, i + 1 (i even).
__device__ __forceinline__ void store_state2(void* base, bool bf16, int64_t i, float2 v) {
  if (!bf16) {
    *reinterpret_cast<float2*>(static_cast<float*>(base) + i) = v;
    return;
  }
  *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(base) + i) = __floats2bfloat162_rn(v.x, v.y);
}
// One bulk copy of bytes (a multiple of 16, both ends 16-byte aligned) from global memory into this
// block's shared memory (cp.async.bulk, sm_90), completing on the mbarrier bar: one thread calls
// bulk_copy_start; every thread that reads dst calls bulk_copy_wait after a __syncthreads that
// follows the start (the barrier's initialisation is then visible). A barrier serves one copy.
__device__ __forceinline__ void bulk_copy_start(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(d),
               "l"(src), "r"(bytes), "r"(b)
               : "memory");
#else
  (void)dst, (void)src, (void)bytes, (void)bar;
  __trap();  // callers copy only on sm_90
#endif
}
__device__ __forceinline__ void bulk_copy_wait(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  uint32_t done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(b)
                 : "memory");
#else
  (void)bar;
#endif
}

// Element offset of (slot, value head hv) in a recurrent state [slots, Hv, Dv, Dk].
__device__ __forceinline__ int64_t state_head(int64_t slot, int Hv, int hv, int64_t head_state) {
  return (slot * Hv + hv) * head_state;
}

// The checkpoint token of sequence s for the chunked kernels (-1: none; a deferred run saves none).
__device__ __forceinline__ int gdn_checkpoint(const GdnArgs& a, int s) {
  return a.ckpt_at && !gdn_deferred(a, s) ? a.ckpt_at[s] : -1;
}

// Length of the chunk of a sequence of n tokens that starts at c0: kGdnChunk tokens, the rest of
// the run, or up to and including the checkpoint token ck (so that the state after it exists).
__device__ __forceinline__ int gdn_chunk_len(int c0, int n, int ck) {
  int L = min(kGdnChunk, n - c0);
  if (ck >= c0 && ck < c0 + L) L = ck - c0 + 1;
  return L;
}

// One warp, lane i < L: the log of gamma_i = g_1 ... g_i (the decays of the chunk's tokens from
// token t, value head hv, from prep's gb) by a scan; beta_i into *beta. Lanes past L: beta 0 and
// the sum so far (their tokens do not exist; callers mask them).
__device__ __forceinline__ float gdn_chunk_log_gamma(const GdnArgs& a, int t, int hv, int L, int lane, float* beta) {
  const bool ok = lane < L;
  const float* gb = a.gb + (int64_t(t + lane) * a.Hv + hv) * 2;
  *beta = ok ? gb[0] : 0.f;
  float lg = ok ? logf(fmaxf(gb[1], 1e-30f)) : 0.f;  // log decay (a decay of 0 stays ~1e-30)
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float x = __shfl_up_sync(0xffffffffu, lg, o);
    if (lane >= o) lg += x;
  }
  return lg;
}

// The tensor-core chunked recurrence (cuda_gdn_chunked_mma.cu) for a run gdn_uses_chunked_mma
// accepts: o lands in conv_out's value columns (not in out, which it uses as scratch).
void launch_gdn_chunked_mma(const GdnArgs& a, int64_t conv_dim, cudaStream_t s);

}  // namespace deltaserve::cuda
