// Skinny matmul for decode: out[T, N] (=|+=) x[T, K] · w[N, K]ᵀ with x f32, w bf16, f32
// accumulation (the same function as cpu_matmul; only the summation order differs).
//
// T = 1 (gemv_kernel): bound by streaming the weights once (one FMA per weight element). A block
// owns R consecutive weight rows; a thread loads 8 bf16 (16 bytes, non-coherent, no L1 allocation)
// per row per step, U steps at a time, so that each thread keeps U*R*16 bytes in flight. x rows are
// re-read through L1 (small, shared by all blocks); each x load is reused for R rows.
//
// 2 <= T <= 8 (gemv_tc_kernel): on CUDA cores the T FMAs per weight element make the op compute
// bound (~10 TFLOP/s), so the tensor cores do it: mma.sync m16n8k16 with 16 weight rows as A (read
// straight from global memory with 16-byte loads, each weight once) and x^T as B (16 k x 8 tokens,
// tokens >= T are zero). Each f32 activation is split into hi = bf16(x) and lo = bf16(x - hi), two
// MMAs per weight fragment into f32 accumulators: x is carried to ~2^-17 relative, f32-like.
// Above 8 rows cuBLAS takes over.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

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
// What the GEMV applies to its input rows on the way in (1 row only): nothing; RMSNorm (x times
// the norm weight in the loop, the row's 1/rms applied to the sums at the end: no extra pass over
// x); SiLU-mul of x = [gate | up] (2K columns), computed as the silu_mul kernel does.
enum Prologue : int { kPlain = 0, kRmsNorm = 1, kSiluMul = 2 };

__device__ __forceinline__ float silu_mul1(float g, float u) { return g / (1.0f + expf(-g)) * u; }

template <int MAXT, int R, int U, int PRO = kPlain>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const float* __restrict__ x, int T, int64_t K,
                                                        const uint16_t* __restrict__ w, int64_t N,
                                                        float* __restrict__ out, bool accumulate,
                                                        const float* __restrict__ norm, float eps) {
  static_assert(PRO == kPlain || MAXT == 1, "prologues are for one row");
  __shared__ float red[kWarps][MAXT * R];
  __shared__ float red_ss[kWarps];
  float ss = 0.f;  // kRmsNorm: sum of x^2 over this thread's chunks
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
#pragma unroll
      for (int t = 0; t < MAXT; ++t) {
        if (t < T) {
          float4 a, b;
          if constexpr (PRO == kSiluMul) {
            const float4* gp = reinterpret_cast<const float4*>(x + int64_t(t) * 2 * K + c * 8);
            const float4* up = reinterpret_cast<const float4*>(x + int64_t(t) * 2 * K + K + c * 8);
            const float4 g0 = __ldg(gp), g1 = __ldg(gp + 1), u0 = __ldg(up), u1 = __ldg(up + 1);
            a = make_float4(silu_mul1(g0.x, u0.x), silu_mul1(g0.y, u0.y), silu_mul1(g0.z, u0.z), silu_mul1(g0.w, u0.w));
            b = make_float4(silu_mul1(g1.x, u1.x), silu_mul1(g1.y, u1.y), silu_mul1(g1.z, u1.z), silu_mul1(g1.w, u1.w));
          } else {
            const float4* xp = reinterpret_cast<const float4*>(x + int64_t(t) * K + c * 8);
            a = __ldg(xp);
            b = __ldg(xp + 1);
            if constexpr (PRO == kRmsNorm) {
              ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
              const float4* np = reinterpret_cast<const float4*>(norm + c * 8);
              const float4 n0 = __ldg(np), n1 = __ldg(np + 1);
              a = make_float4(a.x * n0.x, a.y * n0.y, a.z * n0.z, a.w * n0.w);
              b = make_float4(b.x * n1.x, b.y * n1.y, b.z * n1.z, b.w * n1.w);
            }
          }
#pragma unroll
          for (int r = 0; r < R; ++r) acc[t][r] = dot8(wv[u][r], a, b, acc[t][r]);
        }
      }
    }
  }
  if (!waited) pdl_wait();

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
  if constexpr (PRO == kRmsNorm) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red_ss[warp] = ss;
  }
  __syncthreads();
  const int i = threadIdx.x;
  if (i < MAXT * R) {
    const int t = i / R, r = i % R;
    if (t < T && row0 + r < N) {
      float v = 0.f;
#pragma unroll
      for (int q = 0; q < kWarps; ++q) v += red[q][i];
      if constexpr (PRO == kRmsNorm) {
        float sum = 0.f;
#pragma unroll
        for (int q = 0; q < kWarps; ++q) sum += red_ss[q];
        v *= 1.0f / sqrtf(sum / float(K) + eps);
      }
      float* dst = out + int64_t(t) * N + row0 + r;
      *dst = accumulate ? *dst + v : v;
    }
  }
}

