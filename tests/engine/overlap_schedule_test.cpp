// Overlap scheduling (EngineConfig::overlap_schedule): a greedy decode step launched before the
// tokens of the step before it are read gives exactly the tokens, finishes and prefix-cache
// behaviour of stepping one at a time: requests finishing at different steps (length and stop
// tokens, so chained steps run sequences that have finished and drop their tokens), rolling
// decode checkpoints cached for the next turn, arrivals and cancels while steps are chained, with
// the scheduler's integrity checked after every step. On the CPU (where a launch completes before
// it returns) and on CUDA (queued copies and events; skipped without a GPU).
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "backend/backend_factory.h"
#include "engine/engine.h"
#include "engine_fixture.h"

namespace deltaserve::test {
namespace {

struct Answer {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::None;
};

Answer drain(RequestStream& s) {
  Answer r;
  while (auto ev = s.events.pop()) {
    r.tokens.insert(r.tokens.end(), ev->tokens.begin(), ev->tokens.end());
    if (ev->finish != FinishReason::None) {
      r.finish = ev->finish;
      break;
    }
  }
  return r;
}

struct Ask {
  std::vector<int32_t> prompt;
  int max_tokens = 0;
  std::vector<int32_t> stop_ids;
  SamplingParams sampling = greedy();  // its max_tokens, ignore_eos and stop ids are set from the above

  static SamplingParams greedy() {
    SamplingParams p;
    p.temperature = 0;
    return p;
  }
};

std::shared_ptr<RequestStream> submit(Engine& e, const Ask& a) {
  GenerateRequest r;
  r.id = e.next_request_id();
  r.prompt = a.prompt;
  r.sampling = a.sampling;
  r.sampling.max_tokens = a.max_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.stop_token_ids = a.stop_ids;
  return e.submit(std::move(r));
}

std::vector<Answer> run_all(Engine& e, const std::vector<Ask>& asks) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const Ask& a : asks) streams.push_back(submit(e, a));
  std::vector<Answer> out;
  for (auto& s : streams) out.push_back(drain(*s));
  return out;
}

class OverlapSchedule : public ::testing::TestWithParam<std::tuple<std::string, std::string, int>> {
 protected:
  void SetUp() override {
    if (device() == "cuda") {
      if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
      // A chained step may run a finished sequence beside the others (a batch one row larger than
      // stepping one at a time): exact GEMMs keep each row's logits independent of the batch.
      setenv("DELTASERVE_CUDA_GEMM", "exact", 1);
      // Fewer GPUs than ranks: every rank on GPU 0.
      if (tp() > visible_cuda_devices()) setenv("DELTASERVE_TP_DEVICES", std::string(tp() == 2 ? "0,0" : "0,0,0,0").c_str(), 1);
    }
  }
  void TearDown() override {
    if (device() == "cuda") {
      unsetenv("DELTASERVE_CUDA_GEMM");
      unsetenv("DELTASERVE_TP_DEVICES");
    }
  }
  const std::string& model() const { return std::get<0>(GetParam()); }
  const std::string& device() const { return std::get<1>(GetParam()); }
  int tp() const { return std::get<2>(GetParam()); }

