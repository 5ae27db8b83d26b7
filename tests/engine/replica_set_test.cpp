// Data parallelism (--dp-size): a ReplicaSet of engines behind one EngineService. Requests spread
// over the replicas (least loaded first) and come out exactly as from one engine; cancels reach
// the replica that holds the request; statistics add up, per replica in /metrics; make_replicas
// shares the process's capacity out, and refuses GPUs until replicas get GPUs of their own.
#include <gtest/gtest.h>

#include "app/engine_setup.h"
#include "engine/replica_set.h"
#include "server/server_metrics.h"
#include "../model/fixture.h"

namespace deltaserve::test {
namespace {

EngineConfig config() {
  EngineConfig c;
  c.model_dir = source_dir() / "models/tiny-coder";
  c.n_threads = 1;
  c.max_running_requests = 4;
  c.max_waiting_requests = 16;
  c.context_length = 512;
  c.kv_tokens = 2048;
  c.kv_block_size = 16;
  c.chunked_prefill_size = 64;
  c.max_prefill_tokens = 128;
  return c;
}

std::unique_ptr<Engine> engine() {
  auto e = Engine::create(config());
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  return std::move(*e);
}

std::vector<std::vector<int32_t>> generate_all(EngineService& e, int n_requests, int n_tokens) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int p = 0; p < n_requests; ++p) {
    GenerateRequest r;
    r.id = e.next_request_id();
    for (int i = 0; i < 8 + 5 * p; ++i) r.prompt.push_back(static_cast<int32_t>((i * 31 + p * 97 + 3) % 8000));
    r.sampling.temperature = 0;
    r.sampling.max_tokens = n_tokens;
    r.sampling.ignore_eos = true;
    streams.push_back(e.submit(std::move(r)));
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& s : streams) {
    std::vector<int32_t> toks;
    while (auto ev = s->events.pop()) {
      toks.insert(toks.end(), ev->tokens.begin(), ev->tokens.end());
      if (ev->finish != FinishReason::None) break;
    }
    out.push_back(toks);
  }
  return out;
}

TEST(ReplicaSet, SpreadsRequestsAndMatchesOneEngine) {
  auto one = engine();
  one->start();
  const auto expect = generate_all(*one, 6, 12);
  one->stop();

  std::vector<std::unique_ptr<Engine>> engines;
  engines.push_back(engine());
  engines.push_back(engine());
  ReplicaSet set(std::move(engines));
  set.start();
  const auto got = generate_all(set, 6, 12);
  set.stop();
  EXPECT_EQ(got, expect);
  const auto per = set.replica_stats();
  ASSERT_EQ(per.size(), 2u);
  EXPECT_GT(per[0].generated_tokens_total, 0u);  // six requests submitted at once: both got some
  EXPECT_GT(per[1].generated_tokens_total, 0u);
  EXPECT_EQ(set.stats().generated_tokens_total, 6u * 12u);
  EXPECT_EQ(per[0].generated_tokens_total + per[1].generated_tokens_total, 6u * 12u);

  ServerMetrics metrics;
  const std::string text = metrics.render(set.stats(), per);
  EXPECT_NE(text.find("deltaserve_replica_generation_tokens_total{replica=\"1\"} " +
                      std::to_string(per[1].generated_tokens_total)),
            std::string::npos)
      << text.substr(0, 800);
  EXPECT_NE(text.find("deltaserve_generation_tokens_total 72"), std::string::npos);
}

TEST(ReplicaSet, CancelReachesTheReplicaHoldingTheRequest) {
  std::vector<std::unique_ptr<Engine>> engines;
  engines.push_back(engine());
  engines.push_back(engine());
  ReplicaSet set(std::move(engines));
  set.start();
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<RequestId> ids;
  for (int i = 0; i < 2; ++i) {  // one on each replica
    GenerateRequest r;
    r.id = set.next_request_id();
    ids.push_back(r.id);
    r.prompt = {8183, 755, 12, static_cast<int32_t>(400 + i)};
    r.sampling.max_tokens = 400;
    r.sampling.ignore_eos = true;
    streams.push_back(set.submit(std::move(r)));
  }
  for (RequestId id : ids) set.cancel(id);
  for (auto& s : streams) {
    FinishReason finish = FinishReason::None;
    int n = 0;
    while (auto ev = s->events.pop()) {
      n += static_cast<int>(ev->tokens.size());
      if (ev->finish != FinishReason::None) {
        finish = ev->finish;
        break;
      }
    }
    EXPECT_EQ(finish, FinishReason::Abort);
    EXPECT_LT(n, 400);
  }
  set.stop();
}

TEST(ReplicaSet, MakeReplicasSharesTheProcessCapacityAndRefusesGpus) {
  EngineConfig c = config();
  c.n_threads = 2;
  c.prefix_cache = true;
  c.checkpoint_slots = 8;
  auto r = make_replicas(c, nullptr, 2);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  ASSERT_EQ(r->size(), 2u);
  for (const auto& e : *r) {
    EXPECT_EQ(e->config().kv_tokens, 1024);
    EXPECT_EQ(e->config().max_running_requests, 2);
    EXPECT_EQ(e->config().checkpoint_slots, 4);
    EXPECT_EQ(e->config().n_threads, 1);
  }
  c.device = Device::Cuda;
  auto g = make_replicas(c, nullptr, 2);
  ASSERT_FALSE(g.is_ok());
  EXPECT_NE(g.status().message().find("--dp-size 2"), std::string::npos) << g.status().message();
}

}  // namespace
}  // namespace deltaserve::test
