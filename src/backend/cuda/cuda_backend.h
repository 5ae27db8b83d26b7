// The CUDA backend: device memory (cudaMalloc, zero-filled), one stream, cuBLAS for large matmuls
// and hand-written kernels for everything else (cuda_*.cu). Activations and the KV cache are f32
// (as on the CPU), matmul weights bf16, GDN state f32.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_options.h"

namespace deltaserve {

// Number of CUDA devices (0 when there is no driver or no GPU).
int cuda_device_count();
// options: the backend's knobs (backend/cuda_options.h; make_backend applies the environment's
// developer overrides, backend/cuda_option_env.h).
std::unique_ptr<Backend> make_cuda_backend(int device_index, const CudaOptions& options);

// Extras for benchmarks and tests; `backend` must come from make_cuda_backend.
struct CudaOpTime {
  std::string name;
  int calls = 0;
  double ms = 0;
};
// When on, every Kernels call is bracketed by CUDA events (adds a little launch overhead).
void cuda_set_op_timing(Backend& backend, bool on);
// Synchronises, returns the accumulated per-op times (largest first) and clears them.
std::vector<CudaOpTime> cuda_take_op_times(Backend& backend);
// The backend's stream (a cudaStream_t), for graph capture around Model::forward.
void* cuda_stream(Backend& backend);
// The CUDA device index the backend runs on.
int cuda_device_index(Backend& backend);
// The device's name, e.g. "NVIDIA H200".
std::string cuda_device_name(Backend& backend);
// The GEMMs of 2+ rows met so far and the cuBLAS algorithm each runs (cuda_gemm.h), one per line.
std::vector<std::string> cuda_gemm_choices(Backend& backend);

}  // namespace deltaserve
