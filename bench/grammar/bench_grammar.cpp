// Grammar-constrained decoding on the Qwen3 vocabulary (151,669 ids):
//   BM_BuildVocabulary          tokenizer -> TokenVocabulary (trie), once per server start
//   BM_Compile20PropertySchema  JSON Schema with 20 properties -> CompiledGrammar (the < 50 ms target)
//   BM_MaskStep{Cold,Warm}      per generated token: next_token_mask() + accept_token(), walking a
//                               valid 20-property document token by token. Cold: a new grammar each
//                               iteration (every mask computed); warm: the same grammar again
//                               (masks cached, as for the second request with the same schema).
//   BM_JsonObjectStep{Cold,Warm}  the same for response_format json_object (recursive grammar)
//   BM_ApplyMaskRow             what the engine adds per constrained row: copy a 151,936-float
//                               logits row and apply the mask (RequestConstraint::apply)
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"
#include "server/grammar_service.h"
#include "server/request_constraint.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

const Tokenizer& tokenizer() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::load(fs::path(DELTASERVE_SOURCE_DIR) / "tests/fixtures/tokenizer-qwen3");
    if (!t) {
      std::fprintf(stderr, "%s\n", t.status().message().c_str());
      std::exit(1);
    }
    return new Tokenizer(std::move(*t));
  }();
  return *tok;
}

std::vector<TokenId> eos_ids() {
  std::vector<TokenId> out;
  if (auto e = tokenizer().eos_token_id()) out.push_back(*e);
  if (auto e = tokenizer().token_id("<|endoftext|>")) out.push_back(*e);
  return out;
}

GrammarService& service() {
  static GrammarService* s = new GrammarService(tokenizer(), eos_ids());
  return *s;
}

const json& schema20() {
  static const json s = json::parse(R"({
    "type": "object",
    "properties": {
      "id": {"type": "integer", "minimum": 1, "maximum": 1000000},
      "name": {"type": "string"},
      "email": {"type": "string", "format": "email"},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "score": {"type": "number", "minimum": 0, "maximum": 100},
      "active": {"type": "boolean"},
      "role": {"enum": ["admin", "editor", "viewer"]},
      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
      "created": {"type": "string", "format": "date-time"},
      "country": {"type": "string", "maxLength": 56},
      "city": {"type": "string"},
      "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
      "phone": {"type": ["string", "null"]},
      "balance": {"type": "number"},
      "manager": {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}, "required": ["id", "name"]},
      "notes": {"type": "string"},
      "level": {"type": "integer", "minimum": 1, "maximum": 10},
      "verified": {"type": "boolean"},
      "language": {"enum": ["en", "fr", "de", "zh"]},
      "uuid": {"type": "string", "format": "uuid"}
    },
    "required": ["id", "name", "email", "age", "score", "active", "role", "tags", "created", "country",
                 "city", "zip", "phone", "balance", "manager", "notes", "level", "verified", "language", "uuid"]
  })");
  return s;
}

const std::string& document20() {
  static const std::string d =
      R"({"id": 4711, "name": "Ada Lovelace", "email": "ada@example.com", "age": 36, "score": 97.5, )"
      R"("active": true, "role": "editor", "tags": ["math", "engines", "poetry"], "created": "1843-07-10T12:00:00Z", )"
      R"("country": "United Kingdom", "city": "London", "zip": "12345", "phone": null, "balance": -12.25, )"
      R"("manager": {"id": 1, "name": "Charles Babbage"}, "notes": "Wrote the first published algorithm for a )"
      R"(machine; translated Menabrea's paper and added notes longer than the paper itself.", "level": 10, )"
      R"("verified": false, "language": "en", "uuid": "123e4567-e89b-12d3-a456-426614174000"})";
  return d;
}

const std::string& object_document() {
  static const std::string d =
      R"({"model": "qwen", "messages": [{"role": "user", "content": "hi there"}, {"role": "assistant", )"
      R"("content": "Hello! How can I help?", "meta": {"tokens": [1, 2, 3], "nested": {"a": {"b": {"c": null}}}}}], )"
      R"("temperature": 0.7, "stream": false, "stop": ["\n\n", "END"]})";
  return d;
}

