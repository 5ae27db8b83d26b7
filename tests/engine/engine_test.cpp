// The Engine end to end (no HTTP): greedy output through continuous batching equals the
// reference continuation; speculative decoding (MTP) with k = 1, 2, 3, 5 is token-for-token
// identical to plain decoding, alone and batched; preemption under KV pressure changes nothing;
// cancel frees memory; bad requests get errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "../model/fixture.h"
#include "engine_fixture.h"

namespace deltaserve::test {
namespace {

std::unique_ptr<Engine> make_engine(const std::string& dir, int spec_steps, int max_running = 8,
                                    int64_t kv_tokens = 0, uint64_t random_seed = 0) {
  EngineConfig c = small_engine_config(dir);
  if (random_seed != 0) c.random_seed = random_seed;
  c.spec_num_steps = spec_steps;
  c.max_running_requests = max_running;
  c.max_waiting_requests = 256;
  c.kv_tokens = kv_tokens > 0 ? kv_tokens : 512 * int64_t(max_running);
  auto e = Engine::create(c);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  (*e)->start();
  return std::move(*e);
}

struct Output {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::None;
  double accept_length = 0;
  std::string error;
};

Output collect(RequestStream& s) {
  Output o;
  while (auto ev = s.events.pop()) {
    o.tokens.insert(o.tokens.end(), ev->tokens.begin(), ev->tokens.end());
    if (ev->finish != FinishReason::None) {
      o.finish = ev->finish;
      o.accept_length = ev->accept_length;
      o.error = ev->error;
      break;
    }
  }
  return o;
}

std::shared_ptr<RequestStream> submit(Engine& e, std::vector<int32_t> prompt, int max_tokens,
                                      float temperature = 0.0f, std::optional<uint64_t> seed = {}) {
  GenerateRequest r;
  r.id = e.next_request_id();
  r.prompt = std::move(prompt);
  r.sampling.temperature = temperature;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.seed = seed;
  return e.submit(std::move(r));
}

void expect_idle(Engine& e) { (void)idle_stats(e); }

// Step statistics: steps whose batch holds a prefill chunk are counted apart from decode steps
// (bench-offline's per-decode-step time). A 50-token prompt in chunks of 16 takes 4 prefill steps
// (the last one samples the first token); the other 9 tokens take a decode step each.
TEST(Engine, DecodeStepsAreCountedApartFromPrefillSteps) {
  EngineConfig c = small_engine_config();
  c.chunked_prefill_size = 16;
  c.max_prefill_tokens = 16;
  auto e = Engine::create(c);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  (*e)->start();
  std::vector<int32_t> prompt(50);
  for (int i = 0; i < 50; ++i) prompt[i] = 100 + 7 * i;
  const auto out = greedy_continuations(**e, {prompt}, 10);
  ASSERT_EQ(out[0].size(), 10u);
  EngineStats st;
  for (int i = 0; i < 10000; ++i) {  // the step that emitted the last token publishes after it
    st = (*e)->stats();
    if (st.steps_total == 13) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(st.steps_total, 13u);
  EXPECT_EQ(st.decode_steps_total, 9u);
  EXPECT_GT(st.decode_step_seconds, 0.0);
  EXPECT_LT(st.decode_step_seconds, st.step_seconds);
  EXPECT_LE(st.decode_forward_seconds, st.forward_seconds);
  (*e)->stop();
}

// Stop 54: the last event of a request went out before the engine published its counts without
// it, so a client that had its whole reply and read /metrics at once saw it still running (25 of
// 50 tries), and dp's least-loaded dispatch read the same stale load.
TEST(Engine, AFinishedRequestIsGoneFromTheCountsWhenItsLastEventArrives) {
  auto e = Engine::create(small_engine_config());
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  (*e)->start();
  for (int round = 0; round < 20; ++round) {
    const auto out = greedy_continuations(**e, {{1, 2, 3, 4, 5 + round}}, 3);
    ASSERT_EQ(out[0].size(), 3u);
    const EngineStats st = (*e)->stats();
    EXPECT_EQ(st.requests_running, 0) << "round " << round;
    EXPECT_EQ(st.kv_tokens_used, 0) << "round " << round;
  }
  (*e)->stop();
}

// A prompt that arrives while another request decodes is prefilled mixed_prefill_tokens a step
// (here 16: 13 steps for 200 tokens, against 4 in chunks of 64), and both outputs are what each
// request gives alone. With auto (0) the engine sets the budget from the steps it timed: whole
// blocks, at most max_prefill_tokens.
TEST(Engine, PrefillBesideADecodeKeepsTheMixedBudgetAndTheOutputs) {
  std::vector<int32_t> a_prompt(20), b_prompt(200);
  for (int i = 0; i < 20; ++i) a_prompt[i] = 100 + 3 * i;
  for (int i = 0; i < 200; ++i) b_prompt[i] = 200 + 5 * i;
  std::vector<std::vector<int32_t>> alone;
  {
    auto e = Engine::create(small_engine_config());
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    (*e)->start();
    alone.push_back(greedy_continuations(**e, {a_prompt}, 60)[0]);
    alone.push_back(greedy_continuations(**e, {b_prompt}, 4)[0]);
    (*e)->stop();
  }
  for (int mixed : {16, 0}) {
    EngineConfig c = small_engine_config();
    c.mixed_prefill_tokens = mixed;
    auto e = Engine::create(c);
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    (*e)->start();
    auto a = submit(**e, a_prompt, 60);
    // a decodes from its first token on; after its third, decode steps have been timed.
    std::vector<int32_t> a_first;
    while (a_first.size() < 3) {
      auto ev = a->events.pop();
      ASSERT_TRUE(ev);
      a_first.insert(a_first.end(), ev->tokens.begin(), ev->tokens.end());
    }
    auto b = submit(**e, b_prompt, 4);
    Output oa = collect(*a), ob = collect(*b);
    oa.tokens.insert(oa.tokens.begin(), a_first.begin(), a_first.end());
    EXPECT_EQ(oa.tokens, alone[0]) << "mixed " << mixed;
    EXPECT_EQ(ob.tokens, alone[1]) << "mixed " << mixed;
    const EngineStats st = idle_stats(**e);
    if (mixed == 16) {
      EXPECT_EQ(st.mixed_prefill_tokens, 16);
      EXPECT_GE(st.steps_total - st.decode_steps_total, 1u + 13u);  // a's prompt, then b's 13 chunks
    } else {
      // On a CPU a decode step costs a few prefill tokens (tiny-coder: ~0.8 ms against ~0.15 ms a
      // token), far from the 128 / 1.5 = 85 that would leave the cap in place.
      EXPECT_GE(st.mixed_prefill_tokens, 16);
      EXPECT_LT(st.mixed_prefill_tokens, c.max_prefill_tokens);
      EXPECT_EQ(st.mixed_prefill_tokens % 16, 0);
    }
    (*e)->stop();
  }
}

TEST(Engine, GreedyContinuationMatchesReferenceForTinyCoder) {
  Fixture fx(source_dir() / "models/tiny-coder");
  auto e = make_engine("models/tiny-coder", 0);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& c : fx.cases()) {
    std::vector<int32_t> prompt(c.tokens.begin(), c.tokens.begin() + c.prompt_len);
    streams.push_back(submit(*e, prompt, static_cast<int>(c.tokens.size()) - c.prompt_len));
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    const auto& c = fx.cases()[i];
    Output o = collect(*streams[i]);
    std::vector<int32_t> expect(c.tokens.begin() + c.prompt_len, c.tokens.end());
    EXPECT_EQ(o.tokens, expect) << c.name;  // tiny-coder's margins are all > 0.04
    EXPECT_EQ(o.finish, FinishReason::Length);
  }
  expect_idle(*e);
}

class SpecEquivalence : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(SpecEquivalence, GreedyOutputIdenticalToPlainDecoding) {
  const auto& [dir, k] = GetParam();
  Fixture fx(source_dir() / dir);
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : fx.cases()) prompts.emplace_back(c.tokens.begin(), c.tokens.begin() + c.prompt_len);
  const int n_gen = 40;
  auto plain = make_engine(dir, 0);
  std::vector<std::vector<int32_t>> expect;
  for (auto& p : prompts) expect.push_back(collect(*submit(*plain, p, n_gen)).tokens);
  plain.reset();

