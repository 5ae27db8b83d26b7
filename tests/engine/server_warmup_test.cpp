// The server warm-up (app/server_warmup.h) on the CPU engine: two requests alone, then batches of
// 1, 2, 4 (max running 4, under kMaxWarmupBatch), every request finished with its tokens, and a
// request served after it gets the tokens a fresh engine gives.
#include <gtest/gtest.h>

#include "app/server_warmup.h"
#include "engine/engine.h"
#include "engine_fixture.h"

namespace deltaserve::test {
namespace {

const std::vector<std::vector<int32_t>> kPrompt = {{8183, 755, 12, 400, 77}};

TEST(ServerWarmup, RunsBatchesUpToMaxRunningAndLeavesOutputsAlone) {
  EngineConfig c = small_engine_config();
  c.prefix_cache = true;
  c.checkpoint_slots = 4;
  auto fresh = Engine::create(c);
  ASSERT_TRUE(fresh.is_ok()) << fresh.status().message();
  (*fresh)->start();
  const auto want = greedy_continuations(**fresh, kPrompt, 12);
  (*fresh)->stop();

  auto e = Engine::create(c);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  (*e)->start();
  const WarmupResult w = warm_up_engine(**e, c.max_running_requests);
  EXPECT_EQ(w.batches, (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(w.failed, 0);
  EXPECT_EQ(w.tokens, 2 + 7 * 4);  // two alone of 1 token, then 7 requests of 4
  EXPECT_GT(w.seconds, 0.0);
  EXPECT_EQ(greedy_continuations(**e, kPrompt, 12), want);
  (*e)->stop();
  // Past kMaxWarmupBatch: capped.
  EXPECT_EQ(warm_up_engine_sizes(1000).back(), kMaxWarmupBatch);
}

}  // namespace
}  // namespace deltaserve::test
