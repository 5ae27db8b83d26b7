#include "backend/cuda/cuda_gemm.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "util/log.h"

namespace deltaserve::cuda {

namespace {

constexpr int kHeuristics = 16;  // cuBLASLt's candidates asked for (the H200 offers 8)
constexpr int kTimedCalls = 2;   // calls per candidate and round, each timed alone
constexpr int kRounds = 3;       // rounds over all candidates; a candidate's time is its best call

// Largest power of two (at most 256) dividing the address.
int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && a % static_cast<uintptr_t>(al) != 0) al /= 2;
  return al;
}

int config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  int v = -1;
  std::size_t got = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof v, &got) != CUBLAS_STATUS_SUCCESS) return -1;
  return v;
}

}  // namespace

CublasGemm::CublasGemm(cublasHandle_t blas, cudaStream_t stream, void* workspace, std::size_t workspace_bytes,
                       std::size_t l2_bytes, int algo, int tune_rows)
    : blas_(blas), stream_(stream), workspace_(workspace), workspace_bytes_(workspace_bytes), l2_bytes_(l2_bytes),
      algo_(algo), tune_rows_(tune_rows) {
  if (algo_ != 0) DS_CUBLAS_CHECK(cublasLtCreate(&lt_));
}

CublasGemm::~CublasGemm() {
  for (auto& [k, p] : plans_) release(p);
  if (lt_) cublasLtDestroy(lt_);
}

void CublasGemm::release(Plan& p) {
  if (p.la) cublasLtMatrixLayoutDestroy(p.la);
  if (p.lb) cublasLtMatrixLayoutDestroy(p.lb);
  if (p.lc) cublasLtMatrixLayoutDestroy(p.lc);
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  p = Plan{};
}

CublasGemm::Key CublasGemm::key_of(const Call& c) {
  const int align = std::min({alignment(c.w), alignment(c.x), alignment(c.dst)});
  return Key{c.rows, c.n, c.k, static_cast<int>(c.dst_type), align};
}

int64_t CublasGemm::bucket(int64_t rows) {
  int64_t b = 2;
  while (b < rows) b *= 2;
  return b;
}

std::vector<std::string> CublasGemm::choices() const {
  std::vector<std::string> out;
  for (const auto& [k, p] : plans_)
    out.push_back(str_cat(k.n, "x", k.k, " rows ", k.rows, k.dst_type == CUDA_R_16BF ? " bf16 out" : "", ": ", p.what));
  return out;
}

void CublasGemm::run(const Call& c, bool capturing) {
  if (!planned(c)) {  // GemmEx's default by rule: nothing to remember
    launch(Plan{}, c);
    return;
  }
  const Key key = key_of(c);
  auto it = plans_.find(key);
  if (it == plans_.end()) it = plans_.emplace(key, make_plan(c, capturing)).first;
  launch(it->second, c);
}

bool CublasGemm::launch(const Plan& p, const Call& c, bool check) {
  const float alpha = 1.0f;
  if (p.index == 0) {
    // Column-major view: dst^T [N, rows] = W [N, K] (row-major = K x N col-major, transposed) x^T [K, rows].
    DS_CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(c.n), static_cast<int>(c.rows),
                                 static_cast<int>(c.k), &alpha, c.w, CUDA_R_16BF, static_cast<int>(c.k), c.x,
                                 CUDA_R_16BF, static_cast<int>(c.k), &c.beta, c.dst, c.dst_type, static_cast<int>(c.n),
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return true;
  }
  const cublasStatus_t st = cublasLtMatmul(lt_, p.desc, &alpha, c.w, p.la, c.x, p.lb, &c.beta, c.dst, p.lc, c.dst,
                                           p.lc, &p.algo, workspace_, workspace_bytes_, stream_);
  if (check) DS_CUBLAS_CHECK(st);
  return st == CUBLAS_STATUS_SUCCESS;
}

// cuBLASLt's view of c's product, D [N, rows] (col-major) = op(A) B with A = W as col-major K x N:
// descriptors only (index 0).
CublasGemm::Plan CublasGemm::lt_plan(const Call& c) {
  Plan p;
  DS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
  DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA));
  DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB));
  DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, c.k, c.n, c.k));
  DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, c.k, c.rows, c.k));
  DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lc, c.dst_type, c.n, c.rows, c.n));
  return p;
}

