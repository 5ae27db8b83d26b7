// CUDA / cuBLAS error checks. Standalone (no project headers) so that .cu files stay cheap to
// compile. A failed call is a programming or device error: print where and abort.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

namespace deltaserve::cuda {

[[noreturn]] inline void cuda_fail(const char* what, const char* detail, const char* file, int line) {
  std::fprintf(stderr, "CUDA error: %s (%s) at %s:%d\n", what, detail, file, line);
  std::fflush(stderr);
  std::abort();
}

}  // namespace deltaserve::cuda

#define DS_CUDA_CHECK(expr)                                                                  \
  do {                                                                                       \
    cudaError_t ds_err_ = (expr);                                                            \
    if (ds_err_ != cudaSuccess)                                                              \
      ::deltaserve::cuda::cuda_fail(#expr, cudaGetErrorString(ds_err_), __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: catches bad launch configurations (not asynchronous faults).
#define DS_CUDA_LAUNCH_CHECK() DS_CUDA_CHECK(cudaGetLastError())

#define DS_CUBLAS_CHECK(expr)                                                            \
  do {                                                                                   \
    int ds_st_ = static_cast<int>(expr);                                                 \
    if (ds_st_ != 0) {                                                                   \
      char ds_buf_[32];                                                                  \
      std::snprintf(ds_buf_, sizeof ds_buf_, "cublas status %d", ds_st_);                \
      ::deltaserve::cuda::cuda_fail(#expr, ds_buf_, __FILE__, __LINE__);                 \
    }                                                                                    \
  } while (0)