  auto spec = make_engine(dir, k);
  // Alone.
  for (size_t i = 0; i < prompts.size(); ++i) {
    Output o = collect(*submit(*spec, prompts[i], n_gen));
    EXPECT_EQ(o.tokens, expect[i]) << "alone, prompt " << i;
    EXPECT_GE(o.accept_length, 1.0);
  }
  // Batched: all prompts at once (different acceptance per sequence in one batch).
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (auto& p : prompts) streams.push_back(submit(*spec, p, n_gen));
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(collect(*streams[i]).tokens, expect[i]) << "batched, prompt " << i;
  expect_idle(*spec);
}

INSTANTIATE_TEST_SUITE_P(Models, SpecEquivalence,
                         ::testing::Combine(::testing::Values("models/tiny-coder", "tests/fixtures/qwen35-tiny"),
                                            ::testing::Values(1, 2, 3, 5)),
                         [](const auto& info) {
                           std::string d = std::get<0>(info.param);
                           return std::string(d.find("coder") != std::string::npos ? "tiny_coder" : "qwen35_tiny") +
                                  "_k" + std::to_string(std::get<1>(info.param));
                         });

TEST(Engine, SpeculativeAcceptLengthOnCodeIsAboveTwoAtK3) {
  Fixture fx(source_dir() / "models/tiny-coder");
  auto e = make_engine("models/tiny-coder", 3);
  double sum = 0;
  for (const auto& c : fx.cases()) {
    std::vector<int32_t> prompt(c.tokens.begin(), c.tokens.begin() + c.prompt_len);
    sum += collect(*submit(*e, prompt, 48)).accept_length;
  }
  EXPECT_GT(sum / fx.cases().size(), 2.0);
}

// tiny-coder with MTP k = 3 and the prefix cache (4 checkpoints), 2 running requests, contexts of
// up to 1,024 tokens and 512-token prefill chunks; started.
std::unique_ptr<Engine> spec_cache_engine() {
  EngineConfig c = small_engine_config("models/tiny-coder");
  c.spec_num_steps = 3;
  c.max_running_requests = 2;
  c.kv_tokens = 2048;
  c.context_length = 1024;
  c.chunked_prefill_size = 512;
  c.max_prefill_tokens = 512;
  c.prefix_cache = true;
  c.checkpoint_slots = 4;
  auto made = Engine::create(c);
  EXPECT_TRUE(made.is_ok()) << made.status().message();
  if (!made.is_ok()) return nullptr;
  (*made)->start();
  return std::move(*made);
}

// A request that finishes in its prefill step (max_tokens 1) leaves its prompt in the prefix cache;
// the MTP layer's KV of those positions must be written then too (the catch-up skipped finished
// sequences, so a later request with that prefix drafted from whatever an earlier request had left
// in the blocks). The continuation's drafts and accept length are then the same whether the
// prompt's request stopped after 1 token or 2.
TEST(Engine, APrefixCachedByARequestThatEndsInItsPrefillKeepsItsMtpKv) {
  auto engine = spec_cache_engine();  // (512-token chunks: the prompt in one step, its request ends in it)
  ASSERT_TRUE(engine);
  Engine& e = *engine;
  // The prompts: a fixture prompt and the model's own greedy continuation of it (code it drafts
  // well), cut at 300 tokens, and the same with 100 more.
  Fixture fx(source_dir() / "models/tiny-coder");
  const auto& k0 = fx.cases().front();
  std::vector<int32_t> text(k0.tokens.begin(), k0.tokens.begin() + k0.prompt_len);
  const Output grown = collect(*submit(e, text, 400));
  text.insert(text.end(), grown.tokens.begin(), grown.tokens.end());
  ASSERT_GE(text.size(), 400u);
  const std::vector<int32_t> prompt(text.begin(), text.begin() + 300), longer(text.begin(), text.begin() + 400);
  std::mt19937 rng(11);
  std::vector<int32_t> junk(600);
  for (auto& t : junk) t = static_cast<int32_t>(rng() % 8000);
  auto scenario = [&](int first_max_tokens) {
    EXPECT_TRUE(e.flush_cache());
    const Output j = collect(*submit(e, junk, 64, 1.0f, 1));  // blocks full of another request's KV
    EXPECT_EQ(j.tokens.size(), 64u) << j.error;
    EXPECT_TRUE(e.flush_cache());
    (void)collect(*submit(e, prompt, first_max_tokens));
    auto stream = submit(e, longer, 96);
    int cached = 0;
    Output o;
    while (auto ev = stream->events.pop()) {
      cached = std::max(cached, ev->n_cached_tokens);
      o.tokens.insert(o.tokens.end(), ev->tokens.begin(), ev->tokens.end());
      if (ev->finish != FinishReason::None) {
        o.accept_length = ev->accept_length;
        break;
      }
    }
    EXPECT_GE(cached, 256) << "the prompt's prefix was not reused";
    return std::pair{o.tokens, o.accept_length};
  };
  const auto two = scenario(2), one = scenario(1);
  EXPECT_EQ(one.first, two.first);
  EXPECT_EQ(one.second, two.second) << "accept length after a 1-token request " << one.second << ", after 2 tokens "
                                    << two.second;
  e.stop();
}

// A seeded sampled request gives the same tokens whatever ran before it: the draft chain feeds its
// j-th draft at position (last token) + j - 1, the next position after the catch-up's last row
// (it fed it one position further, so every chain step attended to a position nothing had written
// this request: another request's leftover KV, and the seeded samples followed it).
TEST(Engine, SeededSpeculativeSamplingDoesNotDependOnWhatRanBefore) {
  auto engine = spec_cache_engine();
  ASSERT_TRUE(engine);
  Engine& e = *engine;
  Fixture fx(source_dir() / "models/tiny-coder");
  const auto& k0 = fx.cases().front();
  const std::vector<int32_t> prompt(k0.tokens.begin(), k0.tokens.begin() + k0.prompt_len);
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> outs;
  for (int round = 0; round < 3; ++round) {
    EXPECT_TRUE(e.flush_cache());
    if (round > 0) {  // another request's KV in the blocks this one will take
      std::vector<int32_t> other(40 + 100 * round);
      for (auto& t : other) t = static_cast<int32_t>(rng() % 8000);
      (void)collect(*submit(e, other, 48, 1.0f, 3));
      EXPECT_TRUE(e.flush_cache());
    }
    outs.push_back(collect(*submit(e, prompt, 96, 0.8f, 7)).tokens);
    ASSERT_EQ(outs.back().size(), 96u);
  }
  EXPECT_EQ(outs[1], outs[0]);
  EXPECT_EQ(outs[2], outs[0]);
  e.stop();
}

// --speculative-token-map: the drafts are chosen among the map's tokens only. Verification still
// scores every token, so the output is plain decoding's with any map: one holding every token the
// plain decode emits (drafts accepted as without a map), and a map of one token (nearly every draft
// rejected). One rank and two (each rank keeps its part of the map's lm_head rows).
TEST(Engine, SpeculativeDecodingWithATokenMapKeepsThePlainOutput) {
  Fixture fx(source_dir() / "models/tiny-coder");
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : fx.cases()) prompts.emplace_back(c.tokens.begin(), c.tokens.begin() + c.prompt_len);
  const int n_gen = 40;
  auto plain = make_engine("models/tiny-coder", 0);
  std::vector<std::vector<int32_t>> expect;
  for (auto& p : prompts) expect.push_back(collect(*submit(*plain, p, n_gen)).tokens);
  plain.reset();
  std::vector<int32_t> emitted;
  for (const auto& e : expect) emitted.insert(emitted.end(), e.begin(), e.end());
  std::sort(emitted.begin(), emitted.end());
  emitted.erase(std::unique(emitted.begin(), emitted.end()), emitted.end());
  const std::vector<int32_t> one = {emitted[0] == 0 ? 1 : 0};
  for (int tp : {1, 2}) {
    double accept[2] = {0, 0};
    for (int m = 0; m < 2; ++m) {
      EngineConfig c = small_engine_config();
      c.spec_num_steps = 3;
      c.tp_size = tp;
      c.max_running_requests = 8;
      c.max_waiting_requests = 64;
      c.kv_tokens = 4096;
      c.spec_token_map = m == 0 ? emitted : one;
      auto e = Engine::create(c);
      ASSERT_TRUE(e.is_ok()) << e.status().message();
      (*e)->start();
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (auto& p : prompts) streams.push_back(submit(**e, p, n_gen));
      for (size_t i = 0; i < prompts.size(); ++i) {
        Output o = collect(*streams[i]);
        EXPECT_EQ(o.tokens, expect[i]) << "tp " << tp << ", map " << m << ", prompt " << i;
        accept[m] += o.accept_length / static_cast<double>(prompts.size());
      }
      expect_idle(**e);
    }
    EXPECT_GT(accept[0], 2.0) << "tp " << tp;  // as without a map (SpeculativeAcceptLengthOnCodeIsAboveTwoAtK3)
    EXPECT_LT(accept[1], 1.2) << "tp " << tp;
  }
}

