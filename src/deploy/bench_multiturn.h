// `deltaserve bench --multi-turn`: conversations replayed turn by turn, as a coding agent sends
// them. Each turn's prompt is the previous prompt + the model's actual reply + the next user or
// tool message, so a server with a prefix cache computes only what is new. Reports TTFT per turn
// index, the prompt tokens served from the cache (usage.prompt_tokens_details.cached_tokens) and
// the output throughput.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deploy/bench.h"

namespace deltaserve {

struct MultiTurnOptions {
  int conversations = 4;         // replayed at once, one stream each
  int turns = 12;
  int64_t system_words = 6000;   // generated workload: system prompt + tool schemas, about this many words
  int64_t turn_words = 150;      // each later user / tool message
  std::string dataset;           // JSONL of {"system": "...", "turns": ["...", ...]}; "" = generated
};

struct TurnStats {
  int turn = 0;                  // 1-based
  int64_t requests = 0, failed = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0;  // sums over the conversations
  std::vector<double> ttft_ms;
};

struct MultiTurnReport {
  std::string url, model;
  std::vector<TurnStats> turns;
  int64_t prompt_tokens = 0, cached_tokens = 0, output_tokens = 0;
  double duration_s = 0, output_tokens_per_s = 0;
  std::vector<double> itl_ms;    // gaps between streamed tokens, every request (decode speed)
  double hit_ratio() const { return prompt_tokens > 0 ? double(cached_tokens) / double(prompt_tokens) : 0.0; }
  std::string first_error;
};

// A conversation: an opening (system prompt and tools, or the dataset's "system") and the
// messages of turns 1..n (turn 1's prompt is the opening + message 1).
struct Conversation {
  std::string opening;
  std::vector<std::string> messages;
};
// The generated agent workload (deterministic for a seed), or the dataset's conversations.
Result<std::vector<Conversation>> make_conversations(const BenchOptions& base, const MultiTurnOptions& mt);

Result<MultiTurnReport> run_multi_turn(const BenchOptions& base, const MultiTurnOptions& mt, bool verbose = true);
std::string multi_turn_table(const MultiTurnReport& report);
std::string multi_turn_json(const MultiTurnReport& report);

}  // namespace deltaserve
