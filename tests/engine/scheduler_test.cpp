// Scheduler unit tests over a host-only cache (no model, no device): admission, chunked prefill,
// retraction under block pressure, abort, update()'s finish rules, chain() (overlap scheduling),
// and a randomised run that checks the block/slot invariants (Scheduler::check_integrity) after
// every step.
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

// A step that also decodes a running sequence carries at most mixed_prefill_tokens of prefill;
// a step with no decode rows keeps the whole budget.
TEST(Scheduler, PrefillBesideDecodesKeepsTheMixedBudget) {
  FakeCache cache(128, 4);
  SchedulerConfig c = config(4, 32, 40);
  c.mixed_prefill_tokens = 8;
  Scheduler sch(c, cache);
  sch.add(seq(1, 6, 20));
  sch.add(seq(2, 60, 4));
  // No one decodes yet: 1's whole prompt (6) and 2's first chunk, up to the budget (40 - 6 = 34,
  // capped by the chunk size 32).
  auto items = sch.schedule();
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].n_tokens, 6);
  EXPECT_EQ(items[1].n_tokens, 32);
  auto out = sample(items, 7);
  sch.update(items, out);
  // 1 decodes now: 2's prefill continues 8 tokens a step, the prefill chunk first, then the decode row.
  for (int step = 0; step < 2; ++step) {
    items = sch.schedule();
    ASSERT_EQ(items.size(), 2u);
    EXPECT_EQ(items[0].seq->id, 2u);
    EXPECT_EQ(items[0].n_tokens, 8);
    EXPECT_EQ(items[1].seq->id, 1u);
    EXPECT_EQ(items[1].n_tokens, 1);
    out = sample(items, 7);
    sch.update(items, out);
  }
  EXPECT_EQ(sch.mixed_prefill_tokens(), 8);
  // The engine raises it (auto: from step times); 0 leaves max_prefill_tokens alone.
  sch.set_mixed_prefill_tokens(0);
  items = sch.schedule();
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].n_tokens, 60 - 32 - 16);  // the rest of 2's prompt (12 < 32)
  out = sample(items, 7);
  sch.update(items, out);
  // 1 and 2 both decode now: a new arrival beside them is bounded again.
  sch.set_mixed_prefill_tokens(4);
  sch.add(seq(3, 30, 4));
  items = sch.schedule();
  int prefill = 0;
  for (const auto& it : items)
    if (!it.sample) prefill += it.n_tokens;
  EXPECT_EQ(prefill, 4);
  sch.check_integrity();
}

// With mixed_backlog_steps, the mixed budget rises so that the prefill tokens pending (running
// prefills' rest and waiting prompts) take at most that many steps, in whole blocks.
TEST(Scheduler, MixedBudgetRisesToClearABacklogInItsSteps) {
  FakeCache cache(256, 4);
  SchedulerConfig c = config(4, 64, 64);
  c.mixed_prefill_tokens = 4;
  c.mixed_backlog_steps = 4;
  Scheduler sch(c, cache);
  sch.add(seq(1, 6, 40));
  auto items = sch.schedule();
  auto out = sample(items, 7);
  sch.update(items, out);  // 1 decodes from here
  sch.add(seq(2, 100, 4));
  // 100 pending over 4 steps: 25 a step -> 28 in blocks of 4 (not 4).
  items = sch.schedule();
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].seq->id, 2u);
  EXPECT_EQ(items[0].n_tokens, 28);
  out = sample(items, 7);
  sch.update(items, out);
  // 72 left: 18 a step -> 20.
  items = sch.schedule();
  EXPECT_EQ(items[0].n_tokens, 20);
  out = sample(items, 7);
  sch.update(items, out);
  // A second arrival adds to the backlog: (52 + 200) / 4 = 63 -> 64, the step budget: 2's last
  // 52 tokens and 3's first 12.
  sch.add(seq(3, 200, 4));
  items = sch.schedule();
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].seq->id, 2u);
  EXPECT_EQ(items[0].n_tokens, 52);
  EXPECT_EQ(items[1].seq->id, 3u);
  EXPECT_EQ(items[1].n_tokens, 12);
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

