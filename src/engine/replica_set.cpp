#include "engine/replica_set.h"

#include <algorithm>

namespace deltaserve {

ReplicaSet::ReplicaSet(std::vector<std::unique_ptr<Engine>> replicas) : replicas_(std::move(replicas)) {
  DS_CHECK(!replicas_.empty(), "a replica set needs a replica");
}

std::shared_ptr<RequestStream> ReplicaSet::submit(GenerateRequest request) {
  const int n = size();
  const int first = static_cast<int>(rotate_.fetch_add(1) % static_cast<uint32_t>(n));
  int best = first, best_load = replicas_[first]->load();
  for (int k = 1; k < n; ++k) {
    const int i = (first + k) % n;
    const int l = replicas_[i]->load();
    if (l < best_load) {
      best = i;
      best_load = l;
    }
  }
  return replicas_[best]->submit(std::move(request));
}

void ReplicaSet::cancel(RequestId id) {
  for (auto& r : replicas_) r->cancel(id);
}

std::vector<EngineStats> ReplicaSet::replica_stats() const {
  std::vector<EngineStats> out;
  for (const auto& r : replicas_) out.push_back(r->stats());
  return out;
}

EngineStats ReplicaSet::stats() const { return sum_stats(replica_stats()); }

bool ReplicaSet::flush_cache() {
  // All or none: a busy replica refuses, so the idle ones are not flushed either (they were, and
  // the caller was told nothing was dropped). A request arriving between this check and the
  // flushes below can still make one replica refuse after another has flushed.
  for (const auto& r : replicas_) {
    const EngineStats s = r->stats();
    if (s.requests_running + s.requests_waiting > 0) return false;
  }
  bool ok = true;
  for (auto& r : replicas_) ok = r->flush_cache() && ok;
  return ok;
}

void ReplicaSet::start() {
  for (auto& r : replicas_) r->start();
}

void ReplicaSet::stop() {
  for (auto& r : replicas_) r->stop();
}

EngineStats sum_stats(const std::vector<EngineStats>& parts) {
  EngineStats t;
  for (const EngineStats& s : parts) {
    t.requests_running += s.requests_running;
    t.requests_waiting += s.requests_waiting;
    t.kv_tokens_used += s.kv_tokens_used;
    t.kv_tokens_total += s.kv_tokens_total;
    t.state_slots_used += s.state_slots_used;
    t.state_slots_total += s.state_slots_total;
    t.prompt_tokens_total += s.prompt_tokens_total;
    t.generated_tokens_total += s.generated_tokens_total;
    t.spec_draft_tokens_total += s.spec_draft_tokens_total;
    t.spec_accepted_tokens_total += s.spec_accepted_tokens_total;
    t.spec_verify_steps_total += s.spec_verify_steps_total;
    t.preemptions_total += s.preemptions_total;
    t.mixed_prefill_tokens = std::max(t.mixed_prefill_tokens, s.mixed_prefill_tokens);
    t.device_sampled_total += s.device_sampled_total;
    t.overlapped_steps_total += s.overlapped_steps_total;
    t.overlap_dropped_tokens_total += s.overlap_dropped_tokens_total;
    t.prompt_tokens_cached_total += s.prompt_tokens_cached_total;
    t.cached_blocks += s.cached_blocks;
    t.cached_checkpoints += s.cached_checkpoints;
    t.checkpoint_slots_total += s.checkpoint_slots_total;
    t.steps_total += s.steps_total;
    t.step_seconds += s.step_seconds;
    t.forward_seconds += s.forward_seconds;
    t.sample_seconds += s.sample_seconds;
    t.draft_seconds += s.draft_seconds;
    t.decode_steps_total += s.decode_steps_total;
    t.decode_step_seconds += s.decode_step_seconds;
    t.decode_forward_seconds += s.decode_forward_seconds;
    t.decode_sample_seconds += s.decode_sample_seconds;
    t.decode_draft_seconds += s.decode_draft_seconds;
  }
  return t;
}

}  // namespace deltaserve