template <int MAXT, int R, int U, int PRO = kPlain>
void run(const float* x, int T, int64_t K, const uint16_t* w, int64_t N, float* out, bool accumulate, bool pdl,
         cudaStream_t s, const float* norm = nullptr, float eps = 0.f) {
  const unsigned blocks = static_cast<unsigned>((N + R - 1) / R);
  launch_pdl(pdl, gemv_kernel<MAXT, R, U, PRO>, dim3(blocks), dim3(kThreads), 0, s, x, T, K, w, N, out, accumulate,
             norm, eps);
}

// ---- 2 <= T <= 8: tensor cores -----------------------------------------------------------------
//
// Unit of work: 128 consecutive weight rows (8 warps x 16 rows: the A operand of one m16n8k16)
// times one range of Ks of K (split s of S). The k order inside each 64-k step is permuted (a dot
// product does not care, as long as A and B agree): lane (g, t) = (lane / 4, lane % 4) loads 16
// consecutive bf16 of row g and of row g + 8 at k = 16t .. 16t + 15 (2 x 16 bytes each; the 4
// lanes of a row read its whole 128-byte line), and MMA j (0..3) of the step takes the 4 of them
// at 16t + 4j .. 16t + 4j + 3 as the fragment's logical k = 2t, 2t+1, 2t+8, 2t+9. The B fragment of
// lane (g, t) is then x[token g] at the same 4 physical k: the unit's x is staged in shared memory
// (at most kTcSmemBytes) as 16-byte entries {hi pairs, lo pairs} in the order (step, j, token, t),
// so each MMA's fragment is one conflict-free 16-byte load per lane.
//
// Blocks are persistent (at most the resident count) and take units in turn; weights stream
// through a register ring of D steps (each lane keeps D * 64 bytes in flight) that runs on into
// the next unit, across its x staging. With S > 1 the partial tiles go to a workspace and the last
// unit of each 128-row tile (an atomic counter) adds them in split order: deterministic.
constexpr int kTcWarps = 8;
constexpr int kTcThreads = 32 * kTcWarps;
constexpr int kTcRows = 16 * kTcWarps;
constexpr int kTcSmemBytes = 32 * 1024;       // staged x of a unit: T x Ks x (hi + lo) bf16
constexpr int64_t kTcPartFloats = 12 << 20;   // workspace for split partials (48 MB)
constexpr int kTcCounters = 8192;             // per 128-row tile

__device__ __forceinline__ uint32_t pack_bf16x2(__nv_bfloat16 a, __nv_bfloat16 b) {
  return uint32_t(__bfloat16_as_ushort(a)) | (uint32_t(__bfloat16_as_ushort(b)) << 16);
}

