// Tensor: a non-owning, row-major view (pointer, dtype, device, up to 4 dims). Strides are implied
// by the shape (contiguous); kernels that take a strided view say so and take the row stride.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "util/status.h"

namespace deltaserve {

enum class Device : uint8_t { Cpu, Cuda };

inline const char* device_name(Device d) { return d == Device::Cpu ? "cpu" : "cuda"; }

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::Cpu;
  int ndim = 0;
  std::array<int64_t, 4> shape{0, 0, 0, 0};

  Tensor() = default;
  Tensor(void* p, DType t, std::initializer_list<int64_t> dims, Device dev = Device::Cpu)
      : data(p), dtype(t), device(dev), ndim(static_cast<int>(dims.size())) {
    DS_CHECK(dims.size() <= 4, "at most 4 dims");
    int i = 0;
    for (int64_t d : dims) shape[i++] = d;
  }

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return ndim == 0 ? 0 : n;
  }
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  // Rows when viewed as a matrix [rows, last_dim].
  int64_t rows() const { return ndim == 0 ? 0 : numel() / shape[ndim - 1]; }
  int64_t cols() const { return ndim == 0 ? 0 : shape[ndim - 1]; }

  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  float* f32() const { return static_cast<float*>(data); }
  uint16_t* u16() const { return static_cast<uint16_t*>(data); }
  int32_t* i32() const { return static_cast<int32_t*>(data); }

  // The view of `n` rows starting at `row` (dim 0).
  Tensor slice_rows(int64_t row, int64_t n) const {
    Tensor t = *this;
    int64_t row_elems = ndim == 0 ? 0 : numel() / shape[0];
    t.data = static_cast<char*>(data) + row * row_elems * static_cast<int64_t>(dtype_size(dtype));
    t.shape[0] = n;
    return t;
  }
  Tensor reshaped(std::initializer_list<int64_t> dims) const {
    Tensor t(data, dtype, dims, device);
    DS_CHECK(t.numel() == numel(), "reshape changes element count");
    return t;
  }
  std::string shape_string() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
};

}  // namespace deltaserve