TEST(Engine, SeededSamplingIsReproducibleWithAndWithoutSpeculation) {
  Fixture fx(source_dir() / "models/tiny-coder");
  std::vector<int32_t> prompt(fx.cases()[0].tokens.begin(), fx.cases()[0].tokens.begin() + fx.cases()[0].prompt_len);
  for (int k : {0, 3}) {
    auto e = make_engine("models/tiny-coder", k);
    auto a = collect(*submit(*e, prompt, 32, 0.8f, 42)).tokens;
    // The same seed while other requests run beside it.
    auto noise = submit(*e, prompt, 32, 1.0f, 7);
    auto b = collect(*submit(*e, prompt, 32, 0.8f, 42)).tokens;
    collect(*noise);
    auto c = collect(*submit(*e, prompt, 32, 0.8f, 43)).tokens;
    EXPECT_EQ(a, b) << "k=" << k;
    EXPECT_NE(a, c) << "k=" << k;
    EXPECT_EQ(a.size(), 32u);
  }
}

// Sampling on the device (Kernels::sample_rows through ModelRunner's Fetch::Sample; here the CPU
// kernel) draws the same tokens as the host sampler for every seeded request: temperature alone,
// top-k + top-p, min-p with all three penalties, greedy with a repetition penalty, and a request
// with logprobs beside them (its steps fall back to host sampling for the whole batch).
TEST(Engine, DeviceSamplingDrawsWhatTheHostSamplerDraws) {
  Fixture fx(source_dir() / "models/tiny-coder");
  std::vector<int32_t> prompt(fx.cases()[0].tokens.begin(), fx.cases()[0].tokens.begin() + fx.cases()[0].prompt_len);
  auto run = [&](bool device, bool with_logprobs, EngineStats* stats) {
    EngineConfig c = small_engine_config();
    c.max_waiting_requests = 64;
    c.device_sampling = device;
    auto e = Engine::create(c);
    EXPECT_TRUE(e.is_ok()) << e.status().message();
    // Every request is queued before the engine starts, so both runs batch alike. (The CPU's
    // kernels are batch invariant, so the logits do not depend on it either. Both samplers run
    // RowSampler, so a draw that lands on a CDF step agrees too: when they summed their CDFs
    // differently, a change of the logits' rounding could part them there.)
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < (with_logprobs ? 5 : 4); ++i) {
      GenerateRequest r;
      r.id = (*e)->next_request_id();
      r.prompt = prompt;
      r.prompt.resize(prompt.size() - static_cast<size_t>(i));  // different lengths
      SamplingParams& p = r.sampling;
      p.max_tokens = 24;
      p.ignore_eos = true;
      p.seed = 100 + i;
      if (i == 0) p.temperature = 1.0f;
      if (i == 1) p.temperature = 0.7f, p.top_k = 20, p.top_p = 0.9f;
      if (i == 2) p.temperature = 0.9f, p.min_p = 0.05f, p.presence_penalty = 0.5f, p.frequency_penalty = 0.3f,
                  p.repetition_penalty = 1.15f;
      if (i == 3) p.temperature = 0.0f, p.repetition_penalty = 1.3f;
      if (i == 4) p.temperature = 0.8f, p.top_logprobs = 2;
      streams.push_back((*e)->submit(std::move(r)));
    }
    (*e)->start();
    std::vector<std::vector<int32_t>> out;
    for (auto& s : streams) out.push_back(collect(*s).tokens);
    expect_idle(**e);  // the step that finished the last request has published its counters
    *stats = (*e)->stats();
    return out;
  };
  for (bool with_logprobs : {false, true}) {
    EngineStats host_stats, dev_stats;
    const auto host = run(false, with_logprobs, &host_stats);
    const auto dev = run(true, with_logprobs, &dev_stats);
    ASSERT_EQ(host.size(), dev.size());
    for (size_t i = 0; i < host.size(); ++i) {
      EXPECT_EQ(host[i].size(), 24u);
      EXPECT_EQ(dev[i], host[i]) << "request " << i << (with_logprobs ? " (logprobs beside)" : "");
    }
    EXPECT_EQ(host_stats.device_sampled_total, 0u);
    if (!with_logprobs) EXPECT_GE(dev_stats.device_sampled_total, 4u * 24u);
  }
}

