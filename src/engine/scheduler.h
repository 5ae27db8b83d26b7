// Scheduler: pure CPU decisions over sequences and cache memory. Each step it
//   1. gives every decoding sequence its next token (plus drafts under speculation), preempting
//      the newest running sequence when KV blocks run out (retraction: it is recomputed later);
//   2. continues unfinished prefills in chunks of at most chunked_prefill_size;
//   3. admits waiting sequences while running < max_running, a state slot is free, and the
//      step's prefill token budget (max_prefill_tokens) lasts.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "cache/cache_memory.h"
#include "engine/sequence.h"

namespace deltaserve {

struct SchedulerConfig {
  int max_running = 1;
  int chunked_prefill_size = 512;
  int max_prefill_tokens = 1024;
  int decode_tokens_per_seq = 1;   // 1 + speculative drafts
  int block_size = 16;
};

struct ScheduledItem {
  Sequence* seq = nullptr;
  int n_tokens = 0;     // feeds seq->tokens[n_computed, n_computed + n_tokens)
  bool sample = false;  // reaches the end of the known tokens: sample the next one
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, CacheMemory& cache);

  void add(std::unique_ptr<Sequence> seq);
  // Removes a sequence (waiting or running), releasing its memory. nullptr if unknown.
  std::unique_ptr<Sequence> remove(RequestId id);
  // Removes every sequence (shutdown), releasing its memory.
  std::vector<std::unique_ptr<Sequence>> remove_all();
  RequestId front_waiting_id() const { return waiting_.empty() ? 0 : waiting_.front()->id; }
  // Runs the admission/budget logic. `preempted` counts retractions (for metrics).
  const std::vector<ScheduledItem>& schedule();
  // After a step: take finished sequences out (their memory released).
  std::vector<std::unique_ptr<Sequence>> take_finished();

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int n_running() const { return static_cast<int>(running_.size()); }
  int n_waiting() const { return static_cast<int>(waiting_.size()); }
  int64_t kv_tokens_used() const;
  uint64_t n_preempted() const { return n_preempted_; }
  // Grows seq's block table to cover n tokens; false when the pool is out of blocks.
  [[nodiscard]] bool reserve(Sequence& seq, int n_tokens);
  void release(Sequence& seq);

 private:
  void preempt(Sequence& seq);
  SchedulerConfig config_;
  CacheMemory& cache_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<ScheduledItem> items_;
  uint64_t admit_counter_ = 0;
  uint64_t n_preempted_ = 0;
};

}  // namespace deltaserve
