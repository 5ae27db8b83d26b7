// CublasGemm: the matmuls of two or more rows on cuBLAS, dst [rows, N] = x [rows, K] Wᵀ + beta dst
// (x and W bf16, sums f32, dst f32 or bf16). Which cuBLAS kernel runs a shape is decided here, once
// per (rows, N, K, dst dtype, operand alignment), and kept for the backend's life, so that a CUDA
// graph replays what the eager run before its capture ran:
//  - CudaOptions::gemm_algo -1 (the default): row counts up to gemm_tune_rows fall in buckets
//    (2, 3-4, 5-8, ..., 33-64). A bucket's first eager call times, at the bucket's largest row count
//    (its x rows, zeros after them, into temporary buffers), cublasGemmEx's default and each
//    algorithm cuBLASLt's heuristic offers, each call alone from a flushed L2. The fastest is kept
//    for the bucket when it beats GemmEx by more than kGemmTuneMargin, else GemmEx; the bucket's
//    other row counts take it where cuBLASLt accepts it
//    (cublasLtMatmulAlgoCheck), else GemmEx. So a server times each weight shape at most once per
//    bucket (~0.1 s a bucket for the 27B's shapes on an H200). Larger row counts (prefill), exact
//    mode, and a row count met first inside a graph capture whose bucket is still untimed run
//    GemmEx's default. The choice can differ between GPUs and launches (as SGLang's autotuned kernels
//    can); within a process a row count of a shape always runs the same algorithm.
//  - 0: cublasGemmEx's default everywhere (the behaviour before tuning).
//  - k >= 1: cuBLASLt's k-th heuristic choice where it has one (tests and A/B runs).
// The H200's figures: bench/RESULTS.md, stop 41.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace deltaserve::cuda {

// A tuned algorithm must be at least this much faster than cublasGemmEx's default to replace it
// (timing noise stays with the default).
constexpr double kGemmTuneMargin = 0.02;

class CublasGemm {
 public:
  struct Call {
    const void* w;   // [N, K] bf16, row-major
    const void* x;   // [rows, K] bf16
    void* dst;       // [rows, N], dst_type
    int64_t rows, n, k;
    cudaDataType_t dst_type;  // CUDA_R_32F or CUDA_R_16BF
    float beta;
  };
  // l2_bytes: the device's L2 (timed calls start with it flushed). algo, tune_rows:
  // CudaOptions::gemm_algo / gemm_tune_rows (algo -1 with tune_rows 0: GemmEx).
  CublasGemm(cublasHandle_t blas, cudaStream_t stream, void* workspace, std::size_t workspace_bytes,
             std::size_t l2_bytes, int algo, int tune_rows);
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // Runs c. `capturing`: a graph capture is active (an open bucket is then not timed).
  void run(const Call& c, bool capturing);
  // Each planned shape met so far (row counts the option times or forces) and its algorithm:
  // "NxK rows R [bf16 out]: cublasGemmEx" or "...: cuBLASLt #i (algo, tile, split-K, stages)".
  std::vector<std::string> choices() const;
  // Buckets timed so far (read from any thread: Backend::setup_count).
  uint64_t timed_buckets() const { return timed_.load(std::memory_order_relaxed); }

 private:
  struct Key {
    int64_t rows, n, k;
    int dst_type, align;
    auto operator<=>(const Key&) const = default;
  };
  struct Choice {  // a bucket's timed algorithm
    bool lt = false;  // else cublasGemmEx
    int index = 0;
    cublasLtMatmulAlgo_t algo{};
    std::string what;
  };
  struct Plan {
    int index = 0;  // 0: cublasGemmEx's default; i >= 1: heuristic result i - 1
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulAlgo_t algo{};
    std::string what;  // for logs and tests
  };
  static Key key_of(const Call& c);
  // The bucket of a row count: the power of two at or above it (2, 4, 8, ...).
  static int64_t bucket(int64_t rows);
  // Whether c's row count has a plan (timed or forced), else GemmEx's default by rule.
  bool planned(const Call& c) const {
    return algo_ > 0 || (algo_ < 0 && c.rows >= 2 && c.rows <= tune_rows_ && lt_ != nullptr);
  }
  // The plan for c's row count (timing its bucket first when it is open and not capturing).
  Plan make_plan(const Call& c, bool capturing);
  Choice time_bucket(const Call& c, const Key& bucket_key);
  Plan lt_plan(const Call& c);
  // cuBLASLt's usable heuristic algorithms for c (operands aligned to `align` bytes), in its order.
  std::vector<Plan> candidates(const Call& c, int align);
  std::vector<double> time_plans(const Call& c, const std::vector<Plan>& plans);
  // c's product with plan p. False when cuBLASLt refused it (check: abort instead).
  bool launch(const Plan& p, const Call& c, bool check = true);
  static void release(Plan& p);

  cublasHandle_t blas_;
  cublasLtHandle_t lt_ = nullptr;
  cudaStream_t stream_;
  void* workspace_;
  std::size_t workspace_bytes_, l2_bytes_;
  int algo_, tune_rows_;
  std::map<Key, Plan> plans_;     // per row count
  std::map<Key, Choice> chosen_;  // per bucket (Key::rows: the bucket)
  std::atomic<uint64_t> timed_{0};
};

}  // namespace deltaserve::cuda
