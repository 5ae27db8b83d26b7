// Speculative rollback: after partial acceptance, every GDN layer's conv and recurrent state must
// equal the state of a run that never saw the rejected drafts (on the CPU and on CUDA); and
// speculative sampling must produce exactly the target distribution.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/backend_factory.h"
#include "engine/model_setup.h"
#include "engine/sampler.h"
#include "../model/fixture.h"

namespace deltaserve::test {
namespace {

// The slot's GDN state (conv and recurrent, every layer) on the host.
std::vector<float> slot_state(const ModelSetup& m, int slot) {
  std::vector<float> out;
  for (const auto& v : m.cache->views().state) {
    const int64_t conv = v.conv.numel() / v.conv.dim(0), rec = v.recurrent.numel() / v.recurrent.dim(0);
    std::vector<float> c(conv), r(rec);
    m.backend->copy_to_host(c.data(), Tensor(v.conv.f32() + slot * conv, DType::F32, {conv}, v.conv.device));
    m.backend->copy_to_host(r.data(), Tensor(v.recurrent.f32() + slot * rec, DType::F32, {rec}, v.recurrent.device));
    out.insert(out.end(), c.begin(), c.end());
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

// A sequence with a prompt prefilled: its slot and KV blocks (room for 80 tokens).
struct TestSeq {
  int slot = -1;
  std::vector<int32_t> blocks;
};
void start(ModelSetup& m, const std::vector<int32_t>& prompt, TestSeq& s) {
  s.slot = m.cache->acquire_slot();
  ASSERT_GE(s.slot, 0);
  ASSERT_TRUE(m.cache->blocks().allocate(m.blocks_for(80), s.blocks));
  RunItem pre{prompt, 0, s.blocks, s.slot, false, false};
  m.runner->run(std::span<const RunItem>(&pre, 1));
}
void finish(ModelSetup& m, TestSeq& s) {
  for (auto b : s.blocks) m.cache->blocks().release(b);
  s.blocks.clear();
  m.cache->release_slot(s.slot);
}

// Two sequences after a prompt and a main forward of 3 tokens each (other tokens each round),
// ready for an MTP catch-up: catchup[i] feeds t_{p+1} for h_p, hidden rows 3i .. 3i+2.
struct TwoSeqs {
  TestSeq seq[2];
  std::vector<int32_t> fed[2], next[2];
  RunItem catchup[2];
  void start_round(ModelSetup& m, const std::vector<int32_t>& prompt, int round) {
    const int P = static_cast<int>(prompt.size());
    RunItem items[2];
    for (int i = 0; i < 2; ++i) {
      ASSERT_NO_FATAL_FAILURE(start(m, prompt, seq[i]));
      for (int j = 0; j < 4; ++j) fed[i].push_back(100 + 37 * round + 11 * i + 5 * j);
      next[i] = std::vector<int32_t>(fed[i].begin() + 1, fed[i].end());
      items[i] = RunItem{std::span<const int32_t>(fed[i]).first(3), P, seq[i].blocks, seq[i].slot, false, false};
      catchup[i] = RunItem{next[i], P, seq[i].blocks, seq[i].slot, false, false};
    }
    m.runner->run(items);
  }
  void finish_all(ModelSetup& m) {
    for (TestSeq& q : seq) finish(m, q);
  }
};

class SpecRollback : public ::testing::TestWithParam<std::string> {};

// A verification defers the GDN state; committing the last token and `accepted` drafts must
// leave the state a run that never saw the rejected drafts has (and the same next logits).
// Two sequences verify in one batch, so commits of different lengths go through one call.
TEST_P(SpecRollback, CommittedStateEqualsStateWithoutRejectedDrafts) {
  if (GetParam() == "cuda" && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  SetupOptions o;
  o.model_dir = (source_dir() / "models/tiny-coder").string();
  o.n_threads = 2;
  o.device = GetParam();
  o.pending_depth = 4;  // k = 3 drafts + the last token
  // Exact GEMMs on CUDA (f32-accurate at every row count) keep the verification and the runs of
  // the tokens that stand on the same arithmetic, so what differs is the rollback alone. (The
  // default mode rounds matmul inputs to bf16: runs of different lengths then part by ~1e-3
  // wherever an input lands on the other side of a rounding step.)
  if (GetParam() == "cuda") setenv("DELTASERVE_CUDA_GEMM", "exact", 1);
  auto made = ModelSetup::create(o, 64, 4, 80, 64);
  unsetenv("DELTASERVE_CUDA_GEMM");
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  ModelSetup& m = **made;
  const float state_tol = GetParam() == "cuda" ? 1e-4f : 1e-5f;

  const std::vector<int32_t> prompt = {755, 1200, 30, 418, 279, 12};
  const std::vector<int32_t> verify[2] = {{9, 40, 41, 42}, {17, 300, 301, 302}};  // last token + 3 drafts
  const int P = static_cast<int>(prompt.size());
  for (int accepted = 0; accepted <= 3; ++accepted) {
    // Sequences 0, 1 verify (deferred); 2, 3 see only the tokens that stand.
    TestSeq seq[4];
    for (TestSeq& q : seq) ASSERT_NO_FATAL_FAILURE(start(m, prompt, q));
    const int keep[2] = {accepted, 3 - accepted};  // drafts kept by sequence 0 and 1
    const RunItem vs[2] = {RunItem{verify[0], P, seq[0].blocks, seq[0].slot, true, false, true},
                           RunItem{verify[1], P, seq[1].blocks, seq[1].slot, true, false, true}};
    const std::vector<float> before = slot_state(m, seq[0].slot);
    m.runner->run(vs);
    EXPECT_EQ(slot_state(m, seq[0].slot), before) << "a deferred run left the state as it was";
    const StateCommit commits[2] = {{seq[0].slot, keep[0] + 1}, {seq[1].slot, keep[1] + 1}};
    m.runner->commit_state(commits);
    for (int i = 0; i < 2; ++i) {
      RunItem plain{std::span<const int32_t>(verify[i]).first(keep[i] + 1), P, seq[2 + i].blocks, seq[2 + i].slot,
                    false, false};
      m.runner->run(std::span<const RunItem>(&plain, 1));
      const auto sa = slot_state(m, seq[i].slot), sb = slot_state(m, seq[2 + i].slot);
      ASSERT_EQ(sa.size(), sb.size());
      float maxd = 0;
      for (size_t j = 0; j < sa.size(); ++j) maxd = std::max(maxd, std::fabs(sa[j] - sb[j]));
      EXPECT_LE(maxd, state_tol) << "sequence " << i << " kept " << keep[i];
      // The next decode step (KV length shrunk to P + kept + 1) gives the same logits.
      const int32_t next = 77;
      const int32_t pos = P + keep[i] + 1;
      RunItem na{std::span<const int32_t>(&next, 1), pos, seq[i].blocks, seq[i].slot, false, false};
      m.runner->run(std::span<const RunItem>(&na, 1));
      std::vector<float> la(m.runner->logits(0), m.runner->logits(0) + m.runner->vocab());
      RunItem nb{std::span<const int32_t>(&next, 1), pos, seq[2 + i].blocks, seq[2 + i].slot, false, false};
      m.runner->run(std::span<const RunItem>(&nb, 1));
      float ld = 0;
      for (int64_t j = 0; j < m.runner->vocab(); ++j) ld = std::max(ld, std::fabs(la[j] - m.runner->logits(0)[j]));
      EXPECT_LE(ld, GetParam() == "cuda" ? 1e-3f : 1e-4f) << "sequence " << i << " kept " << keep[i];
    }
    for (TestSeq& q : seq) finish(m, q);
    m.cache->check_integrity();
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, SpecRollback, ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return info.param; });

// The MTP catch-up step after a verification (every sequence feeds its accepted tokens and the
// next one) replays a CUDA graph per batch size and tokens per sequence. Four rounds of two
// sequences with three tokens each (eager, capture, replay, replay), each round with other tokens,
// must give the logits of a runner that never uses graphs.
TEST(MtpGraphs, CatchUpReplaysGiveTheEagerLogitsOnCuda) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  SetupOptions o;
  o.model_dir = (source_dir() / "models/tiny-coder").string();
  o.device = "cuda";
  o.pending_depth = 4;  // k = 3 drafts + the last token
  auto graphed = ModelSetup::create(o, 64, 2, 80, 64);
  o.cuda_graphs = false;
  auto eager = ModelSetup::create(o, 64, 2, 80, 64);
  ASSERT_TRUE(graphed.is_ok() && eager.is_ok());
  const std::vector<int32_t> prompt = {755, 1200, 30, 418, 279, 12};
  int64_t catchup_replays = 0;
  for (int round = 0; round < 4; ++round) {
    std::vector<float> logits[2];  // [graphed, eager]: 2 rows each
    for (int which = 0; which < 2; ++which) {
      ModelSetup& m = which == 0 ? **graphed : **eager;
      TwoSeqs t;
      ASSERT_NO_FATAL_FAILURE(t.start_round(m, prompt, round));
      const std::vector<int32_t> rows = {0, 1, 2, 3, 4, 5};
      const int64_t before = m.runner->graph_replays();
      m.runner->run_mtp(t.catchup, ModelRunner::HiddenFrom::Main, rows);
      if (which == 0) catchup_replays += m.runner->graph_replays() - before;
      ASSERT_EQ(m.runner->n_output_rows(), 2);
      for (int r = 0; r < 2; ++r)
        logits[which].insert(logits[which].end(), m.runner->logits(r), m.runner->logits(r) + m.runner->vocab());
      t.finish_all(m);
    }
    float maxd = 0;
    for (std::size_t j = 0; j < logits[0].size(); ++j) maxd = std::max(maxd, std::fabs(logits[0][j] - logits[1][j]));
    EXPECT_LE(maxd, 1e-5f) << "round " << round;
  }
  EXPECT_EQ(catchup_replays, 3) << "rounds 1..3 replay the graph captured in round 1";
  EXPECT_EQ((*eager)->runner->graph_replays(), 0);
}

// A greedy MTP draft chain with its ids kept on the device (ModelRunner::Fetch::Keep: each step
// fed the previous step's argmax without a host round trip) gives the drafts the step-by-step host
// chain gives (Fetch::Argmax, each draft copied back and fed as a host token): two sequences, a
// catch-up and two chain steps, three rounds (on CUDA the chain steps replay graphs from round 2).
class MtpChain : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpChain, KeptDeviceChainGivesTheHostChainsDrafts) {
  if (GetParam() == "cuda" && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  SetupOptions o;
  o.model_dir = (source_dir() / "models/tiny-coder").string();
  o.device = GetParam();
  o.pending_depth = 4;  // k = 3 drafts + the last token
  auto setup = ModelSetup::create(o, 64, 2, 80, 64);
  ASSERT_TRUE(setup.is_ok());
  ModelSetup& m = **setup;
  ASSERT_TRUE(m.runner->can_keep());
  const std::vector<int32_t> prompt = {755, 1200, 30, 418, 279, 12};
  const int P = static_cast<int>(prompt.size());
  const int32_t placeholder = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<int32_t> drafts[2];  // [host chain, kept chain]: 3 drafts of each sequence, step-major
    for (int which = 0; which < 2; ++which) {
      const bool kept = which == 1;
      TwoSeqs t;
      ASSERT_NO_FATAL_FAILURE(t.start_round(m, prompt, round));
      const std::vector<int32_t> rows = {0, 1, 2, 3, 4, 5};
      m.runner->run_mtp(t.catchup, ModelRunner::HiddenFrom::Main, rows,
                        kept ? ModelRunner::Fetch::Keep : ModelRunner::Fetch::Argmax);
      int32_t last[2] = {0, 0};
      if (!kept)
        for (int i = 0; i < 2; ++i) drafts[0].push_back(last[i] = m.runner->token(i));
      std::vector<int32_t> chain_rows = {2, 5};  // each sequence's last catch-up row
      for (int j = 1; j <= 2; ++j) {
        RunItem step[2];
        for (int i = 0; i < 2; ++i)
          step[i] = RunItem{std::span<const int32_t>(kept ? &placeholder : &last[i], 1), P + 3 + j, t.seq[i].blocks,
                            t.seq[i].slot, false, false};
        if (kept) {
          m.runner->run_mtp(step, ModelRunner::HiddenFrom::Mtp, chain_rows, ModelRunner::Fetch::Keep, j - 1);
        } else {
          m.runner->run_mtp(step, ModelRunner::HiddenFrom::Mtp, chain_rows, ModelRunner::Fetch::Argmax);
          for (int i = 0; i < 2; ++i) drafts[0].push_back(last[i] = m.runner->token(i));
        }
        chain_rows = {0, 1};
      }
      if (kept) {
        m.runner->take_kept();
        for (int j = 0; j < 3; ++j)
          for (int i = 0; i < 2; ++i) drafts[1].push_back(m.runner->kept(j, i));
      }
      t.finish_all(m);
    }
    EXPECT_EQ(drafts[0], drafts[1]) << "round " << round;
  }
  if (GetParam() == "cuda") EXPECT_GT(m.runner->graph_replays(), 0);
}

INSTANTIATE_TEST_SUITE_P(Devices, MtpChain, ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return info.param; });

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
