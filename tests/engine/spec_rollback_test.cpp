// Speculative rollback: after partial acceptance, every GDN layer's conv and recurrent state must
// equal the state of a run that never saw the rejected drafts; and speculative sampling must
// produce exactly the target distribution.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/model_setup.h"
#include "engine/sampler.h"
#include "../model/fixture.h"

namespace deltaserve::test {
namespace {

std::vector<float> slot_state(const CacheMemory& cache, int slot) {
  std::vector<float> out;
  for (const auto& v : cache.views().state) {
    const int64_t conv = v.conv.numel() / v.conv.dim(0), rec = v.recurrent.numel() / v.recurrent.dim(0);
    out.insert(out.end(), v.conv.f32() + slot * conv, v.conv.f32() + (slot + 1) * conv);
    out.insert(out.end(), v.recurrent.f32() + slot * rec, v.recurrent.f32() + (slot + 1) * rec);
  }
  return out;
}

TEST(SpecRollback, StateAfterPartialAcceptanceEqualsStateWithoutRejectedDrafts) {
  SetupOptions o;
  o.model_dir = (source_dir() / "models/tiny-coder").string();
  o.n_threads = 2;
  // Build a setup whose cache keeps 4 snapshots per slot (k = 3 drafts + the last token).
  auto base = ModelSetup::create(o, 64, 2, 80, 64);
  ASSERT_TRUE(base.is_ok()) << base.status().message();
  ModelSetup& m = **base;
  CacheConfig cc = m.cache->config();
  cc.snapshot_depth = 4;
  m.cache = std::make_unique<CacheMemory>(*m.backend, m.model->memory_spec(), cc);
  m.runner = std::make_unique<ModelRunner>(*m.backend, *m.model, *m.cache, m.runner->limits());

  const std::vector<int32_t> prompt = {755, 1200, 30, 418, 279, 12};
  const std::vector<int32_t> verify = {9, 40, 41, 42};  // last token + 3 drafts
  for (int accepted = 0; accepted <= 3; ++accepted) {
    std::vector<int32_t> blocks_a, blocks_b;
    int slot_a = m.cache->acquire_slot(), slot_b = m.cache->acquire_slot();
    ASSERT_TRUE(m.cache->blocks().allocate(m.blocks_for(80), blocks_a));
    ASSERT_TRUE(m.cache->blocks().allocate(m.blocks_for(80), blocks_b));
    const int P = static_cast<int>(prompt.size());
    for (auto [blocks, slot] : {std::pair{&blocks_a, slot_a}, std::pair{&blocks_b, slot_b}}) {
      RunItem pre{prompt, 0, *blocks, slot, false, false};
      m.runner->run(std::span<const RunItem>(&pre, 1));
    }
    // A: verify 4 tokens with snapshots, keep `accepted` drafts.
    RunItem va{verify, P, blocks_a, slot_a, true, false};
    m.runner->run(std::span<const RunItem>(&va, 1), /*write_snapshots=*/true);
    if (accepted < 3) m.cache->restore_snapshot(slot_a, accepted);
    // B: only ever sees the kept tokens.
    RunItem vb{std::span<const int32_t>(verify).first(accepted + 1), P, blocks_b, slot_b, false, false};
    m.runner->run(std::span<const RunItem>(&vb, 1));
    auto sa = slot_state(*m.cache, slot_a), sb = slot_state(*m.cache, slot_b);
    ASSERT_EQ(sa.size(), sb.size());
    float maxd = 0;
    for (size_t i = 0; i < sa.size(); ++i) maxd = std::max(maxd, std::fabs(sa[i] - sb[i]));
    EXPECT_LE(maxd, 1e-5f) << "accepted " << accepted;
    // The next decode step (KV length shrunk to P + accepted + 1) gives the same logits.
    const int32_t next = 77;
    const int32_t pos = P + accepted + 1;
    RunItem na{std::span<const int32_t>(&next, 1), pos, blocks_a, slot_a, false, false};
    m.runner->run(std::span<const RunItem>(&na, 1));
    std::vector<float> la(m.runner->logits(0), m.runner->logits(0) + m.runner->vocab());
    RunItem nb{std::span<const int32_t>(&next, 1), pos, blocks_b, slot_b, false, false};
    m.runner->run(std::span<const RunItem>(&nb, 1));
    float ld = 0;
    for (int64_t i = 0; i < m.runner->vocab(); ++i) ld = std::max(ld, std::fabs(la[i] - m.runner->logits(0)[i]));
    EXPECT_LE(ld, 1e-4f) << "accepted " << accepted;
    for (auto b : blocks_a) m.cache->blocks().release(b);
    for (auto b : blocks_b) m.cache->blocks().release(b);
    m.cache->release_slot(slot_a);
    m.cache->release_slot(slot_b);
  }
}

// Statistical check of the acceptance rule on a 6-token vocabulary: drafts drawn from q, passed
// through speculative_accept, must be distributed as p (chi-square, 200k samples).
TEST(SpecSampling, OutputDistributionEqualsTarget) {
  const std::vector<float> p = {0.05f, 0.30f, 0.10f, 0.25f, 0.00f, 0.30f};
  const std::vector<float> q = {0.40f, 0.05f, 0.20f, 0.05f, 0.20f, 0.10f};
  std::mt19937_64 rng(123);
  std::discrete_distribution<int> draft(q.begin(), q.end());
  const int N = 200000;
  std::vector<int> counts(p.size(), 0);
  int accepted = 0;
  std::vector<float> work;
  for (int i = 0; i < N; ++i) {
    work = p;
    int d = draft(rng);
    SpecDecision dec = speculative_accept(work, q, d, rng);
    accepted += dec.accepted;
    ++counts[dec.token];
  }
  double chi2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has zero target probability";
      continue;
    }
    const double e = p[i] * N;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  // 4 degrees of freedom: P(chi2 > 18.5) < 0.001.
  EXPECT_LT(chi2, 18.5);
  // Acceptance rate is sum(min(p, q)) = 0.05+0.05+0.10+0.05+0+0.10 = 0.35.
  EXPECT_NEAR(double(accepted) / N, 0.35, 0.01);
}

}  // namespace
}  // namespace deltaserve::test
