// --speculative-num-steps auto (app/speculation_choice.h): the engine measures a greedy probe
// plainly and with each number of MTP draft steps and keeps the fastest; whichever it keeps, outputs stay identical to plain
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

TEST(SpeculationChoice, AnyStepsUpToTheConfigsGiveThePlainTokens) {
  const auto ref = plain_reference(40);
  auto e = make_engine(3);
  ASSERT_EQ(e->speculative_steps(), 3);
  for (int k : {0, 3, 1, 2, 0}) {
    e->set_speculative_steps(k);
    EXPECT_EQ(e->speculative_steps(), k);
    EXPECT_EQ(e->capacity().spec_num_steps, k);
    e->start();
    const Output o = generate(*e, 40);
    e->stop();
    EXPECT_EQ(o.tokens, ref) << k << " draft steps";
    if (k == 0) EXPECT_EQ(o.accept_length, 0.0);  // no verification steps
    else EXPECT_GT(o.accept_length, 1.0) << k;    // tiny-coder's trained head gets drafts accepted
    EXPECT_LE(o.accept_length, k + 1.0) << k;
  }
}

TEST(SpeculationChoice, AutoMeasuresEveryStepCountAndKeepsTheFastest) {
  const auto ref = plain_reference(40);
  auto e = make_engine(3);
  const SpeculationChoice c = choose_speculation(*e, flags({"--speculative-algorithm", "NEXTN"}), 32);
  ASSERT_TRUE(c.measured);
  ASSERT_EQ(c.probes.size(), 4u);
  const SpeculationProbe* best = nullptr;
  for (std::size_t i = 0; i < c.probes.size(); ++i) {
    const SpeculationProbe& p = c.probes[i];
    EXPECT_EQ(p.steps, i == 0 ? 0 : 4 - static_cast<int>(i));  // plain, then 3, 2, 1
    EXPECT_GT(p.tok_s, 0);
    if (p.steps == 0) EXPECT_EQ(p.accept_length, 0.0);
    else EXPECT_GT(p.accept_length, 1.0);
    if (p.steps > 0 && (!best || p.tok_s > best->tok_s)) best = &p;
  }
  // The fastest k where it beats plain decoding by 3%, else plain.
  EXPECT_EQ(c.steps, best->tok_s > 1.03 * c.probes[0].tok_s ? best->steps : 0);
  EXPECT_EQ(e->speculative_steps(), c.steps);
  EXPECT_EQ(e->capacity().spec_num_steps, c.steps);
  const std::string summary = c.summary();
  EXPECT_NE(summary.find(c.steps > 0 ? "MTP on" : "MTP off"), std::string::npos) << summary;
  for (const char* part : {" with 3 draft steps (accept length ", " with 2 draft steps", " with 1 draft step (", "plainly"})
    EXPECT_NE(summary.find(part), std::string::npos) << part << " in " << summary;
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

// Found by review (stop 55): with a context too short for the probe's prompt and tokens, every
// probe timed 0 tok/s (or ran past the context) and auto turned MTP off. The steps stand, and the
// summary says why nothing was measured.
TEST(SpeculationChoice, AContextTooShortForTheProbeKeepsTheSteps) {
  EngineConfig cfg = small_engine_config();
  cfg.spec_num_steps = 3;
  cfg.context_length = 40;
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  const SpeculationChoice c = choose_speculation(**e, flags({"--speculative-algorithm", "NEXTN"}), 32);
  EXPECT_FALSE(c.measured);
  EXPECT_EQ(c.steps, 3);
  EXPECT_EQ((*e)->speculative_steps(), 3);
  EXPECT_NE(c.summary().find("too short to time a probe"), std::string::npos) << c.summary();
  // A context with room for a few probe tokens: measured, within it.
  cfg.context_length = 60;
  auto f = Engine::create(cfg);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  const SpeculationChoice d = choose_speculation(**f, flags({"--speculative-algorithm", "NEXTN"}), 32);
  EXPECT_TRUE(d.measured);
  for (const SpeculationProbe& p : d.probes) EXPECT_GT(p.tok_s, 0) << p.steps;
}

TEST(SpeculationChoice, ExplicitStepsAndNoSpeculationAreLeftAlone) {
  auto e = make_engine(3);
  const SpeculationChoice c =
      choose_speculation(*e, flags({"--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"}), 32);
  EXPECT_FALSE(c.measured);
  EXPECT_EQ(c.steps, 3);
  EXPECT_EQ(e->speculative_steps(), 3);
  // --speculative-num-draft-tokens 4 says 3 steps as well: no probe either.
  const SpeculationChoice d =
      choose_speculation(*e, flags({"--speculative-algorithm", "EAGLE", "--speculative-num-draft-tokens", "4"}), 32);
  EXPECT_FALSE(d.measured);
  EXPECT_EQ(d.steps, 3);
  auto plain = make_engine(0);
  const SpeculationChoice p = choose_speculation(*plain, flags({}), 32);
  EXPECT_FALSE(p.measured);
  EXPECT_EQ(p.steps, 0);
}

}  // namespace
}  // namespace deltaserve::test
