#include "engine/engine.h"

#include <algorithm>
#include <random>

#include "backend/backend_factory.h"
#include "util/log.h"
#include "util/timer.h"

namespace deltaserve {

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  std::unique_ptr<Engine> e(new Engine(config));
  EngineConfig& c = e->config_;
  DS_ASSIGN_OR_RETURN(e->backend_, make_backend(c.device == Device::Cuda ? "cuda" : "cpu", c.n_threads));
  ModelLoadOptions lo;
  lo.dummy_weights = c.dummy_weights;
  lo.load_mtp = c.spec_num_steps > 0;
  DS_ASSIGN_OR_RETURN(e->model_, load_model(c.model_dir, *e->backend_, lo));
  const ModelConfig& mc = e->model_->config();
  if (c.spec_num_steps > 0 && !e->model_->has_mtp())
    return error(c.model_dir.string(), ": speculative decoding needs an MTP head, and this model has none");

  // Capacity. Explicit settings win; the rest comes from the model and a memory budget.
  const MemorySpec spec = e->model_->memory_spec();
  if (c.max_running_requests <= 0) c.max_running_requests = 64;
  if (c.context_length <= 0) c.context_length = mc.max_position_embeddings > 0 ? mc.max_position_embeddings : 4096;
  if (c.kv_block_size <= 0) c.kv_block_size = 16;
  const int64_t kv_per_token = CacheMemory::kv_bytes_per_token(spec, e->backend_->activation_dtype());
  if (c.kv_tokens <= 0) {
    const int64_t budget = int64_t(1) << 30;  // CPU default: 1 GiB of KV
    c.kv_tokens = std::min<int64_t>(budget / std::max<int64_t>(kv_per_token, 1),
                                    int64_t(c.max_running_requests) * c.context_length);
  }
  c.kv_tokens = std::max<int64_t>(c.kv_tokens, c.kv_block_size);
  if (c.state_slots <= 0) c.state_slots = c.max_running_requests;
  if (c.chunked_prefill_size <= 0) c.chunked_prefill_size = 1024;
  if (c.max_prefill_tokens <= 0) c.max_prefill_tokens = std::max(2048, c.chunked_prefill_size);
  if (c.max_waiting_requests <= 0) c.max_waiting_requests = 4096;
  if (c.spec_num_steps < 0 || c.spec_num_steps > 8) return error("speculative steps must be in 0..8");

  const int k = c.spec_num_steps;
  CacheConfig cc;
  cc.block_size = c.kv_block_size;
  cc.n_blocks = static_cast<int>((c.kv_tokens + cc.block_size - 1) / cc.block_size);
  cc.n_slots = c.state_slots;
  cc.snapshot_depth = k > 0 ? k + 1 : 0;
  e->cache_ = std::make_unique<CacheMemory>(*e->backend_, spec, cc);

  const int per_decode = 1 + k;
  RunnerLimits lim;
  lim.max_seqs = c.max_running_requests;
  lim.max_tokens = c.max_prefill_tokens + c.max_running_requests * per_decode;
  lim.max_blocks_per_seq = static_cast<int>((c.context_length + per_decode + cc.block_size - 1) / cc.block_size);
  lim.max_logit_rows = c.max_running_requests * per_decode + c.max_running_requests;
  if (c.device == Device::Cuda)
    lim.graph_max_seqs = c.cuda_graph_max_bs < 0 ? std::min(c.max_running_requests, 64) : c.cuda_graph_max_bs;
  e->runner_ = std::make_unique<ModelRunner>(*e->backend_, *e->model_, *e->cache_, lim);