// Overlap scheduling: chain() gives the step after a decode batch whose update() has not run: the
// same sequences, one position further (a block reserved at a block boundary, a decode checkpoint
// planned one token ahead); it refuses when the batch would change.
TEST(Scheduler, ChainFeedsTheNextPositionOrRefusesWhenTheBatchWouldChange) {
  FakeCache cache(64, 4, 4);
  SchedulerConfig c = config(2, 64, 64);
  c.prefix_cache = true;
  c.decode_checkpoints = true;
  Scheduler sch(c, cache);
  sch.add(seq(1, 6, 20));
  sch.add(seq(2, 3, 2));
  auto items = sch.schedule();  // both prompts
  auto out = sample(items, 7);
  sch.update(items, out);
  std::vector<ScheduledItem> prev = sch.schedule();  // decodes: 1 feeds position 6, 2 position 3
  ASSERT_EQ(prev.size(), 2u);
  Sequence& a = *prev[0].seq;
  Sequence& b = *prev[1].seq;
  ASSERT_EQ(a.id, 1u);
  ASSERT_GE(a.rolling_slot, 0);  // admission took a rolling checkpoint slot (decode checkpoints)
  std::vector<ScheduledItem> next;
  // 2 takes its last token (length 3 + 2) in prev, but 1 goes on: chained.
  ASSERT_TRUE(sch.chain(prev, next));
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].seq, &a);
  EXPECT_EQ(next[0].n_tokens, 1);
  EXPECT_TRUE(next[0].sample);
  // 1's chained run feeds position 7, the last of its second block: its checkpoint covers 8 tokens.
  EXPECT_EQ(next[0].checkpoint_slot, a.rolling_slot);
  EXPECT_EQ(next[0].checkpoint_pos, 8);
  EXPECT_GE(a.blocks.size() * 4, 8u);
  EXPECT_EQ(next[1].checkpoint_slot, -1);
  // prev's results, then the chained step's: 2 finished in prev, so its chained run is dropped.
  out = sample(prev, 9);
  sch.update(prev, out);
  EXPECT_EQ(out[1].finish, FinishReason::Length);
  out = sample(next, 9);
  sch.update(next, out);
  EXPECT_FALSE(out[0].dropped);
  EXPECT_TRUE(out[1].dropped);
  EXPECT_EQ(out[1].n_emit, 0);
  EXPECT_EQ(a.n_computed, 8);
  EXPECT_EQ(a.rolling_pos, 8);
  EXPECT_EQ(b.n_computed, 4);  // prev's update only
  // A finished sequence in the batch ends the chain.
  EXPECT_FALSE(sch.chain(next, prev));
  EXPECT_EQ(sch.take_finished().size(), 1u);
  sch.check_integrity();
  // A waiting request that could be admitted ends it too; once running is full, it does not.
  prev = sch.schedule();
  ASSERT_EQ(prev.size(), 1u);
  sch.add(seq(3, 5, 4));
  EXPECT_FALSE(sch.chain(prev, next));
  out = sample(prev, 9);
  sch.update(prev, out);
  prev = sch.schedule();  // 1 decodes beside 3's prompt: not a decode batch
  ASSERT_EQ(prev.size(), 2u);
  out = sample(prev, 9);
  sch.update(prev, out);
  prev = sch.schedule();
  ASSERT_EQ(prev.size(), 2u);
  sch.add(seq(4, 5, 4));
  EXPECT_TRUE(sch.chain(prev, next));  // max running 2: 4 waits either way
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

