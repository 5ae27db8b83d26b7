// RankGroup: the tensor-parallel group of one model replica. Per rank: a backend, the model's
// shard (model/tensor_parallel.h) and a communicator; and the threads that run the ranks
// together, rank 0 on the caller's thread. The runner fans each forward out with run(); the
// block and slot bookkeeping stays single (CacheMemory). tp_size 1: one rank, no threads, no
// communicator, exactly the single-device engine.
//   CPU:  ranks share the process's cores (each its own thread pool) and talk through
//         CpuCommunicator.
//   CUDA: rank r on GPU r (of replica i: i * tp_size + r; DELTASERVE_TP_DEVICES=0,0 puts several
//         ranks or replicas on one GPU: how a single GPU tests them), CudaPeerCommunicator between them.
// Multi-node (a NodeLink): this process holds only its node's ranks (link.first_rank() ..,
// link.local_ranks() of them, on its GPUs 0..), and talks to the others through NCCL (GPUs) or
// SocketCommunicator (CPU); size() counts this node's ranks, tp_size() the whole group's.
#pragma once

#include <condition_variable>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "engine/node_link.h"
#include "model/model.h"
#include "model/step_memory.h"

namespace deltaserve {

struct RankGroupOptions {
  std::filesystem::path model_dir;
  std::string device = "cpu";  // "cpu" or "cuda"
  int n_threads = 0;           // CPU: kernel threads over all ranks (0 = all usable CPUs)
  int tp_size = 1;
  bool custom_all_reduce = true;  // CUDA: the one-shot peer all-reduce for small messages (else NCCL only)
  ModelLoadOptions load;       // comm is set per rank here
  NodeLink* link = nullptr;    // multi-node: this node's place in the group (nullptr: one node)
  // Data parallelism on CUDA: replica dp_rank of dp_size runs its ranks on GPUs
  // dp_rank * tp_size .. + tp_size - 1 (DELTASERVE_TP_DEVICES lists every replica's, in order).
  int dp_rank = 0;
  int dp_size = 1;
};

// How a CUDA tensor-parallel group communicates, decided in one place: the one-shot peer
// all-reduce for messages up to kPeerMaxBytes and NCCL above (both available, one GPU per rank);
// peer only (NCCL unavailable, or ranks sharing a GPU); NCCL only (--disable-custom-all-reduce).
enum class TpTransport { Peer, Nccl, PeerAndNccl };
struct TpTransportChoice {
  TpTransport transport = TpTransport::Peer;
  std::string description;  // one line for the start-up log and /get_server_info
};
constexpr std::size_t kPeerMaxBytes = static_cast<std::size_t>(kPeerAllReduceMaxBytes);  // model/step_memory.h
// distinct_devices: every rank on its own GPU; nccl_error: "" when NCCL is usable, else why not.
Result<TpTransportChoice> choose_tp_transport(bool distinct_devices, const std::string& nccl_error,
                                              bool custom_all_reduce);

class RankGroup {
 public:
  // rank0_backend: rank 0's backend when the caller already made one (to measure memory first).
  static Result<std::unique_ptr<RankGroup>> create(const RankGroupOptions& o,
                                                   std::unique_ptr<Backend> rank0_backend = nullptr);
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }  // this process's ranks
  int tp_size() const { return tp_size_; }                        // the group's, over every node
  Backend& backend(int rank = 0) const { return *ranks_[rank].backend; }
  Model& model(int rank = 0) const { return *ranks_[rank].model; }
  std::vector<Backend*> backends() const;
  // How the ranks communicate ("" with one rank): CPU threads, or choose_tp_transport's line.
  const std::string& transport() const { return transport_; }
  // Sizes every rank's collective staging for messages of up to `bytes` (before any forward).
  void reserve_collectives(std::size_t bytes);
  // Whether a forward with its collectives can be captured in a CUDA graph.
  bool graphs_ok() const {
    for (const auto& r : ranks_)
      if (r.comm && !r.comm->graph_capturable()) return false;
    return true;
  }

  // fn(rank) on every rank at once (rank 0 on this thread); returns when all have finished.
  // Ranks issue the same collectives in the same order, so fn must not branch on data that
  // differs between ranks around a collective. Never allocates (fn is referenced, not copied).
  template <typename Fn>
  void run(Fn&& fn) {
    run_job(Job{&fn, [](void* f, int rank) { (*static_cast<std::remove_reference_t<Fn>*>(f))(rank); }});
  }

 private:
  struct Job {
    void* fn = nullptr;
    void (*call)(void*, int) = nullptr;
  };
  RankGroup() = default;
  static Result<std::unique_ptr<RankGroup>> create_node(const RankGroupOptions& o, std::unique_ptr<Backend> rank0_backend);
  // A backend per rank on devices[r] (rank 0: rank0_backend when given), the CPU threads shared out.
  Status make_backends(const RankGroupOptions& o, const std::vector<int>& devices, std::unique_ptr<Backend> rank0_backend);
  Status load_models(const RankGroupOptions& o);  // every rank's shard, then the rank threads
  void run_job(Job job);
  void worker(int rank);

  struct Rank {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<Model> model;
  };
  std::vector<Rank> ranks_;
  std::vector<std::thread> threads_;  // ranks 1..size-1
  std::string transport_;
  int tp_size_ = 1;
  std::mutex mu_;
  std::condition_variable wake_, done_cv_;
  Job job_;
  uint64_t generation_ = 0;
  int n_done_ = 0;
  bool stop_ = false;
};

}  // namespace deltaserve