  SchedulerConfig sc;
  sc.max_running = c.max_running_requests;
  sc.chunked_prefill_size = c.chunked_prefill_size;
  sc.max_prefill_tokens = c.max_prefill_tokens;
  sc.decode_tokens_per_seq = per_decode;
  sc.block_size = cc.block_size;
  e->scheduler_ = std::make_unique<Scheduler>(sc, *e->cache_);
  // Sampling threads: with a GPU the host cores are free while the engine samples; on the CPU
  // backend its compute pool already owns them.
  const int n_sample = c.device == Device::Cpu ? 1 : std::clamp(hardware_threads() - 1, 1, 8);
  e->sample_pool_ = std::make_unique<ThreadPool>(n_sample);
  for (int i = 0; i < n_sample; ++i) e->samplers_.push_back(std::make_unique<Sampler>(mc.vocab_size));
  e->probs_.resize(n_sample);
  e->eos_ids_ = mc.eos_token_ids;
  for (int32_t id : c.extra_eos_token_ids)
    if (std::find(e->eos_ids_.begin(), e->eos_ids_.end(), id) == e->eos_ids_.end()) e->eos_ids_.push_back(id);
  if (k > 0) {
    const int64_t H = mc.hidden_size;
    e->hidden_all_ = e->backend_->allocate(int64_t(lim.max_tokens) * H * 4);
    e->mtp_in_ = e->backend_->allocate(int64_t(lim.max_tokens) * H * 4);
    e->mtp_out_ = e->backend_->allocate(int64_t(lim.max_tokens) * H * 4);
    e->chain_a_ = e->backend_->allocate(int64_t(lim.max_seqs) * H * 4);
    e->chain_b_ = e->backend_->allocate(int64_t(lim.max_seqs) * H * 4);
  }
  e->update_stats();
  return e;
}

Engine::~Engine() { stop(); }

std::string Engine::plan_summary() const {
  const MemorySpec spec = model_->memory_spec();
  const int64_t kv_per_token = CacheMemory::kv_bytes_per_token(spec, backend_->activation_dtype());
  const int64_t state_per_slot = CacheMemory::state_bytes_per_slot(spec, cache_->config().snapshot_depth);
  return str_cat("engine plan: backend ", backend_->description(), "; weights ", model_->weight_bytes() >> 20,
                 " MiB; KV ", config_.kv_tokens, " tokens (", kv_per_token, " B/token, ",
                 (config_.kv_tokens * kv_per_token) >> 20, " MiB); state slots ", cache_->n_slots_total(),
                 " (", state_per_slot >> 10, " KiB each); max running ", config_.max_running_requests,
                 "; context ", config_.context_length, "; chunked prefill ", config_.chunked_prefill_size,
                 "; speculative steps ", config_.spec_num_steps);
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
    stream->events.push(std::move(ev));
    stream->events.close();
    return stream;
  };
  const int64_t vocab = model_->config().vocab_size;
  if (req.prompt.empty()) return reject("the prompt is empty", EngineErrorKind::BadRequest);
  for (int32_t t : req.prompt)
    if (t < 0 || t >= vocab) return reject(str_cat("token id ", t, " is outside the vocabulary [0, ", vocab, ")"), EngineErrorKind::BadRequest);
  if (int64_t(req.prompt.size()) >= config_.context_length)
    return reject(str_cat("the prompt has ", req.prompt.size(), " tokens; the context length is ",
                          config_.context_length), EngineErrorKind::TooLong);
  if (req.sampling.max_tokens < 1) return reject("max_tokens must be at least 1", EngineErrorKind::BadRequest);

  auto seq = std::make_unique<Sequence>();
  seq->id = req.id;
  seq->stream = stream;
  seq->params = req.sampling;
  seq->tokens = std::move(req.prompt);
  seq->n_prompt = static_cast<int>(seq->tokens.size());
  seq->max_total_tokens = std::min<int64_t>(int64_t(seq->n_prompt) + req.sampling.max_tokens, config_.context_length);
  seq->rng.seed(req.sampling.seed ? *req.sampling.seed : std::random_device{}());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stats_.requests_waiting + n_inbox_waiting_ >= config_.max_waiting_requests)
      return reject(str_cat("the server is busy: ", config_.max_waiting_requests,
                            " requests are already waiting"), EngineErrorKind::Overloaded);
    ++n_inbox_waiting_;
    inbox_.emplace_back(std::move(seq), 0);
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

