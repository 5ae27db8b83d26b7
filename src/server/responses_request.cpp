#include "server/responses_request.h"

#include "server/json_util.h"
#include "server/request_fields.h"

namespace deltaserve {

using json = nlohmann::ordered_json;

namespace {

// An object's "type": `fallback` when absent or null, "" when not a string (no known type matches
// it, so the caller's "not supported" error names the field).
std::string type_of(const json& obj, const char* fallback) {
  if (!obj.is_object() || !obj.contains("type") || obj["type"].is_null()) return fallback;
  return obj["type"].is_string() ? obj["type"].get<std::string>() : std::string();
}

std::string text_of_parts(const json& content, const std::string& param, std::optional<ApiError>& err) {
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  if (!content.is_array()) {
    err = ApiError::bad_request("'" + param + "' must be a string or a list of content parts", param);
    return out;
  }
  for (size_t k = 0; k < content.size(); ++k) {
    const json& part = content[k];
    const std::string type = type_of(part, "");
    if ((type == "input_text" || type == "output_text" || type == "text") && part.contains("text") && part["text"].is_string()) {
      out += part["text"].get<std::string>();
    } else {
      err = ApiError::bad_request("content part type '" + type + "' is not supported (text only)",
                                  param + "[" + std::to_string(k) + "].type");
      return out;
    }
  }
  return out;
}

// Responses input items -> chat messages.
std::optional<ApiError> input_to_messages(const json& input, json& messages) {
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return std::nullopt;
  }
  if (!input.is_array()) return ApiError::bad_request("'input' must be a string or a list of items", "input");
  if (input.empty()) return ApiError::bad_request("'input' must not be an empty list", "input");
  std::string reasoning;  // a reasoning item, for the next assistant message
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string p = "input[" + std::to_string(i) + "]";
    const json& it = input[i];
    if (!it.is_object()) return ApiError::bad_request(p + " must be an object", p);
    const std::string type = type_of(it, "message");
    if (type == "message") {
      if (!it.contains("role") || !it["role"].is_string()) return ApiError::bad_request(p + ".role is required", p + ".role");
      const std::string role = it["role"].get<std::string>();
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        return ApiError::bad_request("unknown role '" + role + "' in " + p + " (expected user, assistant, system or developer)",
                                     p + ".role");
      std::optional<ApiError> err;
      std::string text = text_of_parts(it.value("content", json("")), p + ".content", err);
      if (err) return err;
      json m = {{"role", it["role"]}, {"content", text}};
      if (it["role"] == "assistant" && !reasoning.empty()) {
        m["reasoning_content"] = reasoning;
        reasoning.clear();
      }
      messages.push_back(std::move(m));
    } else if (type == "function_call") {
      for (const char* k : {"call_id", "name", "arguments"})
        if (!it.contains(k) || !it[k].is_string())
          return ApiError::bad_request(p + "." + k + " must be a string", p + "." + k);
      json call = {{"id", it["call_id"]}, {"type", "function"},
                   {"function", {{"name", it["name"]}, {"arguments", it["arguments"]}}}};
      // Calls after an assistant message (its text, or calls before them) belong to its turn, as
      // previous_response_id replays a response's message and calls as one turn.
      if (!messages.empty() && messages.back().value("role", "") == "assistant" && reasoning.empty()) {
        if (!messages.back().contains("tool_calls")) messages.back()["tool_calls"] = json::array();
        messages.back()["tool_calls"].push_back(call);
      } else {
        json m = {{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call})}};
        if (!reasoning.empty()) {
          m["reasoning_content"] = reasoning;
          reasoning.clear();
        }
        messages.push_back(std::move(m));
      }
    } else if (type == "function_call_output") {
      if (!it.contains("call_id") || !it["call_id"].is_string())
        return ApiError::bad_request(p + ".call_id must be a string", p + ".call_id");
      if (!it.contains("output")) return ApiError::bad_request(p + ".output is required", p + ".output");
      // A string, or a list of text parts (joined); other parts are refused by name.
      std::optional<ApiError> err;
      std::string text = text_of_parts(it["output"], p + ".output", err);
      if (err) return err;
      messages.push_back({{"role", "tool"}, {"tool_call_id", it["call_id"]}, {"content", text}});
    } else if (type == "reasoning") {
      for (const char* k : {"content", "summary"}) {
        if (!it.contains(k) || !it[k].is_array()) continue;
        for (const auto& part : it[k])
          if (part.is_object() && part.contains("text") && part["text"].is_string()) reasoning += part["text"].get<std::string>();
      }
    } else {
      return ApiError::bad_request("input item type '" + type + "' is not supported", p + ".type");
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_responses_request(const json& body, const SamplingDefaults& defaults,
                                                const PreviousConversation& previous, OpenAiRequest& out,
                                                json& messages) {
  out = OpenAiRequest{};
  if (!body.is_object()) return ApiError::bad_request("the request body must be a JSON object");
  if (auto e = check_request_fields(body, FieldApi::Responses)) return *e;
  if (!body.contains("input") || body["input"].is_null())
    return ApiError::bad_request("'input' is required", "input", "missing_required_field");

  // The conversation: a stored response's, then instructions, then the new input.
  messages = json::array();
  if (body.contains("previous_response_id") && !body["previous_response_id"].is_null()) {
    if (!body["previous_response_id"].is_string())
      return ApiError::bad_request("'previous_response_id' must be a string", "previous_response_id");
    std::optional<json> prev = previous(body["previous_response_id"].get<std::string>());
    if (!prev)
      return ApiError::bad_request("previous response '" + body["previous_response_id"].get<std::string>() +
                                       "' is not stored",
                                   "previous_response_id");
    // The stored conversation holds the input's own system messages, not the earlier instructions
    // (handle_responses stores it without them): these instructions replace those.
    for (const auto& m : *prev) messages.push_back(m);
  }
  if (body.contains("instructions") && !body["instructions"].is_null()) {
    if (!body["instructions"].is_string())
      return ApiError::bad_request("'instructions' must be a string", "instructions");
    messages.insert(messages.begin(), json{{"role", "system"}, {"content", body["instructions"]}});
  }
  if (auto e = input_to_messages(body["input"], messages)) return *e;

  // The equivalent chat request.
  json chat = {{"messages", messages}};
  for (const char* k : {"temperature", "top_p", "stream", "user", "metadata", "safety_identifier", "prompt_cache_key",
                        "parallel_tool_calls", "service_tier"}) {
    if (body.contains(k)) chat[k] = body[k];
  }
  if (body.contains("max_output_tokens") && !body["max_output_tokens"].is_null()) chat["max_tokens"] = body["max_output_tokens"];
  if (body.contains("reasoning") && !body["reasoning"].is_null()) chat["reasoning"] = body["reasoning"];
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) return ApiError::bad_request("'tools' must be a list", "tools");
    json tools = json::array();
    for (size_t i = 0; i < body["tools"].size(); ++i) {
      const json& t = body["tools"][i];
      const std::string p = "tools[" + std::to_string(i) + "]";
      if (type_of(t, "") != "function" || !t.contains("name") || !t["name"].is_string())
        return ApiError::bad_request(p + " must be {\"type\": \"function\", \"name\": ...} (only function tools are supported)", p);
      if (auto e = check_nested_fields(t, "responses tools[]", p)) return *e;
      json fn = {{"name", t["name"]}};
      for (const char* k : {"description", "parameters", "strict"})
        if (t.contains(k)) fn[k] = t[k];
      tools.push_back({{"type", "function"}, {"function", fn}});
    }
    chat["tools"] = tools;
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const json& tc = body["tool_choice"];
    if (auto e = check_nested_fields(tc, "responses tool_choice", "tool_choice")) return *e;
    if (type_of(tc, "") == "function" && tc.contains("name"))
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    else
      chat["tool_choice"] = tc;
  }
  if (body.contains("text") && !body["text"].is_null()) {
    const json& t = body["text"];
    if (!t.is_object()) return ApiError::bad_request("'text' must be an object", "text");
    if (auto e = check_nested_fields(t, "responses text", "text")) return *e;
    if (t.contains("verbosity") && !t["verbosity"].is_null())
      return ApiError::bad_request("'text.verbosity' is not supported", "text.verbosity", "unsupported_field");
    if (t.contains("format") && !t["format"].is_null()) chat["response_format"] = t["format"];
  }
  if (body.contains("store") && !body["store"].is_null() && !body["store"].is_boolean())
    return ApiError::bad_request("'store' must be a boolean", "store");
  // (Its errors name chat fields; send_error names the Responses ones: as_responses_error.)
  if (auto e = parse_chat_request(chat, defaults, out)) return *e;
  out.kind = ApiKind::Responses;
  out.n = 1;
  out.extra = body;
  return std::nullopt;
}

