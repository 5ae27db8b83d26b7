#include "engine/scheduler.h"

#include <algorithm>

namespace deltaserve {

Scheduler::Scheduler(const SchedulerConfig& config, CacheMemory& cache) : config_(config), cache_(cache) {}

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
  seq.drafts.clear();
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

int64_t Scheduler::kv_tokens_used() const {
  int64_t n = 0;
  for (const auto& s : running_) n += s->n_computed;
  return n;
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
    int n = decoding ? 1 + static_cast<int>(s.drafts.size())
                     : std::min({known - s.n_computed, config_.chunked_prefill_size, prefill_budget});
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

}  // namespace deltaserve