void Engine::update_stats() {
  EngineStats s;
  s.requests_running = scheduler_->n_running();
  s.requests_waiting = scheduler_->n_waiting();
  s.kv_tokens_used = int64_t(cache_->blocks().n_used()) * cache_->config().block_size;
  s.kv_tokens_total = int64_t(cache_->blocks().n_total()) * cache_->config().block_size;
  s.state_slots_total = cache_->n_slots_total();
  s.state_slots_used = s.state_slots_total - cache_->n_slots_free();
  s.prompt_tokens_total = prompt_tokens_total_;
  s.generated_tokens_total = generated_tokens_total_;
  s.spec_draft_tokens_total = spec_draft_total_;
  s.spec_accepted_tokens_total = spec_accepted_total_;
  s.spec_verify_steps_total = spec_steps_total_;
  s.steps_total = steps_total_;
  s.step_seconds = step_s_;
  s.forward_seconds = forward_s_;
  s.sample_seconds = sample_s_;
  s.draft_seconds = draft_s_;
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
           ", #token: ", int64_t(cache_->blocks().n_used()) * cache_->config().block_size, accept,
           ", gen throughput (token/s): ", double(generated_tokens_total_ - log_.generated) / dt);
  log_ = {now, generated_tokens_total_, spec_steps_total_, spec_accepted_total_};
}

void Engine::drain_inbox() {
  std::deque<std::pair<std::unique_ptr<Sequence>, int>> incoming;
  std::vector<RequestId> cancels;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    incoming.swap(inbox_);
    cancels.swap(cancels_);
    n_inbox_waiting_ = 0;
  }
  for (auto& [seq, unused] : incoming) {
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

void Engine::emit(Sequence& seq, TokenEvent ev) { seq.stream->events.push(std::move(ev)); }

void Engine::finish(Sequence& seq, FinishReason reason, TokenEvent& ev) {
  ev.finish = reason;
  ev.n_prompt_tokens = seq.n_prompt;
  ev.n_generated_tokens = seq.n_generated();
  ev.accept_length = seq.spec_steps ? double(seq.spec_accepted) / double(seq.spec_steps) : 0.0;
  seq.status = SeqStatus::Finished;
  emit(seq, std::move(ev));
  seq.stream->events.close();
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !inbox_.empty() || !cancels_.empty() || scheduler_->has_work(); });
      if (stopping_) break;
    }
    drain_inbox();
    if (scheduler_->has_work()) step();
    update_stats();
    maybe_log_progress();
  }
  // Shutting down: everything still queued or running ends with Abort.
  drain_inbox();
  for (auto& seq : scheduler_->remove_all()) {
    TokenEvent ev;
    finish(*seq, FinishReason::Abort, ev);
  }
  update_stats();
}

