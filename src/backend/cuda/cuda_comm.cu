// Kernels of the in-process CUDA peer communicator (cuda_communicator.cpp): a one-shot all-reduce
// and all-gather over peer-to-peer reads (NVLink / PCIe, or one device shared by several ranks),
// synchronised on the device, so the collectives are captured in CUDA graphs with the model.
//   stage:   my data -> my staging buffer [epoch + 1 parity]
//   barrier: epoch += 1; tell every peer (a flag in its memory); wait for every peer's flag
//   sum / gather: read every rank's staging buffer [epoch parity], in rank order
// Two staging buffers alternate: a rank rewrites buffer b only two collectives later, after every
// peer has passed the barrier in between, so it has finished reading b.
#include "backend/cuda/cuda_launch.h"
#include "backend/cuda/cuda_check.h"

namespace deltaserve::cuda {

namespace {

int grid_for(int64_t n_vec) {
  const int64_t b = (n_vec + 255) / 256;
  return static_cast<int>(b < 1 ? 1 : (b > 1024 ? 1024 : b));
}

__global__ void comm_stage_kernel(const uint32_t* x, int64_t n, PeerPtrs mine, const uint32_t* epoch) {
  uint32_t* dst = static_cast<uint32_t*>(mine.p[(*epoch + 1) & 1]);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = x[i];
}

__global__ void comm_barrier_kernel(uint32_t* epoch, PeerPtrs peer_flags, uint32_t* my_flags, int rank, int size) {
  __shared__ uint32_t e;
  if (threadIdx.x == 0) {
    e = *epoch + 1;
    *epoch = e;
  }
  __syncthreads();
  __threadfence_system();  // my staging writes (the previous kernel) before the flag
  const int q = threadIdx.x;
  if (q < size) {
    volatile uint32_t* theirs = static_cast<uint32_t*>(peer_flags.p[q]) + rank;
    *theirs = e;
    volatile uint32_t* mine = my_flags + q;
    while (*mine < e) {
    }
  }
  __syncthreads();
  __threadfence_system();
}

__global__ void comm_sum_kernel(float* x, int64_t n, PeerPtrs s0, PeerPtrs s1, int size, const uint32_t* epoch) {
  const PeerPtrs& s = (*epoch & 1) ? s1 : s0;
  const int64_t n4 = n / 4;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    float4 acc = static_cast<const float4*>(s.p[0])[i];
    for (int q = 1; q < size; ++q) {
      const float4 v = static_cast<const float4*>(s.p[q])[i];
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    reinterpret_cast<float4*>(x)[i] = acc;
  }
  for (int64_t i = n4 * 4 + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float acc = static_cast<const float*>(s.p[0])[i];
    for (int q = 1; q < size; ++q) acc += static_cast<const float*>(s.p[q])[i];
    x[i] = acc;
  }
}

__global__ void comm_gather_kernel(uint32_t* out, int64_t n, PeerPtrs s0, PeerPtrs s1, int size, const uint32_t* epoch) {
  const PeerPtrs& s = (*epoch & 1) ? s1 : s0;
  const int64_t total = n * size;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = static_cast<const uint32_t*>(s.p[i / n])[i % n];
}

}  // namespace

void launch_comm_stage(const void* x, int64_t n_words, PeerPtrs mine, const uint32_t* epoch, cudaStream_t s) {
  comm_stage_kernel<<<grid_for(n_words), 256, 0, s>>>(static_cast<const uint32_t*>(x), n_words, mine, epoch);
  DS_CUDA_LAUNCH_CHECK();
}

void launch_comm_barrier(uint32_t* epoch, PeerPtrs peer_flags, uint32_t* my_flags, int rank, int size, cudaStream_t s) {
  comm_barrier_kernel<<<1, 32, 0, s>>>(epoch, peer_flags, my_flags, rank, size);
  DS_CUDA_LAUNCH_CHECK();
}

void launch_comm_sum(float* x, int64_t n, PeerPtrs s0, PeerPtrs s1, int size, const uint32_t* epoch, cudaStream_t s) {
  comm_sum_kernel<<<grid_for(n / 4 + 1), 256, 0, s>>>(x, n, s0, s1, size, epoch);
  DS_CUDA_LAUNCH_CHECK();
}

void launch_comm_gather(void* out, int64_t n_words, PeerPtrs s0, PeerPtrs s1, int size, const uint32_t* epoch,
                        cudaStream_t s) {
  comm_gather_kernel<<<grid_for(n_words * size), 256, 0, s>>>(static_cast<uint32_t*>(out), n_words, s0, s1, size,
                                                              epoch);
  DS_CUDA_LAUNCH_CHECK();
}

}  // namespace deltaserve::cuda
