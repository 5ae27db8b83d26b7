#include "app/server_warmup.h"

#include <algorithm>
#include <memory>
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
  // n requests of `prompt` tokens generating `gen` each, submitted at once and drained.
  auto round = [&](int n, int prompt, int gen) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int j = 0; j < n; ++j, ++n_req) {
      GenerateRequest q;
      q.id = engine.next_request_id();
      for (int t = 0; t < prompt; ++t) q.prompt.push_back(static_cast<TokenId>((n_req * 7919 + t * 104729 + 17) % V));
      q.sampling.temperature = 0.0f;
      q.sampling.max_tokens = gen;
      q.sampling.ignore_eos = true;
      streams.push_back(engine.submit(std::move(q)));
    }
    for (auto& s : streams)
      while (auto ev = s->events.pop()) {
        r.tokens += static_cast<int>(ev->tokens.size());
        if (ev->finish != FinishReason::None) {
          r.failed += ev->finish == FinishReason::Error;
          break;
        }
      }
  };
  // First, prompts of kBucketPrompts tokens alone: prefill steps of 17-32 and 33-64 rows, the
  // buckets a decode batch below 17 and 33 never meets (mixed steps do). Then the batches, whose
  // decode (and verification) steps meet the smaller buckets.
  for (int p : kBucketPrompts) round(1, p, 1);
  for (int b : r.batches) round(b, kPromptTokens, kGenTokens);
  r.seconds = now_seconds() - t0;
  return r;
}

}  // namespace deltaserve