  // whole_prompts: every prompt prefilled in one piece in the first step after it arrives (budgets
  // above any prompt and any arrival's total). Otherwise a prompt's chunks depend on when the engine
  // thread picks the requests up and on the auto mixed budget, which is learnt from step times. A
  // sampled draw at temperature 1 can flip on the last bits that chunking changes (seen under load:
  // 2 of 25 runs).
  // start: false leaves the engine thread unstarted, so that requests submitted before start()
  // all arrive before its first step.
  std::unique_ptr<Engine> make(bool overlap, bool device_sampling = false, bool whole_prompts = false,
                               bool start = true) {
    EngineConfig c = small_engine_config(model());
    if (whole_prompts) c.max_prefill_tokens = c.mixed_prefill_tokens = 512;
    c.device_sampling = device_sampling;
    c.max_running_requests = 6;
    c.max_waiting_requests = 64;
    c.kv_tokens = 4096;
    c.prefix_cache = true;
    c.checkpoint_slots = 16;
    c.decode_checkpoints = true;
    c.overlap_schedule = overlap;
    c.check_integrity_every_step = true;
    c.tp_size = tp();
    if (device() == "cuda") {
      c.device = Device::Cuda;
      c.kv_cache_dtype = DType::BF16;
    }
    auto e = Engine::create(c);
    EXPECT_TRUE(e.is_ok()) << e.status().message();
    if (!e.is_ok()) return nullptr;
    if (start) (*e)->start();
    return std::move(*e);
  }
};

// Six requests at once, finishing at different steps by length and by a stop token; then a second
// turn of three of them (prompt + answer + more), which resumes from the checkpoints the first
// turn cached.
TEST_P(OverlapSchedule, ChainedStepsGiveTheTokensOfSteppingOneAtATime) {
  std::vector<Ask> asks;
  for (int i = 0; i < 6; ++i) {
    Ask a;
    for (int j = 0; j < 20 + 9 * i; ++j) a.prompt.push_back(10 + (37 * j + 11 * i) % 450);
    a.max_tokens = 12 + 7 * i;
    asks.push_back(a);
  }
  auto plain = make(false);
  ASSERT_NE(plain, nullptr);
  const std::vector<Answer> first = run_all(*plain, asks);
  // Requests 1 and 4 stop at a token of their own answer (the 6th and the 9th).
  asks[1].stop_ids = {first[1].tokens.at(5)};
  asks[4].stop_ids = {first[4].tokens.at(8)};
  const std::vector<Answer> expect = run_all(*plain, asks);
  EXPECT_EQ(expect[1].finish, FinishReason::Stop);
  EXPECT_EQ(expect[4].finish, FinishReason::Stop);
  std::vector<Ask> turn2;
  for (int i : {0, 2, 5}) {
    Ask a = asks[i];
    a.prompt.insert(a.prompt.end(), expect[i].tokens.begin(), expect[i].tokens.end());
    a.prompt.insert(a.prompt.end(), {300, 301, 302});
    a.max_tokens = 10;
    turn2.push_back(a);
  }
  const std::vector<Answer> expect2 = run_all(*plain, turn2);
  const EngineStats ps = idle_stats(*plain);
  EXPECT_EQ(ps.overlapped_steps_total, 0u);
  plain.reset();

  // The same requests in the same order (so both prefix caches hold the same prompts).
  auto over = make(true);
  ASSERT_NE(over, nullptr);
  std::vector<Ask> no_stops = asks;
  for (Ask& a : no_stops) a.stop_ids.clear();
  const std::vector<Answer> got0 = run_all(*over, no_stops);
  for (size_t i = 0; i < asks.size(); ++i) EXPECT_EQ(got0[i].tokens, first[i].tokens) << "request " << i;
  const std::vector<Answer> got = run_all(*over, asks);
  for (size_t i = 0; i < asks.size(); ++i) {
    EXPECT_EQ(got[i].tokens, expect[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].finish, expect[i].finish) << "request " << i;
  }
  const std::vector<Answer> got2 = run_all(*over, turn2);
  for (size_t i = 0; i < turn2.size(); ++i) EXPECT_EQ(got2[i].tokens, expect2[i].tokens) << "second turn " << i;
  const EngineStats os = idle_stats(*over);
  // Most decode steps were chained, and sequences finishing mid-batch had a chained step dropped.
  EXPECT_GT(os.overlapped_steps_total, os.decode_steps_total / 2);
  EXPECT_GT(os.overlap_dropped_tokens_total, 0u);
  EXPECT_EQ(os.generated_tokens_total, ps.generated_tokens_total);
  EXPECT_GT(os.prompt_tokens_cached_total, 0u);
}

