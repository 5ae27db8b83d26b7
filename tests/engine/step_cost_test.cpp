// StepCost: the prefill budget of a step that also decodes, from the step times it is told.
#include <gtest/gtest.h>

#include "engine/step_cost.h"

namespace deltaserve::test {
namespace {

TEST(StepCost, NothingKnownKeepsTheCap) {
  StepCost c;
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 1024), 1024);
  c.observe(0, 8, 0.010);  // a decode step alone: the prefill token's cost is still unknown
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 1024), 1024);
  EXPECT_DOUBLE_EQ(c.decode_step_s(), 0.010);
}

TEST(StepCost, BudgetIsRatioMinusOneDecodeStepsOfPrefillInWholeBlocks) {
  StepCost c;
  c.observe(0, 16, 0.017);     // decode step 17 ms
  c.observe(1000, 0, 0.100);   // a prefill step: 0.1 ms a token
  // (2.5 - 1) x 17 ms / 0.1 ms = 255 tokens -> 240 in blocks of 16.
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 16384), 240);
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 100), 100);  // the cap
  EXPECT_EQ(c.mixed_prefill_tokens(1.0, 16, 16384), 16);  // at least one block
  // A mixed step: its decode rows' share (one decode step) comes off before the per-token cost.
  StepCost m;
  m.observe(0, 4, 0.020);
  m.observe(200, 4, 0.060);  // (60 - 20) ms / 200 tokens = 0.2 ms a token
  EXPECT_DOUBLE_EQ(m.prefill_token_s(), 0.0002);
  EXPECT_EQ(m.mixed_prefill_tokens(3.0, 10, 100000), 200);  // 2 x 20 ms / 0.2 ms
}

TEST(StepCost, AveragesMoveTowardNewStepsAndIgnoreWhatCannotBeTimed) {
  StepCost c;
  c.observe(0, 1, 0.010);
  for (int i = 0; i < 40; ++i) c.observe(0, 1, 0.020);
  EXPECT_NEAR(c.decode_step_s(), 0.020, 1e-6);
  c.observe(8, 1, 0.5);      // too few prefill tokens to time
  c.observe(512, 0, 0.0);    // no time
  c.observe(512, 0, -1.0);
  EXPECT_EQ(c.prefill_token_s(), 0.0);
  StepCost d;
  d.observe(512, 3, 0.05);   // a mixed step before any decode step: its decode share is unknown
  EXPECT_EQ(d.prefill_token_s(), 0.0);
}

}  // namespace
}  // namespace deltaserve::test
