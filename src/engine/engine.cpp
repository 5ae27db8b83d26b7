#include "engine/engine.h"

#include <algorithm>

#include "util/log.h"
#include "util/timer.h"

namespace deltaserve {

namespace {
// Auto mixed_prefill_tokens: a step that carries prefill beside decode rows lasts about this many
// decode steps, so that a running request's inter-token gap while prompts arrive stays within
// ~2.5x its usual one (issue #14: ITL p99 within 3x p50).
constexpr double kMixedStepRatio = 2.5;
// ... unless the prefill tokens pending would then take more than this many steps: the budget
// rises to clear them within it (Scheduler), so arrivals cannot outgrow what small chunks clear.
constexpr int kMixedBacklogSteps = 32;
}  // namespace

void Sequence::constraint_took(int32_t token) {
  // The row was masked by this same constraint, so it cannot refuse; if it ever does, its state
  // lags the sequence: say so once rather than stopping the engine.
  if (constraint && !constraint->accept(token)) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) log_warn("a token constraint refused a token sampled under it (request ", id, ")");
  }
}

RankGroupOptions rank_group_options(const EngineConfig& c) {
  RankGroupOptions ro;
  ro.model_dir = c.model_dir;
  ro.device = c.device == Device::Cuda ? "cuda" : "cpu";
  ro.n_threads = c.n_threads;
  ro.tp_size = c.tp_size;
  ro.custom_all_reduce = c.custom_all_reduce;
  ro.load.dummy_weights = c.dummy_weights;
  ro.load.weight_dtype = c.weight_dtype;
  ro.load.load_mtp = c.spec_num_steps > 0;
  if (c.spec_num_steps > 0) ro.load.draft_vocab = c.spec_token_map;
  ro.link = c.node_link;
  ro.dp_rank = c.dp_rank;
  ro.dp_size = c.dp_size;
  return ro;
}

CacheConfig cache_config(const EngineConfig& c, const Model& model) {
  const int k = c.spec_num_steps;
  CacheConfig cc;
  cc.block_size = c.kv_block_size;
  cc.n_blocks = static_cast<int>(c.kv_tokens / cc.block_size);
  cc.n_slots = c.max_running_requests;
  cc.pending_depth = k > 0 ? k + 1 : 0;
  cc.n_checkpoints = c.prefix_cache ? c.checkpoint_slots : 0;
  cc.kv_dtype = c.kv_cache_dtype;
  cc.state_dtype = c.state_dtype;
  cc.kv_scales = model.kv_scales();
  return cc;
}

