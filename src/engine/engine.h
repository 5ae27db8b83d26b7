// Engine: the engine thread. Owns backend, model, cache, runner, scheduler, sampling and the
// speculative decoder; the HTTP side talks to it only through EngineService (submit / cancel /
// stats). A step:
//
//   Scheduler::schedule -> ModelRunner::launch / wait -> sample (or SpeculativeDecoder::verify)
//     -> Scheduler::update -> SpeculativeDecoder::finish_step (rollback, drafts) -> TokenEvents
//
// Overlap scheduling (EngineConfig::overlap_schedule): a greedy decode batch is left computing
// while the engine thread goes round its loop once more; then, unless anything would change the
// batch (an arrival, a cancel, a finished sequence, ...), the next step is launched from it
// (Scheduler::chain, its tokens copied on the device) before this one's tokens are read, so the
// host work of a step (reading tokens, finishes, events, scheduling, staging) hides behind the
// next step's device work.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_config.h"
#include "engine/engine_service.h"
#include "engine/model_runner.h"
#include "engine/node_command.h"
#include "engine/sampling_pool.h"
#include "engine/scheduler.h"
#include "engine/step_cost.h"
#include "engine/spec/speculative_decoder.h"

namespace deltaserve {

// What the engine actually allocated (reported by /get_server_info and the start-up log).
struct EngineCapacity {
  int64_t kv_tokens = 0;             // KV blocks x block size
  int kv_block_size = 0;
  int max_running_requests = 0;
  int state_slots = 0;               // GDN state slots (0 for models without GDN layers)
  int checkpoint_slots = 0;          // GDN state checkpoints for the prefix cache
  bool prefix_cache = false;
  int64_t context_length = 0;
  int64_t kv_cache_bytes = 0;        // device bytes of the KV cache
  int64_t state_cache_bytes = 0;     // device bytes of GDN state + speculative pending rows
  int64_t weight_bytes = 0;          // per tensor-parallel rank (per GPU)
  // Rank 0's step buffers (model/step_memory.h has the formulas the plan reserves by): what the
  // runner and the model's activations allocated, and what the backend's allocate() gave out since
  // the engine was built (CUDA: the kernels' scratch, grown by the largest steps so far).
  int64_t step_buffer_bytes = 0;
  int64_t scratch_bytes = 0;
  int tp_size = 1;
  std::string kv_cache_dtype;        // "f32", "bf16", ...
  int spec_num_steps = 0;
};

// How an engine config becomes the rank group, cache and runner: Engine::create and the other
// nodes of a multi-node group (engine/follower_node.h) build them alike.
RankGroupOptions rank_group_options(const EngineConfig& c);
CacheConfig cache_config(const EngineConfig& c, const Model& model);
RunnerLimits runner_limits(const EngineConfig& c, const CacheMemory& cache);

class Engine final : public EngineService {
 public:
  // backend: the device to run on (nullptr: made from config.device). Passing one lets the caller
  // measure its free memory before planning.
  static Result<std::unique_ptr<Engine>> create(const EngineConfig& config, std::unique_ptr<Backend> backend = nullptr);
  ~Engine() override;

  void start();  // spawns the engine thread
  void stop();   // finishes every request with Abort and joins

  std::shared_ptr<RequestStream> submit(GenerateRequest request) override;
  void cancel(RequestId id) override;
  RequestId next_request_id() override { return next_id_.fetch_add(1); }
  EngineStats stats() const override;
  // Requests this engine holds: running + waiting + submitted but not yet picked up (what a
  // data-parallel dispatcher balances).
  int load() const;
  int64_t context_length() const override { return config_.context_length; }
  bool flush_cache() override;

  const ModelConfig& model_config() const { return ranks_->model().config(); }
  const EngineConfig& config() const { return config_; }
  EngineCapacity capacity() const;
  std::string backend_description() const { return ranks_->backend().description(); }
  int tp_size() const { return ranks_->tp_size(); }  // over every node
  // How the tensor-parallel ranks communicate ("" with one rank).
  const std::string& tp_transport() const { return ranks_->transport(); }
  // Per rank (per GPU) with tensor parallelism.
  std::size_t weight_bytes() const { return ranks_->model().weight_bytes(); }
  std::size_t decode_weight_bytes() const { return ranks_->model().decode_weight_bytes(); }
  // Human-readable capacity summary (printed once at start-up).
  std::string plan_summary() const;

  // Speculative decoding with k draft steps, 1 up to the config's (whose buffers and plan hold
  // them), or off (k = 0: plain decoding; the MTP head stays loaded). Only while stopped.
  void set_speculative_steps(int k);
  int speculative_steps() const { return spec_ ? spec_->k() : 0; }
  // After probe requests (app/speculation_choice.h): counters back to zero and the prefix cache
  // emptied, as a fresh engine. Only while stopped.
  void reset_after_probe();