TEST(Engine, PreemptionUnderKvPressureKeepsOutputsExact) {
  Fixture fx(source_dir() / "models/tiny-coder");
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : fx.cases()) prompts.emplace_back(c.tokens.begin(), c.tokens.begin() + c.prompt_len);
  auto roomy = make_engine("models/tiny-coder", 0);
  std::vector<std::vector<int32_t>> expect;
  for (auto& p : prompts) expect.push_back(collect(*submit(*roomy, p, 60)).tokens);
  roomy.reset();
  // 96 KV tokens cannot hold three sequences of ~70 tokens: some must be retracted and recomputed.
  auto tight = make_engine("models/tiny-coder", 0, 8, 96);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (auto& p : prompts) streams.push_back(submit(*tight, p, 60));
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(collect(*streams[i]).tokens, expect[i]) << i;
  expect_idle(*tight);
  EXPECT_GT(tight->stats().preemptions_total, 0u) << "the test is meant to run out of KV blocks";
}

// A prompt that does not fit beside a growing decode waits for it rather than being admitted on its
// first chunk, retracted when the decode grows into its blocks, and admitted again (its prefill
// recomputed each time: a 1,600-token decode took 8.5x as long). Outputs stay exact.
TEST(Engine, APromptThatDoesNotFitWaitsInsteadOfChurning) {
  EngineConfig c = small_engine_config();
  c.context_length = 1024;
  c.kv_tokens = 1024;
  c.max_waiting_requests = 16;
  std::vector<int32_t> a_prompt(64), b_prompt(600);
  for (size_t i = 0; i < a_prompt.size(); ++i) a_prompt[i] = static_cast<int32_t>(1 + (i * 37) % 8000);
  for (size_t i = 0; i < b_prompt.size(); ++i) b_prompt[i] = static_cast<int32_t>(1 + (i * 53 + 11) % 8000);
  auto alone = Engine::create(c);
  ASSERT_TRUE(alone.is_ok()) << alone.status().message();
  (*alone)->start();
  const std::vector<int32_t> b_expect = collect(*submit(**alone, b_prompt, 8)).tokens;
  alone->reset();

  auto made = Engine::create(c);
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  Engine& e = **made;
  e.start();
  auto a = submit(e, a_prompt, 700);
  size_t a_tokens = 0;
  while (a_tokens < 400) {  // A holds 464+ of the 1,024 KV tokens: B's 600 no longer fit beside it
    auto ev = a->events.pop();
    ASSERT_TRUE(ev.has_value());
    a_tokens += ev->tokens.size();
    ASSERT_EQ(ev->finish, FinishReason::None);
  }
  auto b = submit(e, b_prompt, 8);
  Output a_rest = collect(*a);
  EXPECT_EQ(a_tokens + a_rest.tokens.size(), 700u);
  EXPECT_EQ(collect(*b).tokens, b_expect);
  expect_idle(e);
  EXPECT_EQ(e.stats().preemptions_total, 0u);
}