RunnerLimits runner_limits(const EngineConfig& c, const CacheMemory& cache) {
  // model/step_memory.h: the same shape the memory plan reserves activations for.
  const StepShape s = step_shape(c.max_prefill_tokens, c.max_running_requests, c.spec_num_steps, c.context_length,
                                 cache.config().block_size);
  RunnerLimits lim;
  lim.max_seqs = static_cast<int>(s.seqs);
  lim.max_tokens = static_cast<int>(s.tokens);
  lim.max_blocks_per_seq = static_cast<int>(s.blocks_per_seq);
  lim.max_logit_rows = static_cast<int>(s.logit_rows);
  lim.mtp = c.spec_num_steps > 0;
  lim.checkpoints = c.prefix_cache && cache.has_state();
  if (c.device == Device::Cuda)
    lim.graph_max_seqs = c.cuda_graph_max_bs < 0 ? std::min(c.max_running_requests, 64) : c.cuda_graph_max_bs;
  return lim;
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config, std::unique_ptr<Backend> backend) {
  const EngineConfig& c = config;
  // Capacities come from the memory plan (or the test that builds the engine): none is guessed here.
  struct Required {
    const char* name;
    int64_t value;
  };
  for (Required r : {Required{"max_running_requests", c.max_running_requests},
                     Required{"max_waiting_requests", c.max_waiting_requests},
                     Required{"context_length", c.context_length}, Required{"kv_tokens", c.kv_tokens},
                     Required{"kv_block_size", c.kv_block_size}, Required{"chunked_prefill_size", c.chunked_prefill_size},
                     Required{"max_prefill_tokens", c.max_prefill_tokens}})
    if (r.value <= 0) return error("engine config: ", r.name, " must be set (got ", r.value, ")");
  if (c.spec_num_steps < 0 || c.spec_num_steps > 8) return error("speculative steps must be in 0..8");
  if (c.kv_tokens < c.kv_block_size) return error("engine config: kv_tokens ", c.kv_tokens, " is less than one block");

  std::unique_ptr<Engine> e(new Engine(config));
  DS_ASSIGN_OR_RETURN(e->ranks_, RankGroup::create(rank_group_options(c), std::move(backend)));
  Model& model = e->ranks_->model();
  const ModelConfig& mc = model.config();
  if (c.spec_num_steps > 0 && !model.has_mtp())
    return error(c.model_dir.string(), ": speculative decoding needs an MTP head, and this model has none");
  e->cache_ = std::make_unique<CacheMemory>(e->ranks_->backends(), model.memory_spec(), cache_config(c, model));
  if (c.node_link) {
    // Node 0 of a multi-node group: the other nodes replay every step and slot operation.
    e->mirror_ = std::make_unique<NodeMirror>(*c.node_link);
    e->cache_->set_mirror(e->mirror_.get());
  }
  const int64_t before_runner = e->ranks_->backend(0).allocated_bytes();
  e->runner_ = std::make_unique<ModelRunner>(*e->ranks_, *e->cache_, runner_limits(c, *e->cache_));
  e->step_buffer_bytes_ = e->ranks_->backend(0).allocated_bytes() - before_runner;
  if (e->mirror_) e->runner_->set_mirror(e->mirror_.get());
  const CacheConfig& cc = e->cache_->config();

  SchedulerConfig sc;
  sc.max_running = c.max_running_requests;
  sc.chunked_prefill_size = c.chunked_prefill_size;
  sc.max_prefill_tokens = c.max_prefill_tokens;
  sc.mixed_prefill_tokens = c.mixed_prefill_tokens > 0 ? c.mixed_prefill_tokens : 0;
  sc.mixed_backlog_steps = c.mixed_prefill_tokens > 0 ? 0 : kMixedBacklogSteps;
  sc.block_size = cc.block_size;
  sc.prefix_cache = c.prefix_cache;
  sc.decode_checkpoints = c.decode_checkpoints;
  sc.policy = c.schedule_lpm ? SchedulePolicy::Lpm : SchedulePolicy::Fcfs;
  sc.eos_token_ids = mc.eos_token_ids;
  for (int32_t id : c.extra_eos_token_ids)
    if (std::find(sc.eos_token_ids.begin(), sc.eos_token_ids.end(), id) == sc.eos_token_ids.end())
      sc.eos_token_ids.push_back(id);
  e->scheduler_ = std::make_unique<Scheduler>(sc, *e->cache_);
  // Sampling threads: with a GPU the host cores are free while the engine samples; on the CPU
  // backend its compute pool already owns them.
  const int n_sample = c.device == Device::Cpu ? 1 : std::clamp(hardware_threads() - 1, 1, 8);
  e->sampling_ = std::make_unique<SamplingPool>(n_sample, mc.vocab_size);
  e->set_speculative_steps(c.spec_num_steps);
  e->run_items_.reserve(static_cast<size_t>(c.max_running_requests));
  e->outputs_.reserve(static_cast<size_t>(c.max_running_requests));
  for (Flight& f : e->flights_) f.items.reserve(static_cast<size_t>(c.max_running_requests));
  e->seed_rng_.seed(c.random_seed ? *c.random_seed : std::random_device{}());
  e->update_stats();
  e->allocated_at_start_ = e->ranks_->backend(0).allocated_bytes();
  return e;
}

Engine::~Engine() { stop(); }

EngineCapacity Engine::capacity() const {
  EngineCapacity cap;
  cap.kv_block_size = cache_->config().block_size;
  cap.kv_tokens = int64_t(cache_->blocks().n_total()) * cap.kv_block_size;
  cap.max_running_requests = config_.max_running_requests;
  cap.state_slots = cache_->has_state() ? cache_->n_slots_total() : 0;
  cap.checkpoint_slots = cache_->n_checkpoints_total();
  cap.prefix_cache = config_.prefix_cache;
  cap.context_length = config_.context_length;
  cap.kv_cache_bytes = cache_->kv_bytes();
  cap.state_cache_bytes = cache_->state_bytes();
  cap.weight_bytes = static_cast<int64_t>(weight_bytes());
  cap.step_buffer_bytes = step_buffer_bytes_;
  cap.scratch_bytes = ranks_->backend(0).allocated_bytes() - allocated_at_start_;
  cap.tp_size = tp_size();
  cap.kv_cache_dtype = std::string(dtype_name(cache_->views().kv.empty() ? ranks_->backend().activation_dtype()
                                                                          : cache_->views().kv[0].k.dtype));
  cap.spec_num_steps = speculative_steps();
  return cap;
}

void Engine::set_speculative_steps(int k) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    DS_CHECK(!thread_.joinable(), "set_speculative_steps while the engine runs");
  }
  DS_CHECK(k >= 0 && k <= config_.spec_num_steps, "speculative steps ", k, " not in 0..", config_.spec_num_steps,
           " (the steps the engine was created for)");
  if (k == speculative_steps()) return;
  spec_.reset();
  if (k > 0)
    spec_ = std::make_unique<SpeculativeDecoder>(*runner_, *sampling_, k, config_.max_running_requests,
                                                 config_.context_length);
}

