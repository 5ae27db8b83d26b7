#include "engine/scheduler.h"

#include <algorithm>
#include <limits>

namespace deltaserve {

Scheduler::Scheduler(const SchedulerConfig& config, CacheAllocator& cache) : config_(config), cache_(cache) {
  if (config.prefix_cache) tree_ = std::make_unique<PrefixCache>(config.block_size, cache);
}

void Scheduler::add(std::unique_ptr<Sequence> seq) {
  seq->status = SeqStatus::Waiting;
  waiting_.push_back(std::move(seq));
}

bool Scheduler::reserve(Sequence& seq, int n_tokens) {
  const int need = (n_tokens + config_.block_size - 1) / config_.block_size - static_cast<int>(seq.blocks.size());
  if (need <= 0) return true;
  if (cache_.blocks().allocate(need, seq.blocks)) return true;
  // Cached data gives way to running requests.
  return tree_ && tree_->evict_blocks(need) && cache_.blocks().allocate(need, seq.blocks);
}

void Scheduler::release(Sequence& seq) {
  for (int32_t b : seq.blocks) cache_.blocks().release(b);
  seq.blocks.clear();
  if (seq.slot >= 0) cache_.release_slot(seq.slot);
  seq.slot = -1;
  if (seq.rolling_slot >= 0) cache_.release_checkpoint(seq.rolling_slot);
  seq.rolling_slot = -1;
  seq.rolling_pos = 0;
}

void Scheduler::preempt(Sequence& seq) {
  // Retraction: drop everything the cache holds for it; its known tokens are recomputed later
  // (after whatever prefix the cache still has).
  release(seq);
  seq.n_computed = 0;
  seq.n_drafts = 0;
  seq.status = SeqStatus::Waiting;
  ++n_preempted_;
}

std::unique_ptr<Sequence> Scheduler::remove(RequestId id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
    if ((*it)->id == id) {
      auto s = std::move(*it);
      waiting_.erase(it);
      release(*s);
      return s;
    }
  for (auto it = running_.begin(); it != running_.end(); ++it)
    if ((*it)->id == id) {
      auto s = std::move(*it);
      running_.erase(it);
      // Cancelled (a stop string the server matched, a client gone): what it computed is cached
      // as a finished sequence's is, for the next turn that repeats its text.
      cache_computed(*s);
      release(*s);
      return s;
    }
  return nullptr;
}

std::vector<std::unique_ptr<Sequence>> Scheduler::remove_all() {
  std::vector<std::unique_ptr<Sequence>> out;
  for (auto& s : running_) out.push_back(std::move(s));
  for (auto& s : waiting_) out.push_back(std::move(s));
  running_.clear();
  waiting_.clear();
  for (auto& s : out) release(*s);
  return out;
}

int Scheduler::take_checkpoint_slot(bool evict) {
  int slot = cache_.acquire_checkpoint();
  if (slot < 0 && evict && tree_ && tree_->evict_checkpoint()) slot = cache_.acquire_checkpoint();
  return slot;
}

int Scheduler::resume_from_cache(Sequence& s) {
  if (!tree_ || s.n_computed > 0 || !s.blocks.empty()) return s.n_computed;
  const PrefixCache::Match m = tree_->match(s.tokens, static_cast<int>(s.tokens.size()) - 1, s.cache_namespace);
  if (m.n_tokens == 0) return 0;
  if (cache_.has_state()) cache_.copy_slot(m.checkpoint_slot, s.slot);
  for (int32_t b : m.blocks) cache_.blocks().retain(b);
  s.blocks = m.blocks;
  s.n_computed = m.n_tokens;
  s.resumed_at = m.n_tokens;
  return m.n_tokens;
}

bool Scheduler::should_wait_for_running_prefix(const Sequence& s, int cached) const {
  const int bs = config_.block_size;
  const size_t limit = s.tokens.size() - 1;
  for (const auto& r : running_) {
    if (r->n_computed >= r->n_prompt) continue;  // its prefill is done: what it caches is cached
    if (r->cache_namespace != s.cache_namespace) continue;  // what it caches s cannot match
    const size_t n = std::min(limit, static_cast<size_t>(r->n_prompt));
    size_t common = 0;
    while (common < n && s.tokens[common] == r->tokens[common]) ++common;
    // Where s could resume once r's prefill is through: r caches its aligned prompt end, and (for
    // models with state) the aligned ends of its chunks.
    int best = static_cast<int>(common) / bs * bs;
    if (cache_.has_state()) {
      const int prompt_end = (r->n_prompt - 1) / bs * bs;
      if (prompt_end <= static_cast<int>(common)) {
        best = prompt_end;
      } else if (config_.chunked_prefill_size % bs == 0) {
        const int step = config_.chunked_prefill_size;
        best = r->n_computed + (static_cast<int>(common) - r->n_computed) / step * step;
        if (best <= r->n_computed) best = 0;
      } else {
        best = 0;
      }
    }
    if (best >= cached + 2 * bs) return true;
  }
  return false;
}

void Scheduler::plan_prefill_checkpoint(ScheduledItem& item) {
  Sequence& s = *item.seq;
  if (!tree_ || !cache_.has_state()) return;
  const int bs = config_.block_size, n0 = s.n_computed, end = n0 + item.n_tokens;
  // The prompt's last whole block before its last token: a request with the same prompt (n > 1, a
  // retry) still has a token to compute from there, and one that extends it loses < 2 blocks.
  const int prompt_end = (s.n_prompt - 1) / bs * bs;
  // A chunk boundary's checkpoint only helps a prompt that leaves this one mid-way: it takes a free
  // slot but never evicts (evicting would drop another conversation's latest checkpoint).
  int at = -1;
  bool evict = true;
  if (n0 < prompt_end && prompt_end <= end) {
    at = prompt_end;
  } else if (end < s.n_prompt && end % bs == 0) {
    at = end;
    evict = false;
  }
  if (at <= n0) return;
  // No free slot for the prompt end: first the checkpoint this request resumed from, which the new
  // one supersedes on its path, then the least recently used one.
  int slot = cache_.acquire_checkpoint();
  if (slot < 0 && evict && s.resumed_at > 0 && s.resumed_at < at &&
      tree_->drop_superseded_checkpoint(s.tokens, s.resumed_at, s.cache_namespace))
    slot = cache_.acquire_checkpoint();
  if (slot < 0) slot = take_checkpoint_slot(evict);
  if (slot < 0) return;
  item.checkpoint_at = at - n0 - 1;
  item.checkpoint_slot = slot;
  item.checkpoint_pos = at;
  in_flight_checkpoints_.push_back(slot);
}

void Scheduler::plan_decode_checkpoint(ScheduledItem& item, int ahead) {
  Sequence& s = *item.seq;
  const int bs = config_.block_size, n0 = s.n_computed + ahead;
  if (s.rolling_slot < 0 || item.n_tokens != 1 || (n0 + 1) % bs != 0) return;
  item.checkpoint_at = 0;
  item.checkpoint_slot = s.rolling_slot;
  item.checkpoint_pos = n0 + 1;
}

CommitCheckpoint Scheduler::commit_checkpoint(Sequence& s, int n_committed) {
  const int bs = config_.block_size, end = s.n_computed, n0 = end - n_committed;
  const int at = end / bs * bs;
  if (s.rolling_slot < 0 || at <= n0) return {};
  s.rolling_pos = at;
  return {at - n0 - 1, s.rolling_slot};
}

void Scheduler::cache_prefix(Sequence& s, int n_tokens, int checkpoint_slot) {
  const int n_blocks = std::min(n_tokens, s.n_computed) / config_.block_size;
  if (n_blocks <= 0) {
    if (checkpoint_slot >= 0) cache_.release_checkpoint(checkpoint_slot);
    return;
  }
  tree_->insert(s.tokens, s.blocks, n_blocks, checkpoint_slot, s.cache_namespace);
}

void Scheduler::order_waiting() {
  if (!tree_ || config_.policy != SchedulePolicy::Lpm || waiting_.size() < 2) return;
  // Longest cached prefix first (among the first 128, so the cost stays bounded); ties keep arrival order.
  const size_t n = std::min<size_t>(waiting_.size(), 128);
  std::vector<std::pair<int, size_t>> keys;
  keys.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const Sequence& s = *waiting_[i];
    keys.push_back({-tree_->match_length(s.tokens, static_cast<int>(s.tokens.size()) - 1, s.cache_namespace), i});
  }
  std::stable_sort(keys.begin(), keys.end());
  std::vector<std::unique_ptr<Sequence>> head;
  head.reserve(n);
  for (auto [key, i] : keys) head.push_back(std::move(waiting_[i]));
  for (size_t i = 0; i < n; ++i) waiting_[i] = std::move(head[i]);
}