// 4 consecutive x -> {hi(x0,x1), hi(x2,x3), lo(x0,x1), lo(x2,x3)}, x = hi + lo + O(2^-17 |x|).
__device__ __forceinline__ uint4 split_hi_lo(const float4 v) {
  const __nv_bfloat16 h0 = __float2bfloat16_rn(v.x), h1 = __float2bfloat16_rn(v.y);
  const __nv_bfloat16 h2 = __float2bfloat16_rn(v.z), h3 = __float2bfloat16_rn(v.w);
  const __nv_bfloat16 l0 = __float2bfloat16_rn(v.x - __bfloat162float(h0));
  const __nv_bfloat16 l1 = __float2bfloat16_rn(v.y - __bfloat162float(h1));
  const __nv_bfloat16 l2 = __float2bfloat16_rn(v.z - __bfloat162float(h2));
  const __nv_bfloat16 l3 = __float2bfloat16_rn(v.w - __bfloat162float(h3));
  return make_uint4(pack_bf16x2(h0, h1), pack_bf16x2(h2, h3), pack_bf16x2(l0, l1), pack_bf16x2(l2, l3));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int D, int MINB>
__global__ void __launch_bounds__(kTcThreads, MINB)
    gemv_tc_kernel(const float* __restrict__ x, int T, int K, const uint16_t* __restrict__ w, int N,
                   float* __restrict__ out, bool accumulate, int Ks, int S, int tiles, int units,
                   float* __restrict__ part, unsigned* __restrict__ counters) {
  extern __shared__ uint4 xs[];
  __shared__ unsigned is_last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const bool has_tok = g < T;
  int u = blockIdx.x;
  if (u >= units) return;
  // Unit u = (tile u % tiles, split u / tiles). Rows past N read row N - 1 (in bounds), never written.
  int tile = u % tiles, s = u / tiles;
  int r0 = tile * kTcRows + warp * 16;
  bool active = r0 < N;  // warp-uniform
  int kb = s * Ks, ke = min(K, kb + Ks);
  const uint16_t* pa = w + int64_t(min(r0 + g, N - 1)) * K + 16 * t;
  const uint16_t* pb = w + int64_t(min(r0 + g + 8, N - 1)) * K + 16 * t;

  // The 16 k of this lane at k (K % 16 == 0, unit ends are multiples of 16: all or nothing).
  auto load_step = [&](uint4 (&b)[4], const uint16_t* qa, const uint16_t* qb, bool act, int k, int kend) {
    if (act && k + 16 * t < kend) {
      b[0] = load_stream(qa + k);
      b[1] = load_stream(qa + k + 8);
      b[2] = load_stream(qb + k);
      b[3] = load_stream(qb + k + 8);
    } else {
      b[0] = b[1] = b[2] = b[3] = make_uint4(0, 0, 0, 0);
    }
  };
  pdl_trigger();
  uint4 buf[D][4];
#pragma unroll
  for (int d = 0; d < D; ++d) load_step(buf[d], pa, pb, active, kb + 64 * d, ke);
  pdl_wait();  // x, out and the split workspace only from here

  while (true) {
    const int steps = (ke - kb + 63) >> 6;
    const int psteps = (steps + D - 1) / D * D;  // the ring restarts at buf[0] for every unit
    // The next unit of this block: its first D steps are loaded during this unit's last D.
    const int un = u + gridDim.x;
    const bool has_next = un < units;
    const int ntile = has_next ? un % tiles : tile, ns = has_next ? un / tiles : s;
    const int nr0 = ntile * kTcRows + warp * 16;
    const bool nactive = has_next && nr0 < N;
    const int nkb = ns * Ks, nke = min(K, nkb + Ks);
    const uint16_t* na = w + int64_t(min(nr0 + g, N - 1)) * K + 16 * t;
    const uint16_t* nb = w + int64_t(min(nr0 + g + 8, N - 1)) * K + 16 * t;

    __syncthreads();  // the previous unit is done with xs
    {
      const int per_tok = steps * 16;  // 16-byte entries (4 k) per token
      for (int q = threadIdx.x; q < T * per_tok; q += kTcThreads) {
        const int tok = q / per_tok, kk = (q - tok * per_tok) * 4;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (kb + kk < ke) v = split_hi_lo(__ldg(reinterpret_cast<const float4*>(x + int64_t(tok) * K + kb + kk)));
        const int c = kk >> 6, tt = (kk >> 4) & 3, j = (kk >> 2) & 3;
        xs[((c * 4 + j) * T + tok) * 4 + tt] = v;
      }
    }
    __syncthreads();

    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int st0 = 0; st0 < psteps; st0 += D) {
#pragma unroll
      for (int d = 0; d < D; ++d) {
        const int st = st0 + d;
        if (active && st < steps) {
          // Fresh MMA accumulators per 64-k step, added in f32 (the tensor cores' own
          // accumulation truncates: long chains drift by ~1e-5 over K = 17408).
          float ch[4] = {0.f, 0.f, 0.f, 0.f}, cl[4] = {0.f, 0.f, 0.f, 0.f};
          const uint4* xb = xs + (st * 4 * T + g) * 4 + t;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint4 bx = has_tok ? xb[j * T * 4] : make_uint4(0, 0, 0, 0);
            const uint4& ag = buf[d][j >> 1];
            const uint4& a8 = buf[d][2 + (j >> 1)];
            const uint32_t a0 = (j & 1) ? ag.z : ag.x, a2 = (j & 1) ? ag.w : ag.y;
            const uint32_t a1 = (j & 1) ? a8.z : a8.x, a3 = (j & 1) ? a8.w : a8.y;
            mma_bf16(ch, a0, a1, a2, a3, bx.x, bx.y);
            mma_bf16(cl, a0, a1, a2, a3, bx.z, bx.w);
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[i] += ch[i] + cl[i];
        }
        if (st + D < psteps) load_step(buf[d], pa, pb, active, kb + 64 * (st + D), ke);
        else load_step(buf[d], na, nb, nactive, nkb + 64 * (st + D - psteps), nke);
      }
    }

    // Accumulator layout: acc[0], acc[1] = (row g, tokens 2t, 2t+1); acc[2], acc[3] = (row g + 8, same).
    if (S == 1) {
      if (active) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = r0 + g + (i >> 1) * 8, tok = 2 * t + (i & 1);
          if (row < N && tok < T) {
            float* dst = out + int64_t(tok) * N + row;
            *dst = accumulate ? *dst + acc[i] : acc[i];
          }
        }
      }
    } else {
      if (active) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = r0 + g + (i >> 1) * 8, tok = 2 * t + (i & 1);
          if (row < N && tok < T) part[(int64_t(s) * T + tok) * N + row] = acc[i];
        }
      }
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) is_last = atomicAdd(&counters[tile], 1u) == unsigned(S - 1);
      __syncthreads();
      if (is_last) {
        __threadfence();
        const int row0 = tile * kTcRows, rows = min(kTcRows, N - row0);
        for (int i = threadIdx.x; i < T * rows; i += kTcThreads) {
          const int tok = i / rows, row = row0 + (i - tok * rows);
          float v = 0.f;
          for (int q = 0; q < S; ++q) v += __ldcg(part + (int64_t(q) * T + tok) * N + row);  // split order
          float* dst = out + int64_t(tok) * N + row;
          *dst = accumulate ? *dst + v : v;
        }
        if (threadIdx.x == 0) counters[tile] = 0;  // ready for the next launch
      }
    }
    if (!has_next) break;
    u = un;
    tile = ntile;
    s = ns;
    r0 = nr0;
    active = nactive;
    kb = nkb;
    ke = nke;
    pa = na;
    pb = nb;
  }
}

