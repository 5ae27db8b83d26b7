#include "deploy/bench_multiturn.h"
#include "util/json_parse.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

namespace deltaserve {

namespace {

// Words of the generated workload: code and tool talk, so the tokenizer sees agent-like text.
const char* kAgentWords[] = {"def",    "return", "self",   "import", "class",  "file",   "path",   "error",
                             "value",  "tests",  "passed", "failed", "line",   "buffer", "result", "config",
                             "server", "request", "tokens", "cache",  "state",  "block",  "engine", "kernel",
                             "read",   "write",  "patch",  "diff",   "commit", "branch", "build",  "run"};

std::string words(std::mt19937_64& rng, int64_t n) {
  std::string out;
  const size_t nw = sizeof kAgentWords / sizeof kAgentWords[0];
  for (int64_t i = 0; i < n; ++i) {
    if (i) out += (i % 12 == 0) ? "\n" : " ";
    out += kAgentWords[rng() % nw];
  }
  return out;
}

// A system prompt with tool schemas, like a coding agent's.
std::string agent_opening(std::mt19937_64& rng, int64_t n_words) {
  std::string s = "You are a coding agent working in a repository. Use the tools below.\n\n# Tools\n";
  const char* tools[] = {"read_file", "write_file", "run_tests", "search", "list_dir", "apply_patch"};
  for (const char* t : tools)
    s += std::string("{\"name\": \"") + t +
         "\", \"description\": \"" + words(rng, 20) +
         "\", \"parameters\": {\"type\": \"object\", \"properties\": {\"path\": {\"type\": \"string\"}, "
         "\"content\": {\"type\": \"string\"}}, \"required\": [\"path\"]}}\n";
  s += "\n# Repository notes\n" + words(rng, n_words) + "\n";
  return s;
}

}  // namespace

Result<std::vector<Conversation>> make_conversations(const BenchOptions& base, const MultiTurnOptions& mt) {
  std::vector<Conversation> out;
  if (!mt.dataset.empty()) {
    std::ifstream in(mt.dataset);
    if (!in) return error("cannot read dataset ", mt.dataset);
    std::string line;
    int line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("turns") || !j["turns"].is_array() || j["turns"].empty())
        return error(mt.dataset, ":", line_no, ": expected {\"system\": \"...\", \"turns\": [\"...\", ...]}");
      Conversation c;
      if (j.contains("system") && !j["system"].is_string())
        return error(mt.dataset, ":", line_no, ": \"system\" must be a string");
      c.opening = j.value("system", "");
      for (const auto& t : j["turns"]) {
        if (!t.is_string()) return error(mt.dataset, ":", line_no, ": every turn must be a string");
        c.messages.push_back(t.get<std::string>());
      }
      out.push_back(std::move(c));
    }
    if (out.empty()) return error(mt.dataset, ": no conversations");
    return out;
  }
  for (int i = 0; i < mt.conversations; ++i) {
    std::mt19937_64 rng(base.seed * 7919 + static_cast<uint64_t>(i));
    Conversation c;
    c.opening = agent_opening(rng, mt.system_words);
    for (int t = 0; t < mt.turns; ++t)
      c.messages.push_back((t % 2 == 0 ? "\n\nUser: " : "\n\nTool result: ") + words(rng, mt.turn_words) +
                           "\n\nAssistant:");
    out.push_back(std::move(c));
  }
  return out;
}