void Engine::reset_after_probe() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    DS_CHECK(!thread_.joinable(), "reset_after_probe while the engine runs");
  }
  scheduler_->flush_prefix_cache();
  prompt_tokens_total_ = generated_tokens_total_ = prompt_tokens_cached_total_ = 0;
  spec_draft_total_ = spec_accepted_total_ = spec_steps_total_ = 0;
  steps_total_ = 0;
  step_s_ = forward_s_ = sample_s_ = draft_s_ = 0;
  decode_steps_total_ = 0;
  device_sampled_total_ = 0;
  overlapped_steps_total_ = overlap_dropped_total_ = 0;
  decode_step_s_ = decode_forward_s_ = decode_sample_s_ = decode_draft_s_ = 0;
  log_ = LogMark{};
  update_stats();
}

std::string Engine::plan_summary() const {
  const EngineCapacity cap = capacity();
  return str_cat("engine: backend ", ranks_->backend().description(),
                 cap.tp_size > 1 ? str_cat(" x ", cap.tp_size, " tensor-parallel ranks (figures per rank)") : "",
                 "; weights ", cap.weight_bytes >> 20, " MiB; KV ",
                 cap.kv_tokens, " tokens (", cap.kv_cache_dtype, ", ", cap.kv_cache_bytes >> 20, " MiB); state slots ",
                 cap.state_slots, " + ", cap.checkpoint_slots, " checkpoints (", cap.state_cache_bytes >> 20,
                 " MiB", config_.state_dtype == DType::BF16 ? ", recurrent state bf16" : "", "); prefix cache ",
                 cap.prefix_cache ? "on" : "off", "; max running ", cap.max_running_requests,
                 "; context ", cap.context_length, "; chunked prefill ", config_.chunked_prefill_size,
                 " (", config_.max_prefill_tokens, " a step; beside decodes ",
                 config_.mixed_prefill_tokens > 0 ? str_cat(config_.mixed_prefill_tokens)
                                                  : std::string("auto, from step times"),
                 ")",
                 "; speculative steps ", speculative_steps(),
                 speculative_steps() > 0 && !config_.spec_token_map.empty()
                     ? str_cat(" (drafts over a token map of ", config_.spec_token_map.size(), " tokens)")
                     : "",
                 "; overlap schedule ",
                 config_.overlap_schedule && !spec_ && runner_->can_chain() ? "on" : "off");
}

void Engine::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<RequestStream> Engine::submit(GenerateRequest req) {
  auto stream = std::make_shared<RequestStream>();
  stream->id = req.id;
  auto reject = [&](std::string msg, EngineErrorKind kind) {
    TokenEvent ev;
    ev.finish = FinishReason::Error;
    ev.error = std::move(msg);
    ev.error_kind = kind;
    ev.n_prompt_tokens = static_cast<int>(req.prompt.size());
    ev.emitted_at = now_seconds();
    stream->events.push(std::move(ev));
    stream->events.close();
    return stream;
  };
  const int64_t vocab = model_config().vocab_size;
  if (req.prompt.empty()) return reject("the prompt is empty", EngineErrorKind::BadRequest);
  for (int32_t t : req.prompt)
    if (t < 0 || t >= vocab)
      return reject(str_cat("token id ", t, " is outside the vocabulary [0, ", vocab, ")"), EngineErrorKind::BadRequest);
  if (int64_t(req.prompt.size()) >= config_.context_length)
    return reject(str_cat("the prompt has ", req.prompt.size(), " tokens; the context length is ",
                          config_.context_length),
                  EngineErrorKind::TooLong);
  if (req.sampling.max_tokens < 1) return reject("max_tokens must be at least 1", EngineErrorKind::BadRequest);

  auto seq = std::make_unique<Sequence>();
  seq->id = req.id;
  seq->stream = stream;
  seq->params = req.sampling;
  seq->constraint = std::move(req.constraint);
  seq->cache_namespace = std::move(req.cache_namespace);
  seq->tokens = std::move(req.prompt);
  seq->n_prompt = static_cast<int>(seq->tokens.size());
  seq->max_total_tokens = std::min<int64_t>(int64_t(seq->n_prompt) + req.sampling.max_tokens, config_.context_length);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stats_.requests_waiting + n_inbox_waiting_ >= config_.max_waiting_requests)
      return reject(str_cat("the server is busy: ", config_.max_waiting_requests,
                            " requests are already waiting (the queue holds max(1024, 4 x --max-running-requests)); "
                            "retry later"),
                    EngineErrorKind::Overloaded);
    seq->rng.seed(req.sampling.seed ? *req.sampling.seed : seed_rng_());
    ++n_inbox_waiting_;
    inbox_.push_back(std::move(seq));
  }
  cv_.notify_all();
  return stream;
}