// --mamba-ssm-dtype bfloat16 through the engine: the cache holds the recurrent state in bf16 (less
// state memory, named in the plan line), and each request's first token, picked from the prompt's
// one run from the zero state, is the f32 engine's. Later tokens may drift by a bf16 rounding per
// step (tests/model: Bf16StateIsTheF32StateRoundedAfterEachRun holds the arithmetic exactly).
TEST(Engine, Bf16RecurrentStateHalvesItsMemoryAndKeepsThePromptsToken) {
  const std::vector<std::vector<int32_t>> prompts = {{8183, 755, 1200, 40, 12}, {81, 75, 120, 40}, {300, 301, 302, 303, 304, 305}};
  std::vector<std::vector<int32_t>> got[2];
  int64_t state_bytes[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    EngineConfig c = small_engine_config();
    c.state_dtype = i == 0 ? DType::F32 : DType::BF16;
    auto e = Engine::create(c);
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    const std::string plan = (*e)->plan_summary();
    EXPECT_EQ(plan.find("recurrent state bf16") != std::string::npos, i == 1) << plan;
    state_bytes[i] = (*e)->capacity().state_cache_bytes;
    (*e)->start();
    got[i] = greedy_continuations(**e, prompts, 12);
  }
  EXPECT_LT(state_bytes[1], state_bytes[0]);
  EXPECT_GT(state_bytes[1], state_bytes[0] / 3);  // conv windows stay f32
  for (size_t p = 0; p < prompts.size(); ++p) {
    ASSERT_EQ(got[1][p].size(), 12u);
    EXPECT_EQ(got[1][p][0], got[0][p][0]) << "prompt " << p;
  }
}

