#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <tuple>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_launch.h"

namespace deltaserve {

namespace {

class CudaLinear final : public LinearWeight {
 public:
  CudaLinear(DeviceBuffer buf, int64_t n, int64_t k) : buf_(std::move(buf)), n_(n), k_(k) {}
  int64_t n() const override { return n_; }
  int64_t k() const override { return k_; }
  std::size_t nbytes() const override { return static_cast<std::size_t>(n_ * k_) * 2; }
  const uint16_t* data() const { return static_cast<const uint16_t*>(buf_.data()); }

 private:
  DeviceBuffer buf_;
  int64_t n_, k_;
};

class CudaBackend;

// Batches with a sequence of at least this many tokens take the tensor-core attention path.
constexpr int kFlashMinSeqTokens = 64;
// The one-row decode's L2 prefetch (CudaKernels::l2_prefetch) runs for contexts of at most this
// many keys, decided in the kernels (graph-safe). H200, 27B, both kernels prefetching: 1k +1%, 4k
// and 8k nothing, 32k -0.6 to -1.2% (the attention's KV reads keep the DRAM busy there).
constexpr int kL2PrefetchMaxKeys = 2048;

// The first sequence of a batch's suffix of one-token sequences (the decode rows the scheduler puts
// after a mixed batch's prefill chunks); n_seqs when there is none; at least 1.
int one_token_suffix(const BatchMeta& meta) {
  int P = meta.n_seqs;
  while (P > 1 && meta.seq_start[P] - meta.seq_start[P - 1] == 1) --P;
  return P;
}

class CudaKernels final : public Kernels {
 public:
  explicit CudaKernels(CudaBackend& b) : b_(b) {}
  ~CudaKernels() override;
  void embed(const Tensor& table, const Tensor& ids, Tensor out, int64_t first_row, int64_t vocab) override;
  void copy_columns(const Tensor& src, int64_t src_col, Tensor dst, int64_t dst_col, int64_t width) override;
  void gather_columns(const Tensor& src, const Tensor& index, Tensor dst, float fill) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out, int64_t out_stride) override;
  void matmul(const Tensor& x, const LinearWeight& w, Tensor out, bool accumulate) override;
  void silu_mul(const Tensor& gate_up, Tensor out) override;
  void attention(const AttentionParams& p, const Tensor& qkv, const KvLayerView& kv, const BatchMeta& meta,
                 Tensor out) override;
  void gated_delta_net(const GdnParams& p, const Tensor& proj, const StateLayerView& state,
                       const BatchMeta& meta, Tensor out) override;
  void gather_rows(const Tensor& src, const int32_t* rows, int n_rows, Tensor dst) override;
  void argmax_rows(const Tensor& x, Tensor out) override;
  void rms_norm_matmul(const Tensor& x, const Tensor& weight, float eps, const LinearWeight& w, Tensor out,
                       bool accumulate, Tensor scratch) override;
  void silu_mul_matmul(const Tensor& gate_up, const LinearWeight& w, Tensor out, bool accumulate,
                       Tensor scratch) override;
  void mlp(const Tensor& x, const Tensor& norm, float eps, const LinearWeight& gate_up, const LinearWeight& down,
           Tensor out, bool accumulate, Tensor normed, Tensor gu, Tensor act) override;
  void sample_rows(Tensor logits, const Tensor& rows, const Tensor& penalties, Tensor out) override;
  void gdn_commit(std::span<const GdnLayerRef> layers, const BatchMeta& commit) override;

  void set_timing(bool on) { timing_ = on; }
  bool timing() const { return timing_; }
  uint64_t epoch() const { return epoch_; }
  bool capturing() const;
  std::vector<CudaOpTime> take_times();

 private:
  // Scratch device memory that only grows (the first large batch sizes it), zeroed when it does.
  void* scratch(int idx, std::size_t bytes);
  void gemm_bf16(const uint16_t* xb, int64_t T, int parts, const CudaLinear& cw, Tensor out, bool accumulate);
  void cublas_gemm(const uint16_t* xb, int64_t rows, const CudaLinear& cw, void* dst, cudaDataType_t dst_type,
                   float beta);
  bool matmul_with_prologue(cuda::GemvPrologue kind, const Tensor& in, const float* norm, float eps,
                            const CudaLinear& cw, Tensor out, bool accumulate);
  const float* inv_freq(int rotary_dim, float theta);
  // Whether the small kernels of a batch of `rows` rows go by programmatic dependent launch (each
  // resident when the kernel before it ends): with one row, where they sit between GEMVs (a
  // decode step 0.8% faster on the H200). Not beside cuBLAS's GEMMs: a 4-row verification was 1%
  // slower with them.
  bool small_pdl(int64_t rows) const;
  // Whether, in a batch of 2..64 rows (decode batches, verifications), the kernels of an attention
  // or GDN op after its first (which follows a plainly launched cuBLAS GEMM) go by PDL: each
  // follows one of ours, which waits before it triggers (CudaOptions::pdl_chain).
  bool chain_pdl(int64_t rows) const;
  // attention() over sequences [s0, s1) of the batch (all of it, or its prefill chunks, then its
  // one-token suffix).
  void attention_part(const AttentionParams& p, const Tensor& qkv, const KvLayerView& kv, const BatchMeta& meta,
                      Tensor out, int s0, int s1);
  // 0, 1, ..., n - 1 on the device (the token starts of n one-token sequences).
  const int32_t* iota(int n);
  // What a one-row GDN / attention decode kernel prefetches into L2 of the matmul after it
  // (CudaOptions::l2_prefetch_mb): the first bytes of w, or nothing.
  std::pair<const void*, int64_t> l2_prefetch(const LinearWeight* w) const;
  // Times one op when timing is on.
  template <typename F>
  void timed(const std::string& name, F&& f);
  cudaStream_t stream() const;