void Engine::cancel(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

int Engine::load() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_.requests_running + stats_.requests_waiting + static_cast<int>(inbox_.size());
}

void Engine::update_stats() {
  EngineStats s;
  s.requests_running = scheduler_->n_running();
  s.requests_waiting = scheduler_->n_waiting();
  s.kv_tokens_used = int64_t(scheduler_->n_blocks_held_by_requests()) * cache_->config().block_size;
  s.kv_tokens_total = int64_t(cache_->blocks().n_total()) * cache_->config().block_size;
  s.state_slots_total = cache_->has_state() ? cache_->n_slots_total() : 0;
  s.state_slots_used = cache_->has_state() ? cache_->n_slots_total() - cache_->n_slots_free() : 0;
  s.prompt_tokens_total = prompt_tokens_total_;
  s.generated_tokens_total = generated_tokens_total_;
  s.spec_draft_tokens_total = spec_draft_total_;
  s.spec_accepted_tokens_total = spec_accepted_total_;
  s.spec_verify_steps_total = spec_steps_total_;
  s.preemptions_total = scheduler_->n_preempted();
  s.mixed_prefill_tokens = scheduler_->mixed_prefill_tokens() > 0 ? scheduler_->mixed_prefill_tokens()
                                                                  : config_.max_prefill_tokens;
  s.prompt_tokens_cached_total = prompt_tokens_cached_total_;
  if (const PrefixCache* pc = scheduler_->prefix_cache()) {
    s.cached_blocks = pc->n_cached_blocks();
    s.cached_checkpoints = pc->n_checkpoints();
  }
  s.checkpoint_slots_total = cache_->n_checkpoints_total();
  s.steps_total = steps_total_;
  s.step_seconds = step_s_;
  s.forward_seconds = forward_s_;
  s.sample_seconds = sample_s_;
  s.draft_seconds = draft_s_;
  s.decode_steps_total = decode_steps_total_;
  s.device_sampled_total = device_sampled_total_;
  s.decode_step_seconds = decode_step_s_;
  s.decode_forward_seconds = decode_forward_s_;
  s.decode_sample_seconds = decode_sample_s_;
  s.decode_draft_seconds = decode_draft_s_;
  s.overlapped_steps_total = overlapped_steps_total_;
  s.overlap_dropped_tokens_total = overlap_dropped_total_;
  std::lock_guard<std::mutex> lock(mutex_);
  stats_ = s;
}

void Engine::maybe_log_progress() {
  // A decode log line every 10 s while generating, as SGLang prints (with the accept length).
  const double now = now_seconds();
  if (log_.t == 0) log_ = {now, generated_tokens_total_, spec_steps_total_, spec_accepted_total_};
  if (now - log_.t < 10.0 || generated_tokens_total_ == log_.generated) return;
  const double dt = now - log_.t;
  const uint64_t steps = spec_steps_total_ - log_.spec_steps;
  std::string accept;
  if (steps > 0)
    accept = str_cat(", accept len: ", 1.0 + double(spec_accepted_total_ - log_.spec_accepted) / double(steps));
  log_info("Decode batch. #running-req: ", scheduler_->n_running(), ", #queue-req: ", scheduler_->n_waiting(),
           ", #token: ", stats_.kv_tokens_used, ", #cached-token: ", stats_.cached_blocks * cache_->config().block_size,
           accept,
           ", gen throughput (token/s): ", double(generated_tokens_total_ - log_.generated) / dt);
  log_ = {now, generated_tokens_total_, spec_steps_total_, spec_accepted_total_};
}

void Engine::drain_inbox() {
  std::deque<std::unique_ptr<Sequence>> incoming;
  std::vector<RequestId> cancels;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    incoming.swap(inbox_);
    cancels.swap(cancels_);
    n_inbox_waiting_ = 0;
  }
  for (auto& seq : incoming) {
    prompt_tokens_total_ += seq->n_prompt;
    scheduler_->add(std::move(seq));
  }
  for (RequestId id : cancels) {
    if (auto seq = scheduler_->remove(id)) {
      TokenEvent ev;
      finish(*seq, FinishReason::Abort, ev);
    }
  }
}

bool Engine::flush_cache() {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t ticket = ++flush_asked_;
  cv_.notify_all();
  if (!flush_cv_.wait_for(lock, std::chrono::seconds(10), [&] { return flush_done_ >= ticket; })) return false;
  return flush_ok_;
}

