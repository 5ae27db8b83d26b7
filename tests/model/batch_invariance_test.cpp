// Batch invariance on the CPU: a sequence's logits are the same bits whether it runs alone or
// beside other sequences (their prompts prefilled in the same forward, their decode rows in the
// same steps, the batch growing and shrinking). Every CPU op is computed per row or per sequence
// in an order that does not depend on the rows beside it; the matmul keeps one summation order at
// every row count (cpu_matmul_kernels.h). So sampling with a seed draws the same tokens however
// the scheduler batches a request (overlap scheduling, arrivals, finishes).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "fixture.h"
#include "kv_runs.h"

namespace deltaserve::test {
namespace {

struct InvarianceCase {
  std::string name;
  std::string dir;
  int tp = 1;
};
std::ostream& operator<<(std::ostream& os, const InvarianceCase& c) { return os << c.name << "_tp" << c.tp; }

class BatchInvarianceTest : public ::testing::TestWithParam<InvarianceCase> {};

// Tokens [n] of a neighbour sequence: a fixed pattern over the vocabulary.
std::vector<int32_t> neighbour_tokens(int n, int64_t vocab, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>((int64_t(i) * 7919 + salt * 104729 + 3) % vocab);
  return t;
}

TEST_P(BatchInvarianceTest, ASequencesLogitsAreTheSameBitsAloneOrInABatch) {
  const InvarianceCase& c = GetParam();
  const auto dir = source_dir() / c.dir;
  Fixture fixture(dir);
  ASSERT_FALSE(fixture.cases().empty());
  const std::vector<int32_t>& a = fixture.cases().front().tokens;  // the sequence watched
  const int T = static_cast<int>(a.size()), P = T / 2;
  ASSERT_GE(T - P, 4);
  const int kNb = 37, kNc = 5;  // the neighbours' prompt lengths
  const int ctx = T + kNb + 16;

  SetupOptions o;
  o.model_dir = dir.string();
  o.n_threads = 2;
  o.tp_size = c.tp;
  auto created = ModelSetup::create(o, ctx + kNc + 16, 3, ctx, ctx + kNc + 16);
  ASSERT_TRUE(created.is_ok()) << created.status().message();
  ModelSetup& s = **created;
  const int64_t V = s.model->config().vocab_size;

  const std::vector<float> alone = prefill_then_decode_logits(s, a, P);  // [T, V]

  const std::vector<int32_t> b = neighbour_tokens(kNb + T, V, 1), cc = neighbour_tokens(kNc + T, V, 2);
  KvRunSeq sa(s, T), sb(s, kNb + T), sc(s, kNc + T);
  auto expect_rows = [&](int first_pos, int n_rows, int out_row, const std::string& what) {
    for (int r = 0; r < n_rows; ++r) {
      const float* got = s.runner->logits(out_row + r);
      const float* want = alone.data() + int64_t(first_pos + r) * V;
      if (std::memcmp(got, want, static_cast<size_t>(V) * sizeof(float)) != 0) {
        int64_t v = 0;
        while (got[v] == want[v]) ++v;
        FAIL() << what << ": position " << first_pos + r << " logit " << v << " is " << got[v] << " in the batch, "
               << want[v] << " alone";
      }
    }
  };
  // One forward: b's prompt, a's prompt (every row's logits), c's prompt.
  {
    const RunItem items[] = {{std::span(b).first(kNb), 0, sb.blocks, sb.slot, false, false},
                             {std::span(a).first(P), 0, sa.blocks, sa.slot, true, false},
                             {std::span(cc).first(kNc), 0, sc.blocks, sc.slot, false, false}};
    s.runner->run(items);
    expect_rows(0, P, 1, "prefill beside two prompts");
    if (HasFatalFailure()) return;
  }
  // Decode steps: a beside b always and beside c every other step (3, 2, 3, .. rows), a first or
  // last in the batch.
  for (int p = P; p < T; ++p) {
    const int i = p - P;
    std::vector<RunItem> items;
    const RunItem ia{std::span(a).subspan(p, 1), p, sa.blocks, sa.slot, false, false};
    const RunItem ib{std::span(b).subspan(kNb + i, 1), kNb + i, sb.blocks, sb.slot, false, false};
    const RunItem ic{std::span(cc).subspan(kNc + i / 2, 1), kNc + i / 2, sc.blocks, sc.slot, false, false};
    if (i % 2 == 0) items = {ib, ic, ia};
    else items = {ia, ib};
    s.runner->run(items);
    expect_rows(p, 1, i % 2 == 0 ? 2 : 0, "decode step beside " + std::to_string(items.size() - 1) + " rows");
    if (HasFatalFailure()) return;
  }
}

// And the same bits however a sequence's tokens are cut into runs: every position in one prefill,
// against the first quarter in one and the rest one token per forward (decode), and against runs
// of 3. Attention sums each row's keys in the same order in a prefill tile and in a short run
// (cpu_attention_test); the GDN delta rule goes token by token through the same state arithmetic
// whatever the run (a state stored between runs is f32, exactly what a longer run carries on).
TEST_P(BatchInvarianceTest, ASequencesLogitsAreTheSameBitsHoweverItsTokensAreCutIntoRuns) {
  const InvarianceCase& c = GetParam();
  const auto dir = source_dir() / c.dir;
  Fixture fixture(dir);
  ASSERT_FALSE(fixture.cases().empty());
  const std::vector<int32_t>& a = fixture.cases().front().tokens;
  const int T = static_cast<int>(a.size());
  SetupOptions o;
  o.model_dir = dir.string();
  o.n_threads = 2;
  o.tp_size = c.tp;
  auto created = ModelSetup::create(o, T + 16, 2, T + 16, T + 16);
  ASSERT_TRUE(created.is_ok()) << created.status().message();
  ModelSetup& s = **created;
  const int64_t V = s.model->config().vocab_size;
  const std::vector<float> whole = prefill_then_decode_logits(s, a, T);
  const std::vector<float> stepped = prefill_then_decode_logits(s, a, T / 4);
  std::vector<float> threes;
  {
    KvRunSeq seq(s, T);
    for (int p = 0; p < T; p += 3) {
      const int n = std::min(3, T - p);
      RunItem item{std::span(a).subspan(p, n), p, seq.blocks, seq.slot, true, false};
      s.runner->run(std::span<const RunItem>(&item, 1));
      threes.insert(threes.end(), s.runner->logits(0), s.runner->logits(0) + int64_t(n) * V);
    }
  }
  const std::vector<float>* const runs[] = {&stepped, &threes};
  for (const std::vector<float>* got : runs) {
    ASSERT_EQ(got->size(), whole.size());
    for (int64_t i = 0; i < int64_t(whole.size()); ++i)
      if (std::memcmp(&(*got)[i], &whole[i], sizeof(float)) != 0)
        FAIL() << (got == &stepped ? "prefill + decode" : "runs of 3") << ": position " << i / V << " logit "
               << i % V << " is " << (*got)[i] << ", " << whole[i] << " prefilled whole";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchInvarianceTest,
                         ::testing::Values(InvarianceCase{"qwen35_tiny", "tests/fixtures/qwen35-tiny", 1},
                                           InvarianceCase{"qwen35_tiny", "tests/fixtures/qwen35-tiny", 2},
                                           InvarianceCase{"qwen3_tiny", "tests/fixtures/qwen3-tiny", 1},
                                           InvarianceCase{"tiny_coder", "models/tiny-coder", 1},
                                           InvarianceCase{"tiny_coder", "models/tiny-coder", 2}),
                         [](const auto& info) { return info.param.name + "_tp" + std::to_string(info.param.tp); });

}  // namespace
}  // namespace deltaserve::test