// Per (device, stream): split partials and tile counters (zeroed once; the last block of a tile
// sets its counter back to 0). Allocated on first use, never inside a stream capture (then the
// caller falls back to S = 1).
struct TcWorkspace {
  float* part = nullptr;
  unsigned* counters = nullptr;
};
const TcWorkspace* tc_workspace(int device, cudaStream_t s) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, TcWorkspace> spaces;
  std::lock_guard<std::mutex> lock(mu);
  auto it = spaces.find({device, s});
  if (it != spaces.end()) return &it->second;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    return nullptr;
  }
  TcWorkspace ws;
  if (cudaMalloc(&ws.part, kTcPartFloats * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&ws.counters, kTcCounters * sizeof(unsigned)) != cudaSuccess) {
    (void)cudaGetLastError();
    if (ws.part) cudaFree(ws.part);
    return nullptr;
  }
  DS_CUDA_CHECK(cudaMemsetAsync(ws.counters, 0, kTcCounters * sizeof(unsigned), s));
  return &spaces.emplace(std::make_pair(device, s), ws).first->second;
}

template <int D, int MINB>
struct TcKernel {
  static void launch(unsigned grid, int smem, bool pdl, cudaStream_t s, const float* x, int T, int K,
                     const uint16_t* w, int N, float* out, bool accumulate, int Ks, int S, int tiles, int units,
                     float* part, unsigned* counters) {
    launch_pdl(pdl, gemv_tc_kernel<D, MINB>, dim3(grid), dim3(kTcThreads), size_t(smem), s, x, T, K, w, N, out,
               accumulate, Ks, S, tiles, units, part, counters);
  }
  // Resident blocks per SM (with the largest staging area), per device.
  static int blocks_per_sm(int device) {
    static std::mutex mu;
    static std::map<int, int> cache;
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(device);
    if (it != cache.end()) return it->second;
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_tc_kernel<D, MINB>, kTcThreads, kTcSmemBytes) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      n = 1;
    }
    return cache[device] = std::max(n, 1);
  }
};