void Engine::finish(Sequence& seq, FinishReason reason, TokenEvent& ev, bool defer) {
  ev.finish = reason;
  ev.n_prompt_tokens = seq.n_prompt;
  ev.n_cached_tokens = seq.n_cached;
  prompt_tokens_cached_total_ += static_cast<uint64_t>(seq.n_cached);
  ev.n_generated_tokens = seq.n_generated();
  ev.accept_length = seq.spec_steps ? double(seq.spec_accepted) / double(seq.spec_steps) : 0.0;
  seq.status = SeqStatus::Finished;
  if (ev.emitted_at == 0.0) ev.emitted_at = now_seconds();  // (a step's events carry its time already)
  if (defer) {
    finals_.emplace_back(seq.stream, std::move(ev));
    return;
  }
  seq.stream->events.push(std::move(ev));
  seq.stream->events.close();
}

void Engine::push_finals() {
  for (auto& [stream, ev] : finals_) {
    stream->events.push(std::move(ev));
    stream->events.close();
  }
  finals_.clear();
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] {
        return stopping_ || !inbox_.empty() || !cancels_.empty() || flush_asked_ > flush_done_ || scheduler_->has_work();
      });
      if (stopping_) break;
    }
    // /flush_cache: only with nothing running or waiting (requests queued in the inbox wait).
    uint64_t flush_ticket = 0;
    if (!in_flight_) {
      std::lock_guard<std::mutex> lock(mutex_);
      flush_ticket = flush_asked_ > flush_done_ ? flush_asked_ : 0;
    }
    if (flush_ticket) {
      const bool ok = scheduler_->flush_prefix_cache();
      update_stats();  // published before flush_cache() returns: /metrics after /flush_cache shows it
      {
        std::lock_guard<std::mutex> lock(mutex_);
        flush_ok_ = ok;
        flush_done_ = flush_ticket;
      }
      flush_cv_.notify_all();
    }
    // A step in flight holds its sequences: arrivals and cancels wait until it is collected
    // (overlap_step chains nothing while any are pending).
    if (in_flight_) {
      overlap_step();
    } else {
      drain_inbox();
      if (scheduler_->has_work()) step();
    }
    update_stats();
    maybe_log_progress();
  }
  // Shutting down: everything still queued or running ends with Abort.
  if (in_flight_) {
    collect(flights_[cur_], true);
    in_flight_ = false;
  }
  drain_inbox();
  for (auto& seq : scheduler_->remove_all()) {
    TokenEvent ev;
    finish(*seq, FinishReason::Abort, ev);
  }
  update_stats();
}

void Engine::step() {
  if (config_.mixed_prefill_tokens <= 0)
    scheduler_->set_mixed_prefill_tokens(
        step_cost_.mixed_prefill_tokens(kMixedStepRatio, config_.kv_block_size, config_.max_prefill_tokens));
  const auto& items = scheduler_->schedule();
  if (items.empty()) {
    if (scheduler_->n_running() == 0 && scheduler_->n_waiting() > 0) {
      // Nothing can be admitted into an empty engine: the oldest waiting request cannot fit.
      if (auto seq = scheduler_->remove(scheduler_->front_waiting_id())) {
        TokenEvent ev;
        ev.error = str_cat("request needs more KV cache than the engine has (", config_.kv_tokens,
                           " tokens) or no slot is free");
        ev.error_kind = EngineErrorKind::TooLong;
        finish(*seq, FinishReason::Error, ev);
      }
    }
    return;
  }
  Flight& f = flights_[cur_];
  f.t_start = now_seconds();
  f.items.assign(items.begin(), items.end());
  // 1. The batch: a verification feeds [last token, drafts], with the GDN state deferred.
  run_items_.clear();
  for (const auto& it : f.items) {
    const Sequence& s = *it.seq;
    if (s.n_drafts > 0)
      run_items_.push_back(RunItem{spec_->feed(s), s.n_computed, s.blocks, s.slot, true, false, true});
    else
      run_items_.push_back(RunItem{std::span<const int32_t>(s.tokens).subspan(s.n_computed, it.n_tokens),
                                   s.n_computed, s.blocks, s.slot, false, !it.sample, false, it.checkpoint_at,
                                   it.checkpoint_slot});
  }
  // 2. Forward, 3. sampling and verification: the tokens are picked on the device when every row
  // allows it (only they come back), else the logits come to the host.
  f.decode_only = true;
  f.prefill_tokens = 0;
  f.decode_rows = 0;
  for (const auto& it : f.items) {
    if (it.seq->n_drafts == 0 && !(it.sample && it.n_tokens == 1)) {  // a prefill chunk
      f.decode_only = false;
      f.prefill_tokens += it.n_tokens;
    } else {
      ++f.decode_rows;
    }
  }
  f.fetch = choose_fetch(f.items);
  const double t_launch = now_seconds();
  f.ticket = runner_->launch(run_items_, nullptr, f.fetch,
                             f.fetch == ModelRunner::Fetch::Sample ? &device_sampling_ : nullptr);
  launch_s_ += now_seconds() - t_launch;
  if (may_overlap(f)) {
    in_flight_ = true;  // the loop comes back to overlap_step, which chains the next step or collects this one
    return;
  }
  collect(f, true);
}