namespace deltaserve::test {
namespace {

std::vector<int32_t> toks(int n, int32_t base) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = base + i;
  return t;
}

// The tree on its own: matches end at the deepest checkpoint (models with state), LRU eviction
// of leaves and checkpoints, references held and given back.
TEST(PrefixCache, MatchesEndAtCheckpointsAndEvictLeastRecentlyUsedFirst) {
  FakeCache cache(16, 2, 4);
  PrefixCache pc(4, cache);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(cache.blocks().allocate(4, blocks));
  const auto a = toks(16, 100);
  const int ck = cache.acquire_checkpoint();
  pc.insert(a, blocks, 3, ck);  // 3 blocks, state after token 12
  EXPECT_EQ(pc.n_cached_blocks(), 3);
  EXPECT_EQ(pc.n_checkpoints(), 1);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cache.blocks().ref_count(blocks[i]), 2);
  EXPECT_EQ(cache.blocks().ref_count(blocks[3]), 1);
  // The same 16 tokens: 3 blocks cached, and a checkpoint at 12.
  PrefixCache::Match m = pc.match(a, 15);
  EXPECT_EQ(m.n_tokens, 12);
  EXPECT_EQ(m.checkpoint_slot, ck);
  EXPECT_EQ(m.blocks, std::vector<int32_t>(blocks.begin(), blocks.begin() + 3));
  EXPECT_EQ(pc.match_length(a, 11), 0) << "no checkpoint at 4 or 8";
  // A prompt that leaves the path inside block 2 gets nothing (no checkpoint before it).
  auto b = a;
  b[9] = 7;
  EXPECT_EQ(pc.match(b, 15).n_tokens, 0);
  // The sequence lets go of its blocks: the cache alone holds three; the fourth is free.
  for (int32_t x : blocks) cache.blocks().release(x);
  EXPECT_EQ(cache.blocks().n_used(), 3);
  pc.check_integrity();
  // Eviction frees leaves first, then their parents.
  EXPECT_TRUE(pc.evict_blocks(cache.blocks().n_total() - 1));
  EXPECT_EQ(pc.n_cached_blocks(), 1);
  EXPECT_EQ(pc.n_checkpoints(), 0);
  EXPECT_EQ(cache.n_checkpoints_free(), 4);
  pc.clear();
  EXPECT_EQ(cache.blocks().n_used(), 0);
  pc.check_integrity();
  cache.check_integrity();
}

// Eviction passes over cached blocks a running sequence still holds: removing them frees nothing
// and only loses the prefix (once, such leaves were dropped with their checkpoints).
TEST(PrefixCache, EvictionLeavesBlocksInUseCached) {
  FakeCache cache(8, 2, 4);
  PrefixCache pc(4, cache);
  std::vector<int32_t> held, done;
  ASSERT_TRUE(cache.blocks().allocate(2, held));
  ASSERT_TRUE(cache.blocks().allocate(2, done));
  const auto a = toks(8, 100), b = toks(8, 300);
  pc.insert(a, held, 2, cache.acquire_checkpoint());  // a running sequence's prompt, still held
  pc.insert(b, done, 2, cache.acquire_checkpoint());  // a finished one's, the tree's alone
  for (int32_t x : done) cache.blocks().release(x);
  // b was used after a, so LRU order would take a's leaf first; nothing of a can come free.
  pc.match(b, 8);
  EXPECT_FALSE(pc.evict_blocks(cache.blocks().n_total()));
  EXPECT_EQ(cache.blocks().n_free(), 6);  // b's two blocks freed, a's kept
  EXPECT_EQ(pc.n_cached_blocks(), 2);
  EXPECT_EQ(pc.n_checkpoints(), 1);
  EXPECT_EQ(pc.match(a, 8).n_tokens, 8);
  for (int32_t x : held) cache.blocks().release(x);
  pc.check_integrity();
  pc.clear();
  cache.check_integrity();
}

