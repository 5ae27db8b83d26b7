// Shared by the engine tests: a small engine configuration on a bundled model, and greedy
// continuations of several prompts submitted together through any EngineService.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "../model/fixture.h"

namespace deltaserve::test {

// 4 running requests, 512-token contexts, 2048 KV tokens in blocks of 16, chunks of 64; tests
// change what they exercise.
inline EngineConfig small_engine_config(const std::string& model = "models/tiny-coder") {
  EngineConfig c;
  c.model_dir = source_dir() / model;
  c.n_threads = 2;
  c.max_running_requests = 4;
  c.max_waiting_requests = 16;
  c.context_length = 512;
  c.kv_tokens = 2048;
  c.kv_block_size = 16;
  c.chunked_prefill_size = 64;
  c.max_prefill_tokens = 128;
  return c;
}

// Every prompt submitted at once (batched decode, chunked prefill), greedy, exactly n tokens
// each; the generated tokens in prompt order.
inline std::vector<std::vector<int32_t>> greedy_continuations(EngineService& e,
                                                              const std::vector<std::vector<int32_t>>& prompts, int n) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& p : prompts) {
    GenerateRequest r;
    r.id = e.next_request_id();
    r.prompt = p;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = n;
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

// The engine's statistics once it holds no request (they are published after the step that
// emitted the last token); EXPECTs that nothing is running or waiting and no memory is held.
inline EngineStats idle_stats(EngineService& e) {
  EngineStats s;
  for (int i = 0; i < 400; ++i) {
    s = e.stats();
    if (s.requests_running == 0 && s.requests_waiting == 0 && s.kv_tokens_used == 0 && s.state_slots_used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(s.requests_running, 0);
  EXPECT_EQ(s.requests_waiting, 0);
  EXPECT_EQ(s.kv_tokens_used, 0);
  EXPECT_EQ(s.state_slots_used, 0);
  return s;
}

}  // namespace deltaserve::test
