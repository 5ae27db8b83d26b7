// bench_cuda_stream: how fast the GPU streams a bf16 weight matrix [N, K] under different read
// patterns, with no arithmetic, beside the kernels that stream it for real: the question behind the
// skinny matmuls (RESULTS, stops 24, 39 and 40). The one-row GEMV streams weights at ~4.45 TB/s,
// cuBLAS at 2-16 rows at ~4.0. A pattern RTxSBxF is a tile of RT consecutive rows read SB bytes of
// each row at a time ("a step": RT x SB bytes, in row-major order of 16-byte pieces over the block's
// 256 threads), every thread keeping F 16-byte loads in flight; a block owns RT rows and walks all of
// K (grid = N / RT blocks), or with a trailing p a block walks tiles b, b + G, ... for a grid of
// G = 8 blocks per SM. The loads are the GEMV's (non-coherent, no L1 allocation); the values are
// XOR-folded so that no load is dropped. Then, on the same matrices: a device-to-device copy, the
// GEMV with and without programmatic dependent launch, cublasGemmEx at 1-16 rows, and cuBLASLt's
// first heuristic choice with and without split-K reductions. Matrices rotate over copies that
// together exceed the L2, so no call reads what the previous one left there.
//
// Builds with the tree (CMake) or alone on the device (tools/gpu-stream.sh): nvcc -O3 -std=c++17 -Isrc
// -gencode=arch=compute_90a,code=sm_90a bench/cuda/bench_cuda_stream.cu src/backend/cuda/cuda_linear.cu
// -lcublas -lcublasLt
//
//   bench_cuda_stream [--shapes 34816x5120,5120x17408,5120x6144] [--iters 40]
//                     [--patterns RTxSBxF[p],...]   (RT and SB / 16 powers of two, F 2, 4, 8 or 16)
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "backend/cuda/cuda_launch.h"
#include "bench_check.h"

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint4 load_stream(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// One tile: rows [r0, r0 + RT) of w, all of the row's bytes, in steps of RT x SB bytes. RT and SB / 16
// are powers of two (shifts, not divisions: the index arithmetic must not cost more than the loads).
template <int F>
__device__ __forceinline__ uint32_t read_tile(const uint8_t* w, int64_t row_bytes, int64_t r0, int lg_rt, int lg_p) {
  const int lg_step = lg_rt + lg_p;  // log2 of the 16-byte pieces per step
  const uint32_t total = uint32_t(row_bytes >> (lg_p + 4)) << lg_step;
  const uint8_t* base = w + r0 * row_bytes;
  uint32_t acc = 0;
  for (uint32_t j0 = threadIdx.x; j0 < total; j0 += uint32_t(kThreads) * F) {
    uint4 v[F];
#pragma unroll
    for (int f = 0; f < F; ++f) {
      const uint32_t j = j0 + uint32_t(f) * kThreads;
      if (j < total) {
        const uint32_t step = j >> lg_step, within = j & ((1u << lg_step) - 1);
        const uint32_t row = within >> lg_p, piece = within & ((1u << lg_p) - 1);
        v[f] = load_stream(base + int64_t(row) * row_bytes + (int64_t(step) << (lg_p + 4)) + int64_t(piece) * 16);
      } else {
        v[f] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int f = 0; f < F; ++f) acc ^= v[f].x ^ v[f].y ^ v[f].z ^ v[f].w;
  }
  return acc;
}

template <int F>
__global__ void __launch_bounds__(kThreads) stream_kernel(const uint8_t* w, int64_t row_bytes, int64_t tiles, int lg_rt,
                                                          int lg_p, uint32_t* sink) {
  uint32_t acc = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) acc ^= read_tile<F>(w, row_bytes, t << lg_rt, lg_rt, lg_p);
  if (acc == 0x9e3779b9u) sink[0] = acc;  // never in practice; keeps every load
}

// Random-looking bf16 bits of magnitude < 1 (the values do not matter: nothing sums them).
__global__ void fill_kernel(uint16_t* w, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9e3779b1u ^ seed;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    w[i] = uint16_t(0x3c00u | (h & 0x83ffu));
  }
}

int lg2(int v) {
  int l = 0;
  while ((1 << l) < v) ++l;
  return (1 << l) == v ? l : -1;
}

struct Pattern {
  int rt = 2;
  int sb = 512;
  int f = 8;
  bool persist = false;
  std::string name;
};

