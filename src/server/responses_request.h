// The OpenAI Responses API's request (POST /v1/responses) -> the equivalent chat request, parsed:
// instructions -> a system message, input items (messages, function_call, function_call_output,
// reasoning) -> chat messages after a stored response's conversation (previous_response_id), flat
// function tools -> chat tools, text.format -> response_format, max_output_tokens -> max_tokens.
// Errors name the Responses fields. server/responses_api.cpp serves the route and the output.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/openai_request.h"

namespace deltaserve {

// A stored response's conversation (chat messages) by id; nullopt when it is not stored.
using PreviousConversation = std::function<std::optional<nlohmann::ordered_json>(const std::string& id)>;

// `messages` gets the conversation the request continues with (stored with its answer for a later
// previous_response_id); `out` the request (kind Responses, n 1, extra: the body).
std::optional<ApiError> parse_responses_request(const nlohmann::ordered_json& body, const SamplingDefaults& defaults,
                                                const PreviousConversation& previous, OpenAiRequest& out,
                                                nlohmann::ordered_json& messages);

// An error about the equivalent chat request, naming the Responses fields (max_output_tokens,
// text.format, tools[i].X, input): OpenAiServer::send_error applies it to every /v1/responses
// error, whether parsing or a later check found it.
ApiError as_responses_error(ApiError err);

// "store" of a parsed request: true unless false (absent or null: the default).
bool responses_store(const nlohmann::ordered_json& body);

}  // namespace deltaserve
