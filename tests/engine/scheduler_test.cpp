// Scheduler unit tests over a host-only cache (no model, no device): admission, chunked prefill,
// retraction under block pressure, abort, update()'s finish rules, and a randomised run that
// checks the block/slot invariants (Scheduler::check_integrity) after every step.
#include <gtest/gtest.h>

#include <random>

#include "engine/scheduler.h"

namespace deltaserve::test {
namespace {

// The scheduler's view of the cache, without tensors.
class FakeCache final : public CacheAllocator {
 public:
  FakeCache(int n_blocks, int n_slots, int n_checkpoints = 0, bool state = true)
      : blocks_(n_blocks), slots_(n_slots), ckpts_(n_checkpoints), state_(state) {}
  BlockPool& blocks() override { return blocks_; }
  const BlockPool& blocks() const override { return blocks_; }
  int acquire_slot() override { return slots_.acquire(); }
  void release_slot(int slot) override { slots_.release(slot); }
  int n_slots_free() const override { return slots_.n_free(); }
  int n_slots_total() const override { return slots_.n_total(); }
  int acquire_checkpoint() override {
    const int c = ckpts_.acquire();
    return c < 0 ? -1 : c + slots_.n_total();
  }
  void release_checkpoint(int slot) override { ckpts_.release(slot - slots_.n_total()); }
  int n_checkpoints_free() const override { return ckpts_.n_free(); }
  int n_checkpoints_total() const override { return ckpts_.n_total(); }
  bool has_state() const override { return state_; }
  // Records copies: (src, dst) - a real cache would copy the GDN state.
  void copy_slot(int src, int dst) override { copies.push_back({src, dst}); }
  void check_integrity() const override {
    blocks_.check_integrity();
    slots_.check_integrity();
    ckpts_.check_integrity();
  }
  std::vector<std::pair<int, int>> copies;

 private:
  BlockPool blocks_;
  SlotPool slots_, ckpts_;
  bool state_;
};

SchedulerConfig config(int max_running, int chunk, int budget) {
  SchedulerConfig c;
  c.max_running = max_running;
  c.chunked_prefill_size = chunk;
  c.max_prefill_tokens = budget;
  c.block_size = 4;
  c.eos_token_ids = {2};
  return c;
}

std::unique_ptr<Sequence> seq(RequestId id, int prompt_len, int max_new) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  for (int i = 0; i < prompt_len; ++i) s->tokens.push_back(100 + i);
  s->n_prompt = prompt_len;
  s->max_total_tokens = prompt_len + max_new;
  s->params.ignore_eos = false;
  return s;
}

// Sampling stand-in: every sampling item appends `token` (verifications: accepts `accept` drafts).
std::vector<StepOutput> sample(const std::vector<ScheduledItem>& items, int32_t token, int accept = 0) {
  std::vector<StepOutput> out(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].sample) continue;
    Sequence& s = *items[i].seq;
    if (s.n_drafts > 0) {
      const int a = std::min(accept, s.n_drafts);
      out[i].n_drafts = s.n_drafts;
      out[i].n_accepted = a;
      for (int j = 0; j <= a; ++j) s.tokens.push_back(token);
      out[i].n_sampled = a + 1;
    } else {
      s.tokens.push_back(token);
      out[i].n_sampled = 1;
    }
  }
  return out;
}

TEST(Scheduler, AdmitsWithinRunningSlotsAndPrefillBudgetAndChunks) {
  FakeCache cache(64, 2);
  Scheduler sch(config(3, 8, 12), cache);
  sch.add(seq(1, 20, 4));
  sch.add(seq(2, 5, 4));
  sch.add(seq(3, 5, 4));
  const auto& items = sch.schedule();
  // 1 takes a chunk of 8 (not its whole 20); 2 takes the 4 left of the budget of 12; 3 waits: no budget.
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].seq->id, 1u);
  EXPECT_EQ(items[0].n_tokens, 8);
  EXPECT_FALSE(items[0].sample);
  EXPECT_EQ(items[1].seq->id, 2u);
  EXPECT_EQ(items[1].n_tokens, 4);
  EXPECT_FALSE(items[1].sample);
  EXPECT_EQ(sch.n_running(), 2);
  EXPECT_EQ(sch.n_waiting(), 1);
  EXPECT_EQ(cache.n_slots_free(), 0);
  sch.check_integrity();
  auto out = sample(items, 7);
  sch.update(items, out);
  EXPECT_EQ(items[0].seq->n_computed, 8);
  // Next step: 1 continues (8), 2 finishes its prompt (1 token) and samples; 3 has no slot.
  const auto& next = sch.schedule();
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].n_tokens, 8);
  EXPECT_EQ(next[1].n_tokens, 1);
  EXPECT_TRUE(next[1].sample);
  EXPECT_EQ(sch.n_waiting(), 1);
  sch.check_integrity();
}

