#include "app/batch_rates.h"

#include <algorithm>
#include <limits>

namespace deltaserve {

DrainedStream drain_stream(RequestStream& stream, std::size_t expected_events) {
  DrainedStream d;
  d.emitted.reserve(expected_events);
  while (auto ev = stream.events.pop()) {
    if (!ev->tokens.empty()) d.emitted.push_back(EmittedTokens{ev->emitted_at, static_cast<int>(ev->tokens.size())});
    if (ev->finish != FinishReason::None) {
      d.accept_length = ev->accept_length;
      if (ev->finish == FinishReason::Error) d.error = ev->error.empty() ? "request failed" : ev->error;
      break;
    }
  }
  return d;
}

BatchRates batch_rates(double t0, int prompt_len, const std::vector<std::vector<EmittedTokens>>& events) {
  BatchRates r;
  const int batch = static_cast<int>(events.size());
  if (batch == 0) return r;
  double first_any = std::numeric_limits<double>::max(), first_all = 0, first_end = std::numeric_limits<double>::max(),
         end = 0;
  for (const auto& ev : events) {
    if (ev.empty()) return r;  // a sequence without tokens: nothing to measure
    first_any = std::min(first_any, ev.front().time);
    first_all = std::max(first_all, ev.front().time);
    first_end = std::min(first_end, ev.back().time);
    end = std::max(end, ev.back().time);
  }
  int all_decoding = 0;  // tokens emitted in (first_all, first_end]
  for (const auto& ev : events)
    for (const EmittedTokens& x : ev) {
      r.generated += x.tokens;
      if (x.time > first_all && x.time <= first_end) all_decoding += x.tokens;
    }
  r.prefill_tok_s = first_any > t0 ? double(batch) * prompt_len / (first_any - t0) : 0;
  r.decode_tok_s = end > first_any ? double(r.generated - batch) / (end - first_any) : 0;
  r.decode_only_tok_s = first_end > first_all ? double(all_decoding) / (first_end - first_all) : 0;
  return r;
}

}  // namespace deltaserve