// Sampled steps drawn on the device chain too: the next step's uniforms come from each request's
// own generator in the order stepping one at a time draws them, so seeded requests get the same
// tokens. A request with a penalty needs the token being picked to build the next step's
// penalties: while it runs nothing is chained, and chaining resumes after it finishes.
TEST_P(OverlapSchedule, SampledStepsChainAndDrawTheTokensOfSteppingOneAtATime) {
  std::vector<Ask> asks;
  for (int i = 0; i < 6; ++i) {
    Ask a;
    for (int j = 0; j < 18 + 7 * i; ++j) a.prompt.push_back(12 + (31 * j + 17 * i) % 440);
    a.max_tokens = 14 + 6 * i;
    SamplingParams& p = a.sampling;
    p = SamplingParams{};
    p.seed = 500 + static_cast<uint64_t>(i);
    p.temperature = 0.6f + 0.2f * float(i % 3);
    if (i == 1) p.top_k = 20, p.top_p = 0.95f;
    if (i == 2) p.top_p = 0.8f;
    if (i == 3) p.min_p = 0.05f, p.top_k = 40;
    if (i == 4) p.temperature = 0;  // greedy beside draws
    asks.push_back(a);
  }
  // The last request of the second round has a presence penalty and ends early.
  std::vector<Ask> with_penalty = asks;
  with_penalty[5].sampling.presence_penalty = 0.5f;
  with_penalty[5].max_tokens = 9;
  // Each round on a fresh engine, every request submitted before its first step, so that every run
  // has the same batches. (The GPU's GEMMs round by row count: a request that joins a step later
  // puts its decode rows beside another's prefill, and a draw at temperature 1 can flip to the
  // neighbouring token id. The CPU matmul used to as well, 1 run in ~60 under load in CI; it is
  // batch invariant now, tests/model/batch_invariance_test.cpp.)
  auto run_round = [&](bool overlap, const std::vector<Ask>& round, EngineStats* stats) {
    std::vector<Answer> out;
    auto e = make(overlap, true, true, /*start=*/false);
    if (!e) return out;
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const Ask& a : round) streams.push_back(submit(*e, a));
    e->start();
    for (auto& st : streams) out.push_back(drain(*st));
    *stats = idle_stats(*e);
    return out;
  };
  EngineStats p1, p2, o1, o2;
  const std::vector<Answer> expect = run_round(false, asks, &p1);
  const std::vector<Answer> expect_pen = run_round(false, with_penalty, &p2);
  ASSERT_EQ(expect.size(), asks.size());
  ASSERT_EQ(expect_pen.size(), asks.size());
  EXPECT_EQ(p1.overlapped_steps_total + p2.overlapped_steps_total, 0u);
  EXPECT_GT(p1.device_sampled_total, 0u);

  const std::vector<Answer> got = run_round(true, asks, &o1);
  ASSERT_EQ(got.size(), asks.size());
  for (size_t i = 0; i < asks.size(); ++i) EXPECT_EQ(got[i].tokens, expect[i].tokens) << "request " << i;
  EXPECT_GT(o1.overlapped_steps_total, o1.decode_steps_total / 2);
  EXPECT_GT(o1.overlap_dropped_tokens_total, 0u);
  const std::vector<Answer> got_pen = run_round(true, with_penalty, &o2);
  ASSERT_EQ(got_pen.size(), asks.size());
  for (size_t i = 0; i < asks.size(); ++i) EXPECT_EQ(got_pen[i].tokens, expect_pen[i].tokens) << "request " << i << " (penalty beside)";
  // The first 9 tokens' steps ran one at a time; the rest chained again.
  EXPECT_GT(o2.overlapped_steps_total, 0u);
  EXPECT_LE(o2.overlapped_steps_total + 8, o2.decode_steps_total);
  EXPECT_EQ(o2.generated_tokens_total, p2.generated_tokens_total);
}

