#include "engine/spec/mtp_drafter.h"

#include <algorithm>
#include <limits>

namespace deltaserve {

namespace {
const int32_t kPlaceholder = 0;  // a device-chained step's token: the ids come from the device
}  // namespace

MtpDrafter::MtpDrafter(ModelRunner& runner, DraftStore& store, SamplingPool& pool, int k, int64_t context_length)
    : runner_(runner), store_(store), pool_(pool), k_(k), context_length_(context_length) {
  const size_t S = static_cast<size_t>(runner.limits().max_seqs), T = static_cast<size_t>(runner.limits().max_tokens);
  items_.reserve(S);
  rows_.reserve(T);
  drafting_.reserve(S);
  drafted_.reserve(S);
  chain_.reserve(S);
  chain_rows_.reserve(S);
  chain_left_.reserve(S);
}

int64_t MtpDrafter::budget(const Sequence& s) const {
  const int64_t n1 = static_cast<int64_t>(s.tokens.size());  // the newest token sits at n1 - 1
  return std::min<int64_t>({k_, context_length_ - n1, s.max_total_tokens - n1});
}

bool MtpDrafter::add_draft(Sequence& s, const float* logits_in, Sampler& sampler) {
  // A constrained sequence drafts under its constraint too (advanced by each draft here, rolled
  // back to the accepted tokens at the end of propose()).
  const float* logits = sampler.constrain(logits_in, s.constraint.get(), s.n_generated() + s.n_drafts);
  if (s.constraint && logits != logits_in) {
    const int64_t V = runner_.vocab();
    if (std::none_of(logits, logits + V, [](float x) { return x > -std::numeric_limits<float>::infinity(); }))
      return false;
  }
  const bool greedy = s.params.greedy();
  int32_t draft;
  if (greedy) {
    draft = sampler.sample(logits, s.params, s.prompt(), s.generated(), s.rng, nullptr);
  } else {
    std::vector<float>& q = store_.q(s, s.n_drafts);
    sampler.distribution(logits, s.params, s.prompt(), s.generated(), q);
    draft = sampler.draw(q, s.rng);
  }
  // The constraint takes the draft before it counts: propose() rolls the constraint back by the
  // drafts counted, so one it refused (none should be) ends the chain rather than unwinding a
  // token it never took.
  if (s.constraint && !s.constraint->accept(draft)) return false;
  store_.push(s, draft);
  return true;
}

template <typename Keep, typename Row>
void MtpDrafter::keep_chains(Keep keep, Row row) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < chain_.size(); ++i) {
    if (!keep(i)) continue;
    chain_[kept] = chain_[i];
    chain_rows_[kept] = row(i);
    chain_left_[kept] = chain_left_[i];
    ++kept;
  }
  chain_.resize(kept);
  chain_rows_.resize(kept);
  chain_left_.resize(kept);
}

bool MtpDrafter::drafts_raw_argmax(const Sequence& s) {
  const SamplingParams& p = s.params;
  return p.greedy() && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f &&
         !s.constraint;
}

