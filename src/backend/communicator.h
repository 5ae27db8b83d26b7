// Communicator: the collectives a tensor-parallel group needs, one object per rank. The model
// calls them between its kernels (one all-reduce per mixer and per MLP, one for the embedding,
// one gather of the vocabulary-parallel logits); every rank issues the same calls in the same
// order. Implementations: CpuCommunicator (ranks are threads of one process, host memory; CI
// checks tensor parallelism with it), CudaPeerCommunicator (ranks are threads of one process,
// one CUDA device each, peer-to-peer), NcclCommunicator (NCCL, one GPU per rank) and
// SplitCommunicator (small messages through one, large through another). RankGroup picks them
// (choose_tp_transport).
#pragma once

#include "core/tensor.h"

namespace deltaserve {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // x [n] f32, in place: the element-wise sum over ranks, bit-identical on every rank (the CPU
  // and peer communicators sum in rank order; NCCL in its own order, the same on every rank).
  virtual void all_reduce_sum(Tensor x) = 0;
  // in [n] (any dtype, the same n on every rank) → out [size * n]: rank r's data at r * n.
  virtual void all_gather(const Tensor& in, Tensor out) = 0;
  virtual void barrier() = 0;
  // Sizes the staging of collectives of up to `bytes` per rank. Call on every rank at once, before
  // the first collective and outside graph capture (a captured collective keeps its buffers).
  virtual void reserve(std::size_t bytes) { (void)bytes; }
  // Whether the collectives can be captured in a CUDA graph (no host synchronisation inside).
  virtual bool graph_capturable() const { return true; }
};

}  // namespace deltaserve