Result<MultiTurnReport> run_multi_turn(const BenchOptions& base, const MultiTurnOptions& mt, bool verbose) {
  MultiTurnReport report;
  report.url = base.url.to_string();
  DS_ASSIGN_OR_RETURN(report.model, resolve_bench_model(base.url, base.model, base.timeout_s));
  DS_ASSIGN_OR_RETURN(std::vector<Conversation> convs, make_conversations(base, mt));
  int n_turns = 0;
  for (const auto& c : convs) n_turns = std::max<int>(n_turns, static_cast<int>(c.messages.size()));
  report.turns.resize(static_cast<size_t>(n_turns));
  for (int t = 0; t < n_turns; ++t) report.turns[t].turn = t + 1;
  // The hits counted are this run's own turns', not a rerun's: the cache starts empty (a server
  // without /flush_cache keeps it; the first turn's hits then show it).
  if (base.flush_cache) {
    if (Status f = flush_prefix_cache(base.url, base.timeout_s); !f && verbose)
      std::fprintf(stderr, "the server did not flush its prefix cache (%s): the first turns may be served from an earlier run\n",
                   f.message().c_str());
  }
  std::mutex mu;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (const Conversation& conv : convs)
    clients.emplace_back([&, conv] {
      std::string prompt = conv.opening;
      for (size_t t = 0; t < conv.messages.size(); ++t) {
        prompt += conv.messages[t];
        BenchPrompt p;
        p.text = prompt;
        p.max_tokens = base.output_len;
        RequestResult r = run_completion(base, report.model, p);
        {
          std::lock_guard<std::mutex> lock(mu);
          TurnStats& ts = report.turns[t];
          ++ts.requests;
          if (!r.ok) {
            ++ts.failed;
            if (report.first_error.empty()) report.first_error = r.error;
          } else {
            ts.prompt_tokens += r.prompt_tokens;
            ts.cached_tokens += r.cached_tokens;
            ts.ttft_ms.push_back(r.ttft_ms);
            report.output_tokens += r.output_tokens;
            report.itl_ms.insert(report.itl_ms.end(), r.itl_ms.begin(), r.itl_ms.end());
          }
        }
        if (!r.ok) return;
        prompt += r.text;  // the model's actual reply, then the next message
        if (verbose)
          std::fprintf(stderr, "  turn %zu: prompt %lld tokens (%lld cached), TTFT %.0f ms\n", t + 1,
                       static_cast<long long>(r.prompt_tokens), static_cast<long long>(r.cached_tokens), r.ttft_ms);
      }
    });
  for (auto& c : clients) c.join();
  report.duration_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& ts : report.turns) {
    report.prompt_tokens += ts.prompt_tokens;
    report.cached_tokens += ts.cached_tokens;
  }
  report.output_tokens_per_s = report.duration_s > 0 ? double(report.output_tokens) / report.duration_s : 0;
  return report;
}

std::string multi_turn_table(const MultiTurnReport& r) {
  std::ostringstream os;
  char line[256];
  os << "multi-turn: " << r.url << " model " << r.model << "\n";
  std::snprintf(line, sizeof line, "%-5s %-8s %14s %14s %12s %12s\n", "turn", "requests", "prompt tokens",
                "cached tokens", "TTFT p50 ms", "TTFT p90 ms");
  os << line;
  for (const auto& t : r.turns) {
    const double n = std::max<double>(1, double(t.requests - t.failed));
    std::snprintf(line, sizeof line, "%-5d %-8lld %14.0f %14.0f %12.1f %12.1f\n", t.turn,
                  static_cast<long long>(t.requests), double(t.prompt_tokens) / n, double(t.cached_tokens) / n,
                  percentile(t.ttft_ms, 50), percentile(t.ttft_ms, 90));
    os << line;
  }
  std::snprintf(line, sizeof line,
                "cache hit ratio %.3f (%lld of %lld prompt tokens); output %.1f tok/s over %.1f s; ITL p50 %.2f ms, "
                "p90 %.2f ms\n",
                r.hit_ratio(), static_cast<long long>(r.cached_tokens), static_cast<long long>(r.prompt_tokens),
                r.output_tokens_per_s, r.duration_s, percentile(r.itl_ms, 50), percentile(r.itl_ms, 90));
  os << line;
  if (!r.first_error.empty()) os << "first error: " << r.first_error << "\n";
  return os.str();
}

std::string multi_turn_json(const MultiTurnReport& r) {
  nlohmann::ordered_json j;
  j["url"] = r.url;
  j["model"] = r.model;
  j["hit_ratio"] = r.hit_ratio();
  j["prompt_tokens"] = r.prompt_tokens;
  j["cached_tokens"] = r.cached_tokens;
  j["output_tokens_per_second"] = r.output_tokens_per_s;
  j["duration_seconds"] = r.duration_s;
  j["itl_ms_p50"] = percentile(r.itl_ms, 50);
  j["itl_ms_p90"] = percentile(r.itl_ms, 90);
  nlohmann::ordered_json turns = nlohmann::ordered_json::array();
  for (const auto& t : r.turns)
    turns.push_back({{"turn", t.turn},
                     {"requests", t.requests},
                     {"failed", t.failed},
                     {"prompt_tokens", t.prompt_tokens},
                     {"cached_tokens", t.cached_tokens},
                     {"ttft_ms_p50", percentile(t.ttft_ms, 50)},
                     {"ttft_ms_p90", percentile(t.ttft_ms, 90)}});
  j["turns"] = turns;
  if (!r.first_error.empty()) j["first_error"] = r.first_error;
  return dump_lossy(j, 2);
}

}  // namespace deltaserve
