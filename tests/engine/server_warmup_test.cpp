// The server warm-up (app/server_warmup.h) on the CPU engine: two requests alone, then batches of
// 1, 2, 4 (max running 4, under kMaxWarmupBatch), every request finished with its tokens, and a request served after it
// gets the tokens a fresh engine gives.
#include <gtest/gtest.h>

#include "app/server_warmup.h"
#include "engine/engine.h"
#include "engine_fixture.h"

namespace deltaserve::test {
namespace {

std::vector<int32_t> greedy(Engine& e, int n) {
  GenerateRequest r;
  r.id = e.next_request_id();
  r.prompt = {8183, 755, 12, 400, 77};
  r.sampling.temperature = 0;
  r.sampling.max_tokens = n;
  r.sampling.ignore_eos = true;
  auto stream = e.submit(std::move(r));
  std::vector<int32_t> out;
  while (auto ev = stream->events.pop()) {
    out.insert(out.end(), ev->tokens.begin(), ev->tokens.end());
    if (ev->finish != FinishReason::None) break;
  }
  return out;
}

TEST(ServerWarmup, RunsBatchesUpToMaxRunningAndLeavesOutputsAlone) {
  EngineConfig c = small_engine_config();
  c.prefix_cache = true;
  c.checkpoint_slots = 4;
  auto fresh = Engine::create(c);
  ASSERT_TRUE(fresh.is_ok()) << fresh.status().message();
  (*fresh)->start();
  const std::vector<int32_t> want = greedy(**fresh, 12);
  (*fresh)->stop();

  auto e = Engine::create(c);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  (*e)->start();
  const WarmupResult w = warm_up_engine(**e, c.max_running_requests);
  EXPECT_EQ(w.batches, (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(w.failed, 0);
  EXPECT_EQ(w.tokens, 2 + 7 * 4);  // two alone of 1 token, then 7 requests of 4
  EXPECT_GT(w.seconds, 0.0);
  EXPECT_EQ(greedy(**e, 12), want);
  (*e)->stop();
  // Past kMaxWarmupBatch: capped.
  EXPECT_EQ(warm_up_engine_sizes(1000).back(), kMaxWarmupBatch);
}

}  // namespace
}  // namespace deltaserve::test
