// The request-field table. Keep docs/api-fields.md in step (tests/server/request_fields_test.cpp
// checks that every row is there and that the server does what the row says).
#include "server/request_fields.h"

#include <vector>

namespace deltaserve {

using json = nlohmann::ordered_json;

namespace {

constexpr uint8_t C = static_cast<uint8_t>(FieldApi::Chat), P = static_cast<uint8_t>(FieldApi::Completion),
                  G = static_cast<uint8_t>(FieldApi::Generate), S = static_cast<uint8_t>(FieldApi::GenerateSampling),
                  R = static_cast<uint8_t>(FieldApi::Responses);
constexpr FieldSupport YES = FieldSupport::Honoured, NOOP = FieldSupport::NoEffect, ONLY = FieldSupport::OnlyDefault;

// clang-format off
const std::vector<RequestField> kFields = {
  // --- prompt and output ---
  {"model", C | P | R, NOOP, nullptr, R"("default")", "one model is served and answers whatever name is given (as SGLang)"},
  {"messages", C, YES, nullptr, R"([{"role":"user","content":"hi"}])", "chat messages (system, developer, user, assistant, tool)"},
  {"prompt", P, YES, nullptr, R"("def f(")", "text, token ids, or a list of either (a batch)"},
  {"text", G, YES, nullptr, R"("def f(")", "prompt text, or a list of texts (a batch)"},
  {"input_ids", G, YES, nullptr, "[1, 2, 3]", "prompt token ids, or a list of them (a batch)"},
  {"input", R, YES, nullptr, R"("hi")", "Responses API input: text or a list of message items"},
  {"instructions", R, YES, nullptr, R"("Be brief.")", "Responses API: a system message before the input"},
  {"previous_response_id", R, YES, nullptr, nullptr, "Responses API: continue a stored response (the conversation is replayed)"},
  {"store", R, YES, nullptr, "false", "Responses API: keep the response for GET /v1/responses/{id} (default true; the store is bounded)"},
  {"sampling_params", G, YES, nullptr, R"({"max_new_tokens":4})", "SGLang sampling parameters (table rows marked sampling_params)"},
  {"rid", C | P | G, YES, nullptr, R"("my-request-1")", "request id, one request in flight each (a second is a 400): POST /abort_request {\"rid\": ...} cancels it"},
  {"request_id", C | P, YES, nullptr, R"("my-request-2")", "vLLM name of rid"},
  {"stream", C | P | G | R, YES, nullptr, "false", "server-sent events"},
  {"stream_options", C | P, YES, nullptr, R"({"include_usage":false})", "include_usage, continuous_usage_stats (with include_usage, as vLLM)"},
  {"stream_options", G, NOOP, nullptr, R"({"include_usage":true})", "every /generate chunk's meta_info carries the token counts already"},
  {"n", C | P | S, YES, nullptr, "1", "choices per prompt"},
  {"echo", P, YES, nullptr, "true", "completions: the prompt (as truncate_prompt_tokens left it) before each choice's text; not with logprobs (prompt logprobs are not computed)"},
  {"echo", C, ONLY, "[false]", "true", "vLLM chat echo of the last message is not supported"},
  {"max_tokens", C | P, YES, nullptr, "4", "/v1/completions defaults to 16, chat to the rest of the context"},
  {"max_completion_tokens", C, YES, nullptr, "4", "OpenAI name of max_tokens"},
  {"max_output_tokens", R, YES, nullptr, "4", "Responses API max_tokens"},
  {"max_new_tokens", S, YES, nullptr, "4", "default 128 (SGLang)"},
  {"min_tokens", C | P, YES, nullptr, "2", "EOS and stop tokens are masked, and stop strings are not matched, until this many tokens are generated (vLLM)"},
  {"min_new_tokens", S, YES, nullptr, "2", "SGLang name of min_tokens"},
  // --- sampling ---
  {"temperature", C | P | S | R, YES, nullptr, "0.5", "below 1e-5 (e.g. 0) = greedy, as vLLM"},
  {"top_p", C | P | S | R, YES, nullptr, "0.9", ""},
  {"top_k", C | P | S, YES, nullptr, "20", "-1 or 0 = off"},
  {"min_p", C | P | S, YES, nullptr, "0.05", ""},
  {"presence_penalty", C | P | S, YES, nullptr, "0.5", ""},
  {"frequency_penalty", C | P | S, YES, nullptr, "0.5", ""},
  {"repetition_penalty", C | P | S, YES, nullptr, "1.1", ""},
  {"seed", C | P, YES, nullptr, "7", "same seed, same output (an int64, as vLLM)"},
  {"sampling_seed", C | P | S, YES, nullptr, "7", "SGLang name of seed"},
  {"logit_bias", C | P | S, YES, nullptr, R"({"11": 5})", "token id (a decimal string) -> bias added to the logit, in [-100, 100]"},
  {"allowed_token_ids", C | P, YES, nullptr, "[11, 12, 13]", "vLLM: only these tokens may be sampled; rules that leave none (bad_words, min_tokens, a grammar) are a 400, or end the request with an error where they meet"},
  {"bad_words", C | P, YES, nullptr, R"(["foo"])", "vLLM: these words (with and without a leading space) are never completed"},
  {"ignore_eos", C | P | S, YES, nullptr, "false", ""},
  {"logprobs", C | P, YES, nullptr, "true", "chat: boolean; completions: the number of alternatives"},
  {"top_logprobs", C, YES, nullptr, "2", "alternatives per token (with logprobs)"},
  {"return_tokens_as_token_ids", C | P, YES, nullptr, "true", "vLLM: logprob tokens written as \"token_id:N\""},
  {"return_logprob", G, YES, nullptr, "false", "SGLang: output token logprobs in meta_info"},
  {"top_logprobs_num", G, YES, nullptr, "0", "SGLang: alternatives per token (with return_logprob)"},
  {"logprob_start_len", G, ONLY, "[-1]", "0", "prompt logprobs are not computed"},
  {"return_text_in_logprobs", G, YES, nullptr, "false", "SGLang: token text next to each logprob"},
  {"prompt_logprobs", C | P, ONLY, "[null]", "1", "prompt logprobs are not computed (the engine keeps only the last position's logits)"},
  // --- stopping ---
  {"stop", C | P | S, YES, nullptr, R"(["\n\n"])", "up to 16 stop strings"},
  {"stop_token_ids", C | P | S, YES, nullptr, "[11]", "token ids of the vocabulary"},
  {"stop_regex", C | P | S, YES, nullptr, R"(["[0-9]{3}"])", "SGLang: stop when the output contains a match (the match stays in the output); a leading ^ anchors it at the output's start"},
  {"no_stop_trim", C | P | S, YES, nullptr, "true", "SGLang: keep the matched stop string in the output"},
  {"include_stop_str_in_output", C | P, YES, nullptr, "true", "vLLM name of no_stop_trim"},
  {"skip_special_tokens", C | P | S, YES, nullptr, "false", "false: special tokens (e.g. <|im_start|>) appear in the text"},
  {"spaces_between_special_tokens", C | P | S, ONLY, "[true]", "false", "byte-level BPE tokenizers never add spaces; false would change nothing and is refused"},
  // --- structured output ---
  {"response_format", C | P, YES, nullptr, R"({"type":"json_object"})", "text, json_object, json_schema, structural_tag"},
  {"text", R, YES, nullptr, R"({"format":{"type":"text"}})", "Responses API: text.format (text, json_object, json_schema)"},
  {"regex", C | P | S, YES, nullptr, R"("[a-z]+")", "SGLang: the output matches this regex"},
  {"ebnf", C | P | S, YES, nullptr, R"("root ::= \"yes\" | \"no\"")", "SGLang: the output matches this EBNF grammar"},
  {"json_schema", C | P | S, YES, nullptr, R"("{\"type\":\"integer\"}")", "SGLang: the output is JSON valid under this schema (a JSON string)"},
  {"structural_tag", C | P | S, YES, nullptr, R"("{\"structures\":[{\"begin\":\"<f>\",\"schema\":{},\"end\":\"</f>\"}],\"triggers\":[\"<f>\"]}")", "SGLang structural tag (a JSON string)"},
  {"guided_json", C | P, YES, nullptr, R"({"type":"boolean"})", "vLLM: as json_schema"},
  {"guided_regex", C | P, YES, nullptr, R"("[a-z]+")", "vLLM: as regex"},
  {"guided_choice", C | P, YES, nullptr, R"(["yes","no"])", "vLLM: one of these strings"},
  {"guided_grammar", C | P, YES, nullptr, R"("root ::= \"a\"+")", "vLLM: as ebnf"},
  {"structured_outputs", C | P, YES, nullptr, R"({"choice":["a","b"]})", "vLLM: json, regex, choice, grammar, json_object or structural_tag"},
  {"guided_decoding_backend", C | P, ONLY, R"([null, "auto", "xgrammar"])", R"("outlines")", "the built-in grammar engine is the only backend"},
  {"guided_whitespace_pattern", C | P, ONLY, "[null]", R"("[ ]?")", "JSON whitespace is fixed (at most 16 blanks between tokens)"},
  // --- chat template, reasoning, tools ---
  {"tools", C | R, YES, nullptr, R"([{"type":"function","function":{"name":"f"}}])", "needs --tool-call-parser; a function with strict: true gets arguments valid under its parameters, also under tool_choice auto"},
  {"tool_choice", C | R, YES, nullptr, R"("auto")", "none, auto, required (a call is forced), or {\"type\":\"function\",\"function\":{\"name\":...}}"},
  {"parallel_tool_calls", C | R, YES, nullptr, "false", "false: at most one call (exactly one when a call is forced)"},
  {"chat_template_kwargs", C, YES, nullptr, R"({"enable_thinking":false})", "passed to the chat template; may not set messages, tools, documents, add_generation_prompt, continue_final_message, bos_token or eos_token"},
  {"add_generation_prompt", C, YES, nullptr, "true", "vLLM: false renders without the assistant prefix"},
  {"continue_final_message", C, YES, nullptr, "true", "the final assistant message is continued, not closed"},
  {"reasoning_effort", C, YES, nullptr, R"("low")", "none (thinking off), minimal, low, medium, high (thinking on; no budget)"},
  {"reasoning", C | R, YES, nullptr, R"({"effort":"low"})", "{\"effort\": ...} as reasoning_effort"},
  {"separate_reasoning", C, YES, nullptr, "true", "SGLang: false leaves <think> text in content"},
  {"include_reasoning", C, YES, nullptr, "true", "vLLM: false drops the reasoning"},
  {"stream_reasoning", C, YES, nullptr, "true", "SGLang: false sends reasoning in one delta"},
  {"chat_template", C, ONLY, "[null]", R"("{{ messages }}")", "per-request templates are not supported; start the server with --chat-template"},
  {"documents", C, ONLY, "[null]", "[]", "RAG documents are not supported by the chat template path"},
  {"mm_processor_kwargs", C, ONLY, "[null]", "{}", "no multimodal input"},
  {"functions", C, ONLY, "[null]", "[]", "deprecated OpenAI field: use tools"},
  {"function_call", C, ONLY, "[null]", R"("auto")", "deprecated OpenAI field: use tool_choice"},
  {"modalities", C, ONLY, R"([null, ["text"]])", R"(["audio"])", "text output only"},
  {"audio", C, ONLY, "[null]", "{}", "no audio output"},
  {"prediction", C, ONLY, "[null]", "{}", "predicted outputs are not supported"},
  {"web_search_options", C, ONLY, "[null]", "{}", "no web search"},
  {"verbosity", C, ONLY, "[null]", R"("low")", "not supported by these models"},
  {"image_data", G, ONLY, "[null]", R"("x.png")", "no multimodal input"},
  {"suffix", P, ONLY, R"([null, ""])", R"("x")", "fill-in-the-middle suffixes are not supported"},
  // --- prompt handling ---
  {"truncate_prompt_tokens", C | P, YES, nullptr, "8", "vLLM: keep only the last N prompt tokens (-1: as many as fit)"},
  {"return_token_ids", C | P, YES, nullptr, "true", "vLLM: prompt_token_ids and each choice's token_ids in the response"},
  {"return_prompt_token_ids", C | P, YES, nullptr, "true", "prompt_token_ids in the response"},
  // --- operations, hints and things not built ---
  {"user", C | P | R, NOOP, nullptr, R"("user-1")", "an end-user id (a string) for the caller's records; it changes no output (as in OpenAI)"},
  {"safety_identifier", C | P | R, NOOP, nullptr, R"("u-1")", "as user"},
  {"metadata", C | P | R, NOOP, nullptr, R"({"k":"v"})", "the caller's tags (an object of strings); nothing is stored"},
  {"prompt_cache_key", C | P | R, NOOP, nullptr, R"("k")", "OpenAI's routing hint: one engine, and every request already sees the whole prefix cache"},
  {"cache_salt", C | P, YES, nullptr, R"("s")", "vLLM: cached prefixes are shared only between requests with the same salt (a non-empty string)"},
  {"store", C | P, ONLY, "[null, false]", "true", "chat completions are not stored"},
  {"service_tier", C | P | R, ONLY, R"([null, "auto", "default"])", R"("flex")", "one tier"},
  {"priority", C | P | G, ONLY, "[null, 0]", "1", "no priority scheduling (first come, first served)"},
  {"best_of", P, ONLY, "[null, 1]", "2", "best_of is not supported (vLLM V1 dropped it too)"},
  {"use_beam_search", C | P, ONLY, "[null, false]", "true", "no beam search"},
  {"length_penalty", C | P, ONLY, "[null, 1, 1.0]", "0.5", "beam search only"},
  {"lora_path", C | P | G, ONLY, "[null]", R"("/adapters/x")", "LoRA adapters are not supported"},
  {"return_hidden_states", C | P | G, ONLY, "[null, false]", "true", "hidden states are not returned"},
  {"custom_logit_processor", C | P | G, ONLY, "[null]", R"("x")", "custom logit processors are not supported"},
  {"custom_params", C | P | S, ONLY, "[null]", "{}", "custom logit processors are not supported"},
  {"session_params", C | P | G, ONLY, "[null]", "{}", "sessions are not supported"},
  {"bootstrap_host", C | P | G, ONLY, "[null]", R"("h")", "prefill/decode disaggregation is not supported"},
  {"bootstrap_port", C | P | G, ONLY, "[null]", "1", "prefill/decode disaggregation is not supported"},
  {"bootstrap_room", C | P | G, ONLY, "[null]", "1", "prefill/decode disaggregation is not supported"},
  {"data_parallel_rank", C | P | G, ONLY, "[null, 0]", "1", "one data-parallel rank"},
  {"kv_transfer_params", C | P, ONLY, "[null]", "{}", "KV transfer is not supported"},
  {"vllm_xargs", C | P, ONLY, "[null]", "{}", "no extension arguments"},
  {"logits_processors", C | P, ONLY, "[null]", "[]", "custom logits processors are not supported"},
  {"extra_key", C | P | G, YES, nullptr, R"("k")", "SGLang: cached prefixes are shared only between requests with the same key (and cache_salt)"},
  {"stream_interval", S, YES, nullptr, "4", "SGLang: this request's stream is sent every N tokens (1..1024; default the server's --stream-interval)"},
  {"log_metrics", G, ONLY, "[null, true]", "false", "requests are always counted in /metrics"},
  {"truncation", R, ONLY, R"([null, "disabled"])", R"("auto")", "Responses API: prompts that do not fit are refused"},
  {"include", R, ONLY, "[null, []]", R"(["reasoning.encrypted_content"])", "Responses API: no extra output items"},
  {"background", R, ONLY, "[null, false]", "true", "Responses API: no background responses"},
  {"top_logprobs", R, ONLY, "[null, 0]", "2", "Responses API: logprobs are not returned"},
};
// clang-format on

// The keys of the objects inside a request (vLLM protocol.py / the OpenAI API shapes).
struct NestedObject {
  std::string_view object;
  std::vector<std::string_view> keys;
  std::vector<std::string_view> null_only;  // accepted only as null or empty (echoed response fields)
};

// clang-format off
const std::vector<NestedObject> kNested = {
  // messages[i] by role (system and developer as user); `name` is passed to the chat template.
  {"message", {"role", "content", "name"}, {}},
  {"assistant message", {"role", "content", "name", "reasoning_content", "reasoning", "tool_calls"},
   {"refusal", "audio", "function_call", "annotations"}},
  {"tool message", {"role", "content", "tool_call_id", "name"}, {}},
  {"stream_options", {"include_usage", "continuous_usage_stats"}, {}},
  // response_format by type (text.format of the Responses API puts the json_schema keys beside type).
  {"response_format text", {"type"}, {}},
  {"response_format json_object", {"type"}, {}},
  {"response_format json_schema", {"type", "json_schema"}, {}},
  {"response_format structural_tag", {"type", "structures", "triggers", "format"}, {}},
  {"json_schema", {"name", "description", "strict", "schema", "schema_"}, {}},
  {"text.format json_schema", {"type", "name", "description", "strict", "schema"}, {}},
  {"tools[]", {"type", "function"}, {}},
  {"tools[].function", {"name", "description", "parameters", "strict"}, {}},
  {"tool_choice", {"type", "function"}, {}},
  {"tool_choice.function", {"name"}, {}},
  {"responses tools[]", {"type", "name", "description", "parameters", "strict"}, {}},
  {"responses tool_choice", {"type", "name"}, {}},
  {"responses text", {"format", "verbosity"}, {}},
  {"reasoning", {"effort", "summary"}, {}},
};
// clang-format on

}  // namespace

std::span<const RequestField> request_fields() { return kFields; }

std::optional<ApiError> check_nested_fields(const json& obj, std::string_view object, const std::string& path) {
  if (!obj.is_object()) return std::nullopt;
  const NestedObject* table = nullptr;
  for (const auto& n : kNested)
    if (n.object == object) table = &n;
  if (!table) return ApiError::internal("no nested field table '" + std::string(object) + "'");
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string param = path + "." + it.key();
    bool known = false, null_only = false;
    for (auto k : table->keys) known = known || k == it.key();
    for (auto k : table->null_only) null_only = null_only || k == it.key();
    if (known) continue;
    if (!null_only)
      return ApiError::bad_request("unrecognized field '" + param + "' (see docs/api-fields.md)", param,
                                   "unrecognized_field");
    const json& v = it.value();
    if (!v.is_null() && !((v.is_array() || v.is_object()) && v.empty()))
      return ApiError::bad_request("'" + param + "' is not supported (only null)", param, "unsupported_field");
  }
  return std::nullopt;
}

std::optional<ApiError> check_request_fields(const json& body, FieldApi api, const std::string& where) {
  if (!body.is_object()) return std::nullopt;
  const uint8_t bit = static_cast<uint8_t>(api);
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& key = it.key();
    const RequestField* row = nullptr;
    for (const auto& f : kFields) {
      if ((f.apis & bit) && key == f.name) {
        row = &f;
        break;
      }
    }
    const std::string param = where + key;
    if (!row) {
      return ApiError::bad_request("unrecognized request field '" + param + "' (see docs/api-fields.md)", param,
                                   "unrecognized_field");
    }
    if (row->support != FieldSupport::OnlyDefault) continue;
    const json accepted = json::parse(row->accepted);
    bool ok = false;
    for (const auto& a : accepted) ok = ok || a == it.value();
    if (!ok) {
      return ApiError::bad_request("'" + param + "' is not supported with value " + it.value().dump() + ": " +
                                       row->note + " (accepted: " + accepted.dump() + ")",
                                   param, "unsupported_field");
    }
  }
  return std::nullopt;
}

}  // namespace deltaserve