// A checkpoint on a straight path gives way to a deeper one; a branch point (a shared system
// prompt) or a pinned one stays.
TEST(PrefixCache, DropsASupersededCheckpointButNotABranchPoint) {
  FakeCache cache(16, 2, 4);
  PrefixCache pc(4, cache);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(cache.blocks().allocate(4, blocks));
  const auto a = toks(16, 100);
  pc.insert(a, blocks, 2, cache.acquire_checkpoint());  // state after token 8
  pc.insert(a, blocks, 3, -1);                           // the path goes on (one child)
  EXPECT_FALSE(pc.drop_superseded_checkpoint(a, 4)) << "no checkpoint there";
  EXPECT_TRUE(pc.drop_superseded_checkpoint(a, 8));
  EXPECT_EQ(pc.n_checkpoints(), 0);
  EXPECT_EQ(cache.n_checkpoints_free(), 4);
  // Two continuations of the first 8 tokens: the checkpoint at 8 is where they part.
  pc.insert(a, blocks, 2, cache.acquire_checkpoint());
  auto b = a;
  b[9] = 7;
  std::vector<int32_t> other;
  ASSERT_TRUE(cache.blocks().allocate(1, other));
  std::vector<int32_t> b_blocks{blocks[0], blocks[1], other[0]};
  pc.insert(b, b_blocks, 3, -1);
  EXPECT_FALSE(pc.drop_superseded_checkpoint(a, 8)) << "a branch point";
  EXPECT_EQ(pc.n_checkpoints(), 1);
  pc.clear();
  for (int32_t x : blocks) cache.blocks().release(x);
  cache.blocks().release(other[0]);
  EXPECT_EQ(cache.blocks().n_used(), 0);
  cache.check_integrity();
}

TEST(PrefixCache, WithoutStateAnyMatchedBlockCounts) {
  FakeCache cache(16, 2, 0, /*state=*/false);
  PrefixCache pc(4, cache);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(cache.blocks().allocate(3, blocks));
  const auto a = toks(12, 5);
  pc.insert(a, blocks, 3, -1);
  auto b = a;
  b[9] = 0;  // diverges in block 2
  EXPECT_EQ(pc.match(b, 12).n_tokens, 8);
  EXPECT_EQ(pc.match(a, 11).n_tokens, 8) << "at most max_tokens, whole blocks";
  EXPECT_EQ(pc.match(a, 12).n_tokens, 12);
}

// Two prompts with a common prefix: the second resumes after the first's checkpoint, sharing its
// blocks and copying its state; usage counts the cached tokens.
TEST(Scheduler, SecondRequestResumesFromTheCachedPrompt) {
  FakeCache cache(64, 4, 8);
  SchedulerConfig c = config(4, 64, 256);
  c.prefix_cache = true;
  Scheduler sch(c, cache);
  auto a = seq(1, 30, 3);  // prompt of 30: checkpoint at 28 (the last whole block before token 29)
  sch.add(std::move(a));
  auto items = sch.schedule();
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].checkpoint_pos, 28);
  EXPECT_EQ(items[0].checkpoint_at, 27);
  sch.check_integrity();
  auto out = sample(items, 7);
  sch.update(items, out);
  sch.check_integrity();
  EXPECT_EQ(sch.prefix_cache()->n_cached_blocks(), 7);
  EXPECT_EQ(sch.prefix_cache()->n_checkpoints(), 1);
  // Same first 29 tokens, then different.
  auto b = seq(2, 34, 3);
  b->tokens[29] = 999;
  sch.add(std::move(b));
  items = sch.schedule();
  ASSERT_EQ(items.size(), 2u);
  // The prefill chunk first, then the decode row (mixed steps: one-token runs last).
  const ScheduledItem& bi = items[0];
  EXPECT_EQ(bi.seq->id, 2u);
  EXPECT_EQ(items[1].seq->id, 1u);
  EXPECT_EQ(items[1].n_tokens, 1);
  EXPECT_EQ(bi.seq->n_cached, 28);
  EXPECT_EQ(bi.seq->n_computed, 28);
  EXPECT_EQ(bi.n_tokens, 6);
  ASSERT_EQ(cache.copies.size(), 1u);
  EXPECT_EQ(cache.copies[0].second, bi.seq->slot);
  sch.check_integrity();
  out = sample(items, 7);
  sch.update(items, out);
  sch.check_integrity();
}

