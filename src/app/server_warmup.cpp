#include "app/server_warmup.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "util/timer.h"

namespace deltaserve {

namespace {
constexpr int kPromptTokens = 16;
constexpr int kGenTokens = 4;
constexpr int kBucketPrompts[] = {24, 48};
}  // namespace

std::vector<int> warm_up_engine_sizes(int max_batch) {
  std::vector<int> sizes;
  const int top = std::max(std::min(max_batch, kMaxWarmupBatch), 1);
  for (int b = 1; b <= top; b *= 2) sizes.push_back(b);
  return sizes;
}

WarmupResult warm_up_engine(Engine& engine, int max_batch) {
  WarmupResult r;
  const double t0 = now_seconds();
  r.batches = warm_up_engine_sizes(max_batch);
  // Prompt ids spread over the vocabulary, distinct per request (no shared prefix among them).
  const int64_t V = std::max<int64_t>(engine.model_config().vocab_size, 1);
  int64_t n_req = 0;
  auto request = [&](int prompt_tokens, int gen_tokens) {
    GenerateRequest q;
    q.id = engine.next_request_id();
    const int64_t i = n_req++;
    for (int t = 0; t < prompt_tokens; ++t)
      q.prompt.push_back(static_cast<TokenId>((i * 7919 + t * 104729 + 17) % V));
    q.sampling.temperature = 0.0f;
    q.sampling.max_tokens = gen_tokens;
    q.sampling.ignore_eos = true;
    return engine.submit(std::move(q));
  };
  // First, prompts of kBucketPrompts tokens alone: prefill steps of 17-32 and 33-64 rows, the
  // buckets a decode batch below 17 and 33 never meets (mixed steps do).
  // Then the batches, whose decode (and verification) steps meet the smaller buckets.
  std::vector<std::vector<std::pair<int, int>>> rounds;  // per round: (prompt tokens, tokens) per request
  for (int p : kBucketPrompts) rounds.push_back({{p, 1}});
  for (int b : r.batches)
    rounds.push_back(std::vector<std::pair<int, int>>(static_cast<std::size_t>(b), {kPromptTokens, kGenTokens}));
  for (const auto& round : rounds) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& [p, g] : round) streams.push_back(request(p, g));
    for (auto& s : streams)
      while (auto ev = s->events.pop()) {
        r.tokens += static_cast<int>(ev->tokens.size());
        if (ev->finish != FinishReason::None) {
          r.failed += ev->finish == FinishReason::Error;
          break;
        }
      }
  }
  r.seconds = now_seconds() - t0;
  return r;
}

}  // namespace deltaserve