// --random-seed: requests without their own seed sample the same output in every engine started
// with the same seed, and a different one with another seed.
TEST(Engine, RandomSeedMakesUnseededSamplingReproducible) {
  const std::vector<int32_t> prompt = {8183, 755, 1200};
  auto run = [&](uint64_t seed) {
    auto e = make_engine("models/tiny-coder", 0, 8, 0, seed);
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < 2; ++i) out.push_back(collect(*submit(*e, prompt, 24, 1.0f)).tokens);
    return out;
  };
  const auto a = run(42), b = run(42), c = run(43);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a[0], a[1]) << "two unseeded requests of one engine still differ";
}

TEST(Engine, CancelFreesMemoryAndEndsWithAbort) {
  auto e = make_engine("models/tiny-coder", 3);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 12; ++i) streams.push_back(submit(*e, {8183, 755, 1000 + i}, 400));
  // Wait for the first tokens, then cancel half of them.
  for (int i = 0; i < 12; i += 2) {
    auto ev = streams[i]->events.pop();
    ASSERT_TRUE(ev.has_value());
    e->cancel(streams[i]->id);
  }
  for (int i = 0; i < 12; i += 2) EXPECT_EQ(collect(*streams[i]).finish, FinishReason::Abort);
  for (int i = 1; i < 12; i += 2) EXPECT_EQ(collect(*streams[i]).finish, FinishReason::Length);
  expect_idle(*e);
}