ApiError as_responses_error(ApiError err) {
  auto rename = [&](const std::string& from, const std::string& to) {
    if (err.param != from && err.param.rfind(from + ".", 0) != 0 && err.param.rfind(from + "[", 0) != 0) return;
    err.param = to + err.param.substr(from.size());
    for (size_t at = err.message.find(from); at != std::string::npos; at = err.message.find(from, at + to.size()))
      err.message.replace(at, from.size(), to);
  };
  // Chat nests a json_schema format's schema (response_format.json_schema.schema); the Responses
  // API puts it beside the type, so a missing one is text.format.schema.
  if (err.param == "response_format.json_schema" && err.code == "missing_required_field") {
    err.param = "text.format.schema";
    err.message = "'text.format.schema' is required";
  }
  rename("response_format", "text.format");
  rename("max_tokens", "max_output_tokens");
  // tools[i].function.X of the chat request is tools[i].X here.
  if (err.param.rfind("tools[", 0) == 0) {
    const std::size_t at = err.param.find("].function");
    if (at != std::string::npos) {
      const std::string from = err.param.substr(0, at + 10), to = err.param.substr(0, at + 1);
      rename(from, to);
    }
  }
  if (err.param.rfind("messages", 0) == 0) {
    // A message's index differs from its input item's (instructions, previous_response_id).
    err.param = "input";
    err.message = "input: " + err.message;
  }
  return err;
}

bool responses_store(const json& body) {
  auto it = body.find("store");
  return it == body.end() || !it->is_boolean() || it->get<bool>();
}

}  // namespace deltaserve