std::vector<CublasGemm::Plan> CublasGemm::candidates(const Call& c, int align) {
  Plan base = lt_plan(c);
  cublasLtMatmulPreference_t pref = nullptr;
  DS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes_;
  DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  // The operands' alignment (part of the key): algorithms that need more are not offered.
  const uint32_t al = static_cast<uint32_t>(align);
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof al));
  std::vector<cublasLtMatmulHeuristicResult_t> heur(kHeuristics);
  int n_heur = 0;
  if (cublasLtMatmulAlgoGetHeuristic(lt_, base.desc, base.la, base.lb, base.lc, base.lc, pref, kHeuristics,
                                     heur.data(), &n_heur) != CUBLAS_STATUS_SUCCESS)
    n_heur = 0;
  cublasLtMatmulPreferenceDestroy(pref);
  std::vector<Plan> out;
  for (int i = 0; i < n_heur; ++i) {
    if (heur[i].state != CUBLAS_STATUS_SUCCESS || heur[i].workspaceSize > workspace_bytes_) continue;
    Plan p = out.empty() ? base : lt_plan(c);  // each owns its descriptors
    p.index = i + 1;
    p.algo = heur[i].algo;
    char buf[96];
    std::snprintf(buf, sizeof buf, "cuBLASLt #%d (algo %d, tile %d, split-K %d, stages %d)", i,
                  config(p.algo, CUBLASLT_ALGO_CONFIG_ID), config(p.algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                  config(p.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), config(p.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID));
    p.what = buf;
    out.push_back(p);
  }
  if (out.empty()) release(base);
  return out;
}

CublasGemm::Plan CublasGemm::make_plan(const Call& c, bool capturing) {
  Plan gemm_ex;
  gemm_ex.what = "cublasGemmEx";
  Key bk = key_of(c);
  if (algo_ > 0) {  // forced: the algo_-th usable result at these rows, or the last there is
    std::vector<Plan> cands = candidates(c, bk.align);
    if (cands.empty()) return gemm_ex;
    const std::size_t pick = std::min<std::size_t>(static_cast<std::size_t>(algo_ - 1), cands.size() - 1);
    for (std::size_t j = 0; j < cands.size(); ++j)
      if (j != pick) release(cands[j]);
    return cands[pick];
  }
  if (workspace_ == nullptr) return gemm_ex;  // (cuBLASLt's candidates want one)
  bk.rows = bucket(c.rows);
  auto it = chosen_.find(bk);
  if (it == chosen_.end()) {
    if (capturing) return gemm_ex;  // not timed inside a capture; the bucket stays open
    it = chosen_.emplace(bk, time_bucket(c, bk)).first;
  }
  if (!it->second.lt) return gemm_ex;
  // The bucket's algorithm, where cuBLASLt accepts it at these rows.
  Plan p = lt_plan(c);
  p.index = it->second.index;
  p.algo = it->second.algo;
  p.what = it->second.what;
  cublasLtMatmulHeuristicResult_t check{};
  if (cublasLtMatmulAlgoCheck(lt_, p.desc, p.la, p.lb, p.lc, p.lc, &p.algo, &check) == CUBLAS_STATUS_SUCCESS &&
      check.workspaceSize <= workspace_bytes_)
    return p;
  release(p);
  gemm_ex.what = "cublasGemmEx (the bucket's cuBLASLt algorithm refused these rows)";
  return gemm_ex;
}

