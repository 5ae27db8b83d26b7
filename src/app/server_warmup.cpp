#include "app/server_warmup.h"

#include <algorithm>
#include <memory>

#include "util/timer.h"

namespace deltaserve {

namespace {
constexpr int kPromptTokens = 16;
constexpr int kGenTokens = 4;
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
  for (int b : r.batches) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < b; ++i) {
      GenerateRequest q;
      q.id = engine.next_request_id();
      for (int t = 0; t < kPromptTokens; ++t)
        q.prompt.push_back(static_cast<TokenId>((int64_t(i) * 7919 + int64_t(t) * 104729 + 17) % V));
      q.sampling.temperature = 0.0f;
      q.sampling.max_tokens = kGenTokens;
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
  }
  r.seconds = now_seconds() - t0;
  return r;
}

}  // namespace deltaserve