// Arrivals and cancels while steps are chained: each breaks the chain until the engine has taken
// it; every answer is still the one stepping one at a time gives.
TEST_P(OverlapSchedule, ArrivalsAndCancelsWhileChained) {
  std::vector<Ask> asks;
  for (int i = 0; i < 5; ++i) {
    Ask a;
    for (int j = 0; j < 16 + 5 * i; ++j) a.prompt.push_back(20 + (29 * j + 13 * i) % 430);
    a.max_tokens = 40;
    asks.push_back(a);
  }
  auto plain = make(false);
  ASSERT_NE(plain, nullptr);
  const std::vector<Answer> expect = run_all(*plain, asks);
  plain.reset();

  auto over = make(true);
  ASSERT_NE(over, nullptr);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(submit(*over, asks[i]));
  // Once request 0 decodes, two more arrive and request 1 is cancelled.
  auto ev = streams[0]->events.pop();
  ASSERT_TRUE(ev.has_value());
  std::vector<int32_t> head = ev->tokens;
  for (int i = 3; i < 5; ++i) streams.push_back(submit(*over, asks[i]));
  over->cancel(streams[1]->id);
  Answer r0 = drain(*streams[0]);
  head.insert(head.end(), r0.tokens.begin(), r0.tokens.end());
  EXPECT_EQ(head, expect[0].tokens);
  const Answer r1 = drain(*streams[1]);
  EXPECT_TRUE(r1.finish == FinishReason::Abort || r1.finish == FinishReason::Length);
  for (int i = 2; i < 5; ++i) EXPECT_EQ(drain(*streams[i]).tokens, expect[i].tokens) << "request " << i;
  const EngineStats s = idle_stats(*over);
  EXPECT_GT(s.overlapped_steps_total, 0u);
}

// Tensor parallelism: each rank feeds the chained step from its own copy of the gathered logits.
INSTANTIATE_TEST_SUITE_P(Models, OverlapSchedule,
                         ::testing::Values(std::make_tuple("models/tiny-coder", "cpu", 1),
                                           std::make_tuple("tests/fixtures/qwen3-tiny", "cpu", 1),
                                           std::make_tuple("models/tiny-coder", "cpu", 2),
                                           std::make_tuple("models/tiny-coder", "cuda", 1),
                                           std::make_tuple("tests/fixtures/qwen3-tiny", "cuda", 1),
                                           std::make_tuple("models/tiny-coder", "cuda", 2)),
                         [](const auto& info) {
                           const std::string& d = std::get<0>(info.param);
                           return std::string(d.find("coder") != std::string::npos ? "tiny_coder" : "qwen3_tiny") +
                                  "_" + std::get<1>(info.param) + "_tp" + std::to_string(std::get<2>(info.param));
                         });

// A request alone chains every decode step but the one after its last token; with speculative
// decoding every step runs alone. The plan says which.
TEST(OverlapScheduleAlone, OnlyTheStepAfterTheLastTokenIsNotChained) {
  for (int spec : {0, 2}) {
    EngineConfig c = small_engine_config();
    c.overlap_schedule = true;
    c.spec_num_steps = spec;
    auto e = Engine::create(c);
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    const std::string plan = (*e)->plan_summary();
    EXPECT_NE(plan.find(spec ? "overlap schedule off" : "overlap schedule on"), std::string::npos) << plan;
    (*e)->start();
    Ask a{{81, 75, 120, 40}, 16, {}};
    EXPECT_EQ(drain(*submit(**e, a)).tokens.size(), 16u);
    const EngineStats s = idle_stats(**e);
    // 15 decode steps after the prefill step's token: the first launched alone, 14 chained.
    EXPECT_EQ(s.overlapped_steps_total, spec ? 0u : 14u);
    EXPECT_EQ(s.overlap_dropped_tokens_total, 0u);
  }
}

}  // namespace
}  // namespace deltaserve::test