TEST(Scheduler, DecodeFeedsTheLastTokenAndItsDrafts) {
  FakeCache cache(64, 4);
  Scheduler sch(config(4, 64, 64), cache);
  sch.add(seq(1, 6, 20));
  auto items = sch.schedule();
  auto out = sample(items, 7);
  sch.update(items, out);
  Sequence& s = *items[0].seq;
  EXPECT_EQ(s.n_computed, 6);
  EXPECT_EQ(s.tokens.size(), 7u);
  s.n_drafts = 3;  // the speculative decoder proposed 3 drafts
  items = sch.schedule();
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].n_tokens, 4);
  EXPECT_TRUE(items[0].sample);
  // 1 draft accepted: the last token and that draft are computed; a bonus token is appended.
  out = sample(items, 9, 1);
  sch.update(items, out);
  EXPECT_EQ(s.n_computed, 8);
  EXPECT_EQ(s.tokens.size(), 9u);
  EXPECT_EQ(s.n_drafts, 0);
  EXPECT_EQ(out[0].n_emit, 2);
  EXPECT_EQ(s.spec_steps, 1u);
  EXPECT_EQ(s.spec_accepted, 2u);
  sch.check_integrity();
}

TEST(Scheduler, UpdateStopsAtEosStopTokenOrLengthAndCutsTheRest) {
  FakeCache cache(64, 4);
  Scheduler sch(config(4, 64, 64), cache);
  sch.add(seq(1, 4, 10));  // EOS (2) inside an accepted run
  auto b = seq(2, 4, 10);
  b->params.stop_token_ids = {55};
  sch.add(std::move(b));
  sch.add(seq(3, 4, 2));  // length
  auto items = sch.schedule();
  auto out = sample(items, 7);
  sch.update(items, out);
  for (const auto& it : items) it.seq->n_drafts = 3;
  items = sch.schedule();
  ASSERT_EQ(items.size(), 3u);
  std::vector<StepOutput> o(3);
  // Sequence 1 accepts all 3 drafts [5, 2, 6] + bonus 8: stops at the EOS, 6 and 8 are cut.
  for (int32_t t : {5, 2, 6, 8}) items[0].seq->tokens.push_back(t);
  o[0] = StepOutput{4, 3, 3, {}, 0, FinishReason::None};
  // Sequence 2 rejects the first draft; the correction is its stop token.
  items[1].seq->tokens.push_back(55);
  o[1] = StepOutput{1, 3, 0, {}, 0, FinishReason::None};
  // Sequence 3 accepts 2 drafts: max_total_tokens = 6 allows only 1 more token.
  for (int32_t t : {5, 6, 8}) items[2].seq->tokens.push_back(t);
  o[2] = StepOutput{3, 3, 2, {}, 0, FinishReason::None};
  sch.update(items, o);
  EXPECT_EQ(o[0].finish, FinishReason::Stop);
  EXPECT_EQ(o[0].n_emit, 2);
  EXPECT_EQ(items[0].seq->tokens.back(), 2);
  EXPECT_EQ(o[1].finish, FinishReason::Stop);
  EXPECT_EQ(o[1].n_emit, 1);
  EXPECT_EQ(o[2].finish, FinishReason::Length);
  EXPECT_EQ(o[2].n_emit, 1);
  EXPECT_EQ(items[2].seq->tokens.size(), 6u);
  EXPECT_EQ(sch.take_finished().size(), 3u);
  EXPECT_EQ(cache.blocks().n_used(), 0);
  EXPECT_EQ(cache.n_slots_free(), 4);
  sch.check_integrity();
}