std::shared_ptr<const CompiledGrammar> compile_fresh(const Grammar& g) {
  auto c = CompiledGrammar::compile(g, service().vocab());
  if (!c) {
    std::fprintf(stderr, "%s\n", c.status().message().c_str());
    std::exit(1);
  }
  return *c;
}

void BM_BuildVocabulary(benchmark::State& state) {
  const std::vector<TokenId> eos = eos_ids();
  for (auto _ : state) {
    GrammarService s(tokenizer(), eos);
    benchmark::DoNotOptimize(s.vocab()->n_nodes());
  }
  state.counters["tokens"] = tokenizer().vocab_size();
}
BENCHMARK(BM_BuildVocabulary)->Unit(benchmark::kMillisecond);

void BM_Compile20PropertySchema(benchmark::State& state) {
  service();
  for (auto _ : state) {
    auto g = grammar_from_json_schema(schema20());
    auto c = compile_fresh(*g);
    benchmark::DoNotOptimize(c->n_nodes_total());
  }
  auto c = compile_fresh(*grammar_from_json_schema(schema20()));
  state.counters["nodes"] = c->stats().n_nodes;
  state.counters["rules"] = c->stats().n_rules;
}
BENCHMARK(BM_Compile20PropertySchema)->Unit(benchmark::kMillisecond);

void run_document(const std::shared_ptr<const CompiledGrammar>& g, const std::vector<TokenId>& ids) {
  GrammarMatcher m(g);
  for (TokenId id : ids) {
    const TokenBitset& mask = m.next_token_mask();
    if (!mask.test(id) || !m.accept_token(id)) {
      std::fprintf(stderr, "bench document rejected at token %d\n", id);
      std::exit(1);
    }
  }
  benchmark::DoNotOptimize(m.next_token_mask().count());
}

void mask_steps(benchmark::State& state, const Grammar& grammar, const std::string& doc, bool warm) {
  const std::vector<TokenId> ids = tokenizer().encode(doc, false);
  auto shared = compile_fresh(grammar);
  if (warm) run_document(shared, ids);
  for (auto _ : state) {
    if (warm) {
      run_document(shared, ids);
    } else {
      state.PauseTiming();
      auto fresh = compile_fresh(grammar);
      state.ResumeTiming();
      run_document(fresh, ids);
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(ids.size() + 1));
  state.counters["tokens"] = static_cast<double>(ids.size());
}

void BM_MaskStepCold(benchmark::State& state) { mask_steps(state, *grammar_from_json_schema(schema20()), document20(), false); }
void BM_MaskStepWarm(benchmark::State& state) { mask_steps(state, *grammar_from_json_schema(schema20()), document20(), true); }
void BM_JsonObjectStepCold(benchmark::State& state) { mask_steps(state, json_object_grammar(), object_document(), false); }
void BM_JsonObjectStepWarm(benchmark::State& state) { mask_steps(state, json_object_grammar(), object_document(), true); }
BENCHMARK(BM_MaskStepCold)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaskStepWarm)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_JsonObjectStepCold)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_JsonObjectStepWarm)->Unit(benchmark::kMillisecond);

void BM_ApplyMaskRow(benchmark::State& state) {
  // The row size of Qwen3 models (151,936 padded); the mask of a string value (most tokens allowed).
  constexpr int64_t kVocab = 151936;
  auto plan = std::make_shared<ConstraintPlan>();
  plan->grammar = compile_fresh(*grammar_from_json_schema(json::parse(R"({"type":"string"})")));
  auto c = make_constraint(plan);
  for (char ch : std::string("\"abc")) {
    TokenId id = tokenizer().encode(std::string(1, ch), false).front();
    c->accept(id);
  }
  std::vector<float> logits(kVocab), row(kVocab);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& x : logits) x = nd(rng);
  for (auto _ : state) {
    std::copy(logits.begin(), logits.end(), row.begin());
    c->apply(row.data(), kVocab, 4);
    benchmark::DoNotOptimize(row.data());
  }
}
BENCHMARK(BM_ApplyMaskRow)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace deltaserve

BENCHMARK_MAIN();
