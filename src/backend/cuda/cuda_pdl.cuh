// Programmatic dependent launch (Hopper, sm_90+): a kernel launched with launch_pdl may start while
// the kernel before it on the stream is still running, once every block of that one has called
// pdl_trigger() (or exited). It must call pdl_wait() before it reads anything an earlier kernel
// wrote and before it writes anything: pdl_wait() returns when the earlier grids have completed
// and their memory is visible. What it may do before: read constant data (the decode GEMVs start
// streaming their weights), so a kernel's ramp-up overlaps the previous kernel's tail. Data an
// earlier kernel wrote is read with coherent loads, never __ldg / ld.global.nc: a load that
// promises read-only data may be scheduled above the wait (cuda_linear.cu, load_act).
// pdl_trigger() at the start of a kernel lets its dependents launch as soon as all its blocks run.
// The small kernels between a decode step's GEMVs (norms, SiLU-mul, the GDN and attention decode
// kernels, argmax) are launched this way too, so that each is resident when the one before it ends.
// They call pdl_wait() first and pdl_trigger() after it: triggering before the wait let a chain of
// later kernels launch early and hold SM slots the running GEMV needed (batch-1 decode 7% slower
// on the H200). Both are no-ops before sm_90, and on a stream without launch_pdl kernels.
// Included by .cu files.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"

namespace deltaserve::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, s>>>(args...), with programmatic serialization allowed when pdl.
template <typename... KArgs, typename... Args>
void launch_pdl(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  DS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
}

}  // namespace deltaserve::cuda