void Engine::step() {
  const auto& items = scheduler_->schedule();
  if (items.empty()) {
    if (scheduler_->n_running() == 0 && scheduler_->n_waiting() > 0) {
      // Nothing can be admitted into an empty engine: the oldest waiting request cannot fit.
      if (auto seq = scheduler_->remove(scheduler_->front_waiting_id())) {
        TokenEvent ev;
        ev.error = str_cat("request needs more KV cache than the engine has (", config_.kv_tokens,
                           " tokens) or no state slot is free");
        ev.error_kind = EngineErrorKind::TooLong;
        finish(*seq, FinishReason::Error, ev);
      }
    }
    return;
  }
  const double t_step = now_seconds();
  const bool spec = config_.spec_num_steps > 0;
  const int64_t H = model_->config().hidden_size;
  run_items_.clear();
  int T = 0;
  for (const auto& it : items) {
    Sequence& s = *it.seq;
    if (!s.drafts.empty()) {
      // Verification: the last sampled token and the drafts, logits for every row.
      s.feed.assign(1, s.tokens.back());
      s.feed.insert(s.feed.end(), s.drafts.begin(), s.drafts.end());
      run_items_.push_back(RunItem{s.feed, s.n_computed, s.blocks, s.slot, true, false});
    } else {
      run_items_.push_back(RunItem{std::span<const int32_t>(s.tokens).subspan(s.n_computed, it.n_tokens),
                                   s.n_computed, s.blocks, s.slot, false, !it.sample});
    }
    T += it.n_tokens;
  }
  const double t_fwd = now_seconds();
  runner_->run(run_items_, /*write_snapshots=*/spec, spec ? hidden_all_.view(DType::F32, {T, H}) : Tensor{});
  const double t_sample = now_seconds();
  forward_s_ += t_sample - t_fwd;
  sample_all(items);
  sample_s_ += now_seconds() - t_sample;

  mtp_items_.clear();
  mtp_rows_.clear();
  drafting_.clear();
  restore_picks_.clear();
  int hidden_row = 0;
  for (const auto& it : items) {
    Sequence& s = *it.seq;
    const int n0 = s.n_computed, fed = it.n_tokens;
    int valid = fed;  // fed tokens whose KV/state stay
    bool finished = false;
    if (!it.sample) {
      s.n_computed += fed;
    } else {
      Sampled& r = sampled_[&it - items.data()];
      const size_t n_before = s.tokens.size() - static_cast<size_t>(r.accepted < 0 ? 1 : r.accepted + 1);
      TokenEvent ev;
      ev.logprobs = std::move(r.logprobs);
      if (r.accepted < 0) {
        s.n_computed += fed;
      } else {
        const int k = static_cast<int>(s.drafts.size());
        const int a = r.accepted;
        valid = a + 1;
        s.n_computed = n0 + a + 1;
        if (a < k) restore_picks_.push_back(SnapshotPick{s.slot, a});  // GDN state after the last accepted token
        ++s.spec_steps;
        s.spec_accepted += a + 1;
        ++spec_steps_total_;
        spec_draft_total_ += k;
        spec_accepted_total_ += a;
        s.drafts.clear();
      }
      // Emit the new tokens, stopping at the first that finishes the sequence.
      FinishReason reason = FinishReason::None;
      size_t end = n_before;
      while (end < s.tokens.size() && reason == FinishReason::None) {
        const int32_t tok = s.tokens[end++];
        const bool is_eos = !s.params.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), tok) != eos_ids_.end();
        const bool is_stop = std::find(s.params.stop_token_ids.begin(), s.params.stop_token_ids.end(), tok) !=
                             s.params.stop_token_ids.end();
        if (is_eos || is_stop) reason = FinishReason::Stop;
        else if (int64_t(end) >= s.max_total_tokens) reason = FinishReason::Length;
      }
      if (ev.logprobs.size() > end - n_before) ev.logprobs.resize(end - n_before);
      s.tokens.resize(end);
      ev.tokens.assign(s.tokens.begin() + static_cast<long>(n_before), s.tokens.end());
      generated_tokens_total_ += ev.tokens.size();
      finished = reason != FinishReason::None;
      if (finished) finish(s, reason, ev);
      else emit(s, std::move(ev));
    }
    if (spec && !finished) {
      // MTP catch-up: row p takes (t_{p+1}, h_p) for the fed positions whose next token is known;
      // the last row of a sequence that just sampled gives its first draft.
      DS_CHECK(size_t(n0 + 1 + valid) <= s.tokens.size(), "mtp catch-up past the known tokens: n0 ", n0, " valid ", valid, " size ", s.tokens.size(), " fed ", fed);
      mtp_items_.push_back(RunItem{std::span<const int32_t>(s.tokens).subspan(n0 + 1, valid), n0, s.blocks,
                                   s.slot, false, !it.sample});
      for (int j = 0; j < valid; ++j) mtp_rows_.push_back(hidden_row + j);
      if (it.sample) drafting_.push_back({&s, static_cast<int>(mtp_rows_.size()) - 1});
    }
    hidden_row += fed;
  }
  cache_->restore_snapshots(restore_picks_);  // before anything reads the GDN state again
  if (!mtp_items_.empty()) {
    const double t_draft = now_seconds();
    propose_drafts();
    draft_s_ += now_seconds() - t_draft;
  }
  scheduler_->take_finished();
  ++steps_total_;
  step_s_ += now_seconds() - t_step;
}