bool Engine::may_overlap(const Flight& f) const {
  const bool picked_on_device = f.fetch == ModelRunner::Fetch::Argmax || f.fetch == ModelRunner::Fetch::Sample;
  if (!config_.overlap_schedule || spec_ || !runner_->can_chain() || !picked_on_device || !f.decode_only) return false;
  for (const ScheduledItem& it : f.items) {
    if (!it.sample || it.n_tokens != 1 || it.seq->n_drafts != 0) return false;
    // A draw under penalties depends on the token still being picked: the next step waits for it.
    const SamplingParams& p = it.seq->params;
    if (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) return false;
  }
  return true;
}

void Engine::chain_sampling(const std::vector<ScheduledItem>& items) {
  // One row per item, its uniform the next from its sequence's RNG, as choose_fetch would draw it
  // once this step's token were known (a draw without penalties does not depend on it).
  sample_rows_.assign(items.size(), SampleRow{});
  for (size_t i = 0; i < items.size(); ++i) {
    Sequence& s = *items[i].seq;
    if (!s.params.greedy()) sample_rows_[i] = sample_row(s.params, next_uniform(s));
  }
  penalties_.clear();
  device_sampling_.rows = sample_rows_;
  device_sampling_.penalties = penalties_;
}

bool Engine::inbox_pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stopping_ || !inbox_.empty() || !cancels_.empty() || flush_asked_ > flush_done_;
}

void Engine::overlap_step() {
  Flight& x = flights_[cur_];
  Flight& y = flights_[cur_ ^ 1];
  bool chained = false;
  if (!inbox_pending() && scheduler_->chain(x.items, y.items)) {
    // Each sequence one position further, fed the token x is picking (copied on the device).
    y.t_start = now_seconds();
    run_items_.clear();
    for (const ScheduledItem& it : y.items) {
      const Sequence& s = *it.seq;
      run_items_.push_back(RunItem{std::span<const int32_t>(&placeholder_, 1), s.n_computed + 1, s.blocks, s.slot,
                                   false, false, false, it.checkpoint_at, it.checkpoint_slot});
    }
    y.fetch = x.fetch;  // Argmax, or Sample without penalties (may_overlap)
    if (y.fetch == ModelRunner::Fetch::Sample) chain_sampling(y.items);
    y.decode_only = true;
    y.prefill_tokens = 0;
    y.decode_rows = static_cast<int>(y.items.size());
    const double t_launch = now_seconds();
    y.ticket = runner_->launch(run_items_, nullptr, y.fetch,
                               y.fetch == ModelRunner::Fetch::Sample ? &device_sampling_ : nullptr,
                               /*ids_from_last=*/true);
    launch_s_ += now_seconds() - t_launch;
    chained = true;
    ++overlapped_steps_total_;
  }
  // Sequences that finish in x also ran in y: their memory goes back once y is collected.
  collect(x, !chained);
  if (chained) cur_ ^= 1;
  else in_flight_ = false;
}

void Engine::collect(Flight& f, bool release_finished) {
  const std::vector<ScheduledItem>& items = f.items;
  // A chained step began when the one before it was collected.
  const double t_step = std::max(f.t_start, last_collect_);
  const double t_fwd = now_seconds();
  runner_->wait(f.ticket);
  const double t_sample = now_seconds();
  // Forward: launching (this step's, or with a chained one, the next one's) and waiting.
  const double fwd = launch_s_ + (t_sample - t_fwd);
  launch_s_ = 0;
  sampled_on_device_ = f.fetch == ModelRunner::Fetch::Sample;
  if (f.fetch == ModelRunner::Fetch::Logits) sample_all(items);
  else take_tokens(items);
  const double smp = now_seconds() - t_sample;
  forward_s_ += fwd;
  sample_s_ += smp;
  double drf = 0;
  // 4. Computed tokens, accepted drafts, finishes.
  scheduler_->update(items, outputs_);
  // 5. Speculative rollback and the next drafts.
  if (spec_) {
    const double t_draft = now_seconds();
    spec_->finish_step(items, outputs_, *scheduler_);
    drf = now_seconds() - t_draft;
    draft_s_ += drf;
  }
  // 6. Events out, finished sequences' memory back. A finished request's last event goes out after
  // the counts are published without it: a client that has its whole reply and then reads /metrics
  // (or a dp dispatcher reading load()) sees it gone. (With the next step already chained, its
  // memory is held until that step is collected, and it still counts until then.)
  emit_all(items);
  if (release_finished) scheduler_->take_finished();
  update_stats();
  push_finals();
  if (config_.check_integrity_every_step) scheduler_->check_integrity();
  ++steps_total_;
  last_collect_ = now_seconds();
  const double step = last_collect_ - t_step;
  step_s_ += step;
  step_cost_.observe(f.prefill_tokens, f.decode_rows, step, ranks_->backend().setup_count());
  if (f.decode_only) {
    ++decode_steps_total_;
    decode_step_s_ += step;
    decode_forward_s_ += fwd;
    decode_sample_s_ += smp;
    decode_draft_s_ += drf;
  }
}

