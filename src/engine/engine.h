// Engine: the engine thread. Owns backend, model, cache, runner, scheduler and sampler; the HTTP
// side talks to it only through EngineService (submit / cancel / stats).
//
//   inbox (submit/cancel) -> Scheduler::schedule -> ModelRunner::run -> Sampler -> TokenEvents
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_config.h"
#include "engine/engine_service.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "util/thread_pool.h"

namespace deltaserve {

class Engine final : public EngineService {
 public:
  static Result<std::unique_ptr<Engine>> create(const EngineConfig& config);
  ~Engine() override;

  void start();  // spawns the engine thread
  void stop();   // finishes every request with Abort and joins

  std::shared_ptr<RequestStream> submit(GenerateRequest request) override;
  void cancel(RequestId id) override;
  RequestId next_request_id() override { return next_id_.fetch_add(1); }
  EngineStats stats() const override;
  int64_t context_length() const override { return config_.context_length; }

  const ModelConfig& model_config() const { return model_->config(); }
  const EngineConfig& config() const { return config_; }
  std::string backend_description() const { return backend_->description(); }
  std::size_t weight_bytes() const { return model_->weight_bytes(); }
  std::size_t decode_weight_bytes() const { return model_->decode_weight_bytes(); }
  // Human-readable capacity plan (printed once at start-up).
  std::string plan_summary() const;

 private:
  explicit Engine(EngineConfig config) : config_(std::move(config)) {}
  void loop();
  void drain_inbox();
  void step();
  void finish(Sequence& seq, FinishReason reason, TokenEvent& ev);
  void emit(Sequence& seq, TokenEvent ev);
  void update_stats();
  void maybe_log_progress();
  // Speculative decoding (MTP, NEXTN). verify() accepts drafts against the target rows starting
  // at `row`, appends the accepted tokens and the bonus token, and returns how many drafts it kept.
  int verify(Sequence& s, int row, std::vector<TokenLogprob>* logprobs, Sampler& sampler, std::vector<float>& probs);
  // Samples (or verifies) every sequence of this step that needs a token, in parallel over
  // sequences: fills sampled_ (tokens appended to each sequence, accepted drafts, logprobs).
  void sample_all(const std::vector<ScheduledItem>& items);
  // Runs the MTP head over this step's mtp_items_ (catch-up) and chains drafts for drafting_.
  void propose_drafts();
  void add_draft(Sequence& s, const float* logits, int j, Sampler& sampler);
  // fn(share, i) for i in [0, n): on the sampling pool (one Sampler per share).
  template <typename Fn>
  void for_each_row(int n, Fn&& fn);

  EngineConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<CacheMemory> cache_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Scheduler> scheduler_;
  // Sampling runs on the host; a step of 64 sequences over a 248k vocabulary is worth spreading
  // over cores when a GPU does the compute (on the CPU backend the compute pool owns the cores,
  // so this pool has one thread: inline). One Sampler and probability buffer per share.
  std::unique_ptr<ThreadPool> sample_pool_;
  std::vector<std::unique_ptr<Sampler>> samplers_;
  std::vector<std::vector<float>> probs_;
  struct Sampled {
    int row = 0;        // first logits row of the sequence
    int accepted = -1;  // drafts kept (-1: plain sample)
    std::vector<TokenLogprob> logprobs;
  };
  std::vector<Sampled> sampled_;  // per scheduled item
  std::vector<RunItem> run_items_;
  std::vector<int32_t> eos_ids_;

  // Speculative decoding buffers (sized once in create()).
  DeviceBuffer hidden_all_;   // [max_tokens, H] final-normed hidden of every fed token
  DeviceBuffer mtp_in_, mtp_out_;  // [max_tokens, H]
  DeviceBuffer chain_a_, chain_b_; // [max_seqs, H]
  std::vector<RunItem> mtp_items_;
  std::vector<int32_t> mtp_rows_;
  std::vector<std::pair<Sequence*, int>> drafting_;  // (sequence, its last row in the MTP batch)
  std::vector<SnapshotPick> restore_picks_;          // rollbacks of this step's verifications
  std::vector<Sequence*> chain_seqs_;
  std::vector<int32_t> chain_rows_;
  std::vector<int> chain_left_;

  // Inbox (any thread -> engine thread).
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::unique_ptr<Sequence>, int>> inbox_;
  std::vector<RequestId> cancels_;
  int n_inbox_waiting_ = 0;
  bool stopping_ = false;
  std::thread thread_;
  std::atomic<RequestId> next_id_{1};

  // Published by the engine thread after each step.
  EngineStats stats_;
  uint64_t prompt_tokens_total_ = 0, generated_tokens_total_ = 0;
  uint64_t spec_draft_total_ = 0, spec_accepted_total_ = 0, spec_steps_total_ = 0;
  uint64_t steps_total_ = 0;
  double step_s_ = 0, forward_s_ = 0, sample_s_ = 0, draft_s_ = 0;
  struct LogMark {
    double t = 0;
    uint64_t generated = 0, spec_steps = 0, spec_accepted = 0;
  } log_;
};

}  // namespace deltaserve