const std::vector<ScheduledItem>& Scheduler::schedule() {
  items_.clear();
  in_flight_checkpoints_.clear();
  // 1. Decodes (and prefill continuations) of running sequences, oldest first.
  std::sort(running_.begin(), running_.end(),
            [](const auto& a, const auto& b) { return a->admit_order < b->admit_order; });
  int prefill_budget = config_.max_prefill_tokens;
  // A step with decode rows: its prefill chunks delay every one of their tokens.
  const bool decodes = std::any_of(running_.begin(), running_.end(), [](const auto& s) {
    return s->n_computed == static_cast<int>(s->tokens.size()) - 1;
  });
  if (decodes && config_.mixed_prefill_tokens > 0) {
    int mixed = config_.mixed_prefill_tokens;
    if (config_.mixed_backlog_steps > 0) {
      int64_t pending = 0;
      for (const auto& s : running_)
        if (s->n_computed < static_cast<int>(s->tokens.size()) - 1) pending += int64_t(s->tokens.size()) - s->n_computed;
      for (const auto& s : waiting_) pending += std::max<int64_t>(int64_t(s->tokens.size()) - s->n_computed, 0);
      const int64_t bs = config_.block_size;
      const int64_t per_step = (pending + config_.mixed_backlog_steps - 1) / config_.mixed_backlog_steps;
      mixed = static_cast<int>(std::min<int64_t>(std::max<int64_t>(mixed, (per_step + bs - 1) / bs * bs),
                                                 config_.max_prefill_tokens));
    }
    prefill_budget = std::min(prefill_budget, mixed);
  }
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = *running_[i];
    const int known = static_cast<int>(s.tokens.size());
    const bool decoding = s.n_computed == known - 1;
    int n = decoding ? 1 + s.n_drafts : std::min({known - s.n_computed, config_.chunked_prefill_size, prefill_budget});
    if (n <= 0) continue;  // prefill waiting for budget
    while (!reserve(s, s.n_computed + n)) {
      // Out of KV blocks: retract the newest running sequence (possibly this one).
      auto victim = std::max_element(running_.begin() + static_cast<long>(i), running_.end(),
                                     [](const auto& a, const auto& b) { return a->admit_order < b->admit_order; });
      Sequence& v = **victim;
      preempt(v);
      auto owned = std::move(*victim);
      running_.erase(victim);
      waiting_.push_front(std::move(owned));
      if (&v == &s) {
        n = 0;
        break;
      }
    }
    if (n == 0) {
      --i;  // running_[i] was removed; the loop's ++i revisits this index
      continue;
    }
    if (!decoding) prefill_budget -= n;
    ScheduledItem item{&s, n, decoding || s.n_computed + n == known};
    if (decoding) plan_decode_checkpoint(item);
    else plan_prefill_checkpoint(item);
    items_.push_back(item);
  }
  // 2. Admission, in policy order. A sequence whose prefix a running prefill is computing waits
  //    for it; any other that cannot be admitted stops admission (first come, first served).
  order_waiting();
  for (size_t w = 0; w < waiting_.size() && static_cast<int>(running_.size()) < config_.max_running &&
                     prefill_budget > 0;) {
    Sequence& s = *waiting_[w];
    const int known = static_cast<int>(s.tokens.size());
    if (tree_ && s.n_computed == 0 &&
        should_wait_for_running_prefix(s, tree_->match_length(s.tokens, known - 1, s.cache_namespace))) {
      ++w;
      continue;
    }
    if (s.slot < 0) {
      s.slot = cache_.acquire_slot();
      if (s.slot < 0) break;
    }
    const bool first_admission = s.admit_order == 0;
    resume_from_cache(s);
    if (first_admission) s.n_cached = std::min(s.n_computed, s.n_prompt);
    const int n = std::min({known - s.n_computed, config_.chunked_prefill_size, prefill_budget});
    // Admitted only with KV for its whole prompt, not just this chunk: one admitted on its first
    // chunk was retracted when the running requests grew into its blocks, admitted again next step
    // and recomputed, over and over (a 1,600-token decode took 8.5x as long beside such a prompt).
    if (!reserve(s, known)) {
      release(s);
      s.n_computed = 0;
      break;
    }
    // A rolling checkpoint only from a free slot: it pays off when the request finishes, while
    // what the cache holds pays off now.
    if (tree_ && config_.decode_checkpoints && cache_.has_state() && s.rolling_slot < 0)
      s.rolling_slot = take_checkpoint_slot(/*evict=*/false);
    s.status = SeqStatus::Running;
    s.admit_order = ++admit_counter_;
    prefill_budget -= n;
    ScheduledItem item{&s, n, s.n_computed + n == known};
    plan_prefill_checkpoint(item);
    items_.push_back(item);
    running_.push_back(std::move(waiting_[w]));
    waiting_.erase(waiting_.begin() + static_cast<long>(w));
  }
  // Prefill chunks first, then the decode rows: a mixed step's one-token runs form a suffix, which
  // a backend can run through its decode kernels (CudaKernels::gated_delta_net).
  std::stable_partition(items_.begin(), items_.end(), [](const ScheduledItem& it) {
    return it.seq->n_computed + 1 != static_cast<int>(it.seq->tokens.size());
  });
  return items_;
}

