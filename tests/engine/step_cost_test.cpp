// StepCost: the prefill budget of a step that also decodes, from the step times it is told.
#include <gtest/gtest.h>

#include "engine/step_cost.h"

namespace deltaserve::test {
namespace {

TEST(StepCost, NothingKnownKeepsTheCap) {
  StepCost c;
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 16384), 16384);
  c.observe(0, 8, 0.010);  // a decode step alone: the prefill token's cost is still unknown
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 16384), 16384);
  EXPECT_DOUBLE_EQ(c.decode_step_s(), 0.010);
  c.observe(8, 8, 0.2);  // a chunk of fewer than 16 tokens does not time b
  EXPECT_EQ(c.prefill_token_s(), 0.0);
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 16384), 16384);
}

// A step during which the backend did one-time set-up (its setup count moved: a GEMM algorithm
// timed, 0.1 s or more) teaches neither cost; the next step with the count unchanged does. Without
// the skip, HTTP TTFT p50 doubled on the H200 (stop 41: stalled steps taught the budget).
TEST(StepCost, StepsWithOneTimeSetupAreSkipped) {
  StepCost c;
  c.observe(0, 16, 0.017, 0);
  c.observe(0, 16, 0.150, 1);  // timed a GEMM bucket
  EXPECT_DOUBLE_EQ(c.decode_step_s(), 0.017);
  c.observe(8192, 0, 2.0, 3);  // and two more
  EXPECT_EQ(c.prefill_token_s(), 0.0);
  c.observe(8192, 0, 0.8192, 3);
  EXPECT_DOUBLE_EQ(c.prefill_token_s(), 0.0001);
  c.observe(0, 16, 0.017, 3);
  EXPECT_DOUBLE_EQ(c.decode_step_s(), 0.017);
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 16384), 240);
}

TEST(StepCost, BudgetIsRatioMinusOneDecodeStepsOfPrefillTokens) {
  StepCost c;
  c.observe(0, 16, 0.017);    // d = 17 ms
  c.observe(8192, 0, 0.8192);  // b = 0.1 ms a token (a prefill-only step)
  EXPECT_DOUBLE_EQ(c.prefill_token_s(), 0.0001);
  // (2.5 - 1) x 17 ms / 0.1 ms = 255 tokens -> 240 in blocks of 16.
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 16384), 240);
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 100), 100);   // the cap
  EXPECT_EQ(c.mixed_prefill_tokens(1.0, 16, 16384), 16);  // at least one block
  // Mixed steps of 48 tokens that take 40 ms: b moves to their marginal cost, (40 - 17) / 48
  // = 0.479 ms a token, and the budget to 1.5 x 17 / 0.479 = 53 -> 48.
  for (int i = 0; i < 80; ++i) c.observe(48, 15, 0.040);
  EXPECT_NEAR(c.prefill_token_s(), 0.023 / 48, 1e-9);
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 16384), 48);
  // A mixed step times b with the decode rows' share taken off: (0.2218 - 0.017) / 1024.
  StepCost m;
  m.observe(0, 4, 0.017);
  m.observe(1024, 4, 0.017 + 1024 * 0.0002);
  EXPECT_NEAR(m.prefill_token_s(), 0.0002, 1e-12);
}

TEST(StepCost, AveragesMoveTowardNewStepsAndIgnoreWhatCannotBeTimed) {
  StepCost c;
  c.observe(0, 1, 0.010);
  for (int i = 0; i < 40; ++i) c.observe(0, 1, 0.020);
  EXPECT_NEAR(c.decode_step_s(), 0.020, 1e-6);
  c.observe(512, 0, 0.0);   // no time
  c.observe(512, 0, -1.0);
  EXPECT_EQ(c.prefill_token_s(), 0.0);
  StepCost d;
  d.observe(512, 3, 0.05);  // a mixed step before any decode step: its decode share is unknown
  EXPECT_EQ(d.prefill_token_s(), 0.0);
  // b moves toward new steps.
  StepCost e;
  e.observe(640, 0, 0.064);
  for (int i = 0; i < 60; ++i) e.observe(640, 0, 0.128);
  EXPECT_NEAR(e.prefill_token_s(), 0.0002, 1e-9);
}

}  // namespace
}  // namespace deltaserve::test