template <typename Fn>
void Engine::for_each_row(int n, Fn&& fn) {
  if (n <= 0) return;
  if (sample_pool_->n_threads() == 1 || n == 1) {
    for (int i = 0; i < n; ++i) fn(0, i);
    return;
  }
  sample_pool_->parallel_for(n, 1, [&](int share, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) fn(share, static_cast<int>(i));
  });
}

void Engine::sample_all(const std::vector<ScheduledItem>& items) {
  // Logits rows in item order: a plain sample has one, a verification k + 1, a chunk none.
  sampled_.resize(items.size());
  int row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    sampled_[i].row = row;
    sampled_[i].accepted = -1;
    sampled_[i].logprobs.clear();
    if (items[i].sample) row += items[i].seq->drafts.empty() ? 1 : static_cast<int>(items[i].seq->drafts.size()) + 1;
  }
  // Each task touches only its own sequence (tokens, RNG, draft probabilities) and its share's
  // sampler, so sequences are independent.
  for_each_row(static_cast<int>(items.size()), [&](int share, int i) {
    const ScheduledItem& it = items[i];
    if (!it.sample) return;
    Sequence& s = *it.seq;
    Sampled& r = sampled_[i];
    const bool want_lp = s.params.top_logprobs >= 0;
    if (s.drafts.empty()) {
      TokenLogprob lp;
      s.tokens.push_back(samplers_[share]->sample(runner_->logits(r.row), s.params, s.prompt(), s.generated(), s.rng,
                                                  want_lp ? &lp : nullptr));
      if (want_lp) r.logprobs.push_back(std::move(lp));
    } else {
      r.accepted = verify(s, r.row, want_lp ? &r.logprobs : nullptr, *samplers_[share], probs_[share]);
    }
  });
}

int Engine::verify(Sequence& s, int row, std::vector<TokenLogprob>* lps, Sampler& sampler, std::vector<float>& probs) {
  // Target rows row .. row+k hold the main model's logits after [last token, d_1 .. d_k].
  const int k = static_cast<int>(s.drafts.size());
  const bool greedy = s.params.temperature <= 0.0f || s.params.top_k == 1;
  int a = 0;
  for (; a < k; ++a) {
    const float* logits = runner_->logits(row + a);
    const int32_t d = s.drafts[a];
    bool accept;
    int32_t alt = -1;
    if (greedy) {
      alt = sampler.sample(logits, s.params, s.prompt(), s.generated(), s.rng, nullptr);
      accept = alt == d;
    } else {
      sampler.distribution(logits, s.params, s.prompt(), s.generated(), probs);
      SpecDecision dec = speculative_accept(probs, s.draft_probs[a], d, s.rng);
      accept = dec.accepted;
      alt = dec.token;
    }
    if (lps) sampler.logprobs(logits, accept ? d : alt, s.params.top_logprobs, &lps->emplace_back());
    if (!accept) {
      s.tokens.push_back(alt);
      return a;
    }
    s.tokens.push_back(d);
  }
  // Every draft accepted: the bonus token comes from the last row.
  TokenLogprob lp;
  s.tokens.push_back(sampler.sample(runner_->logits(row + k), s.params, s.prompt(), s.generated(), s.rng,
                                      lps ? &lp : nullptr));
  if (lps) lps->push_back(std::move(lp));
  return k;
}

