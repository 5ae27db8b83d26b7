// CpuCommunicator: collectives between the threads of one process (one thread per rank, host
// memory), so `--device cpu --tp-size N` runs and CI checks tensor parallelism without a GPU.
// Each collective: every rank copies its data into its own staging slot, a barrier, every rank
// reads all slots (summing in rank order), a second barrier (no slot is rewritten before every
// rank has read it). Within one process only: multi-node needs NCCL.
#pragma once

#include <memory>
#include <vector>

#include "backend/communicator.h"

namespace deltaserve {

// The communicators of one group of `size` ranks: element r is rank r's (hand each to its thread).
std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(int size);

}  // namespace deltaserve
