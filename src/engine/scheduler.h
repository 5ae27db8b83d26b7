// Scheduler: pure CPU decisions over sequences and cache memory (blocks and slots). Each step,
// schedule()
//   1. gives every decoding sequence its next token (plus drafts under speculation), preempting
//      the newest running sequence when KV blocks run out (retraction: it is recomputed later);
//   2. continues unfinished prefills in chunks of at most chunked_prefill_size;
//   3. admits waiting sequences while running < max_running, a slot is free, and the step's
//      prefill token budget (max_prefill_tokens) lasts;
// and after the forward and sampling, update() takes the step's results: computed tokens,
// accepted drafts, and finishes (EOS, stop token ids, length).
#pragma once

#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "cache/cache_allocator.h"
#include "engine/sequence.h"

namespace deltaserve {

struct SchedulerConfig {
  int max_running = 1;
  int chunked_prefill_size = 512;
  int max_prefill_tokens = 1024;
  int block_size = 16;
  std::vector<int32_t> eos_token_ids;  // finish a sequence (reason Stop) unless it ignores EOS
};

struct ScheduledItem {
  Sequence* seq = nullptr;
  int n_tokens = 0;     // feeds tokens[n_computed, n_computed + n_tokens) (a decode: 1 + n_drafts)
  bool sample = false;  // reaches the end of the known tokens: sample the next one
};

// What sampling produced for one scheduled item (schedule()'s order). Sampling appends the new
// tokens to seq->tokens; update() cuts them after a finishing token.
struct StepOutput {
  int n_sampled = 0;      // tokens appended by sampling (0: a prefill chunk that samples nothing)
  int n_drafts = 0;       // verification: drafts it verified
  int n_accepted = -1;    // verification: drafts kept (-1: the item verified nothing)
  std::vector<TokenLogprob> logprobs;  // one per appended token, when asked
  // Filled by Scheduler::update:
  int n_emit = 0;         // appended tokens that stand
  FinishReason finish = FinishReason::None;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, CacheAllocator& cache);

  void add(std::unique_ptr<Sequence> seq);
  // Removes a sequence (waiting or running), releasing its memory. nullptr if unknown.
  std::unique_ptr<Sequence> remove(RequestId id);
  // Removes every sequence (shutdown), releasing its memory.
  std::vector<std::unique_ptr<Sequence>> remove_all();
  RequestId front_waiting_id() const { return waiting_.empty() ? 0 : waiting_.front()->id; }
  // The step's batch (valid until the next call).
  const std::vector<ScheduledItem>& schedule();
  // The step's results, one per item of the last schedule(): advances n_computed (a verification
  // keeps 1 + accepted drafts), cuts each sequence's new tokens at the first EOS / stop token /
  // length limit and marks it Finished. Fills n_emit and finish.
  void update(std::span<const ScheduledItem> items, std::span<StepOutput> outputs);
  // After a step: take finished sequences out (their memory released).
  std::vector<std::unique_ptr<Sequence>> take_finished();

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int n_running() const { return static_cast<int>(running_.size()); }
  int n_waiting() const { return static_cast<int>(waiting_.size()); }
  uint64_t n_preempted() const { return n_preempted_; }
  // Grows seq's block table to cover n tokens; false when the pool is out of blocks.
  [[nodiscard]] bool reserve(Sequence& seq, int n_tokens);
  // Blocks and slots held by sequences equal what the cache counts as used (DS_CHECK otherwise).
  void check_integrity() const;

 private:
  void release(Sequence& seq);
  void preempt(Sequence& seq);
  SchedulerConfig config_;
  CacheAllocator& cache_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<ScheduledItem> items_;
  uint64_t admit_counter_ = 0;
  uint64_t n_preempted_ = 0;
};

}  // namespace deltaserve