// Programmatic dependent launch for the GEMVs: CudaOptions::pdl on a device of compute capability 9+.
bool pdl_enabled(const CudaOptions& o, int device) {
  return o.pdl && device_attribute(cudaDevAttrComputeCapabilityMajor, device, 0) >= 9;
}

// Tuning (environment, read per call; for measurements and tests):
//   DELTASERVE_GEMV_TC=0        CUDA-core GEMV for all T (no tensor-core path)
//   DELTASERVE_GEMV_TC_GRID=n   at most n blocks (each then takes several units in turn)
//   DELTASERVE_GEMV_TC_K0=k     per-unit overhead in k of the split choice (default 128)
//
// Choice of the split S: every block (grid = min(units, resident blocks G)) takes units
// blockIdx.x, + grid, ... A unit's time ~ Ks + k0; a round of a units costs ~ max(a, Gs), Gs =
// 2/3 G being about what saturates HBM: minimise (Ks + k0) * sum over rounds of max(a, Gs).
template <int D, int MINB>
bool run_tc_with(const float* x, int T, int64_t K64, const uint16_t* w, int64_t N64, float* out, bool accumulate,
                 const CudaOptions& o, cudaStream_t s) {
  const int K = static_cast<int>(K64), N = static_cast<int>(N64);
  int device = 0;
  DS_CUDA_CHECK(cudaGetDevice(&device));
  const int tiles = (N + kTcRows - 1) / kTcRows;
  const int step = 64 * D;
  const int KP = (kTcSmemBytes / (4 * T)) / step * step;  // largest unit (staged x fits)
  int64_t G = int64_t(sm_count(device)) * TcKernel<D, MINB>::blocks_per_sm(device);
  const int grid_cap = o.gemv_tc_grid;
  if (grid_cap > 0) G = std::min<int64_t>(G, grid_cap);
  const int64_t Gs = std::max<int64_t>(1, G * 2 / 3);
  const int64_t k0 = std::max(0, o.gemv_tc_k0);
  const int s_min = (K + KP - 1) / KP;
  const int s_max = std::max(s_min, std::min(K / step, 4 * s_min + 64));
  int best_S = 0, best_Ks = 0;
  double best_cost = 0;
  for (int S0 = s_min; S0 <= s_max; ++S0) {
    const int Ks = ((K + S0 - 1) / S0 + step - 1) / step * step;
    const int S = (K + Ks - 1) / Ks;
    if (S > 1 && (int64_t(S) * T * N > kTcPartFloats || tiles > kTcCounters)) continue;
    const int64_t units = int64_t(tiles) * S;
    const int64_t full = units / G, rem = units % G;
    const int64_t width = full * std::max(G, Gs) + (rem ? std::max(rem, Gs) : 0);
    const double cost = double(Ks + k0) * double(width);
    if (best_S == 0 || cost < best_cost) {
      best_S = S;
      best_Ks = Ks;
      best_cost = cost;
    }
  }
  if (best_S == 0) return false;  // no split fits the workspace
  const TcWorkspace* ws = nullptr;
  if (best_S > 1 && !(ws = tc_workspace(device, s))) return false;
  const int64_t units = int64_t(tiles) * best_S;
  if (units > (int64_t(1) << 30)) return false;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(units, G));
  const int smem = T * std::min(KP, (best_Ks + step - 1) / step * step) * 4;
  TcKernel<D, MINB>::launch(grid, smem, pdl_enabled(o, device), s, x, T, K, w, N, out, accumulate, best_Ks, best_S, tiles,
                            static_cast<int>(units), ws ? ws->part : nullptr, ws ? ws->counters : nullptr);
  return true;
}

