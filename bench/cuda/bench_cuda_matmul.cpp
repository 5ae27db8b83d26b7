// bench_cuda_matmul: the decode and verification matmuls alone on the 27B's weight shapes, bf16
// weights [N, K], M rows of input: the one-row GEMV (M = 1), cuBLAS as the backend calls it
// (cublasGemmEx, default algorithm), and every algorithm cuBLASLt's heuristic offers for the
// shape (the fastest one reported with its configuration). Microseconds per call from CUDA events
// over back-to-back calls, and the weight bandwidth that implies. The question it answers: is
// cuBLAS's default choice the fastest cuBLAS has for 2-64 rows? And at prefill sizes (8,192 rows),
// how close to the tensor cores' peak do the GEMMs come (TFLOP/s), with f32 or bf16 outputs?
//
//   bench_cuda_matmul [--rows 1,2,4,8,16,32,64] [--shapes 34816x5120,5120x17408,...] [--iters 50]
//                     [--algos 32] [--out f32|bf16]
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

using namespace deltaserve;

namespace {

int config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  int v = 0;
  size_t got = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof v, &got) != CUBLAS_STATUS_SUCCESS) return -1;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> rows = {1, 2, 4, 8, 16, 32, 64};
  std::vector<std::pair<int64_t, int64_t>> shapes = {{34816, 5120}, {5120, 17408}, {16480, 5120},
                                                     {5120, 6144},  {14336, 5120}, {248320, 5120}};
  int iters = 50, max_algos = 32;
  bool out_bf16 = false;  // the output's dtype: f32 (as the backend calls cuBLAS) or bf16
  if (argc % 2 == 0) {
    std::fprintf(stderr, "flags come in pairs: --name value\n");
    return 2;
  }
  try {
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string a = argv[i], v = argv[i + 1];
      if (a == "--rows") {
        rows.clear();
        for (const auto& r : bench_split(v, ',')) rows.push_back(std::stoi(r));
      } else if (a == "--shapes") {
        if (!bench_parse_shapes(v, &shapes)) return 2;
      } else if (a == "--iters") {
        iters = std::stoi(v);
      } else if (a == "--algos") {
        max_algos = std::stoi(v);
      } else if (a == "--out") {
        if (v != "f32" && v != "bf16") {
          std::fprintf(stderr, "--out: f32 or bf16, not %s\n", v.c_str());
          return 2;
        }
        out_bf16 = v == "bf16";
      } else {
        std::fprintf(stderr, "unknown flag %s\n", a.c_str());
        return 2;
      }
    }
  } catch (const std::exception&) {
    std::fprintf(stderr, "bench_cuda_matmul: a flag's value is not a number\n");
    return 2;
  }
  const bool rows_ok = !rows.empty() && std::all_of(rows.begin(), rows.end(), [](int m) { return m >= 1; });
  const bool shapes_ok = !shapes.empty() && std::all_of(shapes.begin(), shapes.end(), [](const auto& nk) {
    return nk.first >= 1 && nk.second >= 8 && nk.second % 8 == 0;
  });
  if (!rows_ok || !shapes_ok || iters < 1 || max_algos < 1) {
    std::fprintf(stderr, "bench_cuda_matmul: --rows >= 1, --shapes NxK with K a multiple of 8, --iters and --algos >= 1\n");
    return 2;
  }
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cublasHandle_t blas;
  CB(cublasCreate(&blas));
  CB(cublasSetStream(blas, s));
  cublasLtHandle_t lt;
  CB(cublasLtCreate(&lt));
  const size_t ws_bytes = size_t(32) << 20;
  void* ws = nullptr;
  CK(cudaMalloc(&ws, ws_bytes));
  CB(cublasSetWorkspace(blas, ws, ws_bytes));
  const int max_m = *std::max_element(rows.begin(), rows.end());
  CudaOptions opts;

  const cudaDataType_t out_type = out_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  std::printf("output %s\n", out_bf16 ? "bf16" : "f32");
  std::printf("| N x K | rows | GEMV us | cublasGemmEx us | TB/s | best cuBLASLt us | TB/s | vs GemmEx | algo (id tile splitK stages) | algos | GemmEx / best TFLOP/s |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n");
  for (const auto& [N, K] : shapes) {
    uint16_t* w = nullptr;
    uint16_t* xb = nullptr;
    float *xf = nullptr, *out = nullptr;
    CK(cudaMalloc(&w, size_t(N * K) * 2));
    CK(cudaMalloc(&xb, size_t(max_m * K) * 2));
    CK(cudaMalloc(&xf, size_t(max_m * K) * 4));
    CK(cudaMalloc(&out, size_t(max_m * N) * 4));
    cuda::launch_random_bf16(w, N * K, 0.05f, 1, s);
    cuda::launch_random_bf16(xb, max_m * K, 1.0f, 2, s);
    CK(cudaMemsetAsync(xf, 0, size_t(max_m * K) * 4, s));
    const double gbytes = double(N) * K * 2 / 1e9;
    for (const int M : rows) {
      double gemv = 0;
      if (M == 1)
        gemv = bench_time_us([&](int) { cuda::launch_gemv(xf, K, w, N, out, false, true, opts, s); }, iters, s);
      const float alpha = 1.f, beta = 0.f;
      const double ex = bench_time_us(
          [&](int) {
            CB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(N), M, int(K), &alpha, w, CUDA_R_16BF, int(K), xb,
                            CUDA_R_16BF, int(K), &beta, out, out_type, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
          },
          iters, s);
      // cuBLASLt: D [N, M] (col-major) = op(A) B, A = W viewed as col-major K x N (transposed).
      cublasLtMatmulDesc_t desc;
      CB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
      CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA));
      CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB));
      cublasLtMatrixLayout_t la, lb, lc;
      CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
      CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
      CB(cublasLtMatrixLayoutCreate(&lc, out_type, N, M, N));
      cublasLtMatmulPreference_t pref;
      CB(cublasLtMatmulPreferenceCreate(&pref));
      CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                              sizeof ws_bytes));
      std::vector<cublasLtMatmulHeuristicResult_t> heur(static_cast<size_t>(max_algos));
      int n_heur = 0;
      CB(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, max_algos, heur.data(), &n_heur));
      double best = 1e30;
      int best_i = -1;
      for (int i = 0; i < n_heur; ++i) {
        if (heur[i].state != CUBLAS_STATUS_SUCCESS || heur[i].workspaceSize > ws_bytes) continue;
        bool ok = true;
        const double t = bench_time_us(
            [&](int) {
              if (cublasLtMatmul(lt, desc, &alpha, w, la, xb, lb, &beta, out, lc, out, lc, &heur[i].algo, ws, ws_bytes,
                                 s) != CUBLAS_STATUS_SUCCESS)
                ok = false;
            },
            iters, s);
        if (ok && t < best) {
          best = t;
          best_i = i;
        }
      }
      char algo[96] = "-";
      if (best_i >= 0) {
        const auto& a = heur[static_cast<size_t>(best_i)].algo;
        std::snprintf(algo, sizeof algo, "#%d: %d %d %d %d", best_i, config(a, CUBLASLT_ALGO_CONFIG_ID),
                      config(a, CUBLASLT_ALGO_CONFIG_TILE_ID), config(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                      config(a, CUBLASLT_ALGO_CONFIG_STAGES_ID));
      }
      char gv[32] = "-";
      if (M == 1) std::snprintf(gv, sizeof gv, "%.1f (%.2f TB/s)", gemv, gbytes / gemv * 1e3);
      // TB/s of weights: gbytes / us * 1e3; TFLOP/s: 2 M N K / us / 1e6.
      const double tflop = 2.0 * M * double(N) * double(K) / 1e6;
      std::printf("| %lldx%lld | %d | %s | %.1f | %.2f | %.1f | %.2f | %.3f | %s | %d | %.0f / %.0f |\n",
                  static_cast<long long>(N), static_cast<long long>(K), M, gv, ex, gbytes / ex * 1e3, best,
                  best_i >= 0 ? gbytes / best * 1e3 : 0.0, best_i >= 0 ? ex / best : 0.0, algo, n_heur, tflop / ex,
                  best_i >= 0 ? tflop / best : 0.0);
      std::fflush(stdout);
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(desc);
    }
    CK(cudaFree(w));
    CK(cudaFree(xb));
    CK(cudaFree(xf));
    CK(cudaFree(out));
  }
  cublasLtDestroy(lt);
  cublasDestroy(blas);
  CK(cudaFree(ws));
  return 0;
}