double Engine::next_uniform(Sequence& s) { return std::uniform_real_distribution<double>(0.0, 1.0)(s.rng); }

bool Engine::samples_raw_argmax(const Sequence& s) {
  const SamplingParams& p = s.params;
  return p.greedy() && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f &&
         p.top_logprobs < 0 && !s.constraint;
}

ModelRunner::Fetch Engine::choose_fetch(const std::vector<ScheduledItem>& items) {
  draw_u_.clear();  // filled below only when the uniforms are drawn here
  bool all_argmax = true, all_plain = true;
  for (const auto& it : items) {
    if (!it.sample) continue;
    const Sequence& s = *it.seq;
    all_argmax = all_argmax && samples_raw_argmax(s);
    all_plain = all_plain && s.n_drafts == 0 && s.params.top_logprobs < 0 && !s.constraint;
  }
  if (all_argmax) return ModelRunner::Fetch::Argmax;
  if (!config_.device_sampling || !all_plain) return ModelRunner::Fetch::Logits;
  // Every row a plain draw: its settings, its uniform (from its own RNG, as the host sampler
  // would draw it) and its penalties go to the device. Rows are numbered first; then each
  // sequence's row is filled in parallel over the sampling pool (penalties sort its tokens).
  const int n = static_cast<int>(items.size());
  int n_rows = 0;
  row_of_.resize(items.size());
  for (int i = 0; i < n; ++i) row_of_[i] = items[i].sample ? n_rows++ : -1;
  draw_u_.assign(items.size(), 0.0);
  sample_rows_.assign(static_cast<size_t>(n_rows), SampleRow{});
  if (item_penalties_.size() < items.size()) item_penalties_.resize(items.size());
  sampling_->for_each(n, [&](Sampler& sampler, std::vector<float>&, int i) {
    item_penalties_[i].clear();
    if (!items[i].sample) return;
    Sequence& s = *items[i].seq;
    const SamplingParams& p = s.params;
    if (!p.greedy()) {
      draw_u_[i] = next_uniform(s);
      sample_rows_[row_of_[i]] = sample_row(p, draw_u_[i]);
    }
    sampler.penalty_entries(p, s.prompt(), s.generated(), row_of_[i], item_penalties_[i]);
  });
  penalties_.clear();
  for (int i = 0; i < n; ++i) penalties_.insert(penalties_.end(), item_penalties_[i].begin(), item_penalties_[i].end());
  // Too many penalised tokens for the staging area: the host samples, with the uniforms drawn here.
  if (static_cast<int64_t>(penalties_.size()) > ModelRunner::kPenaltyCapacity) return ModelRunner::Fetch::Logits;
  device_sampling_.rows = sample_rows_;
  device_sampling_.penalties = penalties_;
  return ModelRunner::Fetch::Sample;
}

void Engine::take_tokens(const std::vector<ScheduledItem>& items) {
  outputs_.resize(items.size());
  int row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    StepOutput& o = outputs_[i];
    o.n_drafts = 0;
    o.n_accepted = -1;
    o.logprobs.clear();
    o.n_sampled = 0;
    if (!items[i].sample) continue;
    Sequence& s = *items[i].seq;
    if (s.status == SeqStatus::Finished) {  // finished in the step before this chained one: dropped
      ++row;
      ++overlap_dropped_total_;
      continue;
    }
    if (s.n_drafts > 0) {  // a greedy verification (Fetch::Argmax): one argmax per fed token
      const size_t before = s.tokens.size();
      o.n_drafts = s.n_drafts;
      o.n_accepted = spec_->verify_argmax(s, row);
      o.n_sampled = static_cast<int>(s.tokens.size() - before);
      row += 1 + s.n_drafts;
      continue;
    }
    const int32_t tok = runner_->token(row);
    DS_CHECK(tok >= 0 && tok < runner_->vocab(), "row ", row, " picked token ", tok);
    if (sampled_on_device_) ++device_sampled_total_;
    ++row;
    s.tokens.push_back(tok);
    o.n_sampled = 1;
  }
}

