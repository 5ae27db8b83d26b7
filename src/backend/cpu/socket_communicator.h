// SocketCommunicator: collectives between ranks in different processes, over TCP: the ranks of a
// CPU multi-node group (`--device cpu --nnodes N`), so CI checks multi-node serving without a
// GPU. Rank 0 is the hub and every other rank holds one stream to it. An all-reduce: each rank
// sends its data to rank 0, which sums in rank order (the same float sums CpuCommunicator makes)
// and sends the result to every rank; an all-gather the same with concatenation. Two messages a
// collective per rank: fine for a CPU model, never a GPU transport (GPUs use NCCL).
// A peer that goes away ends this process with a message naming it: a collective cannot return
// an error, and waiting for a rank that is gone would hang.
#pragma once

#include <memory>
#include <vector>

#include "backend/communicator.h"
#include "util/tcp.h"

namespace deltaserve {

// Rank 0: streams[r - 1] connects to rank r (r = 1..size-1). Other ranks: streams[0] connects to
// rank 0.
std::unique_ptr<Communicator> make_socket_communicator(int rank, int size, std::vector<TcpStream> streams);

}  // namespace deltaserve
