#include "backend/cpu/cpu_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_matmul.h"

namespace deltaserve {

namespace {

class CpuLinear final : public LinearWeight {
 public:
  explicit CpuLinear(CpuWeight w) : w_(std::move(w)) {}
  int64_t n() const override { return w_.n(); }
  int64_t k() const override { return w_.k(); }
  std::size_t nbytes() const override { return w_.nbytes(); }
  const CpuWeight& weight() const { return w_; }

 private:
  CpuWeight w_;
};

}  // namespace

CpuBackend::CpuBackend(int n_threads)
    : pool_(n_threads > 0 ? n_threads : hardware_threads()), kernels_(pool_) {}

std::string CpuBackend::description() const {
  return str_cat("cpu (", cpu_matmul_isa(), ", ", pool_.n_threads(), " threads)");
}

MemoryInfo CpuBackend::memory_info() const {
  MemoryInfo info;
  long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  info.total_bytes = static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
  info.free_bytes = static_cast<std::size_t>(avail) * static_cast<std::size_t>(page);
  return info;
}

DeviceBuffer CpuBackend::allocate(std::size_t bytes) {
  if (bytes >= (std::size_t(1) << 20)) {
    // Large buffers (KV cache, state pools) come from anonymous mmap: zero pages are supplied
    // lazily by the kernel, so a multi-GiB KV budget costs nothing until tokens fill it.
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    DS_CHECK(p != MAP_FAILED, "out of host memory mapping ", bytes, " bytes");
    return DeviceBuffer(p, bytes, Device::Cpu, counted(bytes, [bytes](void* q) { ::munmap(q, bytes); }));
  }
  std::size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  DS_CHECK(p != nullptr, "out of host memory allocating ", bytes, " bytes");
  std::memset(p, 0, rounded);
  return DeviceBuffer(p, bytes, Device::Cpu, counted(rounded == 0 ? 64 : rounded, [](void* q) { std::free(q); }));
}

std::unique_ptr<LinearWeight> CpuBackend::make_linear(const void* host, DType dtype, int64_t n,
                                                      int64_t k) {
  return std::make_unique<CpuLinear>(CpuWeight::from(host, dtype, n, k));
}

void CpuBackend::copy_to_device(Tensor dst, const void* host_src) {
  std::memcpy(dst.data, host_src, dst.nbytes());
}
void CpuBackend::copy_to_host(void* host_dst, const Tensor& src) {
  std::memcpy(host_dst, src.data, src.nbytes());
}
void CpuBackend::copy(Tensor dst, const Tensor& src) {
  DS_CHECK(dst.nbytes() == src.nbytes(), "copy size mismatch");
  std::memmove(dst.data, src.data, src.nbytes());
}

void CpuKernels::matmul(const Tensor& x, const LinearWeight& w, Tensor out, bool accumulate) {
  const auto& cw = static_cast<const CpuLinear&>(w).weight();
  DS_CHECK(x.cols() == cw.k() && out.cols() == cw.n() && x.rows() == out.rows(), "matmul shapes ",
           x.shape_string(), " x [", cw.n(), ", ", cw.k(), "] -> ", out.shape_string());
  cpu_matmul(pool_, x.f32(), x.rows(), x.cols(), cw, out.f32(), out.cols(), accumulate);
}

std::unique_ptr<Backend> make_cpu_backend(int n_threads) {
  return std::make_unique<CpuBackend>(n_threads);
}

}  // namespace deltaserve
