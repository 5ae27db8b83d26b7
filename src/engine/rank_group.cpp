#include "engine/rank_group.h"

#include <algorithm>
#include <numeric>

#include <cstdlib>
#include <sstream>

#include "backend/backend_factory.h"
#include "backend/cpu/cpu_communicator.h"
#include "backend/cpu/socket_communicator.h"
#include "util/log.h"
#include "util/thread_pool.h"
#include "backend/split_communicator.h"
#ifdef DELTASERVE_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_communicator.h"
#include "backend/cuda/nccl_communicator.h"
#endif

namespace deltaserve {

Result<TpTransportChoice> choose_tp_transport(bool distinct_devices, const std::string& nccl_error,
                                              bool custom_all_reduce) {
  TpTransportChoice c;
  if (!custom_all_reduce) {
    if (!distinct_devices)
      return error("--disable-custom-all-reduce: NCCL needs one GPU per rank, and DELTASERVE_TP_DEVICES puts two ranks "
                   "on one GPU");
    if (!nccl_error.empty()) return error("--disable-custom-all-reduce needs NCCL: ", nccl_error);
    c.transport = TpTransport::Nccl;
    c.description = "NCCL for every collective (--disable-custom-all-reduce)";
    return c;
  }
  if (!distinct_devices) {
    c.description = "one-shot peer all-reduce, host-synchronised (ranks share a GPU: no NCCL, no CUDA graphs)";
    return c;
  }
  if (!nccl_error.empty()) {
    c.description = "one-shot peer all-reduce for every size (NCCL unavailable: " + nccl_error + ")";
    return c;
  }
  c.transport = TpTransport::PeerAndNccl;
  c.description = "one-shot peer all-reduce up to " + std::to_string(kPeerMaxBytes >> 20) + " MiB, NCCL above";
  return c;
}

Result<std::unique_ptr<RankGroup>> RankGroup::create(const RankGroupOptions& o, std::unique_ptr<Backend> rank0_backend) {
  if (o.tp_size < 1) return error("--tp-size must be at least 1 (got ", o.tp_size, ")");
  if (o.link) return create_node(o, std::move(rank0_backend));
  const int P = o.tp_size;
  const bool cuda = o.device == "cuda";
  // CUDA devices of the ranks: replica i's ranks on GPUs i*P .. i*P+P-1, or the entries
  // i*P .. of DELTASERVE_TP_DEVICES (every replica's ranks in order; may repeat a device).
  const int dp = std::max(1, o.dp_size), first = o.dp_rank * P;
  std::vector<int> devices;
  for (int r = 0; r < P; ++r) devices.push_back(first + r);
  if (const char* env = std::getenv("DELTASERVE_TP_DEVICES"); cuda && env && *env) {
    std::vector<int> listed;
    std::stringstream ss(env);
    for (std::string item; std::getline(ss, item, ',');) listed.push_back(std::atoi(item.c_str()));
    if (static_cast<int>(listed.size()) != P * dp)
      return error("DELTASERVE_TP_DEVICES=", env, " names ", listed.size(), " devices for --tp-size ", P,
                   dp > 1 ? str_cat(" x --dp-size ", dp) : std::string());
    devices.assign(listed.begin() + first, listed.begin() + first + P);
  }
#ifdef DELTASERVE_WITH_CUDA
  if (cuda && P * dp > 1 && !std::getenv("DELTASERVE_TP_DEVICES") && cuda_device_count() < P * dp)
    return error(dp > 1 ? str_cat("--dp-size ", dp, " x --tp-size ", P) : str_cat("--tp-size ", P), " needs ", P * dp,
                 " GPUs; ", cuda_device_count(), " visible");
#else
  if (cuda && P * dp > 1)
    return error(dp > 1 ? str_cat("--dp-size ", dp) : str_cat("--tp-size ", P), " on --device cuda: this build has no CUDA backend");
#endif
  std::unique_ptr<RankGroup> g(new RankGroup());
  g->tp_size_ = P;
  DS_RETURN_IF_ERROR(g->make_backends(o, devices, std::move(rank0_backend)));
  if (P > 1) {
    std::vector<std::unique_ptr<Communicator>> comms;
    if (cuda) {
#ifdef DELTASERVE_WITH_CUDA
      bool distinct = true;
      for (int a = 0; a < P; ++a)
        for (int b = a + 1; b < P; ++b) distinct = distinct && devices[a] != devices[b];
      const std::string nccl_error = distinct ? nccl_unavailable_reason() : "ranks share a GPU";
      DS_ASSIGN_OR_RETURN(TpTransportChoice choice, choose_tp_transport(distinct, nccl_error, o.custom_all_reduce));
      g->transport_ = choice.description;
      if (choice.transport == TpTransport::Nccl) {
        DS_ASSIGN_OR_RETURN(comms, make_nccl_communicators(g->backends()));
      } else {
        DS_ASSIGN_OR_RETURN(comms, make_cuda_peer_communicators(g->backends()));
        if (choice.transport == TpTransport::PeerAndNccl) {
          DS_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Communicator>> large, make_nccl_communicators(g->backends()));
          for (int r = 0; r < P; ++r)
            comms[r] = std::make_unique<SplitCommunicator>(std::move(comms[r]), std::move(large[r]), kPeerMaxBytes);
        }
      }
#endif
    } else {
      if (!o.custom_all_reduce) return error("--disable-custom-all-reduce applies to GPU tensor parallelism (--device cuda)");
      comms = make_cpu_communicators(P);
      g->transport_ = "CPU threads of this process (shared-memory staging, spin-then-futex barrier)";
    }
    for (int r = 0; r < P; ++r) g->ranks_[r].comm = std::move(comms[r]);
  }
  DS_RETURN_IF_ERROR(g->load_models(o));
  return g;
}

