// NcclCommunicator: the collectives of a tensor-parallel group over NCCL, one communicator per
// rank (ranks are threads of one process, one GPU each, made with ncclCommInitAll; or, across
// the processes of a multi-node group, by a unique id and ncclCommInitRank). NCCL is
// loaded at run time (dlopen of libnccl.so.2, found on the library path): a binary built with
// NCCL's header runs on machines without it, and says so only when asked for NCCL. Collectives
// are captured in CUDA graphs like the rest of the step. NCCL needs distinct GPUs: ranks that
// share a device (DELTASERVE_TP_DEVICES=0,0) use CudaPeerCommunicator only.
#pragma once

#include <memory>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "util/status.h"

namespace deltaserve {

// Whether NCCL can be used here (built with its header, libnccl.so.2 loadable); "" when it can,
// else the reason.
std::string nccl_unavailable_reason();
// "2.28.9" (the loaded library's version), or "" when unavailable.
std::string nccl_version();

// One communicator per backend (rank r uses backends[r]); the devices must be distinct.
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(const std::vector<Backend*>& backends);

// Multi-node: node 0 makes the group's id (ncclGetUniqueId) and publishes it to the other nodes
// (engine/node_link.h); each process then joins with its own ranks: backends[i] is rank
// first_rank + i of `size` (ncclCommInitRank, one group call). Blocks until every rank has joined.
Result<std::vector<uint8_t>> nccl_unique_id();
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(const std::vector<Backend*>& backends,
                                                                            const std::vector<uint8_t>& unique_id,
                                                                            int first_rank, int size);

}  // namespace deltaserve
