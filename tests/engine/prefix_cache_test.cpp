// The prefix cache end to end (Engine on the CPU, every fixture model): greedy outputs with the
// cache equal the outputs without it, for shared prefixes that end inside a block, at a block
// boundary, at a checkpoint and between checkpoints, for a repeated prompt and for a multi-turn
// continuation (prompt + the model's reply + more); with MTP; under eviction pressure; with the
// block/slot/checkpoint accounting checked after every step; cached tokens reported.
#include <gtest/gtest.h>

#include <thread>

#include "engine/engine.h"
#include "../model/fixture.h"

namespace deltaserve::test {
namespace {

struct CacheSetup {
  int spec = 0;
  bool cache = true;
  int64_t kv_tokens = 0;
  int max_running = 4;
  int checkpoints = 8;
};

std::unique_ptr<Engine> make(const std::string& dir, const CacheSetup& o) {
  EngineConfig c;
  c.model_dir = source_dir() / dir;
  c.n_threads = 2;
  c.spec_num_steps = o.spec;
  c.max_running_requests = o.max_running;
  c.max_waiting_requests = 256;
  c.context_length = 512;
  c.kv_tokens = o.kv_tokens > 0 ? o.kv_tokens : 512 * int64_t(o.max_running);
  c.kv_block_size = 16;
  c.chunked_prefill_size = 64;
  c.max_prefill_tokens = 128;
  c.prefix_cache = o.cache;
  c.checkpoint_slots = o.checkpoints;
  c.decode_checkpoints = true;
  c.check_integrity_every_step = true;
  auto e = Engine::create(c);
  if (!e.is_ok()) {
    ADD_FAILURE() << e.status().message();
    return nullptr;
  }
  (*e)->start();
  return std::move(*e);
}

struct Result {
  std::vector<int32_t> tokens;
  int cached = 0;
  FinishReason finish = FinishReason::None;
};

// A greedy request for n tokens (EOS ignored).
GenerateRequest greedy(Engine& e, const std::vector<int32_t>& prompt, int n) {
  GenerateRequest r;
  r.id = e.next_request_id();
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.sampling.max_tokens = n;
  r.sampling.ignore_eos = true;
  return r;
}

Result run(Engine& e, const std::vector<int32_t>& prompt, int n, const std::string& cache_namespace = "") {
  GenerateRequest r = greedy(e, prompt, n);
  r.cache_namespace = cache_namespace;
  auto s = e.submit(std::move(r));
  Result out;
  while (auto ev = s->events.pop()) {
    out.tokens.insert(out.tokens.end(), ev->tokens.begin(), ev->tokens.end());
    if (ev->finish != FinishReason::None) {
      out.finish = ev->finish;
      out.cached = ev->n_cached_tokens;
      break;
    }
  }
  return out;
}

// A prompt of n tokens: the fixture's first prompt, then filler ids that depend on seed (all below
// the smallest fixture vocabulary, 512).
std::vector<int32_t> prompt_of(const Fixture& fx, int n, int seed) {
  const auto& c = fx.cases()[0];
  std::vector<int32_t> p(c.tokens.begin(), c.tokens.begin() + std::min(c.prompt_len, n));
  for (int i = static_cast<int>(p.size()); i < n; ++i) p.push_back(1 + (i * 37 + seed * 101) % 509);
  return p;
}

// `head` tokens of a, then b's own tokens.
std::vector<int32_t> share(const std::vector<int32_t>& a, int head, std::vector<int32_t> b) {
  std::copy(a.begin(), a.begin() + head, b.begin());
  return b;
}

class PrefixCacheEquivalence : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(PrefixCacheEquivalence, GreedyOutputsEqualThoseWithoutTheCache) {
  const auto& [dir, k] = GetParam();
  if (k > 0 && std::string(dir).find("qwen3-tiny") != std::string::npos) GTEST_SKIP() << "dense Qwen3 has no MTP head";
  Fixture fx(source_dir() / dir);
  const bool has_state = std::string(dir).find("qwen3-tiny") == std::string::npos;
  const int n_gen = 24;
  const auto a = prompt_of(fx, 150, 1);  // checkpoints at 64, 128 (chunk ends), 144 (prompt end)
  std::vector<std::pair<std::string, std::vector<int32_t>>> prompts = {
      {"first", a},
      {"shares 37 (inside a block)", share(a, 37, prompt_of(fx, 120, 2))},
      {"shares 48 (a block boundary)", share(a, 48, prompt_of(fx, 90, 3))},
      {"shares 64 (a checkpoint)", share(a, 64, prompt_of(fx, 100, 4))},
      {"shares 100 (between checkpoints)", share(a, 100, prompt_of(fx, 130, 5))},
      {"the same prompt again", a},
  };
  auto reference = make(dir, CacheSetup{k, false});
  ASSERT_NE(reference, nullptr);
  std::vector<Result> expect;
  for (const auto& [name, p] : prompts) {
    expect.push_back(run(*reference, p, n_gen));
    ASSERT_EQ(expect.back().finish, FinishReason::Length) << name;
  }
  // Multi-turn: the first prompt, its reply, and a new message.
  std::vector<int32_t> turn2 = a;
  turn2.insert(turn2.end(), expect[0].tokens.begin(), expect[0].tokens.end());
  for (int i = 0; i < 20; ++i) turn2.push_back(1 + (i * 13) % 509);
  prompts.push_back({"multi-turn continuation", turn2});
  expect.push_back(run(*reference, turn2, n_gen));
  reference.reset();