bool Scheduler::chain(std::span<const ScheduledItem> prev, std::vector<ScheduledItem>& next) {
  next.clear();
  if (prev.size() != running_.size()) return false;
  if (!waiting_.empty() && static_cast<int>(running_.size()) < config_.max_running) return false;
  // Every sequence takes its last token in `prev` (they reach their length limits together): a
  // next step would be dropped whole.
  bool any_continues = false;
  for (const ScheduledItem& it : prev)
    any_continues = any_continues || int64_t(it.seq->tokens.size()) + 1 < it.seq->max_total_tokens;
  if (!any_continues) return false;
  for (const ScheduledItem& it : prev) {
    Sequence& s = *it.seq;
    // `prev` feeds tokens[n_computed] (its update() has not run); the next step feeds the token
    // it is picking, at position n_computed + 1.
    if (s.status != SeqStatus::Running || !it.sample || it.n_tokens != 1 || s.n_drafts != 0 ||
        s.n_computed + 1 != static_cast<int>(s.tokens.size()))
      return false;
    if (!reserve(s, s.n_computed + 2)) return false;  // blocks already taken serve the next step anyway
    ScheduledItem item{&s, 1, true};
    plan_decode_checkpoint(item, 1);
    next.push_back(item);
  }
  return true;
}

void Scheduler::update(std::span<const ScheduledItem> items, std::span<StepOutput> outputs) {
  DS_CHECK(items.size() == outputs.size(), "update: ", outputs.size(), " outputs for ", items.size(), " items");
  in_flight_checkpoints_.clear();
  for (size_t i = 0; i < items.size(); ++i) {
    const ScheduledItem& it = items[i];
    StepOutput& out = outputs[i];
    Sequence& s = *it.seq;
    out.n_emit = 0;
    out.finish = FinishReason::None;
    out.dropped = s.status == SeqStatus::Finished;
    if (out.dropped) {
      // Finished in the step before this chained one: its run here is discarded. A rolling
      // checkpoint this run wrote holds a state past the sequence's end: it is not cached.
      if (it.checkpoint_slot >= 0 && it.checkpoint_slot == s.rolling_slot) s.rolling_pos = std::numeric_limits<int>::max();
      continue;
    }
    if (!it.sample || out.n_accepted < 0) {
      s.n_computed += it.n_tokens;
    } else {
      // Fed [last token, d_1 .. d_k]: the last token and the accepted drafts stay.
      DS_CHECK(out.n_accepted <= s.n_drafts, "accepted ", out.n_accepted, " of ", s.n_drafts, " drafts");
      s.n_computed += out.n_accepted + 1;
      s.n_drafts = 0;
      ++s.spec_steps;
      s.spec_accepted += static_cast<uint64_t>(out.n_accepted) + 1;
    }
    // The checkpoint this run wrote: a prefill one is cached now; a decode one is the rolling one.
    if (it.checkpoint_slot >= 0) {
      if (it.checkpoint_slot == s.rolling_slot) s.rolling_pos = it.checkpoint_pos;
      else cache_prefix(s, it.checkpoint_pos, it.checkpoint_slot);
    } else if (tree_ && !cache_.has_state() && !(it.sample && out.n_accepted >= 0)) {
      cache_prefix(s, std::min(s.n_computed, s.n_prompt), -1);  // no state: any prompt block can be reused
    }
    if (!it.sample) continue;
    // The new tokens, up to the first that finishes the sequence.
    const size_t first = s.tokens.size() - static_cast<size_t>(out.n_sampled);
    size_t end = first;
    FinishReason reason = FinishReason::None;
    while (end < s.tokens.size() && reason == FinishReason::None) {
      const int32_t tok = s.tokens[end++];
      const auto& eos = config_.eos_token_ids;
      const auto& stop = s.params.stop_token_ids;
      if ((!s.params.ignore_eos && std::find(eos.begin(), eos.end(), tok) != eos.end()) ||
          std::find(stop.begin(), stop.end(), tok) != stop.end())
        reason = FinishReason::Stop;
      else if (int64_t(end) >= s.max_total_tokens)
        reason = FinishReason::Length;
    }
    s.tokens.resize(end);
    out.n_emit = static_cast<int>(end - first);
    if (out.logprobs.size() > static_cast<size_t>(out.n_emit)) out.logprobs.resize(out.n_emit);
    out.finish = reason;
    if (reason != FinishReason::None) {
      s.status = SeqStatus::Finished;
      s.finish = reason;
      // Accepted drafts after the finishing token were computed but are not part of the output;
      // a checkpoint that covers any of them describes tokens that are gone (take_finished drops it).
      s.n_computed = std::min(s.n_computed, static_cast<int>(s.tokens.size()));
    }
  }
}

