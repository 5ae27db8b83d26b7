#include "app/speculation_choice.h"

#include <algorithm>
#include <cstdint>

#include "util/status.h"
#include "util/timer.h"

namespace deltaserve {

namespace {

struct ProbeRun {
  double tok_s = 0;
  double accept_length = 0;
};

// One greedy request of a fixed pseudo-random prompt generating exactly n tokens (ignore_eos):
// decode tokens/s from its first token to its last. Greedy decoding is exact with or without
// drafts, so both runs produce the same tokens.
ProbeRun probe(Engine& e, int n) {
  GenerateRequest r;
  r.id = e.next_request_id();
  const int64_t V = std::max<int64_t>(2, std::min<int64_t>(e.model_config().vocab_size, 4096));
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 32; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    r.prompt.push_back(static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(V)));
  }
  r.sampling.temperature = 0;
  r.sampling.max_tokens = n;
  r.sampling.ignore_eos = true;
  e.start();
  auto stream = e.submit(std::move(r));
  double first = 0, last = 0;
  int after_first = 0;
  ProbeRun run;
  while (auto ev = stream->events.pop()) {
    if (!ev->tokens.empty()) {
      if (first == 0) first = now_seconds();
      else after_first += static_cast<int>(ev->tokens.size());
    }
    if (ev->finish != FinishReason::None) {
      last = now_seconds();
      run.accept_length = ev->accept_length;
      break;
    }
  }
  e.stop();
  if (last > first && after_first > 0) run.tok_s = after_first / (last - first);
  return run;
}

}  // namespace

std::string SpeculationChoice::summary() const {
  if (!measured) return str_cat("speculative decoding: ", steps, " draft steps");
  return str_cat("speculative decoding (--speculative-num-steps auto): probe decoded ", static_cast<int64_t>(plain_tok_s),
                 " tok/s plainly, ", static_cast<int64_t>(spec_tok_s), " tok/s with MTP (accept length ",
                 accept_length, "): ", steps > 0 ? str_cat("MTP on, ", steps, " draft steps") : std::string("MTP off (0 draft steps)"));
}

SpeculationChoice choose_speculation(Engine& engine, const ServeOptions& opts, int probe_tokens) {
  SpeculationChoice c;
  c.steps = engine.speculative_steps();
  if (!opts.speculative_enabled() || opts.is_explicit("speculative-num-steps") || c.steps == 0) return c;
  c.measured = true;
  const int k = c.steps;
  // Warm-up of both paths (buffers, CUDA graphs), then one measured run each.
  engine.set_speculation(false);
  probe(engine, 8);
  engine.set_speculation(true);
  probe(engine, 8);
  const ProbeRun spec = probe(engine, probe_tokens);
  engine.set_speculation(false);
  const ProbeRun plain = probe(engine, probe_tokens);
  c.plain_tok_s = plain.tok_s;
  c.spec_tok_s = spec.tok_s;
  c.accept_length = spec.accept_length;
  const bool on = spec.tok_s > plain.tok_s;
  engine.set_speculation(on);
  c.steps = on ? k : 0;
  engine.reset_after_probe();
  return c;
}

}  // namespace deltaserve
