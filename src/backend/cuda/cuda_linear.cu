// One-row matmul for decode: out[N] (=|+=) x[K] · w[N, K]ᵀ with x f32, w bf16, f32 accumulation
// (the same function as cpu_matmul; only the summation order differs). Bound by streaming the
// weights once (one FMA per weight element): a block owns R consecutive weight rows; a thread loads
// 8 bf16 (16 bytes, non-coherent, no L1 allocation) per row per step, U steps at a time, so that
// each thread keeps U*R*16 bytes in flight. x is re-read through L1 (small, shared by all blocks);
// each x load is reused for R rows. With round_x, x is rounded to bf16 first (the default GEMM
// mode: the values cuBLAS gets for two or more rows, so a verification row sees what a decode row
// sees). More rows go to cuBLAS (CudaKernels::matmul).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_launch.h"
#include "backend/cuda/cuda_pdl.cuh"

namespace deltaserve::cuda {

namespace {

__device__ __forceinline__ uint4 load_stream(const uint16_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// x: written by the kernel before, which may still run when this one starts (PDL). Read with a
// coherent load: a non-coherent one (__ldg) may be scheduled above pdl_wait(), since it promises
// data that no kernel changes (seen on the H200: the one-row GEMV read stale activations once
// nothing but the wait separated the two).
__device__ __forceinline__ float4 load_act(const float* p) {
  float4 v;
  asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ float lo_bf16(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi_bf16(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

__device__ __forceinline__ float dot8(const uint4& w, const float4& a, const float4& b, float acc) {
  acc = fmaf(lo_bf16(w.x), a.x, acc);
  acc = fmaf(hi_bf16(w.x), a.y, acc);
  acc = fmaf(lo_bf16(w.y), a.z, acc);
  acc = fmaf(hi_bf16(w.y), a.w, acc);
  acc = fmaf(lo_bf16(w.z), b.x, acc);
  acc = fmaf(hi_bf16(w.z), b.y, acc);
  acc = fmaf(lo_bf16(w.w), b.z, acc);
  acc = fmaf(hi_bf16(w.w), b.w, acc);
  return acc;
}

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// One block per R consecutive weight rows; the block's threads split K (thread i takes 16-byte
// chunks i, i + 256, ...), so even N = 5120 gives 1280 blocks and the load spreads evenly over
// the SMs. Partial sums: warp shuffle, then across warps through shared memory (deterministic).
// What the GEMV applies to its input row on the way in: nothing; RMSNorm (x times the norm weight
// in the loop, the row's 1/rms applied to the sums at the end: no extra pass over x); SiLU-mul of
// x = [gate | up] (2K columns), computed as the silu_mul kernel does. round_x (kPlain and kSiluMul):
// the input values rounded to bf16, as the GEMM's input conversion rounds them.
enum Prologue : int { kPlain = 0, kRmsNorm = 1, kSiluMul = 2 };

__device__ __forceinline__ float silu_mul1(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__device__ __forceinline__ float4 round_bf16(float4 v) {
  return make_float4(__bfloat162float(__float2bfloat16_rn(v.x)), __bfloat162float(__float2bfloat16_rn(v.y)),
                     __bfloat162float(__float2bfloat16_rn(v.z)), __bfloat162float(__float2bfloat16_rn(v.w)));
}

template <int R, int U, int PRO = kPlain>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const float* x, int64_t K,
                                                        const uint16_t* __restrict__ w, int64_t N,
                                                        float* __restrict__ out, bool accumulate, bool round_x,
                                                        const float* __restrict__ norm, float eps) {
  __shared__ float red[kWarps][R];
  __shared__ float red_ss[kWarps];
  float ss = 0.f;  // kRmsNorm: sum of x^2 over this thread's chunks
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = int64_t(blockIdx.x) * R;
  const int64_t chunks = K / 8;
  const uint16_t* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = w + (row0 + r < N ? row0 + r : N - 1) * K;

  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;

  pdl_trigger();
  bool waited = false;  // pdl_wait() once the first weights are on their way (x comes after)
  for (int64_t c0 = threadIdx.x; c0 < chunks; c0 += int64_t(kThreads) * U) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + int64_t(u) * kThreads;
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = c < chunks ? load_stream(wr[r] + c * 8) : make_uint4(0, 0, 0, 0);
    }
    if (!waited) {
      pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + int64_t(u) * kThreads;
      if (c >= chunks) break;
      float4 a, b;
      if constexpr (PRO == kSiluMul) {
        const float* gp = x + c * 8;
        const float* up = x + K + c * 8;
        const float4 g0 = load_act(gp), g1 = load_act(gp + 4), u0 = load_act(up), u1 = load_act(up + 4);
        a = make_float4(silu_mul1(g0.x, u0.x), silu_mul1(g0.y, u0.y), silu_mul1(g0.z, u0.z), silu_mul1(g0.w, u0.w));
        b = make_float4(silu_mul1(g1.x, u1.x), silu_mul1(g1.y, u1.y), silu_mul1(g1.z, u1.z), silu_mul1(g1.w, u1.w));
      } else {
        a = load_act(x + c * 8);
        b = load_act(x + c * 8 + 4);
        if constexpr (PRO == kRmsNorm) {
          ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
          const float4* np = reinterpret_cast<const float4*>(norm + c * 8);
          const float4 n0 = __ldg(np), n1 = __ldg(np + 1);
          a = make_float4(a.x * n0.x, a.y * n0.y, a.z * n0.z, a.w * n0.w);
          b = make_float4(b.x * n1.x, b.y * n1.y, b.z * n1.z, b.w * n1.w);
        }
      }
      if (PRO != kRmsNorm && round_x) {
        a = round_bf16(a);
        b = round_bf16(b);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = dot8(wv[u][r], a, b, acc[r]);
    }
  }
  if (!waited) pdl_wait();

#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v = acc[r];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[warp][r] = v;
  }
  if constexpr (PRO == kRmsNorm) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red_ss[warp] = ss;
  }
  __syncthreads();
  const int r = threadIdx.x;
  if (r < R && row0 + r < N) {
    float v = 0.f;
#pragma unroll
    for (int q = 0; q < kWarps; ++q) v += red[q][r];
    if constexpr (PRO == kRmsNorm) {
      float sum = 0.f;
#pragma unroll
      for (int q = 0; q < kWarps; ++q) sum += red_ss[q];
      v *= 1.0f / sqrtf(sum / float(K) + eps);
    }
    float* dst = out + row0 + r;
    *dst = accumulate ? *dst + v : v;
  }
}

// Tile: rows per block x 10 + 16-byte loads per row in flight. Measured on the H200 (27B shapes):
// 8 rows x 1 load for N <= 8192 (down, o_proj), 2 rows x 4 loads above (gate_up, in_proj, qkv,
// lm_head); 4 x 2 (the earlier choice) was 3% slower over a decode step, and 2 x 2, 4 x 4, 2 x 8
// slower still. CudaOptions::gemv_shape forces one (A/B).
template <int PRO>
void run(const CudaOptions& o, const float* x, int64_t K, const uint16_t* w, int64_t N, float* out, bool accumulate,
         bool round_x, cudaStream_t s, const float* norm, float eps) {
  int device = 0;
  DS_CUDA_CHECK(cudaGetDevice(&device));
  const bool pdl = pdl_enabled(o, device);
  // The norm prologue reads the norm weight beside x in every block: 8 rows per block amortise it.
  const int shape = o.gemv_shape > 0 ? o.gemv_shape : (N <= 8192 || PRO == kRmsNorm ? 81 : 24);
  auto go = [&](auto kernel, int rows) {
    launch_pdl(pdl, kernel, dim3(static_cast<unsigned>((N + rows - 1) / rows)), dim3(kThreads), 0, s, x, K, w, N, out,
               accumulate, round_x, norm, eps);
  };
  if (shape == 81) go(gemv_kernel<8, 1, PRO>, 8);
  else if (shape == 42) go(gemv_kernel<4, 2, PRO>, 4);
  else go(gemv_kernel<2, 4, PRO>, 2);
}

bool aligned16(const void* a, const void* b, const void* c = nullptr) {
  return (reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) | reinterpret_cast<uintptr_t>(c)) % 16 == 0;
}

}  // namespace

int sm_count(int device) { return std::max(device_attribute(cudaDevAttrMultiProcessorCount, device, 1), 1); }

bool pdl_enabled(const CudaOptions& o, int device) {
  return o.pdl && device_attribute(cudaDevAttrComputeCapabilityMajor, device, 0) >= 9;
}

bool launch_gemv_prologue(const float* x, GemvPrologue prologue, const float* norm, float eps, int64_t K,
                          const uint16_t* w, int64_t N, float* out, bool accumulate, bool round_x,
                          const CudaOptions& o, cudaStream_t s) {
  if (K % 8 != 0 || N < 1 || !aligned16(x, w, norm)) return false;
  // The norm's 1/rms scales the sums at the end: the normed input is never formed, so it cannot be
  // rounded as the separate ops would round it.
  if (prologue == GemvPrologue::RmsNorm && round_x) return false;
  if (prologue == GemvPrologue::RmsNorm) run<kRmsNorm>(o, x, K, w, N, out, accumulate, false, s, norm, eps);
  else run<kSiluMul>(o, x, K, w, N, out, accumulate, round_x, s, nullptr, 0.f);
  return true;
}

bool launch_gemv(const float* x, int64_t K, const uint16_t* w, int64_t N, float* out, bool accumulate, bool round_x,
                 const CudaOptions& o, cudaStream_t s) {
  if (K % 8 != 0 || N < 1 || !aligned16(x, w)) return false;
  run<kPlain>(o, x, K, w, N, out, accumulate, round_x, s, nullptr, 0.f);
  return true;
}

}  // namespace deltaserve::cuda
