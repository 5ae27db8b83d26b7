// StepCost: the prefill budget of a step that also decodes, from the step times it is told.
#include <gtest/gtest.h>

#include "engine/step_cost.h"

namespace deltaserve::test {
namespace {

TEST(StepCost, NothingKnownKeepsTheCap) {
  StepCost c(1024);
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 16384), 16384);
  c.observe(0, 8, 0.010);  // a decode step alone: the prefill token's cost is still unknown
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 16384), 16384);
  EXPECT_DOUBLE_EQ(c.decode_step_s(), 0.010);
  c.observe(512, 8, 0.2);  // a chunk below large_chunk does not time b
  EXPECT_EQ(c.prefill_token_s(), 0.0);
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 16384), 16384);
}

TEST(StepCost, BudgetIsRatioMinusOneDecodeStepsOfPrefillTokens) {
  StepCost c(1024);
  c.observe(0, 16, 0.017);    // d = 17 ms
  c.observe(8192, 0, 0.8192);  // b = 0.1 ms a token (a prefill-only step)
  EXPECT_DOUBLE_EQ(c.prefill_token_s(), 0.0001);
  // (2.5 - 1) x 17 ms / 0.1 ms = 255 tokens -> 240 in blocks of 16.
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 16384), 240);
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 100), 100);   // the cap
  EXPECT_EQ(c.mixed_prefill_tokens(1.0, 16, 16384), 16);  // at least one block
  // Small mixed steps do not move b, however long they take (their fixed costs over few tokens).
  for (int i = 0; i < 60; ++i) c.observe(48, 15, 0.040);
  EXPECT_DOUBLE_EQ(c.prefill_token_s(), 0.0001);
  EXPECT_EQ(c.mixed_prefill_tokens(2.5, 16, 16384), 240);
  // A large mixed step times b with the decode rows' share taken off: (1.117 - 0.017) / 1024.
  StepCost m(1024);
  m.observe(0, 4, 0.017);
  m.observe(1024, 4, 0.017 + 1024 * 0.0002);
  EXPECT_NEAR(m.prefill_token_s(), 0.0002, 1e-12);
}

TEST(StepCost, AveragesMoveTowardNewStepsAndIgnoreWhatCannotBeTimed) {
  StepCost c(64);
  c.observe(0, 1, 0.010);
  for (int i = 0; i < 40; ++i) c.observe(0, 1, 0.020);
  EXPECT_NEAR(c.decode_step_s(), 0.020, 1e-6);
  c.observe(512, 0, 0.0);   // no time
  c.observe(512, 0, -1.0);
  EXPECT_EQ(c.prefill_token_s(), 0.0);
  StepCost d(64);
  d.observe(512, 3, 0.05);  // a mixed step before any decode step: its decode share is unknown
  EXPECT_EQ(d.prefill_token_s(), 0.0);
  // b moves toward new large chunks.
  StepCost e(64);
  e.observe(640, 0, 0.064);
  for (int i = 0; i < 60; ++i) e.observe(640, 0, 0.128);
  EXPECT_NEAR(e.prefill_token_s(), 0.0002, 1e-9);
}

}  // namespace
}  // namespace deltaserve::test
