// --speculative-num-steps auto (app/speculation_choice.h): the engine measures a greedy probe
// plainly and with MTP and keeps the faster; whichever it keeps, outputs stay identical to plain
// decoding, the counters start from zero, and explicit steps are never second-guessed.
#include <gtest/gtest.h>

#include "app/speculation_choice.h"
#include "engine/engine.h"
#include "engine_fixture.h"

namespace deltaserve::test {
namespace {

std::unique_ptr<Engine> make_engine(int spec_steps) {
  EngineConfig c = small_engine_config();
  c.spec_num_steps = spec_steps;
  c.prefix_cache = true;
  c.checkpoint_slots = 4;
  auto e = Engine::create(c);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  return std::move(*e);
}

ServeOptions flags(const std::vector<std::string>& args) {
  std::vector<std::string> a = {"--model-path", (source_dir() / "models/tiny-coder").string()};
  a.insert(a.end(), args.begin(), args.end());
  auto o = parse_serve_options(a, nullptr);
  EXPECT_TRUE(o.is_ok()) << o.status().message();
  return *o;
}

struct Output {
  std::vector<int32_t> tokens;
  double accept_length = 0;
};

Output generate(Engine& e, int n) {
  GenerateRequest r;
  r.id = e.next_request_id();
  r.prompt = {8183, 755, 12, 400, 77};
  r.sampling.temperature = 0;
  r.sampling.max_tokens = n;
  r.sampling.ignore_eos = true;
  auto stream = e.submit(std::move(r));
  Output o;
  while (auto ev = stream->events.pop()) {
    o.tokens.insert(o.tokens.end(), ev->tokens.begin(), ev->tokens.end());
    if (ev->finish != FinishReason::None) {
      o.accept_length = ev->accept_length;
      break;
    }
  }
  return o;
}

std::vector<int32_t> plain_reference(int n) {
  auto e = make_engine(0);
  e->start();
  auto o = generate(*e, n);
  e->stop();
  return o.tokens;
}

TEST(SpeculationChoice, SetSpeculationSwitchesBetweenPlainAndMtpWithTheSameTokens) {
  const auto ref = plain_reference(40);
  auto e = make_engine(3);
  ASSERT_EQ(e->speculative_steps(), 3);
  e->set_speculation(false);
  EXPECT_EQ(e->speculative_steps(), 0);
  e->start();
  const Output plain = generate(*e, 40);
  e->stop();
  EXPECT_EQ(plain.tokens, ref);
  EXPECT_EQ(plain.accept_length, 0.0);  // no verification steps
  e->set_speculation(true);
  EXPECT_EQ(e->speculative_steps(), 3);
  e->start();
  const Output spec = generate(*e, 40);
  e->stop();
  EXPECT_EQ(spec.tokens, ref);
  EXPECT_GT(spec.accept_length, 0.0);  // tiny-coder's trained head gets drafts accepted
}

TEST(SpeculationChoice, AutoMeasuresBothAndKeepsTheFaster) {
  const auto ref = plain_reference(40);
  auto e = make_engine(3);
  const SpeculationChoice c = choose_speculation(*e, flags({"--speculative-algorithm", "NEXTN"}), 32);
  ASSERT_TRUE(c.measured);
  EXPECT_GT(c.plain_tok_s, 0);
  EXPECT_GT(c.spec_tok_s, 0);
  EXPECT_GT(c.accept_length, 0);
  EXPECT_EQ(c.steps, c.spec_tok_s > c.plain_tok_s ? 3 : 0);
  EXPECT_EQ(e->speculative_steps(), c.steps);
  EXPECT_EQ(e->capacity().spec_num_steps, c.steps);
  EXPECT_NE(c.summary().find(c.steps > 0 ? "MTP on" : "MTP off"), std::string::npos) << c.summary();
  // The probes leave no trace: counters at zero, nothing cached, nothing held.
  const EngineStats s = e->stats();
  EXPECT_EQ(s.generated_tokens_total, 0u);
  EXPECT_EQ(s.prompt_tokens_total, 0u);
  EXPECT_EQ(s.spec_verify_steps_total, 0u);
  EXPECT_EQ(s.cached_blocks, 0);
  EXPECT_EQ(s.kv_tokens_used, 0);
  e->start();
  EXPECT_EQ(generate(*e, 40).tokens, ref);
  e->stop();
}

TEST(SpeculationChoice, ExplicitStepsAndNoSpeculationAreLeftAlone) {
  auto e = make_engine(3);
  const SpeculationChoice c =
      choose_speculation(*e, flags({"--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"}), 32);
  EXPECT_FALSE(c.measured);
  EXPECT_EQ(c.steps, 3);
  EXPECT_EQ(e->speculative_steps(), 3);
  auto plain = make_engine(0);
  const SpeculationChoice p = choose_speculation(*plain, flags({}), 32);
  EXPECT_FALSE(p.measured);
  EXPECT_EQ(p.steps, 0);
}

}  // namespace
}  // namespace deltaserve::test
