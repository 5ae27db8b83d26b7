// CPU matrix products with bf16 or f32 weights and f32 activations/accumulation.
//   out[m, n] = sum_k x[m, k] * w[n, k]        (out = x · wᵀ, the nn.Linear convention)
// CpuWeight repacks the checkpoint's [N, K] matrix at load into panels of 16 rows x k pairs
// (cpu_matmul_internal.h), which every kernel family streams without shuffles; callers see only
// n(), k() and matmul(). Kernels are picked at run time from the CPU's features (AVX-512F /
// AVX2+FMA / portable; cpu_matmul_kernels.h), never at compile time only. Results are exact f32
// FMA sums (no reduced-precision dot products), matching a double reference to ~eps*sqrt(k).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "util/thread_pool.h"

namespace deltaserve {

// Kernel families, best last. Every CpuWeight works with every family (one packed layout).
enum class CpuIsa : uint8_t { Portable, Avx2, Avx512 };

namespace detail {
// 64-byte aligned storage for packed weights (one pair block = one cache line).
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64)));
  }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
};
}  // namespace detail

class CpuWeight {
 public:
  CpuWeight() = default;
  // data: [n, k] row-major in `dtype` (BF16 or F32; F16 is converted to F32). The bytes are copied
  // (or repacked), so the source (e.g. an mmap) may go away afterwards.
  static CpuWeight from(const void* data, DType dtype, int64_t n, int64_t k);

  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  DType dtype() const { return dtype_; }
  std::size_t nbytes() const { return storage_.size(); }
  bool empty() const { return n_ == 0; }
  const uint8_t* raw() const { return storage_.data(); }

 private:
  int64_t n_ = 0, k_ = 0;
  DType dtype_ = DType::F32;
  // Packed panels of 16 rows x k pairs, bf16 or f32: see cpu_matmul_internal.h.
  std::vector<uint8_t, detail::CacheLineAllocator<uint8_t>> storage_;
  friend void cpu_matmul(ThreadPool&, const float*, int64_t, int64_t, const CpuWeight&, float*,
                         int64_t, bool);
};

// x: [m, k] with row stride ldx (floats); out: [m, n] with row stride ldo.
// accumulate: out += x·wᵀ instead of out = x·wᵀ.
void cpu_matmul(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const CpuWeight& w,
                float* out, int64_t ldo, bool accumulate = false);

// Name of the kernel family chosen for this CPU ("avx512", "avx2", "portable").
std::string cpu_matmul_isa();

// --- additions -------------------------------------------------------------------------------

// True if this CPU (and OS) can run the family; Portable always can.
bool cpu_isa_supported(CpuIsa isa);
// The family cpu_matmul uses: the best supported one (decided once).
CpuIsa cpu_best_isa();
const char* cpu_isa_name(CpuIsa isa);  // "portable", "avx2", "avx512"

// cpu_matmul with an explicit kernel family (tests, benchmarks). Precondition: supported.
void cpu_matmul(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const CpuWeight& w,
                float* out, int64_t ldo, bool accumulate, CpuIsa isa);

// One product of cpu_matmul_multi: out[m, w->n()] (row stride ldo) (+)= x · wᵀ.
struct CpuMatmulOut {
  const CpuWeight* w;
  float* out;
  int64_t ldo;
  bool accumulate = false;
};

// Several weights applied to the same x (q/k/v, gate+up, the GDN in-projections) in one parallel
// region: the work of all of them is split across the threads together, so a decode step pays one
// fork/join instead of one per weight and small weights still use every thread.
// Preconditions: every w->k() is the same; the outputs do not overlap; at most 16 outputs.
void cpu_matmul_multi(ThreadPool& pool, const float* x, int64_t m, int64_t ldx,
                      std::span<const CpuMatmulOut> outs);
void cpu_matmul_multi(ThreadPool& pool, const float* x, int64_t m, int64_t ldx,
                      std::span<const CpuMatmulOut> outs, CpuIsa isa);

}  // namespace deltaserve
