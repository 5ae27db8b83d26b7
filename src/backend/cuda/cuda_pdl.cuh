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

#include <cstdint>
#include <utility>

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

// Thread block clusters (sm_90): the barrier over a cluster's blocks (arrive and wait may be split,
// so that a block's own work overlaps the others' arrival; a block whose shared memory others read
// waits before it exits), and a float from block `rank`'s shared memory at the address of p in
// this block's. No-ops (and p's own value) before sm_90, where no cluster is launched.
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}
__device__ __forceinline__ float ld_cluster_f32(const float* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint32_t remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
#else
  (void)rank;
  return *p;
#endif
}

// Bytes [0, bytes) of p prefetched into L2 (cp.async.bulk.prefetch; sm_90), split evenly over the
// grid's blocks, four threads of each (1-D blocks). Issued by a decode step's latency-bound small
// kernels (GDN, attention) for the matmul after them, whose weights would otherwise not move until
// it starts: the DRAM is idle while they run. No-op before sm_90 or when p is null.
__device__ __forceinline__ void l2_prefetch_share(const void* p, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p == nullptr || bytes <= 0 || threadIdx.x >= 4) return;
  const int64_t blocks = int64_t(gridDim.x) * gridDim.y * gridDim.z;
  const int64_t b = blockIdx.x + int64_t(gridDim.x) * (blockIdx.y + int64_t(gridDim.y) * blockIdx.z);
  const int64_t parts = blocks * 4, part = b * 4 + threadIdx.x;
  const int64_t chunk = ((bytes + parts - 1) / parts + 15) & ~int64_t(15);  // 16-byte multiples
  const int64_t lo = part * chunk;
  if (lo >= bytes) return;
  const int64_t n = (chunk < bytes - lo ? chunk : bytes - lo) & ~int64_t(15);
  if (n > 0)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(static_cast<const char*>(p) + lo),
                 "r"(static_cast<uint32_t>(n))
                 : "memory");
#else
  (void)p;
  (void)bytes;
#endif
}

// kernel<<<grid, block, smem, s>>>(args...), with programmatic serialization allowed when pdl, in
// clusters of cluster_x blocks along x when cluster_x > 1 (sm_90).
template <typename... KArgs, typename... Args>
void launch_pdl_cluster(bool pdl, int cluster_x, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                        cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = static_cast<unsigned>(cluster_x);
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  DS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
}

// kernel<<<grid, block, smem, s>>>(args...), with programmatic serialization allowed when pdl.
template <typename... KArgs, typename... Args>
void launch_pdl(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                Args&&... args) {
  launch_pdl_cluster(pdl, 1, kernel, grid, block, smem, s, std::forward<Args>(args)...);
}

}  // namespace deltaserve::cuda
