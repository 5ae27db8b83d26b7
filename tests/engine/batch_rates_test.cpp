// bench-offline's figures from token events (app/batch_rates.h), on event series built by hand.
#include "app/batch_rates.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "engine/engine.h"
#include "util/timer.h"

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

// A reader that pops late still gets the engine's times: the events' emitted_at, not its own clock
// (bench-offline's decode rates were timed at each reader thread's pop and varied 2x).
TEST(BatchRates, DrainedStreamsKeepTheEngineEmissionTimes) {
  RequestStream stream;
  for (int i = 0; i < 3; ++i) {
    TokenEvent ev;
    ev.tokens.assign(static_cast<std::size_t>(i + 1), 7);
    ev.emitted_at = 100.0 + 0.010 * i;
    stream.events.push(std::move(ev));
  }
  TokenEvent last;
  last.finish = FinishReason::Length;
  last.accept_length = 2.5;
  last.emitted_at = 100.020;
  stream.events.push(std::move(last));
  stream.events.close();
  const DrainedStream d = drain_stream(stream);
  ASSERT_EQ(d.emitted.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(d.emitted[static_cast<std::size_t>(i)].time, 100.0 + 0.010 * i);
    EXPECT_EQ(d.emitted[static_cast<std::size_t>(i)].tokens, i + 1);
  }
  EXPECT_EQ(d.accept_length, 2.5);
  EXPECT_EQ(d.error, "");
}

TEST(BatchRates, ADrainedStreamThatFailedNamesItsError) {
  RequestStream stream;
  TokenEvent ev;
  ev.finish = FinishReason::Error;
  ev.error = "too long";
  stream.events.push(std::move(ev));
  stream.events.close();
  const DrainedStream d = drain_stream(stream);
  EXPECT_TRUE(d.emitted.empty());
  EXPECT_EQ(d.error, "too long");
}

// The engine stamps each event when it pushes it, once per step: the events of one step share a
// time, and a stream read long after the engine finished still shows when its tokens came out.
TEST(BatchRates, TheEngineStampsEventsWhenItEmitsThem) {
  const std::filesystem::path source = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
  EngineConfig c;
  c.model_dir = source / "models/tiny-coder";
  c.n_threads = 1;
  c.max_running_requests = 2;
  c.max_waiting_requests = 4;
  c.context_length = 128;
  c.kv_tokens = 512;
  c.kv_block_size = 16;
  c.chunked_prefill_size = 64;
  c.max_prefill_tokens = 128;
  auto e = Engine::create(c);
  ASSERT_TRUE(e) << e.status().message();
  const double submitted = now_seconds();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int b = 0; b < 2; ++b) {
    GenerateRequest r;
    r.id = (*e)->next_request_id();
    r.prompt = {1 + b, 2, 3, 4, 5, 6, 7, 8};
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 6;
    r.sampling.ignore_eos = true;
    streams.push_back((*e)->submit(std::move(r)));
  }
  (*e)->start();  // both in its first step
  for (int i = 0; i < 2000; ++i) {  // both finished (their last events pushed)
    const EngineStats s = (*e)->stats();
    if (s.requests_running == 0 && s.requests_waiting == 0 && s.steps_total > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double finished = now_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // popped long after
  std::vector<DrainedStream> d;
  for (auto& s : streams) d.push_back(drain_stream(*s));
  (*e)->stop();
  for (const DrainedStream& x : d) {
    ASSERT_EQ(x.error, "");
    ASSERT_FALSE(x.emitted.empty());
    int tokens = 0;
    for (std::size_t i = 0; i < x.emitted.size(); ++i) {
      tokens += x.emitted[i].tokens;
      EXPECT_GE(x.emitted[i].time, submitted);
      EXPECT_LE(x.emitted[i].time, finished);  // not the pop time, 100 ms later
      if (i > 0) EXPECT_GE(x.emitted[i].time, x.emitted[i - 1].time);
    }
    EXPECT_EQ(tokens, 6);
  }
  // Admitted together: decoded in the same steps, stamped with the same times.
  ASSERT_EQ(d[0].emitted.size(), d[1].emitted.size());
  for (std::size_t i = 0; i < d[0].emitted.size(); ++i) EXPECT_EQ(d[0].emitted[i].time, d[1].emitted[i].time) << i;
}

}  // namespace
}  // namespace deltaserve
