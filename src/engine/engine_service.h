// EngineService: the thread-safe face the server talks to. The real implementation is Engine
// (engine/engine.h), which runs the scheduler and model on its own thread; tests of the HTTP layer
// may use any other implementation of this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/events.h"

namespace deltaserve {

struct EngineStats {
  int requests_running = 0;
  int requests_waiting = 0;
  int64_t kv_tokens_used = 0;       // KV slots held by live requests
  int64_t kv_tokens_total = 0;
  int state_slots_used = 0;
  int state_slots_total = 0;
  uint64_t prompt_tokens_total = 0;     // counters since start
  uint64_t generated_tokens_total = 0;
  uint64_t spec_draft_tokens_total = 0;
  uint64_t spec_accepted_tokens_total = 0;
  uint64_t spec_verify_steps_total = 0;
  uint64_t preemptions_total = 0;       // running requests retracted for lack of KV blocks
  // Prefill tokens a step that also decodes may carry (EngineConfig::mixed_prefill_tokens; auto: the
  // learnt budget, before Scheduler's backlog rule raises it for a step).
  int mixed_prefill_tokens = 0;
  // Tokens drawn on the device (Fetch::Sample).
  uint64_t device_sampled_total = 0;
  // Prefix cache.
  uint64_t prompt_tokens_cached_total = 0;  // prompt tokens served from the cache (not computed)
  int64_t cached_blocks = 0;                // KV blocks the cache holds
  int cached_checkpoints = 0;               // GDN state checkpoints the cache holds
  int checkpoint_slots_total = 0;
  // Where the engine thread's time went (seconds since start), for benchmarks: a step is
  // schedule + forward (incl. logits to the host) + sampling + MTP drafts + emitting events.
  uint64_t steps_total = 0;
  double step_seconds = 0, forward_seconds = 0, sample_seconds = 0, draft_seconds = 0;
  // The same over decode steps only (every item a single sampled token or a verification: no
  // prefill chunk in the batch), so a step time is not diluted by prefills.
  uint64_t decode_steps_total = 0;
  double decode_step_seconds = 0, decode_forward_seconds = 0, decode_sample_seconds = 0, decode_draft_seconds = 0;
  // Overlap scheduling: steps launched while the step before them was still computing, and the
  // tokens they computed for sequences that had finished in that step (dropped).
  uint64_t overlapped_steps_total = 0;
  uint64_t overlap_dropped_tokens_total = 0;
};

class EngineService {
 public:
  virtual ~EngineService() = default;
  // Thread-safe. Never blocks on the model. A request the engine cannot take (queue full, prompt
  // too long) gets a single event with finish == Error and a message.
  virtual std::shared_ptr<RequestStream> submit(GenerateRequest request) = 0;
  // Thread-safe. Frees the request's KV blocks and state slot at the next step; its stream gets a
  // final event with finish == Abort (unless it had already finished).
  virtual void cancel(RequestId id) = 0;
  virtual RequestId next_request_id() = 0;
  virtual EngineStats stats() const = 0;
  // Data parallelism: each replica's statistics (stats() is their sum); empty for one engine.
  virtual std::vector<EngineStats> replica_stats() const { return {}; }
  virtual int64_t context_length() const = 0;  // prompt + generated tokens at most
  // Empties the prefix cache (SGLang's /flush_cache). False when requests are running or waiting
  // (nothing is dropped then), or when the engine does not answer within a few seconds. On return
  // stats() already shows the emptied cache.
  virtual bool flush_cache() { return false; }
};

}  // namespace deltaserve