bool run_tc(const float* x, int T, int64_t K, const uint16_t* w, int64_t N, float* out, bool accumulate,
            const CudaOptions& o, cudaStream_t s) {
  if (T < 2 || T > 8 || K % 16 != 0 || K < 16 || N < 1) return false;
  if (K > (int64_t(1) << 30) || N > (int64_t(1) << 27)) return false;
  if (!o.gemv_tensor_cores) return false;
  // A ring of 2 steps per lane, 3 blocks per SM. (Deeper rings at 2 blocks per SM, 3 or 4 steps,
  // measured slower on the H200: 4-token verification 19.8 vs 18.5 ms.)
  return run_tc_with<2, 3>(x, T, K, w, N, out, accumulate, o, s);
}

}  // namespace

int sm_count(int device) { return std::max(device_attribute(cudaDevAttrMultiProcessorCount, device, 1), 1); }

// Tile of the 1-row GEMV: rows per block x 10 + 16-byte loads per row in flight. Measured on the
// H200 (27B shapes): 8 rows x 1 load for N <= 8192 (down, o_proj), 2 rows x 4 loads above (gate_up,
// in_proj, qkv, lm_head); 4 x 2 (the earlier choice) was 3% slower over a decode step, and 2 x 2,
// 4 x 4, 2 x 8 slower still. CudaOptions::gemv_shape forces one (A/B).
int gemv_shape(const CudaOptions& o, int64_t N) { return o.gemv_shape > 0 ? o.gemv_shape : (N <= 8192 ? 81 : 24); }

template <int PRO>
void run_one_row(int shape, const float* x, int64_t K, const uint16_t* w, int64_t N, float* out, bool accumulate,
                 bool pdl, cudaStream_t s, const float* norm, float eps) {
  if (shape == 81) run<1, 8, 1, PRO>(x, 1, K, w, N, out, accumulate, pdl, s, norm, eps);
  else if (shape == 42) run<1, 4, 2, PRO>(x, 1, K, w, N, out, accumulate, pdl, s, norm, eps);
  else run<1, 2, 4, PRO>(x, 1, K, w, N, out, accumulate, pdl, s, norm, eps);
}

bool launch_gemv_prologue(const float* x, GemvPrologue prologue, const float* norm, float eps, int64_t K,
                          const uint16_t* w, int64_t N, float* out, bool accumulate, const CudaOptions& o,
                          cudaStream_t s) {
  if (K % 8 != 0 || N < 1) return false;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(norm)) % 16 != 0)
    return false;
  int device = 0;
  DS_CUDA_CHECK(cudaGetDevice(&device));
  const bool pdl = pdl_enabled(o, device);
  const int shape = gemv_shape(o, N);
  // The norm prologue reads the norm weight beside x in every block: 8 rows per block amortise it.
  if (prologue == GemvPrologue::RmsNorm)
    run_one_row<kRmsNorm>(o.gemv_shape > 0 ? shape : 81, x, K, w, N, out, accumulate, pdl, s, norm, eps);
  else run_one_row<kSiluMul>(shape, x, K, w, N, out, accumulate, pdl, s, nullptr, 0.f);
  return true;
}

bool launch_gemv(const float* x, int T, int64_t K, const uint16_t* w, int64_t N, float* out,
                 bool accumulate, const CudaOptions& o, cudaStream_t s) {
  if (T < 1 || T > kGemvMaxRows || K % 8 != 0 || N < 1) return false;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16 != 0) return false;
  int device = 0;
  DS_CUDA_CHECK(cudaGetDevice(&device));
  const bool pdl = pdl_enabled(o, device);
  if (T == 1) run_one_row<kPlain>(gemv_shape(o, N), x, K, w, N, out, accumulate, pdl, s, nullptr, 0.f);
  else if (run_tc(x, T, K, w, N, out, accumulate, o, s)) return true;
  else if (T == 2) run<2, 4, 2>(x, T, K, w, N, out, accumulate, pdl, s);
  // (R = 8 for T = 3..8, to halve the x re-reads, measured slower on the H200: 22.9 vs 21.6 ms for
  // the 27B 4-token verification forward.)
  else if (T <= 4) run<4, 4, 2>(x, T, K, w, N, out, accumulate, pdl, s);
  else run<8, 4, 2>(x, T, K, w, N, out, accumulate, pdl, s);
  return true;
}

}  // namespace deltaserve::cuda
