// bench-offline's figures from token events (app/batch_rates.h), on event series built by hand.
#include "app/batch_rates.h"

#include <gtest/gtest.h>

namespace deltaserve {
namespace {

// B sequences whose prompts are prefilled one a step (step = 10 ms): sequence b emits its first
// token at step b + 1 and then one a step, gen tokens in all.
std::vector<std::vector<EmittedTokens>> staggered(int batch, int gen) {
  std::vector<std::vector<EmittedTokens>> ev(batch);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < gen; ++i) ev[b].push_back({0.010 * (b + 1 + i), 1});
  return ev;
}

TEST(BatchRates, DecodeOnlyCountsTheStepsWhereAllSequencesDecode) {
  const auto ev = staggered(4, 20);
  const BatchRates r = batch_rates(0.0, 100, ev);
  EXPECT_EQ(r.generated, 80);
  // The first token of any sequence at 10 ms: 4 prompts of 100 tokens.
  EXPECT_NEAR(r.prefill_tok_s, 400 / 0.010, 1e-6);
  // Sequences 0..3 decode from 40 ms (the last one's first token) to 200 ms (the first one's last):
  // 16 steps of 4 tokens in 160 ms, 400 tok/s: the steady rate of 4 rows a step.
  EXPECT_NEAR(r.decode_only_tok_s, 400.0, 1e-6);
  // Tokens after each one's first (76) from 10 ms to 230 ms: the ramp and the tail included.
  EXPECT_NEAR(r.decode_tok_s, 76 / 0.220, 1e-6);
  EXPECT_LT(r.decode_tok_s, r.decode_only_tok_s);
}

TEST(BatchRates, SequencesInLockstepGiveTheSameDecodeOnlyRateAsAStagger) {
  std::vector<std::vector<EmittedTokens>> ev(4);
  for (int b = 0; b < 4; ++b)
    for (int i = 0; i < 20; ++i) ev[b].push_back({0.010 * (1 + i), 1});
  const BatchRates r = batch_rates(0.0, 100, ev);
  EXPECT_NEAR(r.decode_only_tok_s, 400.0, 1e-6);  // 19 steps after the first, 4 tokens each
  EXPECT_NEAR(r.decode_tok_s, 400.0, 1e-6);
}

TEST(BatchRates, NoStepWithAllSequencesDecodingGivesZero) {
  const auto ev = staggered(8, 3);  // sequence 0 finishes at 30 ms, sequence 7 starts at 80 ms
  const BatchRates r = batch_rates(0.0, 16, ev);
  EXPECT_EQ(r.decode_only_tok_s, 0.0);
  EXPECT_GT(r.decode_tok_s, 0.0);
}

TEST(BatchRates, SpeculativeEventsCountTheirTokens) {
  std::vector<std::vector<EmittedTokens>> ev(2);
  for (int b = 0; b < 2; ++b) {
    ev[b].push_back({0.010, 1});
    for (int i = 1; i <= 10; ++i) ev[b].push_back({0.010 * (1 + i), 3});  // 3 accepted a step
  }
  const BatchRates r = batch_rates(0.0, 8, ev);
  EXPECT_EQ(r.generated, 62);
  EXPECT_NEAR(r.decode_only_tok_s, 60 / 0.100, 1e-6);
}

TEST(BatchRates, ASequenceWithoutTokensGivesNoFigures) {
  std::vector<std::vector<EmittedTokens>> ev = staggered(2, 5);
  ev.push_back({});
  const BatchRates r = batch_rates(0.0, 8, ev);
  EXPECT_EQ(r.generated, 0);
  EXPECT_EQ(r.decode_only_tok_s, 0.0);
  EXPECT_EQ(r.prefill_tok_s, 0.0);
}

}  // namespace
}  // namespace deltaserve