Result<std::unique_ptr<RankGroup>> RankGroup::create_node(const RankGroupOptions& o,
                                                          std::unique_ptr<Backend> rank0_backend) {
  NodeLink& link = *o.link;
  const int P = o.tp_size, L = link.local_ranks();
  const bool cuda = o.device == "cuda";
  if (P != link.tp_size() || L < 1) return error("--tp-size ", P, " over --nnodes ", link.nnodes());
#ifdef DELTASERVE_WITH_CUDA
  if (cuda && cuda_device_count() < L)
    return error("node ", link.node_rank(), " runs ", L, " ranks (--tp-size ", P, " / --nnodes ", link.nnodes(),
                 ") and sees ", cuda_device_count(), " GPUs");
#else
  if (cuda) return error("--device cuda: this build has no CUDA backend");
#endif
  std::unique_ptr<RankGroup> g(new RankGroup());
  g->tp_size_ = P;
  std::vector<int> devices(static_cast<std::size_t>(L));  // this node's GPUs 0..L-1
  std::iota(devices.begin(), devices.end(), 0);
  DS_RETURN_IF_ERROR(g->make_backends(o, devices, std::move(rank0_backend)));
  const std::string nodes = str_cat(link.nnodes(), " nodes (this is node ", link.node_rank(), ": ranks ",
                                    link.first_rank(), "..", link.first_rank() + L - 1, " of ", P, ")");
  std::vector<std::unique_ptr<Communicator>> comms;
  if (cuda) {
#ifdef DELTASERVE_WITH_CUDA
    // One NCCL group over every node (no peer one-shot: its buffers do not cross processes).
    DS_ASSIGN_OR_RETURN(comms, make_nccl_communicators(g->backends(), link.nccl_id(), link.first_rank(), P));
    g->transport_ = "NCCL across " + nodes;
#endif
  } else {
    DS_ASSIGN_OR_RETURN(std::vector<std::vector<TcpStream>> streams, link.rank_streams());
    for (int i = 0; i < L; ++i)
      comms.push_back(make_socket_communicator(link.first_rank() + i, P, std::move(streams[i])));
    g->transport_ = "TCP through rank 0 at " + link.addr().str() + ", " + nodes;
  }
  for (int i = 0; i < L; ++i) g->ranks_[i].comm = std::move(comms[i]);
  DS_RETURN_IF_ERROR(g->load_models(o));
  return g;
}

Status RankGroup::make_backends(const RankGroupOptions& o, const std::vector<int>& devices,
                                std::unique_ptr<Backend> rank0_backend) {
  const int n = static_cast<int>(devices.size());
  ranks_.resize(static_cast<std::size_t>(n));
  // CPU: the kernel threads are shared out between the ranks (each rank has its own pool).
  const int total = o.n_threads > 0 ? o.n_threads : hardware_threads();
  const int per_rank = n > 1 ? std::max(1, total / n) : o.n_threads;
  // (Said, not silent: fewer threads than ranks still run one a rank; a remainder goes unused.)
  if (n > 1 && o.device == "cpu" && total % n != 0)
    log_warn("--tp-size ", n, ": ", total, " CPU threads do not share out evenly: ", per_rank, " a rank, ",
             per_rank * n, " in all");
  for (int r = 0; r < n; ++r) {
    if (r == 0 && rank0_backend) {
      ranks_[r].backend = std::move(rank0_backend);
    } else {
      DS_ASSIGN_OR_RETURN(ranks_[r].backend, make_backend(o.device, per_rank, devices[r]));
    }
  }
  return Status::ok();
}

Status RankGroup::load_models(const RankGroupOptions& o) {
  for (Rank& rk : ranks_) {
    ModelLoadOptions lo = o.load;
    lo.comm = rk.comm.get();
    DS_ASSIGN_OR_RETURN(rk.model, load_model(o.model_dir, *rk.backend, lo));
  }
  for (int r = 1; r < size(); ++r) threads_.emplace_back([this, r] { worker(r); });
  return Status::ok();
}

RankGroup::~RankGroup() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

std::vector<Backend*> RankGroup::backends() const {
  std::vector<Backend*> out;
  for (const auto& r : ranks_) out.push_back(r.backend.get());
  return out;
}

void RankGroup::reserve_collectives(std::size_t bytes) {
  if (tp_size() == 1) return;
  run([&](int rank) { ranks_[rank].comm->reserve(bytes); });
}

void RankGroup::run_job(Job job) {
  ranks_[0].backend->bind_thread();  // the caller may be a new thread (the engine's)
  if (ranks_.size() == 1) {
    job.call(job.fn, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = job;
    n_done_ = 0;
    ++generation_;
  }
  wake_.notify_all();
  job.call(job.fn, 0);
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return n_done_ == size() - 1; });
  job_ = Job{};
}

void RankGroup::worker(int rank) {
  ranks_[rank].backend->bind_thread();
  uint64_t seen = 0;
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    job.call(job.fn, rank);
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++n_done_;
    }
    done_cv_.notify_one();
  }
}

}  // namespace deltaserve