// A request whose prefix a running prefill is computing waits for it rather than computing it twice.
TEST(Scheduler, WaitsForARunningPrefillOfItsPrefix) {
  FakeCache cache(256, 4, 8);
  SchedulerConfig c = config(4, 16, 256);
  c.prefix_cache = true;
  Scheduler sch(c, cache);
  sch.add(seq(1, 60, 2));
  auto items = sch.schedule();  // 1 takes its first chunk of 16
  auto twin = seq(2, 60, 2);    // the same prompt
  sch.add(std::move(twin));
  auto out = sample(items, 7);
  sch.update(items, out);
  int steps = 0;
  while (steps++ < 10) {
    items = sch.schedule();
    bool admitted = false;
    for (const auto& it : items) admitted = admitted || it.seq->id == 2;
    if (admitted) {
      // It starts after the first request's prompt-end checkpoint (56 of 60).
      for (const auto& it : items)
        if (it.seq->id == 2) EXPECT_EQ(it.seq->n_cached, 56);
      break;
    }
    EXPECT_EQ(sch.n_waiting(), 1);
    out = sample(items, 7);
    sch.update(items, out);
    sch.check_integrity();
  }
  EXPECT_LE(steps, 5) << "the twin was admitted once the prompt was cached";
}

// Cached data gives way: a pool full of cache admits new requests by evicting, never failing them.
TEST(Scheduler, CacheIsEvictedForRunningRequests) {
  FakeCache cache(12, 2, 2);
  SchedulerConfig c = config(2, 64, 64);
  c.prefix_cache = true;
  c.decode_checkpoints = true;
  Scheduler sch(c, cache);
  for (RequestId id = 1; id <= 6; ++id) {
    sch.add(seq(id, 20, 3));
    int guard = 0;
    while (sch.has_work() && guard++ < 50) {
      auto items = sch.schedule();
      sch.check_integrity();
      auto out = sample(items, static_cast<int32_t>(300 + id));
      sch.update(items, out);
      sch.take_finished();
      sch.check_integrity();
    }
    ASSERT_FALSE(sch.has_work()) << "request " << id;
  }
  EXPECT_EQ(sch.n_preempted(), 0u);
  EXPECT_GT(sch.prefix_cache()->n_cached_blocks(), 0);
}

// Two conversations taking turns at once, with a checkpoint per request slot and prompts longer
// than a chunk: every turn resumes at least from the end of the previous turn's prompt. A chunk
// boundary's checkpoint comes only from a free slot, so it never evicts the other conversation's.
TEST(Scheduler, ConcurrentConversationsKeepTheirCheckpointsAcrossTurns) {
  FakeCache cache(512, 2, 2);
  SchedulerConfig c = config(2, 16, 24);  // a budget below two chunks: prompts share the steps
  c.prefix_cache = true;
  c.decode_checkpoints = true;
  Scheduler sch(c, cache);
  std::vector<std::vector<int32_t>> convo(2);
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < 40; ++i) convo[k].push_back(1000 * (k + 1) + i);  // distinct system prompts
  RequestId id = 0;
  for (int turn = 0; turn < 5; ++turn) {
    std::vector<int> prev_len(2);
    std::vector<RequestId> ids(2);
    for (int k = 0; k < 2; ++k) {
      for (int i = 0; i < 10; ++i) convo[k].push_back(1000 * (k + 1) + 100 * (turn + 1) + i);  // the user turn
      prev_len[k] = static_cast<int>(convo[k].size());
      auto s = std::make_unique<Sequence>();
      s->id = ids[k] = ++id;
      s->tokens = convo[k];
      s->n_prompt = static_cast<int>(convo[k].size());
      s->max_total_tokens = s->n_prompt + 3;
      s->params.ignore_eos = true;
      sch.add(std::move(s));
    }
    std::vector<int> cached(2, -1);
    int guard = 0;
    while (sch.has_work() && guard++ < 200) {
      auto items = sch.schedule();
      auto out = sample(items, static_cast<int32_t>(7 + turn));
      sch.update(items, out);
      for (auto& done : sch.take_finished()) {
        const int k = done->id == ids[0] ? 0 : 1;
        cached[k] = done->n_cached;
        convo[k] = done->tokens;  // prompt + reply: the next turn's history
      }
      sch.check_integrity();
    }
    ASSERT_FALSE(sch.has_work()) << "turn " << turn;
    for (int k = 0; k < 2; ++k) {
      if (turn == 0) {
        EXPECT_EQ(cached[k], 0);
      } else {
        // At least the previous prompt's checkpoint (its last whole block before the user turn).
        EXPECT_GE(cached[k], prev_len[k] - 10 - 3 - 2 * c.block_size) << "turn " << turn << " conversation " << k;
      }
    }
  }
}