  CudaBackend& b_;
  DeviceBuffer scratch_[12];
  DeviceBuffer iota_;
  std::map<std::pair<int, float>, DeviceBuffer> inv_freq_;
  // gdn_commit's per-layer table on the device, built on the first call for a set of layers
  // (keyed by the layers' state pointers, which are fixed for the cache's lifetime).
  std::vector<const void*> commit_key_, commit_probe_;
  DeviceBuffer commit_table_;
  bool timing_ = false;
  uint64_t epoch_ = 0;  // +1 whenever a scratch buffer moves
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;
  std::vector<std::string> pending_;  // name of each used event pair
  std::map<std::string, CudaOpTime> times_;
};

class CudaEvent final : public DeviceEvent {
 public:
  CudaEvent() { DS_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
  ~CudaEvent() override { cudaEventDestroy(event); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t event = nullptr;
};

class CudaGraph final : public DeviceGraph {
 public:
  ~CudaGraph() override {
    if (exec) cudaGraphExecDestroy(exec);
  }
  cudaGraphExec_t exec = nullptr;
};

// Makes `device` current for the scope (restoring the previous one): backend calls may come from a
// thread bound to another rank's device (the engine thread copying a slot on every rank).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) == cudaSuccess && prev_ != device) {
      DS_CUDA_CHECK(cudaSetDevice(device));
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaOptions& options) : device_(device), options_(options), kernels_(*this) {
    DS_CUDA_CHECK(cudaSetDevice(device));
    DS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DS_CUBLAS_CHECK(cublasCreate(&cublas_));
    DS_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    cudaDeviceProp prop{};
    DS_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    name_ = prop.name;
    cc_ = prop.major * 10 + prop.minor;
    // CudaKernels::l2_prefetch's size: the option, at most a third of L2 (the bulk prefetch is sm_90).
    if (prop.major >= 9)
      l2_prefetch_bytes_ = std::min<int64_t>(int64_t(options_.l2_prefetch_mb) << 20, prop.l2CacheSize / 3);
    // cuBLAS's workspace, ours and fixed (graph capture never allocates): NVIDIA's recommended 32 MiB
    // on Hopper, 4 MiB before (CudaOptions::cublas_workspace_mb; 0: cuBLAS's own default).
    const int mb = options_.cublas_workspace_mb >= 0 ? options_.cublas_workspace_mb : (prop.major >= 9 ? 32 : 4);
    if (mb > 0) {
      DS_CUDA_CHECK(cudaMalloc(&cublas_workspace_, std::size_t(mb) << 20));
      DS_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_, std::size_t(mb) << 20));
    }
    // Exact mode keeps GemmEx's default unless an algorithm is forced (its numerics are the tests').
    const int algo = options_.exact_gemm && options_.gemm_algo < 0 ? 0 : options_.gemm_algo;
    gemm_ = std::make_unique<cuda::CublasGemm>(cublas_, stream_, cublas_workspace_,
                                               cublas_workspace_ ? std::size_t(mb) << 20 : 0,
                                               static_cast<std::size_t>(prop.l2CacheSize), algo,
                                               options_.gemm_tune_rows);
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    gemm_.reset();
    cublasDestroy(cublas_);
    if (cublas_workspace_) cudaFree(cublas_workspace_);
  }
  Device device() const override { return Device::Cuda; }
  std::string description() const override {
    const MemoryInfo m = memory_info();
    return str_cat("cuda (", name_, ", sm_", cc_, ", ", m.total_bytes >> 30, " GiB",
                   options_.exact_gemm ? ", exact GEMM" : ", bf16 GEMM", ")");
  }
  DType activation_dtype() const override { return DType::F32; }
  MemoryInfo memory_info() const override {
    DeviceGuard guard(device_);
    std::size_t f = 0, t = 0;
    DS_CUDA_CHECK(cudaMemGetInfo(&f, &t));
    return MemoryInfo{f, t};
  }
  DeviceBuffer allocate(std::size_t bytes) override {
    DeviceGuard guard(device_);
    const std::size_t rounded = std::max<std::size_t>((bytes + 255) / 256 * 256, 256);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, rounded);
    DS_CHECK(e == cudaSuccess, "cudaMalloc of ", bytes, " bytes failed: ", cudaGetErrorString(e));
    DS_CUDA_CHECK(cudaMemsetAsync(p, 0, rounded, stream_));
    return DeviceBuffer(p, bytes, Device::Cuda, counted(rounded, [](void* q) { cudaFree(q); }));
  }
  DeviceBuffer allocate_host(std::size_t bytes) override {
    DeviceGuard guard(device_);
    void* p = nullptr;
    cudaError_t e = cudaMallocHost(&p, std::max<std::size_t>(bytes, 1));
    DS_CHECK(e == cudaSuccess, "cudaMallocHost of ", bytes, " bytes failed: ", cudaGetErrorString(e));
    std::memset(p, 0, bytes);
    return DeviceBuffer(p, bytes, Device::Cpu, [](void* q) { cudaFreeHost(q); });
  }
  std::unique_ptr<LinearWeight> make_linear(const void* host, DType dtype, int64_t n, int64_t k) override {
    DeviceGuard guard(device_);
    DeviceBuffer buf = allocate(static_cast<std::size_t>(n * k) * 2);
    uint16_t* d = static_cast<uint16_t*>(buf.data());
    if (host == nullptr) {  // dummy weights: uniform(-1/sqrt(k), 1/sqrt(k)), generated on the device
      cuda::launch_random_bf16(d, n * k, 1.0f / std::sqrt(float(k)), 0x5eed0000ull + (seed_++) * 7919ull, stream_);
    } else if (dtype == DType::BF16) {
      DS_CUDA_CHECK(cudaMemcpyAsync(d, host, static_cast<std::size_t>(n * k) * 2, cudaMemcpyHostToDevice, stream_));
    } else {
      // f32 / f16 checkpoints: converted to bf16 (the matmul kernels stream bf16 weights).
      DS_CHECK(dtype == DType::F32 || dtype == DType::F16, "make_linear: unsupported dtype");
      const int64_t total = n * k, chunk = int64_t(1) << 22;
      std::vector<uint16_t> tmp(static_cast<std::size_t>(std::min(total, chunk)));
      for (int64_t i = 0; i < total; i += chunk) {
        const int64_t m = std::min(chunk, total - i);
        for (int64_t j = 0; j < m; ++j) {
          const float f = dtype == DType::F32 ? static_cast<const float*>(host)[i + j]
                                              : f16_to_f32(static_cast<const uint16_t*>(host)[i + j]);
          tmp[j] = f32_to_bf16(f);
        }
        DS_CUDA_CHECK(cudaMemcpyAsync(d + i, tmp.data(), m * 2, cudaMemcpyHostToDevice, stream_));
        DS_CUDA_CHECK(cudaStreamSynchronize(stream_));
      }
    }
    DS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return std::make_unique<CudaLinear>(std::move(buf), n, k);
  }
  void copy_to_device(Tensor dst, const void* host_src) override {
    DeviceGuard guard(device_);
    DS_CUDA_CHECK(cudaMemcpyAsync(dst.data, host_src, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
    DS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy_to_host(void* host_dst, const Tensor& src) override {
    DeviceGuard guard(device_);
    DS_CUDA_CHECK(cudaMemcpyAsync(host_dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
    DS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy(Tensor dst, const Tensor& src) override {
    DeviceGuard guard(device_);
    DS_CHECK(dst.nbytes() == src.nbytes(), "copy size mismatch");
    if (dst.nbytes() == 0) return;
    DS_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDefault, stream_));
    if (dst.device == Device::Cpu || src.device == Device::Cpu) DS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void synchronize() override {
    DeviceGuard guard(device_);
    DS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy_to_device_async(Tensor dst, const void* host_src) override {
    DeviceGuard guard(device_);
    DS_CUDA_CHECK(cudaMemcpyAsync(dst.data, host_src, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
  }
  void copy_to_host_async(void* host_dst, const Tensor& src) override {
    DeviceGuard guard(device_);
    DS_CUDA_CHECK(cudaMemcpyAsync(host_dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
  }
  std::unique_ptr<DeviceEvent> make_event() override {
    DeviceGuard guard(device_);
    return std::make_unique<CudaEvent>();
  }
  void record(DeviceEvent& event) override {
    DeviceGuard guard(device_);
    DS_CUDA_CHECK(cudaEventRecord(static_cast<CudaEvent&>(event).event, stream_));
  }
  void wait(DeviceEvent& event) override {
    DeviceGuard guard(device_);
    DS_CUDA_CHECK(cudaEventSynchronize(static_cast<CudaEvent&>(event).event));
  }

  std::unique_ptr<DeviceGraph> capture(const std::function<void()>& work) override {
    if (kernels_.timing()) return nullptr;  // op timing records events per op: run eagerly
    const uint64_t epoch = kernels_.epoch();
    if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    work();
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    auto out = std::make_unique<CudaGraph>();
    if (e == cudaSuccess && graph && kernels_.epoch() == epoch) e = cudaGraphInstantiate(&out->exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (e != cudaSuccess || !out->exec) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return out;
  }
  void replay(DeviceGraph& graph) override {
    DS_CUDA_CHECK(cudaGraphLaunch(static_cast<CudaGraph&>(graph).exec, stream_));
  }
  uint64_t graph_epoch() const override { return kernels_.epoch(); }
  uint64_t setup_count() const override { return gemm_->timed_buckets(); }
  bool capturing() const {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(stream_, &st) == cudaSuccess && st == cudaStreamCaptureStatusActive;
  }
  Kernels& kernels() override { return kernels_; }

  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  cuda::CublasGemm& gemm() { return *gemm_; }
  bool exact_gemm() const { return options_.exact_gemm; }
  const CudaOptions& options() const { return options_; }
  // Programmatic dependent launch (CudaOptions::pdl, sm_90+).
  bool pdl() const { return cuda::pdl_enabled(options_, device_); }
  int64_t l2_prefetch_bytes() const { return l2_prefetch_bytes_; }
  const std::string& name() const { return name_; }
  int device_index() const { return device_; }
  void bind_thread() override { DS_CUDA_CHECK(cudaSetDevice(device_)); }
  CudaKernels& cuda_kernels() { return kernels_; }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;
  std::unique_ptr<cuda::CublasGemm> gemm_;  // the 2+-row GEMMs' algorithm per shape
  std::string name_;
  int cc_ = 0;
  int64_t l2_prefetch_bytes_ = 0;
  CudaOptions options_;
  uint64_t seed_ = 1;
  CudaKernels kernels_;
};

cudaStream_t CudaKernels::stream() const { return b_.stream(); }

CudaKernels::~CudaKernels() {
  for (auto& [a, b] : events_) {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
}

bool CudaKernels::capturing() const { return b_.capturing(); }

void* CudaKernels::scratch(int idx, std::size_t bytes) {
  if (scratch_[idx].size() < bytes) {
    DS_CHECK(!capturing(), "CUDA graph capture: scratch ", idx, " must grow to ", bytes,
             " bytes (run the shape eagerly first)");
    b_.synchronize();  // the old buffer may still be in use by queued work
    scratch_[idx] = DeviceBuffer();
    scratch_[idx] = b_.allocate(bytes + bytes / 4);
    // Zeros: the GDN decode counters (scratch 11) rely on it; the others are written before read.
    DS_CUDA_CHECK(cudaMemsetAsync(scratch_[idx].data(), 0, scratch_[idx].size(), stream()));
    ++epoch_;  // graphs captured with the old buffer are stale
  }
  return scratch_[idx].data();
}

const int32_t* CudaKernels::iota(int n) {
  if (iota_.size() < static_cast<std::size_t>(n) * 4) {
    DS_CHECK(!capturing(), "CUDA graph capture: the iota table must grow to ", n);
    b_.synchronize();  // the old table may still be in use by queued work
    std::vector<int32_t> h(std::max(n, 4096));
    std::iota(h.begin(), h.end(), 0);
    iota_ = DeviceBuffer();
    iota_ = b_.allocate(h.size() * 4);
    DS_CUDA_CHECK(cudaMemcpy(iota_.data(), h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  }
  return static_cast<const int32_t*>(iota_.data());
}

const float* CudaKernels::inv_freq(int rotary_dim, float theta) {
  auto key = std::make_pair(rotary_dim, theta);
  auto it = inv_freq_.find(key);
  if (it == inv_freq_.end()) {
    std::vector<float> h(std::max(rotary_dim / 2, 1));
    for (int i = 0; i < rotary_dim / 2; ++i) h[i] = 1.0f / std::pow(theta, float(2 * i) / float(rotary_dim));
    DeviceBuffer buf = b_.allocate(h.size() * 4);
    b_.copy_to_device(buf.view(DType::F32, {int64_t(h.size())}), h.data());
    it = inv_freq_.emplace(key, std::move(buf)).first;
  }
  return static_cast<const float*>(it->second.data());
}

template <typename F>
void CudaKernels::timed(const std::string& name, F&& f) {
  if (!timing_) {
    f();
    return;
  }
  const std::size_t i = pending_.size();
  if (events_.size() <= i) {
    cudaEvent_t a, b;
    DS_CUDA_CHECK(cudaEventCreate(&a));
    DS_CUDA_CHECK(cudaEventCreate(&b));
    events_.emplace_back(a, b);
  }
  DS_CUDA_CHECK(cudaEventRecord(events_[i].first, stream()));
  f();
  DS_CUDA_CHECK(cudaEventRecord(events_[i].second, stream()));
  pending_.push_back(name);
}

std::vector<CudaOpTime> CudaKernels::take_times() {
  DS_CUDA_CHECK(cudaStreamSynchronize(stream()));
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    float ms = 0;
    DS_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i].first, events_[i].second));
    auto& t = times_[pending_[i]];
    t.name = pending_[i];
    t.calls++;
    t.ms += ms;
  }
  pending_.clear();
  std::vector<CudaOpTime> out;
  for (auto& [k, v] : times_) out.push_back(v);
  times_.clear();
  std::sort(out.begin(), out.end(), [](const CudaOpTime& a, const CudaOpTime& b) { return a.ms > b.ms; });
  return out;
}

void CudaKernels::embed(const Tensor& table, const Tensor& ids, Tensor out, int64_t first_row, int64_t vocab) {
  const int64_t h = table.dim(1), n = ids.numel(), rows = table.dim(0);
  DS_CHECK(out.rows() == n && out.cols() == h && out.dtype == DType::F32, "embed shapes");
  DS_CHECK(table.dtype == DType::BF16 || table.dtype == DType::F32, "embed table dtype");
  timed("embed", [&] {
    cuda::launch_embed(table.data, table.dtype == DType::BF16, first_row, rows, vocab == 0 ? rows : vocab, h,
                       ids.i32(), n, out.f32(), stream());
  });
}

void CudaKernels::copy_columns(const Tensor& src, int64_t src_col, Tensor dst, int64_t dst_col, int64_t width) {
  const int64_t rows = src.rows();
  DS_CHECK(dst.rows() == rows && src_col >= 0 && dst_col >= 0 && src_col + width <= src.cols() &&
               dst_col + width <= dst.cols(),
           "copy_columns shapes");
  if (rows == 0 || width == 0) return;
  timed("copy_columns", [&] {
    DS_CUDA_CHECK(cudaMemcpy2DAsync(dst.f32() + dst_col, dst.cols() * sizeof(float), src.f32() + src_col,
                                    src.cols() * sizeof(float), width * sizeof(float), rows, cudaMemcpyDeviceToDevice,
                                    stream()));
  });
}

void CudaKernels::gather_columns(const Tensor& src, const Tensor& index, Tensor dst, float fill) {
  const int64_t rows = src.dim(0);  // src may have no columns (a rank with none of the map's tokens)
  DS_CHECK(src.ndim == 2 && dst.rows() == rows && index.numel() == dst.cols() && index.dtype == DType::I32,
           "gather_columns shapes");
  DS_CHECK(rows <= 65535, "gather_columns: ", rows, " rows (at most 65535)");
  if (rows == 0 || dst.cols() == 0) return;
  timed("gather_columns", [&] {
    cuda::launch_gather_columns(src.f32(), src.cols(), index.i32(), rows, dst.cols(), fill, dst.f32(), stream());
  });
}

void CudaKernels::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out, int64_t out_stride) {
  DS_CHECK(weight.numel() == x.cols(), "rms_norm weight size");
  timed("rms_norm", [&] {
    cuda::launch_rms_norm(x.f32(), x.rows(), x.cols(), weight.f32(), eps, out.f32(), out_stride, small_pdl(x.rows()),
                          stream());
  });
}

void CudaKernels::matmul(const Tensor& x, const LinearWeight& w, Tensor out, bool accumulate) {
  const auto& cw = static_cast<const CudaLinear&>(w);
  const int64_t T = x.rows(), K = x.cols(), N = cw.n();
  DS_CHECK(K == cw.k() && out.cols() == N && T == out.rows(), "matmul shapes ", x.shape_string(), " x [", N,
           ", ", cw.k(), "] -> ", out.shape_string());
  if (T == 0) return;
  const bool one = T == 1;
  timed(timing_ ? str_cat(one ? "matmul gemv " : "matmul cublas ", N, "x", K) : std::string(), [&] {
    if (one && cuda::launch_gemv(x.f32(), K, cw.data(), N, out.f32(), accumulate, !b_.exact_gemm(), b_.options(), stream()))
      return;
    // cuBLAS, bf16 x bf16 -> f32. Default: x rounded to bf16 once. Exact mode
    // (DELTASERVE_CUDA_GEMM=exact): x = hi + mid + lo, three bf16 parts (24 mantissa bits, i.e.
    // f32), stacked as 3T rows of one GEMM (the weights are read once), summed per row afterwards.
    const int parts = b_.exact_gemm() ? 3 : 1;
    uint16_t* xb = static_cast<uint16_t*>(scratch(0, static_cast<std::size_t>(T * parts * K) * 2));
    if (parts == 3) cuda::launch_split_bf16x3(x.f32(), T * K, xb, stream());
    else cuda::launch_f32_to_bf16(x.f32(), T * K, xb, stream());
    gemm_bf16(xb, T, parts, cw, out, accumulate);
  });
}

// out [T, N] (+)= x [T, K] W^T by cuBLAS from xb, x as `parts` stacked bf16 copies [parts * T, K]
// (1: x rounded; 3: hi, mid, lo parts, summed per row afterwards).
void CudaKernels::gemm_bf16(const uint16_t* xb, int64_t T, int parts, const CudaLinear& cw, Tensor out,
                            bool accumulate) {
  const int64_t N = cw.n(), rows = T * parts;
  float* dst = out.f32();
  float beta = accumulate ? 1.0f : 0.0f;
  if (parts == 3) {
    dst = static_cast<float*>(scratch(4, static_cast<std::size_t>(rows * N) * 4));
    beta = 0.0f;
  }
  cublas_gemm(xb, rows, cw, dst, CUDA_R_32F, beta);
  if (parts == 3) cuda::launch_sum_parts3(dst, T * N, out.f32(), accumulate, stream());
}

// dst [rows, N] = x [rows, K] W^T + beta dst: cuBLAS, bf16 xb and weights, f32 sums, dst f32 or bf16
// (dst_type; bf16: the sums rounded once).
void CudaKernels::cublas_gemm(const uint16_t* xb, int64_t rows, const CudaLinear& cw, void* dst,
                              cudaDataType_t dst_type, float beta) {
  const cuda::CublasGemm::Call c{cw.data(), xb, dst, rows, cw.n(), cw.k(), dst_type, beta};
  b_.gemm().run(c, capturing());
}

// A matmul behind an RMSNorm (norm, eps) or a SiLU-mul: at one row the prologue folds into the GEMV
// where CudaOptions::fused_gemv asks for it; at two or more rows in the default (bf16) mode it writes
// straight into the GEMM's bf16 input (the f32 result is never stored; the same bf16 values as
// rounding it). False: neither applies, the caller runs the separate ops.
bool CudaKernels::matmul_with_prologue(cuda::GemvPrologue kind, const Tensor& in, const float* norm, float eps,
                                       const CudaLinear& cw, Tensor out, bool accumulate) {
  const int64_t T = in.rows(), K = cw.k(), N = cw.n();
  const bool silu = kind == cuda::GemvPrologue::SiluMul;
  const char* tag = silu ? "silu " : "norm ";
  if (T == 1) {
    if (b_.options().fused_gemv < (silu ? 1 : 2)) return false;
    bool done = false;
    timed(timing_ ? str_cat("matmul gemv+", tag, N, "x", K) : std::string(), [&] {
      done = cuda::launch_gemv_prologue(in.f32(), kind, norm, eps, K, cw.data(), N, out.f32(), accumulate,
                                        !b_.exact_gemm(), b_.options(), stream());
    });
    return done;
  }
  if (T == 0 || b_.exact_gemm()) return false;
  timed(timing_ ? str_cat("matmul cublas+", tag, N, "x", K) : std::string(), [&] {
    uint16_t* xb = static_cast<uint16_t*>(scratch(0, static_cast<std::size_t>(T * K) * 2));
    if (silu) cuda::launch_silu_mul_bf16(in.f32(), T, K, xb, false, stream());
    else cuda::launch_rms_norm_bf16(in.f32(), T, K, norm, eps, xb, false, stream());
    gemm_bf16(xb, T, 1, cw, out, accumulate);
  });
  return true;
}

void CudaKernels::rms_norm_matmul(const Tensor& x, const Tensor& weight, float eps, const LinearWeight& w,
                                  Tensor out, bool accumulate, Tensor scratch) {
  const auto& cw = static_cast<const CudaLinear&>(w);
  const int64_t K = x.cols(), N = cw.n();
  DS_CHECK(K == cw.k() && weight.numel() == K && out.cols() == N && x.rows() == out.rows(), "rms_norm_matmul shapes");
  if (!matmul_with_prologue(cuda::GemvPrologue::RmsNorm, x, weight.f32(), eps, cw, out, accumulate))
    Kernels::rms_norm_matmul(x, weight, eps, w, out, accumulate, scratch);
}

// More than kMlpBf16MinRows rows in the bf16 mode (prefill chunks): the RMSNorm writes gate_up's
// bf16 input, gate_up writes bf16 into gu's buffer, the SiLU-mul reads it and writes down's bf16
// input into act's buffer; only down's output is f32. The f32 intermediates of the default path
// would move 3x the bytes (an 8k prefill of the 27B: 1.7 GB a layer, 10 ms of its 800). Decode
// batches and verifications (at most 64 rows: small intermediates, nothing to gain; a 4-row
// verification measured 0.2 ms slower with it), one row and exact mode: the separate calls.
void CudaKernels::mlp(const Tensor& x, const Tensor& norm, float eps, const LinearWeight& gate_up,
                      const LinearWeight& down, Tensor out, bool accumulate, Tensor normed, Tensor gu, Tensor act) {
  const auto& cg = static_cast<const CudaLinear&>(gate_up);
  const auto& cd = static_cast<const CudaLinear&>(down);
  const int64_t T = x.rows(), H = x.cols(), I = cd.k();
  DS_CHECK(cg.k() == H && cg.n() == 2 * I && cd.n() == out.cols() && norm.numel() == H && out.rows() == T &&
               gu.numel() >= T * 2 * I && act.numel() >= T * I,
           "mlp shapes");
  constexpr int64_t kMlpBf16MinRows = 65;
  if (T < kMlpBf16MinRows || b_.exact_gemm())
    return Kernels::mlp(x, norm, eps, gate_up, down, out, accumulate, normed, gu, act);
  uint16_t* gu16 = reinterpret_cast<uint16_t*>(gu.data);    // [T, 2I] bf16 in gu's f32 buffer
  uint16_t* act16 = reinterpret_cast<uint16_t*>(act.data);  // [T, I] bf16 in act's
  timed(timing_ ? str_cat("matmul cublas+norm bf16 out ", cg.n(), "x", H) : std::string(), [&] {
    uint16_t* xb = static_cast<uint16_t*>(scratch(0, static_cast<std::size_t>(T * H) * 2));
    cuda::launch_rms_norm_bf16(x.f32(), T, H, norm.f32(), eps, xb, false, stream());
    cublas_gemm(xb, T, cg, gu16, CUDA_R_16BF, 0.0f);
  });
  timed(timing_ ? str_cat("matmul cublas+silu bf16 in ", cd.n(), "x", I) : std::string(), [&] {
    cuda::launch_silu_mul_bf16_in(gu16, T, I, act16, stream());
    gemm_bf16(act16, T, 1, cd, out, accumulate);
  });
}

void CudaKernels::silu_mul_matmul(const Tensor& gate_up, const LinearWeight& w, Tensor out, bool accumulate,
                                  Tensor scratch) {
  const auto& cw = static_cast<const CudaLinear&>(w);
  const int64_t K = cw.k(), N = cw.n();
  DS_CHECK(gate_up.cols() == 2 * K && out.cols() == N && gate_up.rows() == out.rows(), "silu_mul_matmul shapes");
  if (!matmul_with_prologue(cuda::GemvPrologue::SiluMul, gate_up, nullptr, 0.f, cw, out, accumulate))
    Kernels::silu_mul_matmul(gate_up, w, out, accumulate, scratch);
}

void CudaKernels::silu_mul(const Tensor& gate_up, Tensor out) {
  DS_CHECK(gate_up.cols() == 2 * out.cols() && gate_up.rows() == out.rows(), "silu_mul shapes");
  timed("silu_mul", [&] {
    cuda::launch_silu_mul(gate_up.f32(), gate_up.rows(), out.cols(), out.f32(), small_pdl(gate_up.rows()), stream());
  });
}

void CudaKernels::attention(const AttentionParams& p, const Tensor& qkv, const KvLayerView& kv,
                            const BatchMeta& meta, Tensor out) {
  const int nh = p.n_heads, nkv = p.n_kv_heads, hd = p.head_dim;
  const int64_t row = int64_t(nh) * (p.output_gate ? 2 : 1) * hd + 2LL * nkv * hd;
  DS_CHECK(qkv.cols() == row && qkv.rows() == meta.n_tokens, "attention qkv ", qkv.shape_string());
  DS_CHECK(out.cols() == int64_t(nh) * hd, "attention out ", out.shape_string());
  DS_CHECK(kv.v.dtype == kv.k.dtype, "attention: K and V caches differ in dtype");
  DS_CHECK(kv.k_scale > 0.f && kv.v_scale > 0.f, "attention: KV scales must be positive");
  DS_CHECK(nh % nkv == 0 && nh / nkv <= 32, "attention: GQA group of ", nh / nkv);
  DS_CHECK(p.rotary_dim % 2 == 0 && p.rotary_dim <= hd, "rotary_dim");
  if (meta.n_tokens == 0) return;
  // A mixed batch (prefill chunks, then one-token decode rows: the scheduler's order): the chunks
  // take the flash kernel and the decode rows, as a decode batch of their own, the split-KV decode
  // kernel (in the flash kernel each would be a tile of one row walking its context alone).
  const bool long_seq = b_.options().flash_attention && meta.max_seq_tokens >= kFlashMinSeqTokens;
  const int P = long_seq && b_.options().mixed_decode_rows ? one_token_suffix(meta) : meta.n_seqs;
  timed("attention", [&] {
    attention_part(p, qkv, kv, meta, out, 0, P);
    if (P < meta.n_seqs) attention_part(p, qkv, kv, meta, out, P, meta.n_seqs);
  });
}

void CudaKernels::attention_part(const AttentionParams& p, const Tensor& qkv, const KvLayerView& kv,
                                 const BatchMeta& meta, Tensor out, int s0, int s1) {
  const int nh = p.n_heads, nkv = p.n_kv_heads, hd = p.head_dim;
  const int64_t row = qkv.cols();
  // Sequences [s0, s1): token rows from tok0 on. A suffix (s0 > 0) is one-token sequences, whose
  // starts relative to tok0 are 0, 1, 2, ... (iota).
  const int tok0 = meta.seq_start[s0], T = meta.seq_start[s1] - tok0, S = s1 - s0;
  int max_seq_tokens = 0, max_keys = 0;
  bool past = false;  // a sequence continues a cached prefix (its earlier keys: the paged cache)
  for (int s = s0; s < s1; ++s) {
    const int n = meta.seq_start[s + 1] - meta.seq_start[s];
    max_seq_tokens = std::max(max_seq_tokens, n);
    max_keys = std::max(max_keys, meta.context_len[s]);
    past = past || meta.context_len[s] > n;
  }
  DS_CHECK(s0 == 0 || max_seq_tokens == 1, "attention: a batch's suffix of decode rows has one token each");
  cuda::AttnArgs a;
  a.n_tokens = T;
  a.n_seqs = S;
  a.n_heads = nh;
  a.n_kv_heads = nkv;
  a.head_dim = hd;
  a.rotary_dim = p.rotary_dim;
  a.output_gate = p.output_gate;
  a.eps = p.eps;
  a.scale = p.scale;
  a.q_norm = p.q_norm.f32();
  a.k_norm = p.k_norm.f32();
  a.inv_freq = inv_freq(p.rotary_dim, p.rope_theta);
  a.qkv = qkv.f32() + int64_t(tok0) * row;
  a.k_cache = kv.k.data;
  a.v_cache = kv.v.data;
  switch (kv.k.dtype) {
    case DType::F32: a.kv_type = cuda::KvType::F32; break;
    case DType::BF16: a.kv_type = cuda::KvType::BF16; break;
    case DType::F8E4M3: a.kv_type = cuda::KvType::E4M3; break;
    case DType::F8E5M2: a.kv_type = cuda::KvType::E5M2; break;
    default: DS_CHECK(false, "attention: unsupported KV cache dtype ", dtype_name(kv.k.dtype));
  }
  a.k_scale = kv.k_scale;
  a.v_scale = kv.v_scale;
  a.k_inv_scale = 1.0f / kv.k_scale;  // as the CPU reference: x * (1/scale)
  a.v_inv_scale = 1.0f / kv.v_scale;
  a.positions = meta.d_positions.i32() + tok0;
  a.seq_start = s0 == 0 ? meta.d_seq_start.i32() : iota(S + 1);
  a.block_table = meta.d_block_table.i32() + int64_t(s0) * meta.max_blocks;
  a.max_blocks = meta.max_blocks;
  a.block_size = meta.block_size;
  a.out = out.f32() + int64_t(tok0) * nh * hd;
  // Prefill (a sequence with many tokens): the tensor-core flash kernel over these sequences
  // (CudaOptions::flash_attention off keeps the CUDA-core kernel, for A/B measurements).
  const bool long_seq = b_.options().flash_attention && max_seq_tokens >= kFlashMinSeqTokens;
  cuda::FlashPlan plan;
  if (long_seq && cuda::flash_attention_plan(nh, nkv, hd, past, a.kv_type, b_.options(), &plan)) {
    const int bt = 16 * plan.m_tiles;
    int tiles = 0;
    for (int s = s0; s < s1; ++s) tiles += (meta.seq_start[s + 1] - meta.seq_start[s] + bt - 1) / bt;
    a.flash_tiles = tiles;
    a.flash_hb = plan.heads_per_block;
    a.flash_mt = plan.m_tiles;
    a.flash_bn = plan.keys_per_tile;
    a.flash_stage = past;
    a.flash_wgmma = plan.wgmma;
    a.n_split = cuda::flash_attention_splits(tiles * nkv * (nh / nkv / plan.heads_per_block), max_keys,
                                             a.flash_split_min_tiles, b_.options());
    const std::size_t q_n = static_cast<std::size_t>(T) * nh * hd, kv_n = static_cast<std::size_t>(T) * nkv * hd;
    a.q16 = static_cast<uint16_t*>(scratch(7, q_n * 2));
    a.k16 = static_cast<uint16_t*>(scratch(8, kv_n * 4));
    a.v16 = a.k16 + kv_n;
  } else {
    a.q_scratch = static_cast<float*>(scratch(2, static_cast<std::size_t>(T) * nh * hd * 4));
    // Decode / verification: the split-KV kernel, its split count from the batch shape only (a
    // captured graph stays valid as contexts grow). Else the tiled kernel, 8 splits when it has
    // few (token, kv head) blocks.
    const CudaOptions& o = b_.options();
    a.decode_kernel = o.decode_attention &&
                      cuda::decode_attention_supported(nh, nkv, hd, a.kv_type, meta.block_size);
    cuda::DecodeMmaPlan mma;
    if (a.decode_kernel && o.decode_tensor_cores &&
        cuda::decode_attention_mma_plan(nh, nkv, hd, a.kv_type, S, max_seq_tokens, o, &mma)) {
      // bf16 / fp8 cache, few tokens per sequence: tensor cores, a block per (sequence, kv head).
      a.dec_mma_mt = mma.m_tiles;
      a.dec_mma_kg = mma.key_groups;
      a.dec_mma_bn = mma.keys_per_tile;
      a.dec_mma_stages = mma.stages;
      a.dec_fused_prep = o.decode_fused_prep;
      a.n_split = cuda::decode_attention_mma_splits(S, nkv, hd, mma, o);
      a.dec_min_keys = std::max(1, o.decode_min_keys);
    } else if (a.decode_kernel) {
      a.n_split = cuda::decode_attention_splits(T, nkv, o);
      a.dec_min_keys = std::max(1, o.decode_min_keys);
      a.dec_keys_per_step = o.decode_keys_per_step;
      a.dec_min_blocks = o.decode_min_blocks;
    } else if (int64_t(T) * nkv < 128) {
      a.n_split = 8;
    }
  }
  if (a.n_split > 1) {  // the splits' partials (the flash or decode kernel's), for the combine kernel
    a.part_ml = static_cast<float*>(scratch(5, static_cast<std::size_t>(T) * nh * a.n_split * 2 * 4));
    a.part_o = static_cast<float*>(scratch(6, static_cast<std::size_t>(T) * nh * a.n_split * hd * 4));
  }
  a.pdl = small_pdl(T);
  a.pdl_chain = chain_pdl(T);
  if (a.pdl) {
    std::tie(a.l2_next, a.l2_next_bytes) = l2_prefetch(p.then);
    a.l2_next_max_keys = kL2PrefetchMaxKeys;
  }
  cuda::launch_attention(a, stream());
}

void CudaKernels::gated_delta_net(const GdnParams& p, const Tensor& proj, const StateLayerView& state,
                                  const BatchMeta& meta, Tensor out) {
  const int T = meta.n_tokens;
  DS_CHECK(proj.cols() == p.proj_dim() && proj.rows() == T, "gdn proj ", proj.shape_string());
  DS_CHECK(out.cols() == p.value_dim() && out.rows() == T, "gdn out ", out.shape_string());
  DS_CHECK(meta.state_defer == nullptr || state.pending.data, "deferred GDN run without pending rows");
  if (T == 0) return;
  const int64_t conv_dim = p.conv_dim();
  cuda::GdnArgs a;
  a.n_tokens = T;
  a.n_seqs = meta.n_seqs;
  a.Hk = p.n_k_heads;
  a.Hv = p.n_v_heads;
  a.Dk = p.k_head_dim;
  a.Dv = p.v_head_dim;
  a.K = p.conv_kernel;
  a.eps = p.eps;
  a.conv_weight = p.conv_weight.f32();
  a.neg_exp_a = p.neg_exp_a.f32();
  a.dt_bias = p.dt_bias.f32();
  a.norm = p.norm.f32();
  a.proj = proj.f32();
  a.conv_state = state.conv.f32();
  DS_CHECK(state.recurrent.dtype == DType::F32 || state.recurrent.dtype == DType::BF16, "GDN state dtype ",
           dtype_name(state.recurrent.dtype));
  a.rec_state = state.recurrent.data;
  a.rec_bf16 = state.recurrent.dtype == DType::BF16;
  if (meta.state_defer) {
    for (int s = 0; s < meta.n_seqs; ++s)
      DS_CHECK(!meta.state_defer[s] || meta.seq_start[s + 1] - meta.seq_start[s] <= state.pending_depth,
               "deferred GDN run longer than the pending rows (", state.pending_depth, ")");
    a.defer = meta.d_state_defer.i32();
    a.pending = state.pending.f32();
    a.pending_depth = state.pending_depth;
  }
  if (meta.checkpoint_at) {
    a.ckpt_at = meta.d_checkpoint_at.i32();
    a.ckpt_slot = meta.d_checkpoint_slot.i32();
  }
  a.seq_start = meta.d_seq_start.i32();
  a.state_slot = meta.d_state_slot.i32();
  a.conv_out = static_cast<float*>(scratch(1, static_cast<std::size_t>(T) * conv_dim * 4));
  a.gb = static_cast<float*>(scratch(3, static_cast<std::size_t>(T) * p.n_v_heads * 2 * 4));
  a.out = out.f32();
  // Which recurrence kernel: rows spread over lanes (default) or a thread per row for runs of more
  // than 8 tokens per sequence (CudaOptions::gdn_thread_per_row, for A/B measurements).
  a.rows_kernel = !(b_.options().gdn_thread_per_row && T > 8 * meta.n_seqs);
  // Long runs: the chunked delta rule unless DELTASERVE_CUDA_GDN=rows or =thread (A/B, fallback).
  a.chunked = b_.options().gdn_chunked && !b_.options().gdn_thread_per_row;
  // Decode (one token per sequence, nothing deferred): the whole layer in one kernel.
  a.decode = meta.n_tokens == meta.n_seqs && !meta.state_defer && b_.options().gdn_fused_decode;
  if (a.decode)  // zeros, returned to zero by every launch: sized for at least 512 sequences so it does not move between graphs
    a.head_count = static_cast<int*>(scratch(11, static_cast<std::size_t>(std::max(meta.n_seqs, 512)) * p.n_k_heads * 4));
  // Long runs on tensor cores unless DELTASERVE_CUDA_GDN=chunked (the CUDA-core chunked kernel).
  a.chunked_mma = b_.options().gdn_chunked_mma;
  a.chunk_prefetch = b_.options().gdn_chunk_prefetch;
  a.tf32_parts = b_.exact_gemm() ? 3 : b_.options().gdn_tf32_parts;
  a.decode_warps = b_.options().gdn_decode_warps;
  a.decode_cluster = b_.options().gdn_decode_cluster;
  a.decode_layout = b_.options().gdn_decode_layout;
  a.decode_stage = b_.options().gdn_decode_stage;
  a.pdl = small_pdl(T);
  a.pdl_chain = chain_pdl(T);
  if (a.pdl && a.decode) {
    std::tie(a.l2_next, a.l2_next_bytes) = l2_prefetch(p.then);
    a.positions = meta.d_positions.i32();
    a.l2_next_max_keys = kL2PrefetchMaxKeys;
  }
  // A mixed batch (prefill chunks, then one-token decode rows: the scheduler's order): the chunks
  // take the long-run path and the decode rows the fused decode kernel, in two launches over
  // disjoint sequences and rows (one launch would run each decode row as a chunk of its own).
  cuda::GdnArgs d;
  int P = meta.n_seqs;
  if (!meta.state_defer && b_.options().gdn_fused_decode && p.n_v_heads % p.n_k_heads == 0 && T > meta.n_seqs)
    P = one_token_suffix(meta);
  if (P < meta.n_seqs) {
    d = a;
    d.n_seqs = meta.n_seqs - P;
    d.n_tokens = d.n_seqs;
    d.seq_start = a.seq_start + P;  // absolute token rows: proj and out stay as they are
    d.state_slot = a.state_slot + P;
    if (a.ckpt_at) {
      d.ckpt_at = a.ckpt_at + P;
      d.ckpt_slot = a.ckpt_slot + P;
    }
    d.decode = true;
    d.head_count = static_cast<int*>(scratch(11, static_cast<std::size_t>(std::max(d.n_seqs, 512)) * p.n_k_heads * 4));
    a.n_seqs = P;
    a.n_tokens = meta.seq_start[P];
  }
  if (cuda::gdn_uses_chunked_mma(a))
    a.chunk_m = static_cast<float*>(scratch(9, static_cast<std::size_t>(T) * p.n_v_heads * cuda::kGdnChunkRow * 4));
  timed("gated_delta_net", [&] {
    DS_CHECK(cuda::launch_gated_delta_net(a, stream()), "CUDA gated_delta_net: unsupported head sizes (Dk ",
             a.Dk, ", conv kernel ", a.K, ")");
    if (d.n_seqs > 0) DS_CHECK(cuda::launch_gated_delta_net(d, stream()), "CUDA gated_delta_net (decode rows)");
  });
}

bool CudaKernels::small_pdl(int64_t rows) const { return rows == 1 && b_.pdl(); }
bool CudaKernels::chain_pdl(int64_t rows) const {
  return rows > 1 && rows <= 64 && b_.options().pdl_chain && b_.pdl();
}

std::pair<const void*, int64_t> CudaKernels::l2_prefetch(const LinearWeight* w) const {
  const int64_t bytes = b_.l2_prefetch_bytes();
  if (w == nullptr || bytes <= 0) return {nullptr, 0};
  return {static_cast<const CudaLinear*>(w)->data(), std::min<int64_t>(bytes, static_cast<int64_t>(w->nbytes()))};
}

void CudaKernels::argmax_rows(const Tensor& x, Tensor out) {
  DS_CHECK(out.numel() >= x.rows() && out.dtype == DType::I32 && x.dtype == DType::F32, "argmax_rows shapes");
  DS_CHECK(x.rows() <= 65535, "argmax_rows: ", x.rows(), " rows (at most 65535)");
  // At least what any batch of up to 512 rows needs, so that the buffer does not move between graphs.
  void* parts = scratch(10, std::max(cuda::argmax_scratch_bytes(x.rows(), x.cols()), cuda::argmax_scratch_bytes(512, x.cols())));
  timed("argmax_rows", [&] {
    cuda::launch_argmax_rows(x.f32(), x.rows(), x.cols(), out.i32(), parts, small_pdl(x.rows()), stream());
  });
}

void CudaKernels::sample_rows(Tensor logits, const Tensor& rows, const Tensor& penalties, Tensor out) {
  const int64_t R = logits.rows();
  DS_CHECK(logits.dtype == DType::F32 && out.dtype == DType::I32 && out.numel() >= R &&
               rows.nbytes() >= static_cast<std::size_t>(R) * sizeof(SampleRow) && logits.cols() < (int64_t(1) << 31),
           "sample_rows shapes");
  const int n_pen = static_cast<int>(penalties.nbytes() / sizeof(PenaltyEntry));
  timed("sample_rows", [&] {
    cuda::launch_sample_rows(logits.f32(), R, logits.cols(), rows.data, penalties.data, n_pen, out.i32(), stream());
  });
}

void CudaKernels::gather_rows(const Tensor& src, const int32_t* rows, int n_rows, Tensor dst) {
  const int64_t d = src.cols();
  DS_CHECK(dst.cols() == d && dst.rows() >= n_rows, "gather_rows shapes");
  for (int i = 0; i < n_rows; ++i) DS_CHECK(rows[i] >= 0 && rows[i] < src.rows(), "gather row out of range");
  timed("gather_rows", [&] { cuda::launch_gather_rows(src.f32(), d, rows, n_rows, dst.f32(), stream()); });
}

void CudaKernels::gdn_commit(std::span<const GdnLayerRef> layers, const BatchMeta& commit) {
  if (layers.empty() || commit.n_seqs == 0) return;
  const GdnParams& p0 = *layers[0].params;
  const StateLayerView& s0 = *layers[0].state;
  // Keyed by every pointer the table holds (a cache or its parameters reallocated at the same
  // address of the recurrent state must not reuse a stale table).
  commit_probe_.clear();
  for (const GdnLayerRef& l : layers)
    for (const Tensor* t : {&l.params->conv_weight, &l.params->neg_exp_a, &l.params->dt_bias, &l.state->conv,
                            &l.state->recurrent, &l.state->pending})
      commit_probe_.push_back(t->data);
  if (commit_probe_ != commit_key_) {
    DS_CHECK(!capturing(), "CUDA graph capture: gdn_commit must run eagerly once first");
    std::vector<cuda::GdnCommitLayer> table;
    for (const GdnLayerRef& l : layers) {
      const GdnParams& p = *l.params;
      DS_CHECK(p.n_k_heads == p0.n_k_heads && p.n_v_heads == p0.n_v_heads && p.k_head_dim == p0.k_head_dim &&
                   p.v_head_dim == p0.v_head_dim && p.conv_kernel == p0.conv_kernel &&
                   l.state->pending_depth == s0.pending_depth && l.state->pending.data,
               "gdn_commit: layers of different shapes, or no pending rows");
      DS_CHECK(l.state->recurrent.dtype == s0.recurrent.dtype, "gdn_commit: layers of different state dtypes");
      table.push_back({p.conv_weight.f32(), p.neg_exp_a.f32(), p.dt_bias.f32(), l.state->conv.f32(),
                       l.state->recurrent.data, l.state->pending.f32()});
    }
    b_.synchronize();
    commit_table_ = b_.allocate(table.size() * sizeof(cuda::GdnCommitLayer));
    DS_CUDA_CHECK(cudaMemcpy(commit_table_.data(), table.data(), table.size() * sizeof(cuda::GdnCommitLayer),
                             cudaMemcpyHostToDevice));
    commit_key_ = commit_probe_;
  }
  int max_n = 0;
  for (int s = 0; s < commit.n_seqs; ++s) max_n = std::max(max_n, commit.seq_start[s + 1] - commit.seq_start[s]);
  DS_CHECK(max_n <= s0.pending_depth, "gdn_commit of ", max_n, " tokens; pending rows hold ", s0.pending_depth);
  cuda::GdnCommitArgs a;
  a.n_layers = static_cast<int>(layers.size());
  a.n_seqs = commit.n_seqs;
  a.max_tokens = max_n;
  a.Hk = p0.n_k_heads;
  a.Hv = p0.n_v_heads;
  a.Dk = p0.k_head_dim;
  a.Dv = p0.v_head_dim;
  a.K = p0.conv_kernel;
  a.pending_depth = s0.pending_depth;
  a.rec_bf16 = s0.recurrent.dtype == DType::BF16;
  a.layers = static_cast<const cuda::GdnCommitLayer*>(commit_table_.data());
  a.seq_start = commit.d_seq_start.i32();
  a.state_slot = commit.d_state_slot.i32();
  if (commit.checkpoint_at) {
    a.ckpt_at = commit.d_checkpoint_at.i32();
    a.ckpt_slot = commit.d_checkpoint_slot.i32();
  }
  timed("gdn_commit", [&] {
    DS_CHECK(cuda::launch_gdn_commit(a, stream()), "CUDA gdn_commit: unsupported head sizes (Dk ", a.Dk, ")");
  });
}

CudaBackend& as_cuda(Backend& b) {
  DS_CHECK(b.device() == Device::Cuda, "not a CUDA backend");
  return static_cast<CudaBackend&>(b);
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(int device_index, const CudaOptions& options) {
  return std::make_unique<CudaBackend>(device_index, options);
}

void cuda_set_op_timing(Backend& backend, bool on) { as_cuda(backend).cuda_kernels().set_timing(on); }
std::vector<CudaOpTime> cuda_take_op_times(Backend& backend) { return as_cuda(backend).cuda_kernels().take_times(); }
void* cuda_stream(Backend& backend) { return as_cuda(backend).stream(); }
std::string cuda_device_name(Backend& backend) { return as_cuda(backend).name(); }
std::vector<std::string> cuda_gemm_choices(Backend& backend) { return as_cuda(backend).gemm().choices(); }
int cuda_device_index(Backend& backend) { return as_cuda(backend).device_index(); }

}  // namespace deltaserve