  // Room for every checkpoint of this test (eviction has its own test below).
  auto cached = make(dir, CacheSetup{k, true, 0, 4, 32});
  ASSERT_NE(cached, nullptr);
  std::vector<Result> got;
  for (size_t i = 0; i < prompts.size(); ++i) {
    got.push_back(run(*cached, prompts[i].second, n_gen));
    EXPECT_EQ(got[i].tokens, expect[i].tokens) << prompts[i].first;
  }
  // What was served from the cache: a model with GDN state resumes at checkpoints only.
  EXPECT_EQ(got[0].cached, 0);
  EXPECT_EQ(got[1].cached, has_state ? 0 : 32);
  EXPECT_EQ(got[2].cached, has_state ? 0 : 48);
  EXPECT_EQ(got[3].cached, 64);
  EXPECT_EQ(got[4].cached, has_state ? 64 : 96);
  EXPECT_EQ(got[5].cached, 144);
  // The continuation resumes past the first prompt: its reply was cached when it finished (the
  // last block boundary its checkpoint reached).
  EXPECT_GE(got[6].cached, 160) << "prompt " << a.size() << " + reply " << n_gen;
  const EngineStats st = cached->stats();
  EXPECT_GT(st.cached_blocks, 0);
  EXPECT_GT(st.prompt_tokens_cached_total, 0u);
  // flush_cache() returns once the engine's published stats show the emptied cache (/metrics read
  // right after /flush_cache once showed the old count: the stats were published after the answer).
  EXPECT_TRUE(cached->flush_cache());
  EXPECT_EQ(cached->stats().cached_blocks, 0);
  EXPECT_EQ(cached->stats().cached_checkpoints, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Models, PrefixCacheEquivalence,
    ::testing::Combine(::testing::Values("models/tiny-coder", "tests/fixtures/qwen35-tiny", "tests/fixtures/qwen3-tiny"),
                       ::testing::Values(0, 3)),
    [](const auto& info) {
      const std::string d = std::get<0>(info.param);
      const std::string m = d.find("coder") != std::string::npos ? "tiny_coder"
                            : d.find("qwen35") != std::string::npos ? "qwen35_tiny"
                                                                     : "qwen3_tiny";
      return m + "_k" + std::to_string(std::get<1>(info.param));
    });

// Namespaces (cache_salt / extra_key): a prompt cached under one is served from cache only to
// requests under the same one; the same prompt under another is computed again and cached beside
// it; outputs stay those of the default namespace.
TEST(PrefixCache, NamespacesIsolateCachedPrefixes) {
  Fixture fx(source_dir() / "models/tiny-coder");
  const auto p = prompt_of(fx, 150, 1);
  auto e = make("models/tiny-coder", CacheSetup{});
  ASSERT_NE(e, nullptr);
  const Result plain = run(*e, p, 8);
  EXPECT_EQ(plain.cached, 0);
  const Result a1 = run(*e, p, 8, "7:salt-A");
  EXPECT_EQ(a1.cached, 0) << "the default namespace's entry is not salt-A's";
  const Result a2 = run(*e, p, 8, "7:salt-A");
  EXPECT_GE(a2.cached, 128) << "salt-A's own entry";
  const Result b1 = run(*e, p, 8, "7:salt-B");
  EXPECT_EQ(b1.cached, 0);
  const Result again = run(*e, p, 8);
  EXPECT_GE(again.cached, 128) << "the default namespace keeps its entry";
  for (const Result* r : {&a1, &a2, &b1, &again}) EXPECT_EQ(r->tokens, plain.tokens);
  // A prompt sharing only a prefix with salt-B's is served that prefix under salt-B alone.
  const auto q = share(p, 100, prompt_of(fx, 130, 5));
  EXPECT_GE(run(*e, q, 4, "7:salt-B").cached, 64);
  EXPECT_EQ(run(*e, q, 4, "7:salt-C").cached, 0);
}

// A pool too small for everything: the cache is evicted for running requests, nobody fails, and
// the outputs stay those of an engine without the cache.
TEST(PrefixCache, UnderEvictionPressureNoRequestFailsAndOutputsStayExact) {
  Fixture fx(source_dir() / "models/tiny-coder");
  const auto a = prompt_of(fx, 100, 1);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) prompts.push_back(share(a, 20 + 10 * (i % 6), prompt_of(fx, 90 + 5 * i, 10 + i)));
  auto reference = make("models/tiny-coder", CacheSetup{0, false});
  std::vector<std::vector<int32_t>> expect;
  for (auto& p : prompts) expect.push_back(run(*reference, p, 20).tokens);
  reference.reset();
  for (int k : {0, 3}) {
    // 320 KV tokens: two or three sequences at a time, the cache squeezed in between; 3 checkpoints.
    auto e = make("models/tiny-coder", CacheSetup{k, true, 320, 3, 3});
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (auto& p : prompts) streams.push_back(e->submit(greedy(*e, p, 20)));
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::vector<int32_t> got;
      FinishReason finish = FinishReason::None;
      while (auto ev = streams[i]->events.pop()) {
        got.insert(got.end(), ev->tokens.begin(), ev->tokens.end());
        if (ev->finish != FinishReason::None) {
          finish = ev->finish;
          break;
        }
      }
      EXPECT_EQ(finish, FinishReason::Length) << "k=" << k << " request " << i;
      EXPECT_EQ(got, expect[i]) << "k=" << k << " request " << i;
    }
  }
}

// Found by review (stop 55). A request cancelled while it decodes (a stop string the server
// matched, a client gone) keeps its computed prefix in the cache, up to its rolling checkpoint, as
// a finished one does: the next turn that repeats its reply resumes there. And with MTP, the
// verification that finishes a request still saves the checkpoint of a block its kept tokens
// completed: a follow-up resumes as far as after plain decoding.
TEST(PrefixCache, CancelledAndSpeculativeLastStepsKeepTheirCheckpoint) {
  Fixture fx(source_dir() / "models/tiny-coder");
  const auto p = prompt_of(fx, 40, 3);
  auto reference = make("models/tiny-coder", CacheSetup{0, false});
  auto e = make("models/tiny-coder", CacheSetup{});
  ASSERT_NE(e, nullptr);
  GenerateRequest r = greedy(*e, p, 300);
  const RequestId id = r.id;
  auto stream = e->submit(std::move(r));
  std::vector<int32_t> got;
  FinishReason finish = FinishReason::None;
  bool cancelled = false;
  while (auto ev = stream->events.pop()) {
    got.insert(got.end(), ev->tokens.begin(), ev->tokens.end());
    if (!cancelled && got.size() >= 30) {
      e->cancel(id);
      cancelled = true;
    }
    if (ev->finish != FinishReason::None) {
      finish = ev->finish;
      break;
    }
  }
  ASSERT_EQ(finish, FinishReason::Abort);
  ASSERT_LT(got.size(), 300u);
  // Computed: the prompt and every token but the last; the rolling checkpoint at the last block
  // boundary within them.
  const int computed = static_cast<int>(p.size() + got.size()) - 1;
  std::vector<int32_t> next = p;
  next.insert(next.end(), got.begin(), got.end());
  for (int i = 0; i < 8; ++i) next.push_back(1 + (i * 53) % 509);
  const Result turn = run(*e, next, 6);
  EXPECT_EQ(turn.cached, computed / 16 * 16) << got.size() << " tokens before the cancel";
  EXPECT_EQ(turn.tokens, run(*reference, next, 6).tokens);
  // MTP: whatever step finishes the request, the follow-up resumes at the last block boundary of
  // what it computed (the finishing verification may cross one).
  auto spec = make("models/tiny-coder", CacheSetup{3});
  ASSERT_NE(spec, nullptr);
  for (int n = 20; n < 36; ++n) {
    // An empty cache each time: a rolling checkpoint takes only a free slot, and the 8 fill up.
    ASSERT_TRUE(spec->flush_cache());
    const auto q = prompt_of(fx, 40, 100 + n);
    const Result first = run(*spec, q, n);
    ASSERT_EQ(first.tokens.size(), static_cast<size_t>(n));
    std::vector<int32_t> follow = q;
    follow.insert(follow.end(), first.tokens.begin(), first.tokens.end());
    for (int i = 0; i < 8; ++i) follow.push_back(1 + (i * 53 + n) % 509);
    const Result again = run(*spec, follow, 4);
    EXPECT_GE(again.cached, (40 + n - 1) / 16 * 16) << "max_tokens " << n;
    EXPECT_EQ(again.tokens, run(*reference, follow, 4).tokens) << "max_tokens " << n;
  }
}

}  // namespace
}  // namespace deltaserve::test
