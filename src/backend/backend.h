// Backend: one per device. Owns allocation, host<->device copies and the Kernels. The model and
// engine see only this interface, so model code is identical on the CPU and on CUDA.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backend/kernels.h"
#include "core/tensor.h"

namespace deltaserve {

// RAII owner of one backend allocation. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(void* ptr, std::size_t bytes, Device device, std::function<void(void*)> free_fn)
      : ptr_(ptr), bytes_(bytes), device_(device), free_(std::move(free_fn)) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      device_ = o.device_;
      free_ = std::move(o.free_);
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }
  void reset() {
    if (ptr_ && free_) free_(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* data() const { return ptr_; }
  std::size_t size() const { return bytes_; }
  Device device() const { return device_; }
  Tensor view(DType dtype, std::initializer_list<int64_t> shape, std::size_t byte_offset = 0) const {
    Tensor t(static_cast<char*>(ptr_) + byte_offset, dtype, shape, device_);
    DS_CHECK(byte_offset + t.nbytes() <= bytes_, "view ", t.shape_string(), " overruns buffer");
    return t;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_ = Device::Cpu;
  std::function<void(void*)> free_;
};

// Captured device work (a CUDA graph), replayed with Backend::replay. Opaque.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
};

// A point in a backend's queue of device work (a CUDA event), for the overlap scheduler. Opaque.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
};

struct MemoryInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string description() const = 0;   // e.g. "cpu (avx2, 2 threads)"
  virtual DType activation_dtype() const = 0;      // dtype of hidden states / KV on this backend
  virtual MemoryInfo memory_info() const = 0;
  virtual DeviceBuffer allocate(std::size_t bytes) = 0;  // zero-filled
  // Host memory that copies to and from this device fastest (page-locked on CUDA; plain memory
  // on the CPU). Zero-filled. For staging: batch metadata up, logits down.
  virtual DeviceBuffer allocate_host(std::size_t bytes) = 0;
  // Matmul weight [n, k] from host memory (bf16/f16/f32), in the backend's preferred layout.
  // host == nullptr (GPU backends only; used by dummy weights): uniform random values in
  // ±1/sqrt(k), generated on the device.
  virtual std::unique_ptr<LinearWeight> make_linear(const void* host, DType dtype, int64_t n,
                                                    int64_t k) = 0;
  virtual void copy_to_device(Tensor dst, const void* host_src) = 0;
  virtual void copy_to_host(void* host_dst, const Tensor& src) = 0;
  virtual void copy(Tensor dst, const Tensor& src) = 0;  // device to device, same bytes
  virtual void synchronize() = 0;
  // Transfers queued behind the work already issued, returning at once (copy_to_device and
  // copy_to_host wait for them). The host memory must stay as it is (to the device) or unread (to
  // the host) until an event recorded after the copy has been waited for. Backends without a queue
  // (the CPU) copy at once.
  virtual void copy_to_device_async(Tensor dst, const void* host_src) { copy_to_device(dst, host_src); }
  virtual void copy_to_host_async(void* host_dst, const Tensor& src) { copy_to_host(host_dst, src); }
  // Events: record() marks the work issued so far; wait() returns once the device has done it.
  // The CPU's work is done when its calls return, so its events are always reached.
  virtual std::unique_ptr<DeviceEvent> make_event() { return std::make_unique<DeviceEvent>(); }
  virtual void record(DeviceEvent& event) { (void)event; }
  virtual void wait(DeviceEvent& event) { (void)event; }
  virtual Kernels& kernels() = 0;
  // Makes this backend's device current on the calling thread (CUDA: cudaSetDevice). A thread
  // that launches work on a backend other than its first calls it (tensor-parallel rank threads).
  virtual void bind_thread() {}

  // Graph capture (CUDA graphs). capture() records the device work `work` issues, without
  // running it, and returns the graph; nullptr when the backend cannot capture or the capture
  // failed (then run `work` eagerly). `work` must already have run once eagerly with the same
  // shapes, so that no buffer is allocated while capturing. A graph stays valid while
  // graph_epoch() is unchanged (the backend's scratch buffers have not moved).
  virtual std::unique_ptr<DeviceGraph> capture(const std::function<void()>& work) {
    (void)work;
    return nullptr;
  }
  virtual void replay(DeviceGraph& graph) { (void)graph; }
  virtual uint64_t graph_epoch() const { return 0; }
  // One-time set-up work done inside kernel calls so far (CUDA: GEMM algorithm buckets timed,
  // cuda/cuda_gemm.h). A step during which it grew ran longer than steps like it will.
  // Thread-safe.
  virtual uint64_t setup_count() const { return 0; }

  // Bytes held now by buffers from allocate() (CUDA: device memory, as cudaMalloc rounded it; the
  // CPU: allocate() and allocate_host(), the same memory). Neither counts what a backend takes
  // elsewhere (CUDA: cuBLAS's workspace, graphs, NCCL; the CPU: the weights' packed matrices and the
  // kernels' scratch vectors). Thread-safe.
  int64_t allocated_bytes() const { return allocated_->load(std::memory_order_relaxed); }

 protected:
  // A buffer's free function that also takes its bytes off allocated_bytes(); every allocate()
  // wraps its own with it.
  std::function<void(void*)> counted(std::size_t bytes, std::function<void(void*)> free_fn) {
    allocated_->fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    return [counter = allocated_, bytes, f = std::move(free_fn)](void* p) {
      f(p);
      counter->fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    };
  }

 private:
  // Shared with the free functions: a buffer may outlive its backend.
  std::shared_ptr<std::atomic<int64_t>> allocated_ = std::make_shared<std::atomic<int64_t>>(0);
};

std::unique_ptr<Backend> make_cpu_backend(int n_threads);

}  // namespace deltaserve
