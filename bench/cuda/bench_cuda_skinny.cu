// bench_cuda_skinny: tensor-core matmuls of 1-16 rows in the one-row GEMV's block shape (stop 51's
// experiment; bench/RESULTS.md): each warp reads 512 contiguous bytes of each of its weight rows per
// step (16 bytes a lane, as the GEMV), stores them from registers into its own swizzled shared tile
// and reads them back as mma B fragments with ldmatrix (W [N, K] row-major is B col-major); x's A
// fragments come from global memory ("by fragments") or from x staged in shared memory by 16-byte
// loads ("staged"; "in M rows": only x's rows, not 8 or 16). "mma R rows": a block owns R weight rows
// and its 8 warps split K. "grouped G x S": a block's 8 warps are G row groups of 8 weight rows times
// S k-splits; the G warps of a k-split walk the same k steps and share one x tile a step (named
// barrier), so x comes from L2 once per 8 G weight rows. Each variant is checked against
// cublasGemmEx (max error over max |ref|) and timed beside it and the GEMV, back to back, on
// matrices that rotate past the L2 (as bench_cuda_stream).
//
// On the device (tools/gpu-skinny.sh): nvcc -O3 -std=c++17 -Isrc -Ibench/cuda -gencode=arch=compute_90a,code=sm_90a
// bench/cuda/bench_cuda_skinny.cu src/backend/cuda/cuda_linear.cu -lcublas
//
//   bench_cuda_skinny [--shapes 34816x5120,5120x17408,5120x6144,16480x5120,14336x5120,248320x5120]
//                     [--rows 1,2,4,8,16] [--iters 40]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "backend/cuda/cuda_launch.h"
#include "bench_check.h"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ uint4 load_stream(const uint16_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t load_x2(const uint16_t* p) {  // two bf16 of x (coherent, L1)
  uint32_t v;
  asm volatile("ld.global.b32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// out[m, n] = sum_k x[m, k] w[n, k] for m < M (M <= 16), x bf16 [M, K], w bf16 [N, K], out f32 [M, N].
// K a multiple of 8, N a multiple of RB. RB: weight rows per block, 8 or 16 (one or two n8 tiles share
// each A fragment). XR: rows of x a warp stages, 8 (M <= 8) or 16. XS: x staged in shared memory by
// 16-byte loads and read by ldmatrix (else each A fragment is loaded from global memory, 4 bytes a
// lane). A warp's shared tile: RB rows of weights then XR rows of x, 256 k each, chunk c of row r at
// chunk c ^ (r % 8) (eight rows of one chunk hit eight different bank groups).
template <int RB, int XR, bool XS, int MINB = 1>
__global__ void __launch_bounds__(kThreads, MINB) skinny_kernel(const uint16_t* __restrict__ x, int M, int64_t K,
                                                          const uint16_t* __restrict__ w, int64_t N,
                                                          float* __restrict__ out) {
  constexpr int NT = RB / 8;  // n8 tiles
  constexpr int TILE_ROWS = RB + (XS ? XR : 0);
  extern __shared__ __align__(16) uint16_t smem[];  // [kWarps][TILE_ROWS][256]
  __shared__ float red[kWarps][16][RB];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  uint16_t* const tile = smem + size_t(warp) * TILE_ROWS * 256;
  const int64_t row0 = int64_t(blockIdx.x) * RB;
  const int64_t chunks = K / 8;                // 16-byte pieces of a row
  const int64_t steps = (chunks + 31) / 32;    // 256 k each
  const uint16_t* const wb = w + row0 * K;

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  const uint32_t tile_base = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
  // ldmatrix: lane i gives the address of row (i % 8) of matrix (i / 8).
  const int lm_row = lane & 7, lm_q = lane >> 3;
  const auto at = [&](int r, int c) { return tile_base + uint32_t((r * 256 + ((c ^ (r & 7)) * 8)) * 2); };

  for (int64_t step = warp; step < steps; step += kWarps) {
    const int64_t c = step * 32 + lane;
    const bool in = c < chunks;
    uint4 wv[RB];
#pragma unroll
    for (int r = 0; r < RB; ++r) wv[r] = in ? load_stream(wb + int64_t(r) * K + c * 8) : make_uint4(0, 0, 0, 0);
    if constexpr (XS) {
#pragma unroll
      for (int r = 0; r < XR; ++r) {
        if (r < M) {
          const uint4 v = in ? *reinterpret_cast<const uint4*>(x + int64_t(r) * K + c * 8) : make_uint4(0, 0, 0, 0);
          *reinterpret_cast<uint4*>(&tile[(RB + r) * 256 + (lane ^ (r & 7)) * 8]) = v;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < RB; ++r) *reinterpret_cast<uint4*>(&tile[r * 256 + (lane ^ (r & 7)) * 8]) = wv[r];
    __syncwarp();
    const int64_t kbase = step * 256;
#pragma unroll
    for (int kb = 0; kb < 16; kb += 2) {
      // A fragments of x for k-blocks kb (chunks 2kb, 2kb+1) and kb+1 (chunks 2kb+2, 2kb+3):
      // a[h] = {rows 0-7 lo, rows 8-15 lo, rows 0-7 hi, rows 8-15 hi}.
      uint32_t a[2][4];
      if constexpr (XS) {
        if constexpr (XR <= 8) {  // rows XR-7 of the ldmatrix: the next rows of shared memory, D rows >= M
          uint32_t q[4];
          ldmatrix_x4(q, at(RB + lm_row, 2 * kb + lm_q));
          a[0][0] = q[0], a[0][2] = q[1], a[1][0] = q[2], a[1][2] = q[3];
          a[0][1] = a[0][3] = a[1][1] = a[1][3] = 0u;
        } else {
#pragma unroll
          for (int h = 0; h < 2; ++h) ldmatrix_x4(a[h], at(RB + (lm_q & 1) * 8 + lm_row, 2 * (kb + h) + (lm_q >> 1)));
        }
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t k_lo = kbase + (2 * (kb + h)) * 8 + 2 * t, k_hi = k_lo + 8;
          const bool in_lo = k_lo < K, in_hi = k_hi < K;
          a[h][0] = (g < M && in_lo) ? load_x2(x + int64_t(g) * K + k_lo) : 0u;
          a[h][2] = (g < M && in_hi) ? load_x2(x + int64_t(g) * K + k_hi) : 0u;
          if constexpr (XR == 16) {
            a[h][1] = (g + 8 < M && in_lo) ? load_x2(x + int64_t(g + 8) * K + k_lo) : 0u;
            a[h][3] = (g + 8 < M && in_hi) ? load_x2(x + int64_t(g + 8) * K + k_hi) : 0u;
          } else {
            a[h][1] = a[h][3] = 0u;
          }
        }
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        uint32_t b[4];
        ldmatrix_x4(b, at(j * 8 + lm_row, 2 * kb + lm_q));
        mma_bf16(acc[j], a[0][0], a[0][1], a[0][2], a[0][3], b[0], b[1]);
        mma_bf16(acc[j], a[1][0], a[1][1], a[1][2], a[1][3], b[2], b[3]);
      }
    }
    __syncwarp();
  }
  // D fragment: acc[j][0..1] = D[g][2t, 2t+1], acc[j][2..3] = D[g + 8][2t, 2t+1] (m = x row, n = w row).
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    red[warp][g][j * 8 + 2 * t] = acc[j][0];
    red[warp][g][j * 8 + 2 * t + 1] = acc[j][1];
    red[warp][g + 8][j * 8 + 2 * t] = acc[j][2];
    red[warp][g + 8][j * 8 + 2 * t + 1] = acc[j][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < M * RB; i += kThreads) {
    const int m = i / RB, n = i % RB;
    float v = 0.f;
#pragma unroll
    for (int q = 0; q < kWarps; ++q) v += red[q][m][n];
    out[int64_t(m) * N + row0 + n] = v;
  }
}

template <int RB, int XR, bool XS, int MINB = 1>
void launch_one(const uint16_t* x, int M, int64_t K, const uint16_t* w, int64_t N, float* out) {
  // + 8 - XR rows: the last warp's ldmatrix of x rows XR-7 stays inside the allocation.
  const int smem = (kWarps * (RB + (XS ? XR : 0)) + (XS ? 8 - std::min(XR, 8) : 0)) * 256 * 2;
  static bool set = false;
  if (!set) {
    CK(cudaFuncSetAttribute(skinny_kernel<RB, XR, XS, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    set = true;
  }
  skinny_kernel<RB, XR, XS, MINB><<<dim3(static_cast<unsigned>(N / RB)), kThreads, smem>>>(x, M, K, w, N, out);
}

// x staged in only as many rows as it has (4 when M <= 4), MINB blocks per SM asked of the compiler.
template <int MINB>
void launch_tight(const uint16_t* x, int M, int64_t K, const uint16_t* w, int64_t N, float* out) {
  if (M > 8) launch_one<8, 16, true, MINB>(x, M, K, w, N, out);
  else if (M > 4) launch_one<8, 8, true, MINB>(x, M, K, w, N, out);
  else launch_one<8, 4, true, MINB>(x, M, K, w, N, out);
}

template <int RB, bool XS>
void launch_skinny(const uint16_t* x, int M, int64_t K, const uint16_t* w, int64_t N, float* out) {
  if (M > 8) launch_one<RB, 16, XS>(x, M, K, w, N, out);
  else launch_one<RB, 8, XS>(x, M, K, w, N, out);
}

// The block's 8 warps as RG row groups x KS k-splits: warp (rg, ks) owns weight rows row0 + 8 rg ..
// + 8 and walks the k steps ks, ks + KS, ...; the RG warps of a k-split walk the same steps, so they
// share one x tile a step (XR rows, double-buffered), written by the group's 32 RG threads and
// guarded by the group's named barrier: x is read from L2 once per 8 RG weight rows.
__device__ __forceinline__ void group_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

template <int RG, int XR>
__global__ void __launch_bounds__(kThreads) grouped_kernel(const uint16_t* __restrict__ x, int M, int64_t K,
                                                           const uint16_t* __restrict__ w, int64_t N,
                                                           float* __restrict__ out) {
  constexpr int KS = kWarps / RG;
  constexpr int RB = 8 * RG;  // rows per block
  // [kWarps][8][256] weight tiles, then [KS][2][XR (+ pad to 8)][256] x tiles.
  extern __shared__ __align__(16) uint16_t smem[];
  __shared__ float red[kWarps][16][8];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rg = warp % RG, ks = warp / RG;
  const int g = lane >> 2, t = lane & 3;
  constexpr int XT = XR < 8 ? 8 : XR;  // rows an x tile spans for ldmatrix
  uint16_t* const wt = smem + size_t(warp) * 8 * 256;
  uint16_t* const xt = smem + size_t(kWarps) * 8 * 256 + size_t(ks) * 2 * XT * 256;
  const int64_t row0 = int64_t(blockIdx.x) * RB + 8 * rg;
  const int64_t chunks = K / 8;
  const int64_t steps = (chunks + 31) / 32;
  const uint16_t* const wb = w + row0 * K;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const uint32_t wt_base = static_cast<uint32_t>(__cvta_generic_to_shared(wt));
  const uint32_t xt_base = static_cast<uint32_t>(__cvta_generic_to_shared(xt));
  const int lm_row = lane & 7, lm_q = lane >> 3;
  const auto at = [](uint32_t base, int r, int c) { return base + uint32_t((r * 256 + ((c ^ (r & 7)) * 8)) * 2); };
  const int gt = rg * 32 + lane;  // this thread's index in its k-split group (RG * 32 threads)
  int buf = 0;
  for (int64_t step = ks; step < steps; step += KS, buf ^= 1) {
    const int64_t c = step * 32 + lane;
    const bool in = c < chunks;
    uint4 wv[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) wv[r] = in ? load_stream(wb + int64_t(r) * K + c * 8) : make_uint4(0, 0, 0, 0);
    // x tile: XR rows x 32 pieces of 16 bytes, over the group's RG * 32 threads.
    for (int i = gt; i < XR * 32; i += RG * 32) {
      const int r = i >> 5, cc = i & 31;
      const int64_t ci = step * 32 + cc;
      const uint4 v = (r < M && ci < chunks) ? *reinterpret_cast<const uint4*>(x + int64_t(r) * K + ci * 8)
                                             : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(&xt[(buf * XT + r) * 256 + (cc ^ (r & 7)) * 8]) = v;
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) *reinterpret_cast<uint4*>(&wt[r * 256 + (lane ^ (r & 7)) * 8]) = wv[r];
    group_sync(1 + ks, RG * 32);
    const uint32_t xb = xt_base + uint32_t(buf * XT * 256 * 2);
#pragma unroll
    for (int kb = 0; kb < 16; kb += 2) {
      uint32_t a[2][4];
      if constexpr (XR <= 8) {
        uint32_t q[4];
        ldmatrix_x4(q, at(xb, lm_row, 2 * kb + lm_q));
        a[0][0] = q[0], a[0][2] = q[1], a[1][0] = q[2], a[1][2] = q[3];
        a[0][1] = a[0][3] = a[1][1] = a[1][3] = 0u;
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) ldmatrix_x4(a[h], at(xb, (lm_q & 1) * 8 + lm_row, 2 * (kb + h) + (lm_q >> 1)));
      }
      uint32_t b[4];
      ldmatrix_x4(b, at(wt_base, lm_row, 2 * kb + lm_q));
      mma_bf16(acc, a[0][0], a[0][1], a[0][2], a[0][3], b[0], b[1]);
      mma_bf16(acc, a[1][0], a[1][1], a[1][2], a[1][3], b[2], b[3]);
    }
    __syncwarp();
  }
  red[warp][g][2 * t] = acc[0];
  red[warp][g][2 * t + 1] = acc[1];
  red[warp][g + 8][2 * t] = acc[2];
  red[warp][g + 8][2 * t + 1] = acc[3];
  __syncthreads();
  for (int i = threadIdx.x; i < M * RB; i += kThreads) {
    const int m = i / RB, n = i % RB, q0 = n / 8;
    float v = 0.f;
#pragma unroll
    for (int q = 0; q < KS; ++q) v += red[q * RG + q0][m][n % 8];
    out[int64_t(m) * N + int64_t(blockIdx.x) * RB + n] = v;
  }
}

template <int RG>
void launch_grouped(const uint16_t* x, int M, int64_t K, const uint16_t* w, int64_t N, float* out) {
  const auto go = [&](auto kernel, int xr) {
    const int xt = xr < 8 ? 8 : xr;
    const int smem = (kWarps * 8 + (kWarps / RG) * 2 * xt) * 256 * 2;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<dim3(static_cast<unsigned>(N / (8 * RG))), kThreads, smem>>>(x, M, K, w, N, out);
  };
  if (M > 8) go(grouped_kernel<RG, 16>, 16);
  else if (M > 4) go(grouped_kernel<RG, 8>, 8);
  else go(grouped_kernel<RG, 4>, 4);
}

__global__ void fill_kernel(uint16_t* w, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed * 40503u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    const float f = (float(h & 0xffff) / 65535.f - 0.5f) * 0.1f;
    w[i] = __bfloat16_as_ushort(__float2bfloat16(f));
  }
}

struct Variant {
  const char* name;
  void (*go)(const uint16_t*, int, int64_t, const uint16_t*, int64_t, float*);
  int64_t rows_per_block;  // N must be a multiple
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<int64_t, int64_t>> shapes = {{34816, 5120}, {5120, 17408}, {5120, 6144},
                                                     {16480, 5120}, {14336, 5120}, {248320, 5120}};
  std::vector<int> rows = {1, 2, 4, 8, 16};
  int iters = 40;
  if (argc % 2 == 0) {
    std::fprintf(stderr, "flags come in pairs: --name value\n");
    return 2;
  }
  try {
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string a = argv[i], v = argv[i + 1];
      if (a == "--shapes") {
        if (!bench_parse_shapes(v, &shapes)) return 2;
      } else if (a == "--rows") {
        rows.clear();
        for (const auto& s : bench_split(v, ',')) rows.push_back(std::stoi(s));
      } else if (a == "--iters") {
        iters = std::stoi(v);
      } else {
        std::fprintf(stderr, "unknown flag %s\n", a.c_str());
        return 2;
      }
    }
  } catch (const std::exception&) {
    std::fprintf(stderr, "bench_cuda_skinny: a flag's value is not a number\n");
    return 2;
  }
  if (iters < 1 || std::any_of(rows.begin(), rows.end(), [](int m) { return m < 1 || m > 16; }) ||
      std::any_of(shapes.begin(), shapes.end(), [](const auto& nk) { return nk.first % 16 != 0 || nk.second % 8 != 0; })) {
    std::fprintf(stderr, "bench_cuda_skinny: --rows 1-16, --shapes NxK with N a multiple of 16, K of 8\n");
    return 2;
  }
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  int l2 = 0;
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  cublasHandle_t blas;
  CB(cublasCreate(&blas));
  const size_t ws_bytes = size_t(32) << 20;
  void* ws = nullptr;
  CK(cudaMalloc(&ws, ws_bytes));
  CB(cublasSetWorkspace(blas, ws, ws_bytes));
  const Variant variants[] = {{"mma 8 rows, x by fragments", launch_skinny<8, false>, 8},
                              {"mma 8 rows, x staged (8 or 16 rows)", launch_skinny<8, true>, 8},
                              {"mma 16 rows, x staged (8 or 16 rows)", launch_skinny<16, true>, 16},
                              {"mma 8 rows, x staged in M rows", launch_tight<1>, 8},
                              {"mma 8 rows, x staged in M rows, 3 blocks/SM", launch_tight<3>, 8},
                              {"grouped 2 row groups x 4 k-splits", launch_grouped<2>, 16},
                              {"grouped 4 row groups x 2 k-splits", launch_grouped<4>, 32},
                              {"grouped 8 row groups x 1 k-split", launch_grouped<8>, 64}};
  std::printf("| N x K | kernel | rows of x | us | TB/s | max err / max ref |\n|---|---|---:|---:|---:|---:|\n");
  for (const auto& nk : shapes) {
    const int64_t N = nk.first, K = nk.second;
    const size_t bytes = size_t(N) * size_t(K) * 2;
    const int copies = int(std::max<size_t>(2, (size_t(3) * size_t(l2) + bytes - 1) / bytes + 1));
    std::vector<uint16_t*> w(size_t(copies), nullptr);
    for (int i = 0; i < copies; ++i) {
      CK(cudaMalloc(&w[size_t(i)], bytes));
      fill_kernel<<<1024, 256>>>(w[size_t(i)], int64_t(N) * K, 1u + uint32_t(i));
    }
    const auto tbs = [&](double us) { return double(bytes) / (us * 1e-6) / 1e12; };
    float *xf = nullptr, *out = nullptr, *ref = nullptr;
    uint16_t* xb = nullptr;
    CK(cudaMalloc(&xf, size_t(K) * 4));
    CK(cudaMalloc(&xb, size_t(16 * K) * 2));
    CK(cudaMalloc(&out, size_t(16 * N) * 4));
    CK(cudaMalloc(&ref, size_t(16 * N) * 4));
    CK(cudaMemset(xf, 0, size_t(K) * 4));
    fill_kernel<<<64, 256>>>(xb, 16 * K, 7u);
    deltaserve::CudaOptions opts;
    const double gemv = bench_time_us(
        [&](int i) { deltaserve::cuda::launch_gemv(xf, K, w[size_t(i % copies)], N, out, false, true, opts, nullptr); },
        iters);
    std::printf("| %lldx%lld | GEMV (PDL) | 1 | %.1f | %.2f | |\n", static_cast<long long>(N),
                static_cast<long long>(K), gemv, tbs(gemv));
    std::vector<float> h_out(size_t(16 * N)), h_ref(size_t(16 * N));
    for (const int m : rows) {
      const float alpha = 1.f, beta = 0.f;
      const auto blas_go = [&](int i, float* dst) {
        CB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(N), m, int(K), &alpha, w[size_t(i % copies)], CUDA_R_16BF,
                        int(K), xb, CUDA_R_16BF, int(K), &beta, dst, CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
      };
      const double ub = bench_time_us([&](int i) { blas_go(i, out); }, iters);
      std::printf("| %lldx%lld | cublasGemmEx | %d | %.1f | %.2f | |\n", static_cast<long long>(N),
                  static_cast<long long>(K), m, ub, tbs(ub));
      blas_go(0, ref);
      CK(cudaMemcpy(h_ref.data(), ref, size_t(m) * size_t(N) * 4, cudaMemcpyDeviceToHost));
      double max_ref = 0;
      for (size_t i = 0; i < size_t(m) * size_t(N); ++i) max_ref = std::max(max_ref, double(std::fabs(h_ref[i])));
      for (const auto& v : variants) {
        if (N % v.rows_per_block != 0) {
          std::printf("| %lldx%lld | %s | %d | - | (does not tile N) | |\n", static_cast<long long>(N),
                      static_cast<long long>(K), v.name, m);
          continue;
        }
        CK(cudaMemset(out, 0xff, size_t(16 * N) * 4));
        v.go(xb, m, K, w[0], N, out);
        CK(cudaGetLastError());
        CK(cudaMemcpy(h_out.data(), out, size_t(m) * size_t(N) * 4, cudaMemcpyDeviceToHost));
        double err = 0;
        for (size_t i = 0; i < size_t(m) * size_t(N); ++i) {
          const double e = std::fabs(double(h_out[i]) - double(h_ref[i]));
          err = std::isnan(e) ? INFINITY : std::max(err, e);
        }
        const double us = bench_time_us([&](int i) { v.go(xb, m, K, w[size_t(i % copies)], N, out); }, iters);
        std::printf("| %lldx%lld | %s | %d | %.1f | %.2f | %.2e |\n", static_cast<long long>(N),
                    static_cast<long long>(K), v.name, m, us, tbs(us), err / std::max(max_ref, 1e-30));
      }
    }
    CK(cudaDeviceSynchronize());
    CK(cudaFree(xf));
    CK(cudaFree(xb));
    CK(cudaFree(out));
    CK(cudaFree(ref));
    for (auto* p : w) CK(cudaFree(p));
  }
  return 0;
}
