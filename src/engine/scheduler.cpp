#include "engine/scheduler.h"

#include <algorithm>

namespace deltaserve {

Scheduler::Scheduler(const SchedulerConfig& config, CacheAllocator& cache) : config_(config), cache_(cache) {}

void Scheduler::add(std::unique_ptr<Sequence> seq) {
  seq->status = SeqStatus::Waiting;
  waiting_.push_back(std::move(seq));
}

bool Scheduler::reserve(Sequence& seq, int n_tokens) {
  const int need = (n_tokens + config_.block_size - 1) / config_.block_size - static_cast<int>(seq.blocks.size());
  if (need <= 0) return true;
  return cache_.blocks().allocate(need, seq.blocks);
}

void Scheduler::release(Sequence& seq) {
  for (int32_t b : seq.blocks) cache_.blocks().release(b);
  seq.blocks.clear();
  if (seq.slot >= 0) cache_.release_slot(seq.slot);
  seq.slot = -1;
}

void Scheduler::preempt(Sequence& seq) {
  // Retraction: drop everything the cache holds for it; its known tokens are recomputed later.
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

const std::vector<ScheduledItem>& Scheduler::schedule() {
  items_.clear();
  // 1. Decodes (and prefill continuations) of running sequences, oldest first.
  std::sort(running_.begin(), running_.end(),
            [](const auto& a, const auto& b) { return a->admit_order < b->admit_order; });
  int prefill_budget = config_.max_prefill_tokens;
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
    items_.push_back({&s, n, decoding || s.n_computed + n == known});
  }
  // 2. Admission.
  while (!waiting_.empty() && static_cast<int>(running_.size()) < config_.max_running && prefill_budget > 0) {
    Sequence& s = *waiting_.front();
    const int known = static_cast<int>(s.tokens.size());
    const int n = std::min({known - s.n_computed, config_.chunked_prefill_size, prefill_budget});
    if (s.slot < 0) {
      s.slot = cache_.acquire_slot();
      if (s.slot < 0) break;
    }
    if (!reserve(s, s.n_computed + n)) {
      release(s);
      break;
    }
    s.status = SeqStatus::Running;
    s.admit_order = ++admit_counter_;
    prefill_budget -= n;
    items_.push_back({&s, n, s.n_computed + n == known});
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  return items_;
}

void Scheduler::update(std::span<const ScheduledItem> items, std::span<StepOutput> outputs) {
  DS_CHECK(items.size() == outputs.size(), "update: ", outputs.size(), " outputs for ", items.size(), " items");
  for (size_t i = 0; i < items.size(); ++i) {
    const ScheduledItem& it = items[i];
    StepOutput& out = outputs[i];
    Sequence& s = *it.seq;
    out.n_emit = 0;
    out.finish = FinishReason::None;
    if (!it.sample) {
      s.n_computed += it.n_tokens;
      continue;
    }
    if (out.n_accepted < 0) {
      s.n_computed += it.n_tokens;
    } else {
      // Fed [last token, d_1 .. d_k]: the last token and the accepted drafts stay.
      DS_CHECK(out.n_accepted <= s.n_drafts, "accepted ", out.n_accepted, " of ", s.n_drafts, " drafts");
      s.n_computed += out.n_accepted + 1;
      s.n_drafts = 0;
      ++s.spec_steps;
      s.spec_accepted += static_cast<uint64_t>(out.n_accepted) + 1;
    }
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
    }
  }
}

std::vector<std::unique_ptr<Sequence>> Scheduler::take_finished() {
  std::vector<std::unique_ptr<Sequence>> done;
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->status == SeqStatus::Finished) {
      release(**it);
      done.push_back(std::move(*it));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  return done;
}

void Scheduler::check_integrity() const {
  cache_.check_integrity();
  int64_t blocks = 0;
  int slots = 0;
  std::vector<uint8_t> seen_block(static_cast<size_t>(cache_.blocks().n_total()), 0);
  std::vector<uint8_t> seen_slot(static_cast<size_t>(cache_.n_slots_total()), 0);
  auto count = [&](const Sequence& s) {
    for (int32_t b : s.blocks) {
      DS_CHECK(b >= 0 && b < cache_.blocks().n_total() && !seen_block[b], "block ", b, " held twice or out of range");
      seen_block[b] = 1;
    }
    blocks += static_cast<int64_t>(s.blocks.size());
    if (s.slot >= 0) {
      DS_CHECK(s.slot < cache_.n_slots_total() && !seen_slot[s.slot], "slot ", s.slot, " held twice or out of range");
      seen_slot[s.slot] = 1;
      ++slots;
    }
    DS_CHECK(s.n_computed <= static_cast<int>(s.tokens.size()), "sequence ", s.id, " computed past its tokens");
    DS_CHECK(int64_t(s.blocks.size()) * config_.block_size >= s.n_computed, "sequence ", s.id,
             " has fewer blocks than computed tokens");
  };
  for (const auto& s : running_) {
    DS_CHECK(s->slot >= 0, "running sequence ", s->id, " without a slot");
    count(*s);
  }
  for (const auto& s : waiting_) {
    DS_CHECK(s->blocks.empty() && s->slot < 0 && s->n_computed == 0, "waiting sequence ", s->id, " holds memory");
    count(*s);
  }
  DS_CHECK(blocks == cache_.blocks().n_used(), "sequences hold ", blocks, " blocks, the pool counts ",
           cache_.blocks().n_used());
  DS_CHECK(slots == cache_.n_slots_total() - cache_.n_slots_free(), "sequences hold ", slots, " slots, the pool counts ",
           cache_.n_slots_total() - cache_.n_slots_free());
  DS_CHECK(static_cast<int>(running_.size()) <= config_.max_running, "running ", running_.size(), " > max ",
           config_.max_running);
}

}  // namespace deltaserve