TEST(Engine, BadRequestsGetErrors) {
  auto e = make_engine("models/tiny-coder", 0);
  EXPECT_EQ(collect(*submit(*e, {}, 4)).finish, FinishReason::Error);
  Output o = collect(*submit(*e, {8183, 99999}, 4));
  EXPECT_EQ(o.finish, FinishReason::Error);
  EXPECT_NE(o.error.find("99999"), std::string::npos);
  std::vector<int32_t> too_long(600, 5);
  o = collect(*submit(*e, too_long, 4));
  EXPECT_EQ(o.finish, FinishReason::Error);
  EXPECT_NE(o.error.find("context length"), std::string::npos);
  // Reaching the context length ends with "length", not a crash.
  std::vector<int32_t> near(500, 5);
  o = collect(*submit(*e, near, 100));
  EXPECT_EQ(o.finish, FinishReason::Length);
  EXPECT_EQ(o.tokens.size(), 12u);
  expect_idle(*e);
}

// vLLM's rule: a temperature below 1e-5 samples greedily. 1e-40 (a float denormal) would make
// 1/T infinite and the scaled logits NaN.
TEST(Engine, TinyTemperatureSamplesGreedily) {
  auto e = make_engine("models/tiny-coder", 0);
  Output greedy = collect(*submit(*e, {8183, 755}, 16, 0.0f));
  for (float t : {1e-40f, 1e-7f, 9e-6f}) {
    Output tiny = collect(*submit(*e, {8183, 755}, 16, t, 1234));
    EXPECT_EQ(tiny.finish, FinishReason::Length) << t;
    EXPECT_EQ(tiny.tokens, greedy.tokens) << t;
  }
  expect_idle(*e);
}

// A full waiting queue refuses with Overloaded and a message naming the flag that sizes it.
TEST(Engine, QueueFullNamesARealFlag) {
  EngineConfig c = small_engine_config();
  c.max_running_requests = 1;
  c.max_waiting_requests = 1;
  c.kv_tokens = 512;
  auto e = Engine::create(c);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  (*e)->start();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 6; ++i) streams.push_back(submit(**e, {8183, 755, 1000 + i}, 64));
  int refused = 0;
  for (auto& s : streams) {
    Output o = collect(*s);
    if (o.finish != FinishReason::Error) continue;
    ++refused;
    EXPECT_NE(o.error.find("--max-running-requests"), std::string::npos) << o.error;
  }
  EXPECT_GE(refused, 4);  // one runs, one waits, the rest are refused
  expect_idle(**e);
}

}  // namespace
}  // namespace deltaserve::test