template <int F>
void launch(const Pattern& pt, const uint8_t* w, int64_t n, int64_t row_bytes, int grid_persist, uint32_t* sink) {
  const int64_t tiles = n / pt.rt;
  const int64_t grid = pt.persist ? std::min<int64_t>(grid_persist, tiles) : tiles;
  stream_kernel<F><<<dim3(unsigned(grid)), kThreads>>>(w, row_bytes, tiles, lg2(pt.rt), lg2(pt.sb / 16), sink);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<int64_t, int64_t>> shapes = {{34816, 5120}, {5120, 17408}, {5120, 6144}};
  std::string patterns =
      "2x2048x4,2x2048x8,8x512x2,8x512x4,8x512x8,16x256x4,16x256x8,16x1024x8,32x128x8,32x512x8,64x64x8,"
      "64x128x8,128x128x4,128x128x8,16x64x4,16x64x8,2x2048x8p,128x128x8p,16x512x8p";
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
      } else if (a == "--patterns") {
        patterns = v;
      } else if (a == "--iters") {
        iters = std::stoi(v);
      } else {
        std::fprintf(stderr, "unknown flag %s\n", a.c_str());
        return 2;
      }
    }
  } catch (const std::exception&) {
    std::fprintf(stderr, "bench_cuda_stream: a flag's value is not a number\n");
    return 2;
  }
  if (iters < 1 || shapes.empty() || std::any_of(shapes.begin(), shapes.end(), [](const auto& nk) {
        return nk.first < 1 || nk.second < 8 || nk.second % 8 != 0;
      })) {
    std::fprintf(stderr, "bench_cuda_stream: --iters >= 1, --shapes NxK with K a multiple of 8\n");
    return 2;
  }
  std::vector<Pattern> pts;
  for (const auto& s : bench_split(patterns, ',')) {
    Pattern p;
    p.name = s;
    std::string t = s;
    if (!t.empty() && t.back() == 'p') {
      p.persist = true;
      t.pop_back();
    }
    const auto parts = bench_split(t, 'x');
    try {
      if (parts.size() != 3) throw std::invalid_argument(s);
      p.rt = std::stoi(parts[0]);
      p.sb = std::stoi(parts[1]);
      p.f = std::stoi(parts[2]);
    } catch (const std::exception&) {
      std::fprintf(stderr, "--patterns: RTxSBxF[p], not %s\n", s.c_str());
      return 2;
    }
    if (lg2(p.rt) < 0 || p.sb < 16 || lg2(p.sb / 16) < 0 || (p.f != 2 && p.f != 4 && p.f != 8 && p.f != 16)) {
      std::fprintf(stderr, "--patterns %s: RT and SB / 16 powers of two, F one of 2, 4, 8, 16\n", s.c_str());
      return 2;
    }
    pts.push_back(p);
  }
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  int sms = 0, l2 = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&sink, 4));
  cublasHandle_t blas;
  CB(cublasCreate(&blas));
  cublasLtHandle_t lt;
  CB(cublasLtCreate(&lt));
  const size_t ws_bytes = size_t(32) << 20;
  void* ws = nullptr;
  CK(cudaMalloc(&ws, ws_bytes));
  CB(cublasSetWorkspace(blas, ws, ws_bytes));
  std::printf("SMs %d, L2 %d MB; persistent grids: 8 blocks per SM\n", sms, l2 >> 20);
  std::printf("| N x K | pattern (rows x bytes per step x loads in flight) | us | TB/s |\n|---|---|---:|---:|\n");
  for (const auto& nk : shapes) {
    const int64_t N = nk.first, K = nk.second;
    const int64_t row_bytes = K * 2;
    const size_t bytes = size_t(N) * size_t(row_bytes);
    const int copies = int(std::max<size_t>(2, (size_t(3) * size_t(l2) + bytes - 1) / bytes + 1));
    std::vector<uint8_t*> w(size_t(copies), nullptr);
    for (auto& p : w) {
      CK(cudaMalloc(&p, bytes));
      fill_kernel<<<1024, 256>>>(reinterpret_cast<uint16_t*>(p), int64_t(bytes / 2), 1u);
    }
    const auto tbs = [&](double us) { return double(bytes) / (us * 1e-6) / 1e12; };
    // Anchor: a device-to-device copy of the same bytes (reads + writes).
    uint8_t* dst = nullptr;
    CK(cudaMalloc(&dst, bytes));
    const double cp = bench_time_us(
        [&](int i) { CK(cudaMemcpyAsync(dst, w[size_t(i % copies)], bytes, cudaMemcpyDeviceToDevice)); }, iters);
    std::printf("| %lldx%lld | cudaMemcpy D2D (read + write) | %.1f | %.2f |\n", static_cast<long long>(N),
                static_cast<long long>(K), cp, 2 * tbs(cp));
    CK(cudaFree(dst));
    for (const auto& pt : pts) {
      if (N % pt.rt != 0 || row_bytes % pt.sb != 0) {
        std::printf("| %lldx%lld | %s | - | (does not tile) |\n", static_cast<long long>(N), static_cast<long long>(K),
                    pt.name.c_str());
        continue;
      }
      const auto go = [&](int i) {
        const uint8_t* m = w[size_t(i % copies)];
        if (pt.f == 2) launch<2>(pt, m, N, row_bytes, 8 * sms, sink);
        else if (pt.f == 4) launch<4>(pt, m, N, row_bytes, 8 * sms, sink);
        else if (pt.f == 8) launch<8>(pt, m, N, row_bytes, 8 * sms, sink);
        else launch<16>(pt, m, N, row_bytes, 8 * sms, sink);
      };
      const double us = bench_time_us(go, iters);
      CK(cudaGetLastError());
      std::printf("| %lldx%lld | %s | %.1f | %.2f |\n", static_cast<long long>(N), static_cast<long long>(K),
                  pt.name.c_str(), us, tbs(us));
    }
    // The kernels themselves on the same rotation: the one-row GEMV (f32 x), cuBLAS at 1-16 rows.
    float *xf = nullptr, *out = nullptr;
    uint16_t* xb = nullptr;
    CK(cudaMalloc(&xf, size_t(K) * 4));
    CK(cudaMalloc(&xb, size_t(16 * K) * 2));
    CK(cudaMalloc(&out, size_t(16 * N) * 4));
    CK(cudaMemset(xf, 0, size_t(K) * 4));
    fill_kernel<<<64, 256>>>(xb, 16 * K, 2u);
    deltaserve::CudaOptions opts;
    const double gemv = bench_time_us(
        [&](int i) {
          deltaserve::cuda::launch_gemv(xf, K, reinterpret_cast<const uint16_t*>(w[size_t(i % copies)]), N, out, false,
                                        true, opts, nullptr);
        },
        iters);
    std::printf("| %lldx%lld | GEMV, 1 row | %.1f | %.2f |\n", static_cast<long long>(N), static_cast<long long>(K),
                gemv, tbs(gemv));
    deltaserve::CudaOptions plain = opts;
    plain.pdl = false;
    const double gemv_plain = bench_time_us(
        [&](int i) {
          deltaserve::cuda::launch_gemv(xf, K, reinterpret_cast<const uint16_t*>(w[size_t(i % copies)]), N, out, false,
                                        true, plain, nullptr);
        },
        iters);
    std::printf("| %lldx%lld | GEMV, 1 row, no PDL | %.1f | %.2f |\n", static_cast<long long>(N),
                static_cast<long long>(K), gemv_plain, tbs(gemv_plain));
    for (const int m : {1, 2, 4, 16}) {
      const float alpha = 1.f, beta = 0.f;
      const double us = bench_time_us(
          [&](int i) {
            CB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(N), m, int(K), &alpha, w[size_t(i % copies)],
                            CUDA_R_16BF, int(K), xb, CUDA_R_16BF, int(K), &beta, out, CUDA_R_32F, int(N),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
          },
          iters);
      std::printf("| %lldx%lld | cublasGemmEx, %d rows | %.1f | %.2f |\n", static_cast<long long>(N),
                  static_cast<long long>(K), m, us, tbs(us));
    }
    // cuBLASLt's first heuristic choice, then the same with split-K reductions excluded
    // (REDUCTION_SCHEME_MASK none): is the separate reduce kernel of down_proj's split worth it?
    for (const int m : {4, 16}) {
      for (const bool no_split : {false, true}) {
        cublasLtMatmulDesc_t desc;
        CB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
        CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA));
        CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB));
        cublasLtMatrixLayout_t la, lb, lc;
        CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, uint64_t(K), uint64_t(N), K));
        CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, uint64_t(K), uint64_t(m), K));
        CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, uint64_t(N), uint64_t(m), N));
        cublasLtMatmulPreference_t pref;
        CB(cublasLtMatmulPreferenceCreate(&pref));
        CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                sizeof ws_bytes));
        if (no_split) {
          const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE;
          CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask));
        }
        cublasLtMatmulHeuristicResult_t h{};
        int got = 0;
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &h, &got);
        if (st == CUBLAS_STATUS_SUCCESS && got > 0) {
          const float alpha = 1.f, beta = 0.f;
          const double us = bench_time_us(
              [&](int i) {
                CB(cublasLtMatmul(lt, desc, &alpha, w[size_t(i % copies)], la, xb, lb, &beta, out, lc, out, lc, &h.algo, ws,
                                  ws_bytes, nullptr));
              },
              iters);
          int split = 0, tile = 0;
          size_t sz = 0;
          cublasLtMatmulAlgoConfigGetAttribute(&h.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split, &sz);
          cublasLtMatmulAlgoConfigGetAttribute(&h.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &sz);
          std::printf("| %lldx%lld | cuBLASLt first choice%s, %d rows (tile id %d, split %d) | %.1f | %.2f |\n",
                      static_cast<long long>(N), static_cast<long long>(K), no_split ? ", no split-K" : "", m, tile, split,
                      us, tbs(us));
        } else {
          std::printf("| %lldx%lld | cuBLASLt%s, %d rows | - | (no algorithm) |\n", static_cast<long long>(N),
                      static_cast<long long>(K), no_split ? ", no split-K" : "", m);
        }
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(desc);
      }
    }
    CK(cudaDeviceSynchronize());
    CK(cudaFree(xf));
    CK(cudaFree(xb));
    CK(cudaFree(out));
    for (auto* p : w) CK(cudaFree(p));
  }
  return 0;
}
