// Skinny matmul for decode: out[T, N] (=|+=) x[T, K] · w[N, K]ᵀ with x f32, w bf16, f32
// accumulation (the same function as cpu_matmul; only the summation order differs).
//
// At T <= 8 the op is bound by streaming the weights once (T FMAs per weight element). A block owns
// R consecutive weight rows; a thread loads 8 bf16 (16 bytes, non-coherent, no L1 allocation) per
// row per step, U steps at a time, so that each thread keeps U*R*16 bytes in flight. x rows are
// re-read through L1 (small, shared by all blocks); each x load is reused for R rows. Above 8 rows
// the CUDA cores run out of FMA throughput (T FMAs per weight element): cuBLAS takes over.
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_launch.h"

namespace deltaserve::cuda {

namespace {

__device__ __forceinline__ uint4 load_stream(const uint16_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
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
template <int MAXT, int R, int U>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const float* __restrict__ x, int T, int64_t K,
                                                        const uint16_t* __restrict__ w, int64_t N,
                                                        float* __restrict__ out, bool accumulate) {
  __shared__ float red[kWarps][MAXT * R];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = int64_t(blockIdx.x) * R;
  const int64_t chunks = K / 8;
  const uint16_t* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = w + (row0 + r < N ? row0 + r : N - 1) * K;

  float acc[MAXT][R];
#pragma unroll
  for (int t = 0; t < MAXT; ++t)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[t][r] = 0.f;

  for (int64_t c0 = threadIdx.x; c0 < chunks; c0 += int64_t(kThreads) * U) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + int64_t(u) * kThreads;
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = c < chunks ? load_stream(wr[r] + c * 8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + int64_t(u) * kThreads;
      if (c >= chunks) break;
#pragma unroll
      for (int t = 0; t < MAXT; ++t) {
        if (t < T) {
          const float4* xp = reinterpret_cast<const float4*>(x + int64_t(t) * K + c * 8);
          const float4 a = __ldg(xp), b = __ldg(xp + 1);
#pragma unroll
          for (int r = 0; r < R; ++r) acc[t][r] = dot8(wv[u][r], a, b, acc[t][r]);
        }
      }
    }
  }

#pragma unroll
  for (int t = 0; t < MAXT; ++t) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[t][r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) red[warp][t * R + r] = v;
    }
  }
  __syncthreads();
  const int i = threadIdx.x;
  if (i < MAXT * R) {
    const int t = i / R, r = i % R;
    if (t < T && row0 + r < N) {
      float v = 0.f;
#pragma unroll
      for (int q = 0; q < kWarps; ++q) v += red[q][i];
      float* dst = out + int64_t(t) * N + row0 + r;
      *dst = accumulate ? *dst + v : v;
    }
  }
}

template <int MAXT, int R, int U>
void run(const float* x, int T, int64_t K, const uint16_t* w, int64_t N, float* out, bool accumulate,
         cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>((N + R - 1) / R);
  gemv_kernel<MAXT, R, U><<<blocks, kThreads, 0, s>>>(x, T, K, w, N, out, accumulate);
  DS_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool launch_gemv(const float* x, int T, int64_t K, const uint16_t* w, int64_t N, float* out,
                 bool accumulate, cudaStream_t s) {
  if (T < 1 || T > kGemvMaxRows || K % 8 != 0 || N < 1) return false;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16 != 0) return false;
  if (T == 1) run<1, 4, 2>(x, T, K, w, N, out, accumulate, s);
  else if (T == 2) run<2, 4, 2>(x, T, K, w, N, out, accumulate, s);
  // (R = 8 for T = 3..8, to halve the x re-reads, measured slower on the H200: 22.9 vs 21.6 ms for
  // the 27B 4-token verification forward.)
  else if (T <= 4) run<4, 4, 2>(x, T, K, w, N, out, accumulate, s);
  else run<8, 4, 2>(x, T, K, w, N, out, accumulate, s);
  return true;
}

}  // namespace deltaserve::cuda