void Engine::sample_all(const std::vector<ScheduledItem>& items) {
  // Logits rows in item order: a plain sample has one, a verification 1 + drafts, a chunk none.
  outputs_.resize(items.size());
  std::vector<int>& rows = row_of_;
  rows.resize(items.size());
  int row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    StepOutput& o = outputs_[i];
    o.n_sampled = 0;
    o.n_drafts = items[i].sample ? items[i].seq->n_drafts : 0;
    o.n_accepted = -1;
    o.logprobs.clear();
    rows[i] = row;
    if (items[i].sample) row += 1 + items[i].seq->n_drafts;
  }
  // choose_fetch drew the uniforms already when it fell back to the host.
  const bool drawn = !draw_u_.empty();
  // Each task touches only its own sequence (tokens, RNG) and its share's sampler.
  sampling_->for_each(static_cast<int>(items.size()), [&](Sampler& sampler, std::vector<float>& probs, int i) {
    const ScheduledItem& it = items[i];
    if (!it.sample) return;
    Sequence& s = *it.seq;
    StepOutput& o = outputs_[i];
    const size_t before = s.tokens.size();
    const bool want_lp = s.params.top_logprobs >= 0;
    if (s.n_drafts == 0) {
      TokenLogprob lp;
      const float* raw = runner_->logits(rows[i]);
      const float* row = sampler.constrain(raw, s.constraint.get(), s.n_generated());
      TokenLogprob* lp_out = want_lp && row == raw ? &lp : nullptr;
      const int32_t tok = drawn ? sampler.sample_u(row, s.params, s.prompt(), s.generated(), draw_u_[i], lp_out)
                                : sampler.sample(row, s.params, s.prompt(), s.generated(), s.rng, lp_out);
      if (want_lp && row != raw) sampler.logprobs(raw, tok, s.params.top_logprobs, &lp);  // logprobs stay raw
      s.tokens.push_back(tok);
      s.constraint_took(tok);
      if (want_lp) o.logprobs.push_back(std::move(lp));
    } else {
      o.n_accepted = spec_->verify(s, rows[i], sampler, probs, want_lp ? &o.logprobs : nullptr);
    }
    o.n_sampled = static_cast<int>(s.tokens.size() - before);
  });
}

void Engine::emit_all(const std::vector<ScheduledItem>& items) {
  const double emitted_at = now_seconds();  // one clock read for the step's events
  for (size_t i = 0; i < items.size(); ++i) {
    StepOutput& o = outputs_[i];
    if (!items[i].sample || o.dropped) continue;
    Sequence& s = *items[i].seq;
    if (o.n_accepted >= 0) {
      ++spec_steps_total_;
      spec_draft_total_ += static_cast<uint64_t>(o.n_drafts);
      spec_accepted_total_ += static_cast<uint64_t>(o.n_accepted);
    }
    TokenEvent ev;
    ev.emitted_at = emitted_at;
    ev.logprobs = std::move(o.logprobs);
    ev.tokens.assign(s.tokens.end() - o.n_emit, s.tokens.end());
    ev.n_prompt_tokens = s.n_prompt;
    ev.n_cached_tokens = s.n_cached;
    FinishReason reason = o.finish;
    // The request's rules left no token to draw (TokenConstraint::exhausted_at): it ends with an
    // error before the token drawn there. A row past the tokens kept (a verification's bonus row
    // beyond max_tokens, or after an accepted stop, which Scheduler::update cut) was never emitted.
    if (const int at = s.constraint ? s.constraint->exhausted_at() : -1; at >= 0 && at < s.n_generated()) {
      const int first = s.n_generated() - o.n_emit;  // generated index of ev.tokens[0]
      const size_t keep = static_cast<size_t>(std::clamp(at - first, 0, o.n_emit));
      ev.tokens.resize(keep);
      if (ev.logprobs.size() > keep) ev.logprobs.resize(keep);
      s.tokens.resize(static_cast<size_t>(s.n_prompt + std::max(at, 0)));
      s.n_computed = std::min(s.n_computed, static_cast<int>(s.tokens.size()));
      ev.error = "the request's rules leave no token to generate: allowed_token_ids, bad_words, min_tokens and "
                 "the structured-output grammar exclude every token at output token " + std::to_string(at);
      ev.error_kind = EngineErrorKind::BadRequest;
      reason = FinishReason::Error;
    }
    generated_tokens_total_ += ev.tokens.size();
    if (reason != FinishReason::None) finish(s, reason, ev, /*defer=*/true);
    else s.stream->events.push(std::move(ev));
  }
}

}  // namespace deltaserve
