// Scheduler: pure CPU decisions over sequences and cache memory (blocks and slots). Each step,
// schedule()
//   1. gives every decoding sequence its next token (plus drafts under speculation), preempting
//      the newest running sequence when KV blocks run out (retraction: it is recomputed later,
//      re-matching the prefix cache); cached blocks are evicted before anything running;
//   2. continues unfinished prefills in chunks of at most chunked_prefill_size, all prefills of
//      the step together within max_prefill_tokens (mixed_prefill_tokens when a running sequence
//      decodes in the same step);
//   3. admits waiting sequences (in FCFS or longest-prefix-match order) while running <
//      max_running, a slot is free, and the step's prefill token budget lasts; an admitted
//      sequence starts after the longest cached prefix it has (blocks shared, GDN state copied
//      from the checkpoint), or waits when a running prefill is computing a longer one for it;
//   4. asks for GDN state checkpoints at block boundaries: at the end of the prompt and of
//      prefill chunks (cached after the step), and with decode checkpoints at the last boundary
//      a decoding sequence crossed (cached when it finishes);
// and after the forward and sampling, update() takes the step's results: computed tokens,
// accepted drafts, finishes (EOS, stop token ids, length), and the checkpoints to cache.
// Overlap scheduling: chain() gives a decode batch's next step before update() has taken the
// batch's results (the engine launches it while the batch still computes).
#pragma once

#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "cache/cache_allocator.h"
#include "cache/prefix_cache.h"
#include "engine/sequence.h"

namespace deltaserve {

enum class SchedulePolicy : uint8_t { Fcfs, Lpm };

struct SchedulerConfig {
  int max_running = 1;
  int chunked_prefill_size = 512;
  int max_prefill_tokens = 1024;
  // Prefill tokens in a step that also decodes running sequences (their next token waits for the
  // whole step): at most this many (0: max_prefill_tokens alone). The engine sets it as it learns
  // step costs (set_mixed_prefill_tokens).
  int mixed_prefill_tokens = 0;
  // With mixed_prefill_tokens: raised for a step so that the prefill tokens pending (unfinished
  // prefills and waiting prompts) take at most this many steps, so a backlog cannot outgrow what
  // small chunks clear (0: never raised).
  int mixed_backlog_steps = 0;
  int block_size = 16;
  std::vector<int32_t> eos_token_ids;  // finish a sequence (reason Stop) unless it ignores EOS
  bool prefix_cache = false;           // reuse cached prefixes (off: --disable-radix-cache)
  bool decode_checkpoints = false;     // a checkpoint slot per running request (extra_buffer)
  SchedulePolicy policy = SchedulePolicy::Fcfs;
};

struct ScheduledItem {
  Sequence* seq = nullptr;
  int n_tokens = 0;     // feeds tokens[n_computed, n_computed + n_tokens) (a decode: 1 + n_drafts)
  bool sample = false;  // reaches the end of the known tokens: sample the next one
  // Save the GDN state after fed token checkpoint_at into checkpoint_slot (-1: none); it then
  // covers checkpoint_pos tokens. A prefill checkpoint is cached after the step; a decode one is
  // the sequence's rolling checkpoint.
  int checkpoint_at = -1;
  int checkpoint_slot = -1;
  int checkpoint_pos = 0;
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
  // Overlap: the sequence had finished in the step before (which this chained step followed
  // before its tokens were read); this step's run of it is discarded.
  bool dropped = false;
};

// A checkpoint for a verification's commit (the accepted run is known only after sampling).
struct CommitCheckpoint {
  int at = -1;    // replayed token after which the state is saved
  int slot = -1;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, CacheAllocator& cache);