void MtpDrafter::propose(std::span<const ScheduledItem> items, std::span<const StepOutput> outputs,
                         Scheduler& scheduler) {
  // 1. Catch-up batch: row p of a sequence takes (t_{p+1}, h_p) for the positions this step
  //    computed; hidden rows index the main forward's batch.
  items_.clear();
  rows_.clear();
  drafting_.clear();
  int hidden_row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const ScheduledItem& it = items[i];
    Sequence& s = *it.seq;
    const int fed = it.n_tokens;
    const int valid = it.sample && outputs[i].n_accepted >= 0 ? outputs[i].n_accepted + 1 : fed;
    // A sequence that finished in this step, with its blocks still held, is caught up too (no
    // drafts): the prefix cache may keep the positions it computed (its prompt, up to a checkpoint),
    // and a later request with that prefix would draft from another request's stale MTP KV. (Not
    // when n_computed reaches the last token: update() cut accepted drafts after the finish, so the
    // rows are not known; no checkpoint covers them.)
    const bool finished = s.status == SeqStatus::Finished;
    const bool cached_rows = finished && scheduler.prefix_cache() != nullptr && !outputs[i].dropped && !s.blocks.empty() &&
                             s.n_computed >= valid && s.n_computed < static_cast<int>(s.tokens.size());
    if (!finished || cached_rows) {
      const int n0 = s.n_computed - valid;
      DS_CHECK(n0 >= 0 && size_t(n0 + 1 + valid) <= s.tokens.size(), "MTP catch-up past the known tokens");
      items_.push_back(RunItem{std::span<const int32_t>(s.tokens).subspan(n0 + 1, valid), n0, s.blocks, s.slot, false,
                               !it.sample || finished, false});
      for (int j = 0; j < valid; ++j) rows_.push_back(hidden_row + j);
      if (it.sample && !finished) drafting_.push_back(&s);
    }
    hidden_row += fed;
  }
  if (items_.empty()) return;
  const bool on_device = std::all_of(drafting_.begin(), drafting_.end(), [](const Sequence* s) {
    return drafts_raw_argmax(*s);
  });
  // Greedy drafts on one rank stay on the device until the chain ends (ModelRunner::Fetch::Keep):
  // the catch-up's argmax is kept, and taken to the host below.
  const bool keep = on_device && runner_.can_keep();
  const ModelRunner::Fetch fetch = on_device ? ModelRunner::Fetch::Argmax : ModelRunner::Fetch::Logits;
  runner_.run_mtp(items_, ModelRunner::HiddenFrom::Main, rows_, keep ? ModelRunner::Fetch::Keep : fetch);
  for (Sequence* s : drafting_) store_.begin(*s);

  // 2. Chain: the sequences that want more drafts and have blocks for their positions. Their MTP
  //    hidden is catch-up output row (the sequence's last row).
  chain_.clear();
  chain_rows_.clear();
  chain_left_.clear();
  int last_row = -1;
  size_t d = 0;
  for (size_t r = 0; r < items_.size(); ++r) {
    last_row += static_cast<int>(items_[r].tokens.size());
    if (items_[r].no_logits) continue;
    Sequence& s = *drafting_[d++];
    const int64_t k_eff = budget(s);
    if (k_eff > 1 && scheduler.reserve(s, static_cast<int>(int64_t(s.tokens.size()) + k_eff))) {
      chain_.push_back(&s);
      chain_rows_.push_back(last_row);
      chain_left_.push_back(static_cast<int>(k_eff) - 1);
    }
  }
  // Every drafting sequence chaining the same number of steps (the common case): the chain runs
  // on the device, each step fed the previous step's kept argmax; one copy to the host at the end.
  const bool device_chain =
      keep && !chain_.empty() && chain_.size() == drafting_.size() &&
      std::all_of(chain_left_.begin(), chain_left_.end(), [&](int left) { return left == chain_left_[0]; });
  if (device_chain) {
    const int n = static_cast<int>(chain_.size()), steps = chain_left_[0];
    for (int j = 1; j <= steps; ++j) {
      items_.clear();
      for (Sequence* s : chain_) {
        const int32_t pos = static_cast<int32_t>(s->tokens.size()) - 2 + j;  // after j drafts
        items_.push_back(RunItem{std::span<const int32_t>(&kPlaceholder, 1), pos, s->blocks, s->slot, false, false,
                                 false});
      }
      runner_.run_mtp(items_, ModelRunner::HiddenFrom::Mtp, chain_rows_, ModelRunner::Fetch::Keep, j - 1);
      for (int i = 0; i < n; ++i) chain_rows_[static_cast<size_t>(i)] = i;
    }
    runner_.take_kept();
    for (int j = 0; j <= steps; ++j)
      for (int i = 0; i < n; ++i) store_.push(*chain_[static_cast<size_t>(i)], runner_.kept(j, i));
    chain_.clear();
  } else if (keep) {  // uneven chains: the first drafts to the host, then the chain step by step
    runner_.take_kept();
    for (size_t i = 0; i < drafting_.size(); ++i)
      if (budget(*drafting_[i]) > 0) store_.push(*drafting_[i], runner_.kept(0, static_cast<int>(i)));
  } else if (on_device) {
    for (size_t i = 0; i < drafting_.size(); ++i)
      if (budget(*drafting_[i]) > 0) store_.push(*drafting_[i], runner_.token(static_cast<int>(i)));
  } else {
    pool_.for_each(static_cast<int>(drafting_.size()), [&](Sampler& sampler, std::vector<float>&, int i) {
      Sequence& s = *drafting_[i];
      if (budget(s) > 0) add_draft(s, runner_.logits(i), sampler);
    });
    // A sequence without its first draft (add_draft found no token) does not chain.
    keep_chains([&](size_t i) { return chain_[i]->n_drafts > 0; }, [&](size_t i) { return chain_rows_[i]; });
  }
  while (!chain_.empty()) {
    const int n = static_cast<int>(chain_.size());
    items_.clear();
    for (Sequence* s : chain_) {
      const auto drafts = store_.drafts(*s);
      const int32_t pos = static_cast<int32_t>(s->tokens.size()) - 2 + s->n_drafts;
      items_.push_back(RunItem{drafts.subspan(drafts.size() - 1, 1), pos, s->blocks, s->slot, false, false, false});
    }
    runner_.run_mtp(items_, ModelRunner::HiddenFrom::Mtp, chain_rows_, fetch);
    if (on_device) {
      for (int i = 0; i < n; ++i) store_.push(*chain_[i], runner_.token(i));
    } else {
      drafted_.assign(static_cast<size_t>(n), 1);
      pool_.for_each(n, [&](Sampler& sampler, std::vector<float>&, int i) {
        drafted_[static_cast<size_t>(i)] = add_draft(*chain_[i], runner_.logits(i), sampler);
      });
    }
    // Keep the sequences that still need drafts (and got one this step); a kept sequence's MTP
    // hidden is row i of this step's output.
    for (int i = 0; i < n; ++i) chain_left_[i] = on_device || drafted_[static_cast<size_t>(i)] ? chain_left_[i] - 1 : 0;
    keep_chains([&](size_t i) { return chain_left_[i] > 0; }, [](size_t i) { return static_cast<int32_t>(i); });
  }
  // Constraints follow the accepted tokens: the drafts are checked again at verification.
  for (Sequence* s : drafting_)
    if (s->constraint) s->constraint->rollback(s->n_drafts);
}

}  // namespace deltaserve