void Engine::propose_drafts() {
  const int64_t H = model_->config().hidden_size;
  Kernels& kern = backend_->kernels();
  const int n_rows = static_cast<int>(mtp_rows_.size());
  Tensor in = mtp_in_.view(DType::F32, {n_rows, H});
  kern.gather_rows(hidden_all_.view(DType::F32, {runner_->limits().max_tokens, H}), mtp_rows_.data(), n_rows, in);
  runner_->run_mtp(mtp_items_, in, mtp_out_.view(DType::F32, {n_rows, H}));

  // First draft for every sequence that sampled this step; remember where its hidden m is.
  chain_rows_.clear();
  chain_seqs_.clear();
  auto draft_budget = [&](const Sequence& s) {
    const int64_t n1 = static_cast<int64_t>(s.tokens.size());  // the bonus token sits at position n1 - 1
    return std::min<int64_t>({config_.spec_num_steps, config_.context_length - n1, s.max_total_tokens - n1});
  };
  for_each_row(static_cast<int>(drafting_.size()), [&](int share, int i) {
    Sequence& s = *drafting_[i].first;
    if (draft_budget(s) > 0) add_draft(s, runner_->logits(i), 0, *samplers_[share]);
  });
  for (size_t i = 0; i < drafting_.size(); ++i) {
    Sequence& s = *drafting_[i].first;
    const int64_t n1 = static_cast<int64_t>(s.tokens.size());
    const int64_t k_eff = draft_budget(s);
    if (k_eff > 1 && scheduler_->reserve(s, static_cast<int>(n1 + k_eff))) {
      chain_seqs_.push_back(&s);
      chain_rows_.push_back(drafting_[i].second);
      chain_left_.push_back(static_cast<int>(k_eff) - 1);
    }
  }
  // Chain: step j feeds the previous draft and the previous step's m at the next position.
  Tensor prev = mtp_out_.view(DType::F32, {n_rows, H});
  bool use_a = true;
  while (!chain_seqs_.empty()) {
    const int n = static_cast<int>(chain_seqs_.size());
    Tensor cin = (use_a ? chain_a_ : chain_b_).view(DType::F32, {n, H});
    Tensor cout = (use_a ? chain_b_ : chain_a_).view(DType::F32, {n, H});
    kern.gather_rows(prev, chain_rows_.data(), n, cin);
    mtp_items_.clear();
    for (Sequence* s : chain_seqs_) {
      const int32_t pos = static_cast<int32_t>(s->tokens.size()) - 1 + static_cast<int32_t>(s->drafts.size());
      mtp_items_.push_back(RunItem{std::span<const int32_t>(&s->drafts.back(), 1), pos, s->blocks, s->slot, false, false});
    }
    runner_->run_mtp(mtp_items_, cin, cout);
    // Keep the sequences that still need drafts, compacted in place (no allocation per step).
    for_each_row(n, [&](int share, int i) {
      Sequence& s = *chain_seqs_[i];
      add_draft(s, runner_->logits(i), static_cast<int>(s.drafts.size()), *samplers_[share]);
    });
    int kept = 0;
    for (int i = 0; i < n; ++i) {
      Sequence& s = *chain_seqs_[i];
      if (--chain_left_[i] > 0) {
        chain_seqs_[kept] = &s;
        chain_rows_[kept] = i;  // its m is row i of this step's output
        chain_left_[kept] = chain_left_[i];
        ++kept;
      }
    }
    chain_seqs_.resize(kept);
    chain_rows_.resize(kept);
    chain_left_.resize(kept);
    prev = cout;
    use_a = !use_a;
  }
  chain_left_.clear();
}

void Engine::add_draft(Sequence& s, const float* logits, int j, Sampler& sampler) {
  const bool greedy = s.params.temperature <= 0.0f || s.params.top_k == 1;
  if (greedy) {
    s.drafts.push_back(sampler.sample(logits, s.params, s.prompt(), s.generated(), s.rng, nullptr));
    return;
  }
  if (static_cast<int>(s.draft_probs.size()) <= j) s.draft_probs.resize(j + 1);
  sampler.distribution(logits, s.params, s.prompt(), s.generated(), s.draft_probs[j]);
  s.drafts.push_back(sampler.draw(s.draft_probs[j], s.rng));
}

}  // namespace deltaserve
