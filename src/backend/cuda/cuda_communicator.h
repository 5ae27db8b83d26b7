// CudaPeerCommunicator: the collectives of a tensor-parallel group whose ranks are threads of one
// process, each with its own CUDA backend (device), over peer-to-peer memory access (NVLink or
// PCIe; several ranks may share one device, which is how one GPU tests tensor parallelism). A
// one-shot all-reduce: every rank stages its data, a device-side barrier (flags written into the
// peers' memory), every rank sums all staged buffers in rank order; no host synchronisation, so
// the collectives are captured in CUDA graphs with the model (cuda_comm.cu). Large messages go
// to NCCL when it is available (SplitCommunicator, RankGroup's choose_tp_transport).
//   Ranks that share a device (DELTASERVE_TP_DEVICES=0,0: testing on one GPU) synchronise on the
// host instead: a kernel spinning on the device while another rank's thread waits for that device
// to go idle (cudaFree of a growing scratch buffer) would never finish. That mode cannot be
// captured in graphs (graph_capturable() false). DELTASERVE_TP_DEVICE_BARRIER=1 forces the device
// barrier anyway (bench_cuda_comm, which allocates nothing while it runs).
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"

namespace deltaserve {

// One communicator per backend (rank r uses backends[r]); enables peer access between their
// devices. At most 8 ranks. Error when two devices cannot reach each other.
Result<std::vector<std::unique_ptr<Communicator>>> make_cuda_peer_communicators(const std::vector<Backend*>& backends);

}  // namespace deltaserve
