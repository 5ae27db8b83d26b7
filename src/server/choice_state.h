// ChoiceState: one choice's output pipeline, fed the engine's TokenEvents in order:
//   token ids → IncrementalDetokenizer → StopMatcher → [chat: ReasoningParser → ToolCallParser]
// Each event yields a ChoiceDelta (what to stream now); the same deltas, accumulated, give the
// non-streaming message. Not thread-safe: one owner (the request's connection strand).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/events.h"
#include "grammar/grammar_matcher.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/stop_matcher.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve {

struct ChoiceOptions {
  bool chat = true;
  std::vector<std::string> stop;
  bool reasoning = false;           // run the reasoning parser
  bool start_in_reasoning = false;  // thinking on: the prompt opened <think>
  ToolParserKind tool_parser = ToolParserKind::None;
  nlohmann::ordered_json tools;             // for schema-typed tool arguments
  std::unordered_set<TokenId> hidden_ids;  // EOS / stop-token ids: counted, never detokenized
  bool skip_special = false;        // also drop every special token from the text...
  std::unordered_set<TokenId> keep_special;  // ...but these (the parsers' <think>, <tool_call>)
  bool no_stop_trim = false;        // a matched stop string stays in the text
  // Stop strings and stop_regex are not checked in the text of the first min_tokens tokens
  // (vLLM, SGLang): only a match that ends in a later token's text stops the choice.
  int min_tokens = 0;
  // stop_regex: (pattern, compiled "anything, then the pattern"): the choice stops at the end of
  // the first match (the match stays in the text: it may have been streamed already).
  std::vector<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> stop_regex;
  int max_tool_calls = -1;          // parallel_tool_calls false: 1 (later calls are dropped)
  std::optional<TokenId> think_end_id;     // counts reasoning tokens up to and including it
  // Where the prompt did not open <think> (start_in_reasoning false), a reply that opens it with
  // its first token reasons too: counted from that token.
  std::optional<TokenId> think_start_id;
  bool count_reasoning_tokens = false;
  bool include_reasoning = true;    // false: reasoning is split off and dropped (vLLM)
  bool stream_reasoning = true;     // false: reasoning held back, sent in one delta when it ends
};

struct ChoiceDelta {
  std::string text;       // completions: text; chat: content
  std::string reasoning;  // chat only
  std::vector<ToolCallDelta> tool_calls;
  std::vector<TokenLogprob> logprobs;
  std::vector<TokenId> token_ids;  // the tokens of this event (return_token_ids)
  bool finished = false;
  std::string finish_reason;  // "stop" | "length" | "tool_calls" | "abort" | "error"
  std::string error;          // engine error message (finish_reason "error")
  // On the finishing delta: the stop string or stop_regex pattern (string) or stop token id
  // (integer, EOS included) that ended the choice; null when it ended otherwise.
  nlohmann::ordered_json matched_stop;
  bool empty() const {
    return text.empty() && reasoning.empty() && tool_calls.empty() && logprobs.empty() && !finished;
  }
  // The delta of this one's tokens followed by `later`'s (its end, if it finishes).
  void append(ChoiceDelta&& later) {
    text += later.text;
    reasoning += later.reasoning;
    tool_calls.insert(tool_calls.end(), later.tool_calls.begin(), later.tool_calls.end());
    logprobs.insert(logprobs.end(), later.logprobs.begin(), later.logprobs.end());
    token_ids.insert(token_ids.end(), later.token_ids.begin(), later.token_ids.end());
    if (later.finished) {
      finished = true;
      finish_reason = std::move(later.finish_reason);
      error = std::move(later.error);
      matched_stop = std::move(later.matched_stop);
    }
  }
};

class ChoiceState {
 public:
  ChoiceState(const Tokenizer& tokenizer, ChoiceOptions options);

  // Processes one event. After a stop-string match the delta is finished ("stop") and
  // stop_matched() is true: the caller cancels the engine request and ignores later events.
  ChoiceDelta on_event(const TokenEvent& event);
  // The engine stream ended without a final event (closed): finish with `reason`.
  ChoiceDelta on_closed(const std::string& reason);

  bool finished() const { return finished_; }
  bool stop_matched() const { return stop_matched_; }
  int n_generated() const { return n_generated_; }
  int n_prompt() const { return n_prompt_; }
  int n_cached() const { return n_cached_; }  // prompt tokens the engine served from its prefix cache
  int n_reasoning_tokens() const { return n_reasoning_; }
  double accept_length() const { return accept_length_; }
  bool saw_tool_call() const { return tools_ && tools_->saw_tool_call(); }

  // Accumulated output (for non-streaming responses).
  const std::string& text() const { return acc_text_; }
  const std::string& reasoning() const { return acc_reasoning_; }
  const std::vector<ToolCallDelta>& tool_call_deltas() const { return acc_calls_; }
  const std::vector<TokenLogprob>& logprobs() const { return acc_logprobs_; }
  const std::vector<TokenId>& token_ids() const { return acc_ids_; }
  const std::string& finish_reason() const { return finish_reason_; }
  const nlohmann::ordered_json& matched_stop() const { return matched_stop_; }

 private:
  // on_event for the event's tokens [begin, end) (its final bookkeeping with the last of them).
  ChoiceDelta on_tokens(const TokenEvent& event, std::size_t begin, std::size_t end);
  void route_text(std::string text, bool at_end, ChoiceDelta& out);
  void finish(ChoiceDelta& out, std::string reason, nlohmann::ordered_json matched = nullptr);
  void accumulate(const ChoiceDelta& d);
  // Length of the prefix of `text` up to the end of the first stop_regex match ending at or
  // after byte `from` (npos: none); text before `from` only advances the scans.
  std::size_t stop_regex_end(std::string_view text, std::size_t from = 0);

  const Tokenizer& tokenizer_;
  ChoiceOptions options_;
  IncrementalDetokenizer detok_;
  StopMatcher stop_;
  std::optional<ReasoningParser> reasoning_;
  std::unique_ptr<ToolCallParser> tools_;

  bool finished_ = false;
  bool stop_matched_ = false;
  bool think_ended_ = false;
  int n_generated_ = 0;
  int n_prompt_ = 0;
  int n_cached_ = 0;
  int n_reasoning_ = 0;
  double accept_length_ = 0.0;
  std::string finish_reason_;
  nlohmann::ordered_json matched_stop_;
  std::optional<TokenId> last_token_;  // the last generated token id (a stop token at Stop)
  std::string held_reasoning_;         // stream_reasoning=false: reasoning not sent yet
  std::string held_blank_;             // with a tool parser: content of blanks only, not sent yet

  std::string acc_text_, acc_reasoning_;
  std::vector<ToolCallDelta> acc_calls_;
  std::vector<TokenLogprob> acc_logprobs_;
  std::vector<TokenId> acc_ids_;
  struct RegexScan {
    std::unique_ptr<GrammarStepper> stepper;
    std::vector<Frame> cur, next;
    bool done = false;
  };
  std::vector<RegexScan> regex_;
  int matched_regex_ = -1;
};

}  // namespace deltaserve
