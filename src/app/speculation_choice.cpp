#include "app/speculation_choice.h"

#include <algorithm>
#include <cstdint>

#include "util/status.h"
#include "util/timer.h"

namespace deltaserve {

namespace {

constexpr int kRounds = 2;
constexpr double kMinGain = 0.03;
constexpr double kProbeSeconds = 0.1;
constexpr int kMaxProbeTokens = 1024;
constexpr int kProbePromptTokens = 32;
constexpr int kMinProbeTokens = 16;

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
  for (int i = 0; i < kProbePromptTokens; ++i) {
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
  if (!measured)
    return str_cat("speculative decoding: ", steps, " draft steps", note.empty() ? "" : str_cat(" (not probed: ", note, ")"));
  std::string figures;
  for (const SpeculationProbe& p : probes) {
    if (p.steps == 0) continue;
    figures += str_cat(figures.empty() ? "" : ", ", static_cast<int64_t>(p.tok_s), " with ", p.steps,
                       p.steps == 1 ? " draft step" : " draft steps", " (accept length ", p.accept_length, ")");
  }
  return str_cat("speculative decoding (--speculative-num-steps auto): probe decoded ",
                 static_cast<int64_t>(probes.empty() ? 0.0 : probes.front().tok_s), " tok/s plainly, ", figures, ": ",
                 steps > 0 ? str_cat("MTP on, ", steps, steps == 1 ? " draft step" : " draft steps")
                           : std::string("MTP off (0 draft steps)"));
}

SpeculationChoice choose_speculation(Engine& engine, const ServeOptions& opts, int probe_tokens) {
  SpeculationChoice c;
  c.steps = engine.speculative_steps();
  // Either flag names the number of steps (draft tokens = steps + 1): the user's choice stands.
  if (!opts.speculative_enabled() || opts.is_explicit("speculative-num-steps") ||
      opts.is_explicit("speculative-num-draft-tokens") || c.steps == 0)
    return c;
  // The probe's prompt and a few tokens must fit in the context; else the configured steps stand
  // (a probe cut off by the context timed nothing: 0 tok/s everywhere turned MTP off).
  const int64_t fit = engine.context_length() - kProbePromptTokens - 1;
  if (fit < kMinProbeTokens) {
    c.note = str_cat("the context (", engine.context_length(), " tokens) is too short to time a probe of ",
                     kProbePromptTokens, " + ", kMinProbeTokens, " tokens");
    return c;
  }
  probe_tokens = static_cast<int>(std::min<int64_t>(probe_tokens, fit));
  c.measured = true;
  const int max_k = c.steps;
  // Warm-up of every path (buffers, CUDA graphs), then the measured runs.
  for (int k = 0; k <= max_k; ++k) {
    engine.set_speculative_steps(k);
    probe(engine, 8);
  }
  // Probes long enough to time: as many tokens as plain decoding makes in kProbeSeconds (a small
  // CPU model decodes 64 tokens in ~10 ms), within the context.
  engine.set_speculative_steps(0);
  const ProbeRun first = probe(engine, probe_tokens);
  if (first.tok_s > 0) {
    const double want = std::clamp(first.tok_s * kProbeSeconds, double(probe_tokens), double(kMaxProbeTokens));
    probe_tokens = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(want), fit));
  }
  c.probes.push_back(SpeculationProbe{0, 0, 0});
  for (int k = max_k; k >= 1; --k) c.probes.push_back(SpeculationProbe{k, 0, 0});
  // kRounds rounds, interleaved, averaged: a probe is short (64 tokens: ~10 ms on a small CPU
  // model), and a busy machine moves one run by 10% or more.
  for (int round = 0; round < kRounds; ++round) {
    for (SpeculationProbe& p : c.probes) {
      engine.set_speculative_steps(p.steps);
      const ProbeRun run = probe(engine, probe_tokens);
      p.tok_s += run.tok_s / kRounds;
      p.accept_length += run.accept_length / kRounds;
    }
  }
  // The fastest k, if it beats plain decoding by kMinGain: near break-even, plain decoding is the
  // safe side of the noise (#14: MTP must never make decoding slower).
  const SpeculationProbe* best = &c.probes.front();
  for (const SpeculationProbe& p : c.probes)
    if (p.steps > 0 && p.tok_s > c.probes.front().tok_s * (1 + kMinGain) && p.tok_s > best->tok_s) best = &p;
  c.steps = best->steps;
  engine.set_speculative_steps(c.steps);
  engine.reset_after_probe();
  return c;
}

}  // namespace deltaserve
