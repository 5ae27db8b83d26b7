// EngineService: the thread-safe face the server talks to. The real implementation is Engine
// (engine/engine.h), which runs the scheduler and model on its own thread; tests of the HTTP layer
// may use any other implementation of this interface.
#pragma once

#include <cstdint>
#include <memory>

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
  // Where the engine thread's time went (seconds since start), for benchmarks: a step is
  // schedule + forward (incl. logits to the host) + sampling + MTP drafts + emitting events.
  uint64_t steps_total = 0;
  double step_seconds = 0, forward_seconds = 0, sample_seconds = 0, draft_seconds = 0;
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
  virtual int64_t context_length() const = 0;  // prompt + generated tokens at most
};

}  // namespace deltaserve
