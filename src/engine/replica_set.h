// ReplicaSet: data parallelism (--dp-size N). N engines, each a whole model replica with its own
// caches, scheduler and thread, behind one EngineService: a new request goes to the least-loaded
// replica (running + waiting + not yet picked up), cancels go to every replica (each ignores ids
// it does not hold), statistics are summed (and kept per replica for /metrics).
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "engine/engine.h"

namespace deltaserve {

class ReplicaSet final : public EngineService {
 public:
  explicit ReplicaSet(std::vector<std::unique_ptr<Engine>> replicas);

  std::shared_ptr<RequestStream> submit(GenerateRequest request) override;
  void cancel(RequestId id) override;
  RequestId next_request_id() override { return next_id_.fetch_add(1); }
  EngineStats stats() const override;
  std::vector<EngineStats> replica_stats() const override;
  int64_t context_length() const override { return replicas_[0]->context_length(); }
  bool flush_cache() override;

  int size() const { return static_cast<int>(replicas_.size()); }
  Engine& replica(int i) { return *replicas_[i]; }
  void start();
  void stop();

 private:
  std::vector<std::unique_ptr<Engine>> replicas_;
  std::atomic<RequestId> next_id_{1};
  std::atomic<uint32_t> rotate_{0};  // where the least-loaded search starts (ties spread)
};

// Sums the counters and gauges of several replicas.
EngineStats sum_stats(const std::vector<EngineStats>& parts);

}  // namespace deltaserve
