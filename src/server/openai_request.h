// OpenAI request bodies → native, validated requests. Every error is an ApiError (400) naming the
// offending field in `param`. JSON stays in server/: the engine later gets SamplingParams.
#pragma once

#include "model/generation_config.h"
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampling_params.h"
#include "server/api_error.h"
#include "server/constraint_spec.h"
#include "tokenizer/token_id.h"

namespace deltaserve {

// Sampling defaults from the model's generation_config.json (a request value wins over these,
// and these win over the OpenAI defaults), as SGLang applies them.
// Model defaults from generation_config.json (one loader for the whole program: model/).
using SamplingDefaults = GenerationDefaults;

// The API a request came in on: it decides parsing (Chat and Responses run the reasoning and
// tool-call parsers) and the output format.
enum class ApiKind { Chat, Completion, Generate, Responses };
inline bool is_chat_like(ApiKind k) { return k == ApiKind::Chat || k == ApiKind::Responses; }

struct ConstraintPlan;

// One prompt of /v1/completions: text, or token ids (`prompt` may be a list of either).
struct CompletionPrompt {
  std::string text;           // text prompts; for id prompts filled in (decoded) when echo is on
  std::vector<TokenId> ids;   // id prompts
  bool is_ids = false;
};

struct OpenAiRequest {
  ApiKind kind = ApiKind::Chat;
  std::string model;

  // Chat: messages normalized for the chat template (developer→system, string tool arguments
  // parsed to objects, text parts flattened, `reasoning` → `reasoning_content`).
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;            // the tools rendered and parsed; null when none / tool_choice none
  nlohmann::ordered_json template_kwargs;  // chat_template_kwargs (object, maybe empty)
  bool enable_thinking = true;     // chat_template_kwargs.enable_thinking, reasoning_effort "none"
  bool separate_reasoning = true;  // SGLang: false = no reasoning split, raw text in content
  bool include_reasoning = true;   // vLLM: false = reasoning dropped from the response
  bool stream_reasoning = true;    // SGLang: false = reasoning sent in one delta when it ends

  // Completion: one or more prompts (a batch); each gets n choices, choice index p * n + j.
  std::vector<CompletionPrompt> prompts;
  bool batched_prompt = false;  // `prompt` was a list of prompts (errors then name the index)
  bool echo = false;

  int n = 1;
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage_stats = false;
  std::vector<std::string> stop;
  bool logprobs = false;
  int top_logprobs = 0;
  bool skip_special_tokens = true;
  std::optional<int> max_tokens;   // absent: chat up to the context length, completions 16
  std::string max_tokens_param = "max_tokens";  // the field that set it, for errors (max_completion_tokens)
  SamplingParams sampling;         // max_tokens filled in later, once the prompt length is known

  // Structured output: at most one of response_format / regex / ebnf / json_schema /
  // structural_tag / guided_* / structured_outputs (a forced tool call is added by the server,
  // which knows the tool-call format).
  ConstraintSpec constraint;
  std::string tool_choice = "auto";  // none | auto | required | function (one named tool)
  bool parallel_tool_calls = true;   // false: at most one call
  // Logits processing on the engine's sampling path (server/request_constraint.h).
  std::vector<std::pair<TokenId, float>> logit_bias;
  std::vector<TokenId> allowed_token_ids;
  std::vector<std::string> bad_words;
  int min_tokens = 0;
  // Stopping and output.
  bool no_stop_trim = false;             // keep the matched stop string
  int stream_interval = 0;               // /generate's sampling_params.stream_interval (0: the server's)
  std::vector<std::string> stop_regex;   // stop when the output contains a match
  bool return_token_ids = false;         // prompt_token_ids + choices[i].token_ids
  bool return_prompt_token_ids = false;  // prompt_token_ids
  bool tokens_as_ids = false;            // logprob tokens as "token_id:N"
  // Prompt.
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  std::optional<int> truncate_prompt_tokens;  // keep the last N prompt tokens (-1: what fits)
  std::string rid;                            // for /abort_request
  std::string cache_namespace;                // prefix-cache namespace (GenerateRequest::cache_namespace)
  std::shared_ptr<const ConstraintPlan> plan;  // filled by the server (null: nothing to apply)
  nlohmann::ordered_json extra;               // API-specific echo fields (Responses: the request)
};

// Parse and validate. `body` must already be parsed JSON (the caller rejects bad/too-deep JSON).
std::optional<ApiError> parse_chat_request(const nlohmann::ordered_json& body,
                                           const SamplingDefaults& defaults, OpenAiRequest& out);
std::optional<ApiError> parse_completion_request(const nlohmann::ordered_json& body,
                                                 const SamplingDefaults& defaults,
                                                 OpenAiRequest& out);

// SGLang's /generate body ({"text" | "input_ids", "sampling_params", ...}) -> OpenAiRequest (kind Generate).
std::optional<ApiError> parse_generate_request(const nlohmann::ordered_json& body,
                                               const SamplingDefaults& defaults, OpenAiRequest& out);
// A later check's error (the context, min_tokens, logit_bias) in /generate's names:
// sampling_params.max_new_tokens, sampling_params.min_new_tokens, sampling_params.logit_bias.
ApiError as_generate_error(ApiError err);

// The logits-processing and structured-output fields shared by chat, completions and /generate
// sampling_params (min_tokens, logit_bias, regex, ...). `api` picks the field names.
std::optional<ApiError> parse_constraint_fields(const nlohmann::ordered_json& body, bool sglang_names,
                                                OpenAiRequest& out);

// The prefix-cache namespace from vLLM's cache_salt (chat, completions) and SGLang's extra_key
// (those and /generate): requests share cached prefixes only when both are equal.
std::optional<ApiError> parse_cache_namespace(const nlohmann::ordered_json& body, OpenAiRequest& out);

constexpr int kMaxChoices = 64;
constexpr int kDefaultCompletionMaxTokens = 16;  // OpenAI, SGLang and vLLM
// Sequences one request may start: prompts x n (a batched /v1/completions request).
constexpr int kMaxSequencesPerRequest = 256;
constexpr int kMaxTopLogprobs = 20;

}  // namespace deltaserve
