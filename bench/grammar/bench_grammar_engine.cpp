// Grammar overhead in the engine's decode loop, CPU backend, models/tiny-coder: 16 sequences
// decode 96 tokens each (greedy, so that sampling costs the same with and without the mask;
// ignore_eos), plain and with a grammar on every sequence
// (a JSON array of strings: the mask changes at every quote and comma, and stays open). The
// difference in tokens per second is the per-step cost of masks (cached) and their application;
// step_ms / sample_ms / draft_ms (the engine's own accounting, per step) isolate it from noise.
// With --speculative (k = 3 MTP drafts) every draft is masked too, then rolled back.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>

#include "engine/engine.h"
#include "server/grammar_service.h"
#include "server/request_constraint.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve {
namespace {

constexpr int kSeqs = 16, kTokens = 96;
constexpr int32_t kEndOfText = 8183, kImEnd = 8185;
const std::string kModel = std::string(DELTASERVE_SOURCE_DIR) + "/models/tiny-coder";

std::unique_ptr<Engine> make_engine(int spec) {
  EngineConfig c;
  c.model_dir = kModel;
  c.n_threads = 2;
  c.spec_num_steps = spec;
  c.max_running_requests = kSeqs;
  c.max_waiting_requests = 64;
  c.context_length = 512;
  c.kv_tokens = 512 * kSeqs;
  c.kv_block_size = 16;
  c.chunked_prefill_size = 256;
  c.max_prefill_tokens = 2048;
  c.extra_eos_token_ids = {kEndOfText, kImEnd};
  auto e = Engine::create(c);
  if (!e) {
    std::fprintf(stderr, "%s\n", e.status().message().c_str());
    std::exit(1);
  }
  (*e)->start();
  return std::move(*e);
}

std::shared_ptr<const ConstraintPlan> json_plan(const Tokenizer& tok) {
  static GrammarService* g = new GrammarService(tok, {kEndOfText, kImEnd});
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::JsonSchema;
  spec.json = nlohmann::ordered_json::parse(R"({"type":"array","items":{"type":"string"}})");
  auto plan = std::make_shared<ConstraintPlan>();
  plan->grammar = *g->compile(spec);
  plan->end_ids = {kEndOfText, kImEnd};
  return plan;
}

void decode(benchmark::State& state, bool constrained, int spec) {
  auto tok = Tokenizer::load(kModel);
  auto engine = make_engine(spec);
  auto plan = constrained ? json_plan(*tok) : nullptr;
  const std::vector<int32_t> prompt = tok->encode("data = ", true);
  int64_t tokens = 0;
  uint64_t seed = 1;
  for (auto _ : state) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < kSeqs; ++i) {
      GenerateRequest r;
      r.id = engine->next_request_id();
      r.prompt = prompt;
      r.sampling.temperature = 0.0f;
      r.sampling.max_tokens = kTokens;
      r.sampling.ignore_eos = true;
      r.sampling.seed = seed++;
      r.constraint = make_constraint(plan);
      streams.push_back(engine->submit(std::move(r)));
    }
    for (auto& s : streams)
      while (auto ev = s->events.pop()) {
        tokens += static_cast<int64_t>(ev->tokens.size());
        if (ev->finish != FinishReason::None) break;
      }
  }
  const EngineStats st = engine->stats();
  engine->stop();
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  // Where the engine thread's time went, per step: the mask costs land in sampling (and drafting).
  const double steps = static_cast<double>(std::max<uint64_t>(st.steps_total, 1));
  state.counters["step_ms"] = 1e3 * st.step_seconds / steps;
  state.counters["sample_ms"] = 1e3 * st.sample_seconds / steps;
  state.counters["draft_ms"] = 1e3 * st.draft_seconds / steps;
}

void BM_Decode16Plain(benchmark::State& s) { decode(s, false, 0); }
void BM_Decode16Grammar(benchmark::State& s) { decode(s, true, 0); }
void BM_Decode16PlainMtp3(benchmark::State& s) { decode(s, false, 3); }
void BM_Decode16GrammarMtp3(benchmark::State& s) { decode(s, true, 3); }
BENCHMARK(BM_Decode16Plain)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
BENCHMARK(BM_Decode16Grammar)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
BENCHMARK(BM_Decode16PlainMtp3)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
BENCHMARK(BM_Decode16GrammarMtp3)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);

}  // namespace
}  // namespace deltaserve

BENCHMARK_MAIN();