// The bucket's algorithm, timed at its largest row count (an algorithm timed at fewer rows can tile
// them so that the bucket's top reads the weights twice: seen at 48 rows, 5% slower at 64). x's rows
// and the products go to temporary buffers of that many rows (c's rows of x, zeros after them).
CublasGemm::Choice CublasGemm::time_bucket(const Call& c, const Key& bk) {
  Choice gemm_ex{false, 0, {}, "cublasGemmEx"};
  timed_.fetch_add(1, std::memory_order_relaxed);
  const std::size_t elem = c.dst_type == CUDA_R_16BF ? 2 : 4;
  const std::size_t x_bytes = static_cast<std::size_t>(bk.rows * c.k) * 2;
  const std::size_t d_bytes = static_cast<std::size_t>(bk.rows * c.n) * elem;
  void *x = nullptr, *d = nullptr;
  if (cudaMalloc(&x, x_bytes) != cudaSuccess || cudaMalloc(&d, d_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    if (x) cudaFree(x);
    log_debug("gemm ", c.n, "x", c.k, " rows ", bk.rows / 2 + 1, "-", bk.rows, ": cublasGemmEx (no memory to time)");
    return gemm_ex;
  }
  DS_CUDA_CHECK(cudaMemsetAsync(x, 0, x_bytes, stream_));
  DS_CUDA_CHECK(cudaMemcpyAsync(x, c.x, static_cast<std::size_t>(c.rows * c.k) * 2, cudaMemcpyDeviceToDevice, stream_));
  const Call t{c.w, x, d, bk.rows, c.n, c.k, c.dst_type, 0.0f};
  std::vector<Plan> plans{Plan{}};  // GemmEx, then cuBLASLt's candidates
  plans[0].what = gemm_ex.what;
  for (Plan& p : candidates(t, bk.align)) plans.push_back(p);
  const std::vector<double> us = time_plans(t, plans);
  std::size_t win = 0;
  for (std::size_t j = 1; j < plans.size(); ++j)
    if (us[j] < us[win]) win = j;
  if (us[win] > us[0] * (1.0 - kGemmTuneMargin)) win = 0;
  log_debug("gemm ", c.n, "x", c.k, " rows ", bk.rows / 2 + 1, "-", bk.rows, " (timed at ", bk.rows, "): ",
            plans[win].what, " ", us[win], " us (cublasGemmEx ", us[0], " us, ", plans.size() - 1,
            " cuBLASLt candidates)");
  const Choice ch{win > 0, plans[win].index, plans[win].algo, plans[win].what};
  for (Plan& p : plans) release(p);
  DS_CUDA_CHECK(cudaFree(x));
  DS_CUDA_CHECK(cudaFree(d));
  return ch;
}

// Microseconds of each plan on c's operands, its best of kRounds x kTimedCalls calls, each timed
// alone; infinity for a plan cuBLASLt refuses.
std::vector<double> CublasGemm::time_plans(const Call& c, const std::vector<Plan>& plans) {
  // Each timed call starts with the weights out of L2, as in a step (whose other matmuls evict
  // them): an L2-sized buffer is written before it (a matrix smaller than L2, e.g. a tensor-parallel
  // shard, would otherwise be timed from L2). Without the memory for it, calls run back to back.
  void* flush = nullptr;
  if (l2_bytes_ > 0 && cudaMalloc(&flush, l2_bytes_) != cudaSuccess) {
    (void)cudaGetLastError();
    flush = nullptr;
  }
  std::vector<double> best(plans.size(), std::numeric_limits<double>::infinity());
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  DS_CUDA_CHECK(cudaEventCreate(&e0));
  DS_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<bool> ok(plans.size(), true);
  for (std::size_t j = 0; j < plans.size(); ++j) ok[j] = launch(plans[j], c, false);  // warm-up
  for (int r = 0; r < kRounds; ++r) {
    for (std::size_t j = 0; j < plans.size(); ++j) {
      if (!ok[j]) continue;
      for (int i = 0; i < kTimedCalls; ++i) {
        if (flush) DS_CUDA_CHECK(cudaMemsetAsync(flush, i & 0xff, l2_bytes_, stream_));
        DS_CUDA_CHECK(cudaEventRecord(e0, stream_));
        launch(plans[j], c);
        DS_CUDA_CHECK(cudaEventRecord(e1, stream_));
        DS_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0.f;
        DS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        best[j] = std::min(best[j], double(ms) * 1e3);
      }
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (flush) DS_CUDA_CHECK(cudaFree(flush));
  return best;
}

}  // namespace deltaserve::cuda