TEST(Scheduler, RetractsTheNewestSequenceWhenBlocksRunOut) {
  // 6 blocks of 4 tokens: two prompts of 8 (2 blocks each) fit; decoding past 12 tokens does not.
  FakeCache cache(6, 4);
  Scheduler sch(config(4, 64, 64), cache);
  sch.add(seq(1, 8, 40));
  sch.add(seq(2, 8, 40));
  int steps = 0;
  while (sch.n_preempted() == 0 && steps < 40) {
    auto items = sch.schedule();
    sch.check_integrity();
    auto out = sample(items, 7);
    sch.update(items, out);
    sch.take_finished();
    ++steps;
  }
  ASSERT_GT(sch.n_preempted(), 0u) << "no preemption happened";
  EXPECT_EQ(sch.n_running(), 1);
  EXPECT_EQ(sch.n_waiting(), 1);
  // The retracted sequence (2, the newest) holds nothing and restarts from token 0.
  auto victim = sch.remove(2);
  ASSERT_NE(victim, nullptr);
  EXPECT_EQ(victim->n_computed, 0);
  EXPECT_TRUE(victim->blocks.empty());
  EXPECT_EQ(victim->slot, -1);
  EXPECT_GT(victim->tokens.size(), 8u) << "its generated tokens are kept for recomputation";
  sch.check_integrity();
}

TEST(Scheduler, RemoveReleasesWaitingAndRunningSequences) {
  FakeCache cache(64, 2);
  Scheduler sch(config(2, 64, 64), cache);
  sch.add(seq(1, 10, 5));
  sch.add(seq(2, 10, 5));
  sch.add(seq(3, 10, 5));
  auto items = sch.schedule();
  EXPECT_EQ(cache.n_slots_free(), 0);
  ASSERT_NE(sch.remove(1), nullptr);  // running
  ASSERT_NE(sch.remove(3), nullptr);  // waiting
  EXPECT_EQ(sch.remove(99), nullptr);
  EXPECT_EQ(cache.n_slots_free(), 1);
  sch.check_integrity();
  EXPECT_EQ(sch.remove_all().size(), 1u);
  EXPECT_EQ(cache.blocks().n_used(), 0);
  sch.check_integrity();
}

// Random arrivals, lengths, drafts, acceptances, EOS and cancellations through a small pool: the
// invariants hold after every step and every request ends.
TEST(Scheduler, RandomisedRunKeepsInvariantsEveryStep) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    FakeCache cache(24, 5);
    Scheduler sch(config(5, 6, 10), cache);
    RequestId next = 1;
    int finished = 0, removed = 0, added = 0;
    for (int step = 0; step < 400; ++step) {
      if (added < 30 && rng() % 3 == 0) {
        sch.add(seq(next++, 1 + int(rng() % 20), 1 + int(rng() % 25)));
        ++added;
      }
      if (rng() % 23 == 0 && next > 1 && sch.remove(1 + rng() % (next - 1))) ++removed;
      const auto items = sch.schedule();
      sch.check_integrity();
      std::vector<StepOutput> out(items.size());
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].sample) continue;
        Sequence& s = *items[i].seq;
        const int32_t tok = rng() % 10 == 0 ? 2 : 7;  // EOS now and then
        if (s.n_drafts > 0) {
          const int a = int(rng() % (s.n_drafts + 1));
          out[i].n_drafts = s.n_drafts;
          out[i].n_accepted = a;
          for (int j = 0; j <= a; ++j) s.tokens.push_back(j == a ? tok : 7);
          out[i].n_sampled = a + 1;
        } else {
          s.tokens.push_back(tok);
          out[i].n_sampled = 1;
        }
      }
      sch.update(items, out);
      // The speculative decoder proposes up to 3 drafts for sequences that go on, when their
      // block table can hold them.
      for (const auto& it : items) {
        Sequence& s = *it.seq;
        if (it.sample && s.status != SeqStatus::Finished) {
          const int want = int(rng() % 4);
          if (want > 0 && sch.reserve(s, int(s.tokens.size()) + want)) s.n_drafts = want;
        }
      }
      finished += static_cast<int>(sch.take_finished().size());
      sch.check_integrity();
      if (added == 30 && !sch.has_work()) break;
    }
    EXPECT_FALSE(sch.has_work()) << "seed " << seed;
    EXPECT_EQ(finished + removed, added) << "seed " << seed;
    EXPECT_EQ(cache.blocks().n_used(), 0) << "seed " << seed;
  }
}

}  // namespace
}  // namespace deltaserve::test
