#include "engine/rank_group.h"

#include <algorithm>

#include "backend/backend_factory.h"
#include "backend/cpu/cpu_communicator.h"
#include "util/thread_pool.h"

namespace deltaserve {

Result<std::unique_ptr<RankGroup>> RankGroup::create(const RankGroupOptions& o, std::unique_ptr<Backend> rank0_backend) {
  const int P = o.tp_size;
  if (P < 1) return error("--tp-size must be at least 1 (got ", P, ")");
  if (P > 1 && o.device != "cpu")
    return error("--tp-size ", P, " on --device ", o.device,
                 ": tensor parallelism on GPUs needs the NCCL communicator, which is not built yet (issue #12); "
                 "--device cpu runs it");
  std::unique_ptr<RankGroup> g(new RankGroup());
  g->ranks_.resize(static_cast<std::size_t>(P));
  std::vector<std::unique_ptr<Communicator>> comms;
  if (P > 1) comms = make_cpu_communicators(P);
  // CPU: the kernel threads are shared out between the ranks (each rank has its own pool).
  const int total = o.n_threads > 0 ? o.n_threads : hardware_threads();
  const int per_rank = P > 1 ? std::max(1, total / P) : o.n_threads;
  for (int r = 0; r < P; ++r) {
    Rank& rk = g->ranks_[r];
    if (r == 0 && rank0_backend) {
      rk.backend = std::move(rank0_backend);
    } else {
      DS_ASSIGN_OR_RETURN(rk.backend, make_backend(o.device, per_rank));
    }
    if (P > 1) rk.comm = std::move(comms[r]);
    ModelLoadOptions lo = o.load;
    lo.comm = rk.comm.get();
    DS_ASSIGN_OR_RETURN(rk.model, load_model(o.model_dir, *rk.backend, lo));
  }
  for (int r = 1; r < P; ++r) g->threads_.emplace_back([p = g.get(), r] { p->worker(r); });
  return g;
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

void RankGroup::run_job(Job job) {
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
