// The CPU backend: host memory, a thread pool, and the reference kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/row_sampler.h"
#include "util/thread_pool.h"

namespace deltaserve {

class CpuKernels final : public Kernels {
 public:
  explicit CpuKernels(ThreadPool& pool) : pool_(pool) {}
  void embed(const Tensor& table, const Tensor& ids, Tensor out, int64_t first_row, int64_t vocab) override;
  void copy_columns(const Tensor& src, int64_t src_col, Tensor dst, int64_t dst_col, int64_t width) override;
  void gather_columns(const Tensor& src, const Tensor& index, Tensor dst, float fill) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out,
                int64_t out_stride) override;
  void matmul(const Tensor& x, const LinearWeight& w, Tensor out, bool accumulate) override;
  void silu_mul(const Tensor& gate_up, Tensor out) override;
  void attention(const AttentionParams& p, const Tensor& qkv, const KvLayerView& kv,
                 const BatchMeta& meta, Tensor out) override;
  void gated_delta_net(const GdnParams& p, const Tensor& proj, const StateLayerView& state,
                       const BatchMeta& meta, Tensor out) override;
  void gather_rows(const Tensor& src, const int32_t* rows, int n_rows, Tensor dst) override;
  void argmax_rows(const Tensor& x, Tensor out) override;
  void sample_rows(Tensor logits, const Tensor& rows, const Tensor& penalties, Tensor out) override;
  void gdn_commit(std::span<const GdnLayerRef> layers, const BatchMeta& commit) override;

 private:
  // attention() for one KV cache dtype.
  template <DType DT>
  void attention_impl(const AttentionParams& p, const Tensor& qkv, const KvLayerView& kv,
                      const BatchMeta& meta, Tensor out);
  // Scratch buffers reused across calls: they grow to the largest batch once, then never
  // allocate again (the decode loop must not allocate). The floats start on a cache line, so that
  // a kernel's rows keep the alignment it laid them out with whatever malloc returned (an
  // attention tile's rows straddling lines cost a fifth of a long prefill).
  float* scratch_f32(int idx, int64_t n) {
    constexpr int64_t kLine = 64 / sizeof(float);
    auto& v = scratch_f32_[idx];
    if (static_cast<int64_t>(v.size()) < n + kLine) v.resize(n + kLine);
    const auto p = reinterpret_cast<uintptr_t>(v.data());
    return reinterpret_cast<float*>((p + 63) & ~uintptr_t{63});
  }
  std::vector<int32_t>& scratch_i32(int idx, int64_t n) {
    auto& v = scratch_i32_[idx];
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    return v;
  }
  ThreadPool& pool_;
  std::vector<float> scratch_f32_[3];
  std::vector<int32_t> scratch_i32_[3];
  RowSampler row_sampler_;  // sample_rows' buffers
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads);
  Device device() const override { return Device::Cpu; }
  std::string description() const override;
  DType activation_dtype() const override { return DType::F32; }
  MemoryInfo memory_info() const override;
  DeviceBuffer allocate(std::size_t bytes) override;
  DeviceBuffer allocate_host(std::size_t bytes) override { return allocate(bytes); }
  std::unique_ptr<LinearWeight> make_linear(const void* host, DType dtype, int64_t n,
                                            int64_t k) override;
  void copy_to_device(Tensor dst, const void* host_src) override;
  void copy_to_host(void* host_dst, const Tensor& src) override;
  void copy(Tensor dst, const Tensor& src) override;
  void synchronize() override {}
  Kernels& kernels() override { return kernels_; }
  ThreadPool& pool() { return pool_; }

 private:
  ThreadPool pool_;
  CpuKernels kernels_;
};

}  // namespace deltaserve