void Scheduler::cache_computed(Sequence& s) {
  if (!tree_) return;
  // What it computed stays for the next request with this prefix: up to its last checkpoint
  // (models with state) or every full block (without).
  if (!cache_.has_state()) {
    cache_prefix(s, s.n_computed, -1);
  } else if (s.rolling_slot >= 0 && s.rolling_pos <= s.n_computed) {
    cache_prefix(s, s.rolling_pos, s.rolling_slot);
    s.rolling_slot = -1;
  }
}

std::vector<std::unique_ptr<Sequence>> Scheduler::take_finished() {
  std::vector<std::unique_ptr<Sequence>> done;
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->status == SeqStatus::Finished) {
      Sequence& s = **it;
      cache_computed(s);
      release(s);
      done.push_back(std::move(*it));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  return done;
}

int Scheduler::n_blocks_held_by_requests() {
  if (!tree_) return cache_.blocks().n_used();
  block_mark_.resize(static_cast<size_t>(cache_.blocks().n_total()), 0);
  if (++mark_gen_ == 0) {
    std::fill(block_mark_.begin(), block_mark_.end(), 0);
    mark_gen_ = 1;
  }
  int n = 0;
  for (const auto& s : running_)
    for (int32_t b : s->blocks)
      if (block_mark_[b] != mark_gen_) {
        block_mark_[b] = mark_gen_;
        ++n;
      }
  return n;
}

