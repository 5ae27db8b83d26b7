// A fixture case run by hand on a ModelSetup (model_fixture_test.cpp on the CPU, cuda_model_test.cpp
// on CUDA, weight_dtype_test.cpp): a sequence's KV blocks and state slot, its prompt through the
// model, and its MTP head teacher-forced.
#pragma once

#include <gtest/gtest.h>

#include <span>
#include <vector>

#include "engine/model_setup.h"
#include "fixture.h"

namespace deltaserve::test {

// A fresh sequence: blocks for max_tokens tokens and a zeroed state slot.
struct FixtureSeq {
  std::vector<int32_t> blocks;
  int slot = -1;

  static FixtureSeq acquire(ModelSetup& m, int max_tokens) {
    FixtureSeq s;
    s.slot = m.cache->acquire_slot();
    EXPECT_GE(s.slot, 0);
    EXPECT_TRUE(m.cache->blocks().allocate(m.blocks_for(max_tokens), s.blocks));
    return s;
  }
  void release(ModelSetup& m) {
    for (auto b : blocks) m.cache->blocks().release(b);
    m.cache->release_slot(slot);
    blocks.clear();
  }
};

// tokens from position 0 through the model in one run; logits of every position when `logits`
// (runner.logits(0) onwards).
inline void run_prompt(ModelSetup& m, std::span<const int32_t> tokens, const FixtureSeq& s, bool logits) {
  RunItem it{tokens, 0, s.blocks, s.slot, logits, false};
  m.runner->run(std::span<const RunItem>(&it, 1));
}

// After case c's prompt: its MTP head teacher-forced, row p taking (t_{p+1}, h_p), T - 1 rows,
// fetched as `fetch` says.
inline void mtp_teacher_forced(ModelSetup& m, const FixtureCase& c, const FixtureSeq& s,
                               ModelRunner::Fetch fetch = ModelRunner::Fetch::Logits) {
  const int T = static_cast<int>(c.tokens.size());
  std::vector<int32_t> next(c.tokens.begin() + 1, c.tokens.end());
  RunItem mi{next, 0, s.blocks, s.slot, true, false};
  std::vector<int32_t> rows(T - 1);
  for (int p = 0; p < T - 1; ++p) rows[p] = p;
  m.runner->run_mtp(std::span<const RunItem>(&mi, 1), ModelRunner::HiddenFrom::Main, rows, fetch);
}

}  // namespace deltaserve::test