 private:
  explicit Engine(EngineConfig config) : config_(std::move(config)) {}
  // A launched step: its batch, and what it fetches.
  struct Flight {
    std::vector<ScheduledItem> items;
    int ticket = -1;                  // ModelRunner::launch's
    ModelRunner::Fetch fetch = ModelRunner::Fetch::Logits;
    bool decode_only = false;         // no prefill chunk in the batch
    int prefill_tokens = 0;           // tokens of its prefill chunks (StepCost)
    int decode_rows = 0;              // its decode and verification rows
    double t_start = 0;               // when the step began
  };
  void loop();
  void drain_inbox();
  // Schedules and launches a step; collects it unless it may be chained (then in_flight_).
  void step();
  // With a step in flight: launches the next one from it when nothing would change the batch,
  // then collects it.
  void overlap_step();
  // Whether the launched step `f` may be left computing while the next one is chained: every row
  // picked on the device (argmax, or a draw without penalties), no prefill chunk or drafts.
  bool may_overlap(const Flight& f) const;
  // A chained Fetch::Sample step's rows (device_sampling_): each item's settings and next uniform.
  void chain_sampling(const std::vector<ScheduledItem>& items);
  // Arrivals, cancels, a cache flush or a stop waiting for the engine thread.
  bool inbox_pending() const;
  // Waits for the step's tokens and takes them: sampling (or verification), Scheduler::update,
  // drafts, events; release_finished: finished sequences' memory back (not while a chained step
  // still runs them).
  void collect(Flight& f, bool release_finished);
  // Samples (or verifies) every item of this step that needs a token, in parallel over
  // sequences: appends tokens to each sequence and fills outputs_.
  void sample_all(const std::vector<ScheduledItem>& items);
  // A sequence whose next token (or, verifying drafts, each token) is the argmax of its raw
  // logits row (greedy; no penalties, constraint or logprobs).
  static bool samples_raw_argmax(const Sequence& s);
  // The next uniform of a sequence's RNG (one per drawn token, the host sampler's order), for
  // sample_row (engine/sampler.h).
  static double next_uniform(Sequence& s);
  // Where this step's tokens are picked: Argmax (every row samples_raw_argmax), Sample (every
  // row a plain draw: no logprobs, constraint or verification; config device_sampling; fills
  // device_sampling_), else Logits (the host samples).
  ModelRunner::Fetch choose_fetch(const std::vector<ScheduledItem>& items);
  // sample_all for a step whose tokens the device picked (Fetch::Argmax / Sample).
  void take_tokens(const std::vector<ScheduledItem>& items);
  // Sends each item's new tokens (and the final event of a finished sequence).
  void emit_all(const std::vector<ScheduledItem>& items);
  // Ends `seq` with `ev` (its finish set here); `defer`: the event waits in finals_ for push_finals.
  void finish(Sequence& seq, FinishReason reason, TokenEvent& ev, bool defer = false);
  void push_finals();
  void update_stats();
  void maybe_log_progress();

  EngineConfig config_;
  std::unique_ptr<RankGroup> ranks_;  // backends and model shards (one rank without --tp-size)
  std::unique_ptr<CacheMemory> cache_;
  std::unique_ptr<NodeMirror> mirror_;  // multi-node (node 0): tells the other nodes each step
  std::unique_ptr<ModelRunner> runner_;
  int64_t step_buffer_bytes_ = 0;  // allocated by the runner's construction (rank 0; EngineCapacity)
  int64_t allocated_at_start_ = 0;  // rank 0's Backend::allocated_bytes() once built
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<SamplingPool> sampling_;
  std::unique_ptr<SpeculativeDecoder> spec_;  // null without speculative decoding
  std::vector<RunItem> run_items_;            // this step's batch
  Flight flights_[2];                         // flights_[cur_]: the step launched last
  int cur_ = 0;
  bool in_flight_ = false;                    // flights_[cur_] is launched and not collected
  int32_t placeholder_ = 0;                   // what a chained item feeds on the host (its id comes from the device)
  double last_collect_ = 0;                   // when the last collect() ended
  double launch_s_ = 0;                       // seconds in ModelRunner::launch since then
  std::vector<StepOutput> outputs_;           // per scheduled item
  std::vector<std::pair<std::shared_ptr<RequestStream>, TokenEvent>> finals_;  // last events held for push_finals
  std::vector<int> row_of_;                   // per scheduled item: its first logits row
  // Fetch::Sample of this step: per output row, its penalties (gathered from each item's), and
  // the uniform drawn per scheduled item (empty when this step's uniforms were not drawn ahead).
  std::vector<SampleRow> sample_rows_;
  std::vector<PenaltyEntry> penalties_;
  std::vector<std::vector<PenaltyEntry>> item_penalties_;
  std::vector<double> draw_u_;
  ModelRunner::Sampling device_sampling_;

  // Inbox (any thread -> engine thread).
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> inbox_;
  std::vector<RequestId> cancels_;
  int n_inbox_waiting_ = 0;
  bool stopping_ = false;
  // /flush_cache: asked by any thread, done by the engine thread between steps.
  uint64_t flush_asked_ = 0, flush_done_ = 0;
  bool flush_ok_ = false;
  std::condition_variable flush_cv_;
  std::thread thread_;
  std::atomic<RequestId> next_id_{1};
  std::mt19937_64 seed_rng_;  // seeds of requests without one (guarded by mutex_)

  // Published by the engine thread after each step.
  EngineStats stats_;
  uint64_t prompt_tokens_total_ = 0, generated_tokens_total_ = 0, prompt_tokens_cached_total_ = 0;
  uint64_t spec_draft_total_ = 0, spec_accepted_total_ = 0, spec_steps_total_ = 0;
  uint64_t steps_total_ = 0;
  // Step times, for the prefill budget of steps that also decode (EngineConfig::mixed_prefill_tokens).
  StepCost step_cost_;
  double step_s_ = 0, forward_s_ = 0, sample_s_ = 0, draft_s_ = 0;
  uint64_t device_sampled_total_ = 0;
  uint64_t overlapped_steps_total_ = 0, overlap_dropped_total_ = 0;
  bool sampled_on_device_ = false;            // this step's rows were drawn by Fetch::Sample
  uint64_t decode_steps_total_ = 0;  // steps without prefill chunks, and their phases
  double decode_step_s_ = 0, decode_forward_s_ = 0, decode_sample_s_ = 0, decode_draft_s_ = 0;
  struct LogMark {
    double t = 0;
    uint64_t generated = 0, spec_steps = 0, spec_accepted = 0;
  } log_;
};

}  // namespace deltaserve