  void add(std::unique_ptr<Sequence> seq);
  // Removes a sequence (waiting or running), releasing its memory (a running one's computed prefix
  // cached first). nullptr if unknown.
  std::unique_ptr<Sequence> remove(RequestId id);
  // Removes every sequence (shutdown), releasing its memory.
  std::vector<std::unique_ptr<Sequence>> remove_all();
  RequestId front_waiting_id() const { return waiting_.empty() ? 0 : waiting_.front()->id; }
  // The step's batch (valid until the next call).
  const std::vector<ScheduledItem>& schedule();
  // Overlap scheduling: the step after `prev`, a batch of plain decodes (one sampled token each,
  // no drafts) that has run but whose results update() has not taken: the same sequences in the
  // same order, each fed the token `prev` is picking for it, one position further (blocks
  // reserved, decode checkpoints planned). False when the next step would be another batch: not
  // every running sequence is in `prev`, a waiting request could be admitted, a sequence has
  // finished, or a block cannot be reserved without preempting; or when every sequence reaches its
  // length limit in `prev`.
  bool chain(std::span<const ScheduledItem> prev, std::vector<ScheduledItem>& next);
  // The step's results, one per item of the last schedule(): advances n_computed (a verification
  // keeps 1 + accepted drafts), cuts each sequence's new tokens at the first EOS / stop token /
  // length limit and marks it Finished, and caches the prefill checkpoints written this step.
  void update(std::span<const ScheduledItem> items, std::span<StepOutput> outputs);
  // A verified sequence whose state is about to be committed (n_computed already advanced by
  // update() over `n_committed` tokens): where its rolling checkpoint goes, if it crossed a block.
  CommitCheckpoint commit_checkpoint(Sequence& seq, int n_committed);
  // After a step: take finished sequences out (their blocks and checkpoint cached, memory released).
  std::vector<std::unique_ptr<Sequence>> take_finished();

  // The prefill budget of steps that also decode (SchedulerConfig::mixed_prefill_tokens).
  void set_mixed_prefill_tokens(int n) { config_.mixed_prefill_tokens = n; }
  int mixed_prefill_tokens() const { return config_.mixed_prefill_tokens; }

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int n_running() const { return static_cast<int>(running_.size()); }
  int n_waiting() const { return static_cast<int>(waiting_.size()); }
  uint64_t n_preempted() const { return n_preempted_; }
  // Grows seq's block table to cover n tokens (evicting cached blocks first if needed); false when
  // the pool is out of blocks.
  [[nodiscard]] bool reserve(Sequence& seq, int n_tokens);
  // Distinct KV blocks held by running or waiting sequences (shared ones once); the rest of the
  // pool's used blocks belong to the prefix cache alone (evictable).
  int n_blocks_held_by_requests();
  // The prefix cache (nullptr when off).
  PrefixCache* prefix_cache() { return tree_.get(); }
  const PrefixCache* prefix_cache() const { return tree_.get(); }
  // Empties the prefix cache; false (nothing done) while requests run or wait.
  bool flush_prefix_cache();
  // Every block's reference count equals the sequences and cache nodes holding it; every slot and
  // checkpoint is held once (DS_CHECK otherwise).
  void check_integrity() const;

 private:
  void release(Sequence& seq);
  // A sequence leaving (finished or cancelled): its computed prefix into the prefix cache, up to
  // its rolling checkpoint (models with state) or every full block (without).
  void cache_computed(Sequence& seq);
  void preempt(Sequence& seq);
  // Matches the prefix cache for a sequence with nothing computed: shares the blocks, copies the
  // checkpoint into its slot. Returns the tokens it starts after.
  int resume_from_cache(Sequence& seq);
  // Whether a running prefill is computing a longer prefix of seq than the cache has now.
  bool should_wait_for_running_prefix(const Sequence& seq, int cached) const;
  // A checkpoint slot for the cache (evicting the oldest cached checkpoint when none is free and
  // `evict` says so); -1 when there is none.
  int take_checkpoint_slot(bool evict);
  // Block boundary checkpoint for a run over [n0, n0 + n) of seq (prefill: chunk end or prompt end).
  void plan_prefill_checkpoint(ScheduledItem& item);
  // ahead: tokens of the sequence computed but not yet counted in n_computed (a chained step).
  void plan_decode_checkpoint(ScheduledItem& item, int ahead = 0);
  void cache_prefix(Sequence& seq, int n_tokens, int checkpoint_slot);
  void order_waiting();

  SchedulerConfig config_;
  CacheAllocator& cache_;
  std::unique_ptr<PrefixCache> tree_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<ScheduledItem> items_;
  std::vector<int> in_flight_checkpoints_;
  std::vector<uint32_t> block_mark_;  // n_blocks_held_by_requests scratch (generation stamps)
  uint32_t mark_gen_ = 0;  // prefill checkpoint slots between schedule() and update()
  uint64_t admit_counter_ = 0;
  uint64_t n_preempted_ = 0;
};

}  // namespace deltaserve
