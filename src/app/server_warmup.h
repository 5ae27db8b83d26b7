// The warm-up `serve` runs on a CUDA engine before it reports ready (SGLang's server warm-up;
// --skip-server-warmup skips it). Two greedy requests alone, of 24 and 48 prompt tokens (prefill
// steps in the GEMM buckets of 17-32 and 33-64 rows), then batches of 1, 2, 4, ... up to the
// engine's max running requests (at most kMaxWarmupBatch) of 16-token greedy requests, each batch
// submitted at once and drained. Their steps capture the decode (and, with MTP, verification) CUDA
// graphs of those batch sizes and time the GEMM algorithm buckets (backend/cuda/cuda_gemm.h), so
// that the first requests served do not wait for them (on the H200, 29 buckets timed inside a
// 16-stream HTTP benchmark cost it 2-5% of its throughput; bench/RESULTS.md, stop 41). The
// warm-up's requests count in the engine's statistics like any others.
//
// Also here: EngineProgressWatch, the test `serve`'s watchdog makes (header-only, so the server
// tests check it without an engine).
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_service.h"

namespace deltaserve {

constexpr int kMaxWarmupBatch = 64;  // the GEMM buckets' range (CudaOptions::gemm_tune_rows)

struct WarmupResult {
  std::vector<int> batches;  // the batch sizes run
  double seconds = 0;
  int tokens = 0;  // generated tokens received
  int failed = 0;  // requests that ended in an error
};

// The batch sizes a warm-up runs for an engine of `max_batch` running requests: 1, 2, 4, ... up to
// min(max_batch, kMaxWarmupBatch).
std::vector<int> warm_up_engine_sizes(int max_batch);
// Runs the warm-up on a started engine; returns when every request has finished.
WarmupResult warm_up_engine(Engine& engine, int max_batch);

// What the watchdog watches: each replica's statistics (--dp-size N), or the one engine's.
inline std::vector<EngineStats> engine_progress_snapshot(const EngineService& engine) {
  std::vector<EngineStats> replicas = engine.replica_stats();
  if (replicas.empty()) replicas.push_back(engine.stats());
  return replicas;
}

// serve's watchdog: every replica with requests pending (running or waiting) must finish a step
// within `timeout`. Replicas are watched one by one: a stuck replica is seen while the others
// make progress (their summed step counter would hide it), and an idle one is never stuck.
class EngineProgressWatch {
 public:
  using Clock = std::chrono::steady_clock;
  struct Stuck {
    int replica = 0;
    Clock::duration stalled{};  // since its last step (or since its work began)
    int pending = 0;            // its requests running + waiting
  };
  // Called periodically with engine_progress_snapshot(); the first stuck replica (the one stalled
  // longest), or nullopt. A timeout of zero or less never fires.
  std::optional<Stuck> update(const std::vector<EngineStats>& replicas, Clock::time_point now, Clock::duration timeout) {
    if (last_steps_.size() != replicas.size()) {  // first call (or the replica count changed)
      last_steps_.assign(replicas.size(), 0);
      last_progress_.assign(replicas.size(), now);
      for (std::size_t i = 0; i < replicas.size(); ++i) last_steps_[i] = replicas[i].steps_total;
    }
    std::optional<Stuck> worst;
    for (std::size_t i = 0; i < replicas.size(); ++i) {
      const EngineStats& st = replicas[i];
      const int pending = st.requests_running + st.requests_waiting;
      if (st.steps_total != last_steps_[i] || pending == 0) {
        last_steps_[i] = st.steps_total;
        last_progress_[i] = now;
      }
      const Clock::duration stalled = now - last_progress_[i];
      if (timeout.count() > 0 && stalled > timeout && (!worst || stalled > worst->stalled))
        worst = Stuck{static_cast<int>(i), stalled, pending};
    }
    return worst;
  }

 private:
  std::vector<uint64_t> last_steps_;
  std::vector<Clock::time_point> last_progress_;
};

}  // namespace deltaserve