// The randomised run again, with the prefix cache and decode checkpoints: prompts share
// prefixes, and every block reference and checkpoint stays accounted for after every step.
TEST(Scheduler, RandomisedRunWithPrefixCacheKeepsInvariants) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    FakeCache cache(40, 4, 6, /*state=*/seed % 3 != 0);
    SchedulerConfig c = config(4, 6, 12);
    c.prefix_cache = true;
    c.decode_checkpoints = seed % 2 == 0;
    c.policy = seed % 4 == 1 ? SchedulePolicy::Lpm : SchedulePolicy::Fcfs;
    Scheduler sch(c, cache);
    RequestId next = 1;
    int finished = 0, removed = 0, added = 0;
    const std::vector<int32_t> shared = toks(40, 500);
    for (int step = 0; step < 600; ++step) {
      if (added < 40 && rng() % 3 == 0) {
        auto s = seq(next++, 1 + int(rng() % 30), 1 + int(rng() % 20));
        const int keep = int(rng() % (s->tokens.size() + 1));  // a shared prefix of random length
        std::copy(shared.begin(), shared.begin() + keep, s->tokens.begin());
        sch.add(std::move(s));
        ++added;
      }
      if (rng() % 29 == 0 && next > 1 && sch.remove(1 + rng() % (next - 1))) ++removed;
      const auto items = sch.schedule();
      sch.check_integrity();
      std::vector<StepOutput> out(items.size());
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].sample) continue;
        Sequence& s = *items[i].seq;
        const int32_t tok = rng() % 12 == 0 ? 2 : 7;
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
      for (size_t i = 0; i < items.size(); ++i) {
        Sequence& s = *items[i].seq;
        if (out[i].n_accepted >= 0 && s.status != SeqStatus::Finished) sch.commit_checkpoint(s, out[i].n_accepted + 1);
        if (items[i].sample && s.status != SeqStatus::Finished) {
          const int want = int(rng() % 4);
          if (want > 0 && sch.reserve(s, int(s.tokens.size()) + want)) s.n_drafts = want;
        }
      }
      finished += static_cast<int>(sch.take_finished().size());
      sch.check_integrity();
      if (added == 40 && !sch.has_work()) break;
    }
    EXPECT_FALSE(sch.has_work()) << "seed " << seed;
    EXPECT_EQ(finished + removed, added) << "seed " << seed;
    ASSERT_TRUE(sch.flush_prefix_cache());
    EXPECT_EQ(cache.blocks().n_used(), 0) << "seed " << seed;
    EXPECT_EQ(cache.n_checkpoints_free(), cache.n_checkpoints_total()) << "seed " << seed;
  }
}

}  // namespace
}  // namespace deltaserve::test