bool Scheduler::flush_prefix_cache() {
  if (!tree_) return true;
  if (!running_.empty() || !waiting_.empty()) return false;
  tree_->clear();
  return true;
}

void Scheduler::check_integrity() const {
  cache_.check_integrity();
  if (tree_) tree_->check_integrity();
  std::vector<int> refs(static_cast<size_t>(cache_.blocks().n_total()), 0);
  std::vector<uint8_t> seen_slot(static_cast<size_t>(cache_.n_slots_total()), 0);
  const int n_live = cache_.n_slots_total();
  std::vector<uint8_t> seen_ckpt(static_cast<size_t>(cache_.n_checkpoints_total()), 0);
  int slots = 0, ckpts = 0;
  auto hold_ckpt = [&](int c) {
    DS_CHECK(c >= n_live && c < n_live + cache_.n_checkpoints_total() && !seen_ckpt[c - n_live], "checkpoint slot ", c,
             " held twice or out of range");
    seen_ckpt[c - n_live] = 1;
    ++ckpts;
  };
  auto count = [&](const Sequence& s) {
    std::vector<int32_t> sorted = s.blocks;
    std::sort(sorted.begin(), sorted.end());
    DS_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), "sequence ", s.id, " lists a block twice");
    for (int32_t b : s.blocks) {
      DS_CHECK(b >= 0 && b < cache_.blocks().n_total(), "block ", b, " out of range");
      ++refs[b];
    }
    if (s.slot >= 0) {
      DS_CHECK(s.slot < n_live && !seen_slot[s.slot], "slot ", s.slot, " held twice or out of range");
      seen_slot[s.slot] = 1;
      ++slots;
    }
    if (s.rolling_slot >= 0) hold_ckpt(s.rolling_slot);
    DS_CHECK(s.n_computed <= static_cast<int>(s.tokens.size()), "sequence ", s.id, " computed past its tokens");
    DS_CHECK(int64_t(s.blocks.size()) * config_.block_size >= s.n_computed, "sequence ", s.id,
             " has fewer blocks than computed tokens");
  };
  for (const auto& s : running_) {
    DS_CHECK(s->slot >= 0, "running sequence ", s->id, " without a slot");
    count(*s);
  }
  for (const auto& s : waiting_) {
    DS_CHECK(s->blocks.empty() && s->slot < 0 && s->n_computed == 0 && s->rolling_slot < 0, "waiting sequence ",
             s->id, " holds memory");
    count(*s);
  }
  if (tree_) tree_->for_each_held([&](int32_t b) { ++refs[b]; }, hold_ckpt);
  // Prefill checkpoints between schedule() and update() belong to no one else yet.
  for (int c : in_flight_checkpoints_) hold_ckpt(c);
  for (int b = 0; b < cache_.blocks().n_total(); ++b)
    DS_CHECK(refs[b] == cache_.blocks().ref_count(b), "block ", b, " has ", cache_.blocks().ref_count(b),
             " references; sequences and cache hold ", refs[b]);
  DS_CHECK(slots == n_live - cache_.n_slots_free(), "sequences hold ", slots, " slots, the pool counts ",
           n_live - cache_.n_slots_free());
  DS_CHECK(ckpts == cache_.n_checkpoints_total() - cache_.n_checkpoints_free(), "cache and sequences hold ", ckpts,
           " checkpoints, the pool counts ", cache_.n_checkpoints_total() - cache_.n_checkpoints_free());
  DS_CHECK(static_cast<int>(running_.size()) <= config_.max_running, "running ", running_.size(), " > max ",
           config_.max_running);
}

}  // namespace deltaserve
