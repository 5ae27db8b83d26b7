// OpenAI request bodies → native, validated requests. Every error is an ApiError (400) naming the
// offending field in `param`. JSON stays in server/: the engine later gets SamplingParams.
#pragma once

#include "model/generation_config.h"
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampling_params.h"
#include "server/api_error.h"
#include "tokenizer/token_id.h"

namespace deltaserve {

// Sampling defaults from the model's generation_config.json (a request value wins over these,
// and these win over the OpenAI defaults), as SGLang applies them.
// Model defaults from generation_config.json (one loader for the whole program: model/).
using SamplingDefaults = GenerationDefaults;

enum class ApiKind { Chat, Completion };

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
  std::optional<int> max_tokens;   // absent: up to the context length
  SamplingParams sampling;         // max_tokens filled in later, once the prompt length is known
};

// Parse and validate. `body` must already be parsed JSON (the caller rejects bad/too-deep JSON).
std::optional<ApiError> parse_chat_request(const nlohmann::ordered_json& body,
                                           const SamplingDefaults& defaults, OpenAiRequest& out);
std::optional<ApiError> parse_completion_request(const nlohmann::ordered_json& body,
                                                 const SamplingDefaults& defaults,
                                                 OpenAiRequest& out);

constexpr int kMaxChoices = 64;
// Sequences one request may start: prompts x n (a batched /v1/completions request).
constexpr int kMaxSequencesPerRequest = 256;
constexpr int kMaxTopLogprobs = 20;

}  // namespace deltaserve
