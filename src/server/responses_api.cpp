// The OpenAI Responses API on OpenAiServer, and GenerationJob's Responses output format:
//
//   POST   /v1/responses       {model, input, instructions, tools, tool_choice, text.format, stream, store,
//                              previous_response_id, max_output_tokens, temperature, top_p, reasoning, ...}
//   GET    /v1/responses/{id}  a stored response
//   DELETE /v1/responses/{id}
//
// A request becomes a chat request (instructions -> system message, input items -> messages,
// flat function tools -> chat tools, text.format -> response_format) and runs through the chat
// path (template, reasoning and tool-call parsers, constraints). Output items: reasoning (when the
// reasoning parser split some), message (output_text), function_call (one per call). Streaming
// sends response.created / in_progress, per item output_item.added, content deltas and .done
// events, then response.completed (or .incomplete / .failed), each with a sequence_number.
// Responses are kept (store, default true) in a bounded in-memory store, oldest dropped first;
// previous_response_id replays that conversation before the new input.
#include <deque>
#include <mutex>
#include <unordered_map>

#include "server/generation_job.h"
#include "server/json_util.h"
#include "server/openai_server.h"
#include "server/request_fields.h"

namespace deltaserve {

using json = nlohmann::ordered_json;

class OpenAiServer::ResponsesStore {
 public:
  explicit ResponsesStore(size_t capacity) : capacity_(capacity) {}
  struct Entry {
    json response;
    json conversation;  // chat messages: the input and the output, for previous_response_id
  };
  void put(const std::string& id, Entry e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (capacity_ == 0) return;
    if (!entries_.count(id)) order_.push_back(id);
    entries_[id] = std::move(e);
    while (order_.size() > capacity_) {
      entries_.erase(order_.front());
      order_.pop_front();
    }
  }
  std::optional<Entry> get(const std::string& id) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return std::nullopt;
    return it->second;
  }
  bool erase(const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!entries_.erase(id)) return false;
    for (auto it = order_.begin(); it != order_.end(); ++it)
      if (*it == id) {
        order_.erase(it);
        break;
      }
    return true;
  }

 private:
  size_t capacity_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Entry> entries_;
  std::deque<std::string> order_;
};

std::shared_ptr<OpenAiServer::ResponsesStore> OpenAiServer::make_responses_store(size_t capacity) {
  return std::make_shared<ResponsesStore>(capacity);
}

namespace {

std::string text_of_parts(const json& content, const std::string& param, std::optional<ApiError>& err) {
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  if (!content.is_array()) {
    err = ApiError::bad_request("'" + param + "' must be a string or a list of content parts", param);
    return out;
  }
  for (size_t k = 0; k < content.size(); ++k) {
    const json& part = content[k];
    const std::string type = part.is_object() ? part.value("type", "") : "";
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
    const std::string type = it.value("type", "message");
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
      // Consecutive calls belong to one assistant turn.
      if (!messages.empty() && messages.back().value("role", "") == "assistant" && messages.back().contains("tool_calls")) {
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
      const json& out = it["output"];
      messages.push_back({{"role", "tool"}, {"tool_call_id", it["call_id"]}, {"content", out.is_string() ? out.get<std::string>() : out.dump()}});
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

// The output items of a finished choice.
json output_items(const std::string& rid, const ChoiceState& s, bool include_reasoning) {
  json items = json::array();
  const std::string base = rid.size() > 5 ? rid.substr(5) : rid;  // after "resp_"
  if (include_reasoning && !s.reasoning().empty()) {
    items.push_back({{"type", "reasoning"}, {"id", "rs_" + base}, {"summary", json::array()},
                     {"content", json::array({{{"type", "reasoning_text"}, {"text", s.reasoning()}}})},
                     {"status", "completed"}});
  }
  const auto calls = merge_tool_call_deltas(s.tool_call_deltas());
  // Only blanks before the calls: no message item (vLLM, SGLang give no content).
  if (s.text().find_first_not_of(" \t\r\n") != std::string::npos || calls.empty()) {
    // Cut off by max_output_tokens: the message is incomplete, as the response.
    const char* status = s.finish_reason() == "length" ? "incomplete" : "completed";
    items.push_back({{"type", "message"}, {"id", "msg_" + base}, {"status", status}, {"role", "assistant"},
                     {"content", json::array({{{"type", "output_text"}, {"text", s.text()}, {"annotations", json::array()}}})}});
  }
  for (size_t k = 0; k < calls.size(); ++k) {
    items.push_back({{"type", "function_call"}, {"id", "fc_" + base + "_" + std::to_string(k)}, {"call_id", calls[k].id},
                     {"name", calls[k].name}, {"arguments", calls[k].arguments}, {"status", "completed"}});
  }
  return items;
}

}  // namespace

// --- GenerationJob: the Responses output format ---

json GenerationJob::responses_object(const std::string& status_in) const {
  const json& req = request_.extra;
  const ChoiceState* s = choices_.empty() ? nullptr : choices_[0].state.get();
  std::string status = status_in;
  json incomplete = nullptr;
  if (status.empty() && s) {
    const std::string& r = s->finish_reason();
    status = r == "length" ? "incomplete" : r == "abort" ? "cancelled" : r == "error" ? "failed" : "completed";
    if (r == "length") incomplete = {{"reason", "max_output_tokens"}};
  }
  json out = json::array();
  if (s && status_in.empty()) out = output_items(response_id_, *s, options_.include_reasoning);
  const int reasoning = s ? s->n_reasoning_tokens() : 0, generated = s ? s->n_generated() : 0;
  json body = {{"id", response_id_},
               {"object", "response"},
               {"created_at", created_},
               {"status", status},
               {"error", status == "failed" ? json{{"code", "server_error"}, {"message", "the engine failed"}} : json(nullptr)},
               {"incomplete_details", incomplete},
               {"instructions", req.value("instructions", json(nullptr))},
               {"max_output_tokens", req.value("max_output_tokens", json(nullptr))},
               {"model", env_.model_name},
               {"output", out},
               {"parallel_tool_calls", request_.parallel_tool_calls},
               {"previous_response_id", req.value("previous_response_id", json(nullptr))},
               {"reasoning", req.value("reasoning", json{{"effort", nullptr}, {"summary", nullptr}})},
               {"store", req.value("store", true)},
               {"temperature", req.value("temperature", json(json_float(request_.sampling.temperature)))},
               {"text", req.value("text", json{{"format", {{"type", "text"}}}})},
               {"tool_choice", req.value("tool_choice", json("auto"))},
               {"tools", req.value("tools", json::array())},
               {"top_p", req.value("top_p", json(json_float(request_.sampling.top_p)))},
               {"truncation", "disabled"},
               {"usage", status_in.empty() ? json{{"input_tokens", n_prompt_tokens_},
                                                  {"input_tokens_details", {{"cached_tokens", cached_tokens()}}},
                                                  {"output_tokens", generated},
                                                  {"output_tokens_details", {{"reasoning_tokens", reasoning}}},
                                                  {"total_tokens", n_prompt_tokens_ + generated}}
                                           : json(nullptr)},
               {"user", req.value("user", json(nullptr))},
               {"metadata", req.value("metadata", json::object())}};
  return body;
}

void GenerationJob::responses_event(const std::string& type, json payload, std::string& out) {
  json e = {{"type", type}, {"sequence_number", rs_.seq++}};
  for (auto it = payload.begin(); it != payload.end(); ++it) e[it.key()] = it.value();
  out += "event: " + type + "\ndata: " + safe_dump(e) + "\n\n";
}

void GenerationJob::append_responses_events(const ChoiceDelta& d, std::string& out) {
  const std::string base = response_id_.substr(5);
  auto close = [&] {
    if (rs_.open.empty()) return;
    json item;
    if (rs_.open == "reasoning") {
      responses_event("response.reasoning_text.done",
                      {{"item_id", rs_.item_id}, {"output_index", rs_.output_index}, {"content_index", 0}, {"text", rs_.text}}, out);
      item = {{"type", "reasoning"}, {"id", rs_.item_id}, {"summary", json::array()},
              {"content", json::array({{{"type", "reasoning_text"}, {"text", rs_.text}}})}, {"status", "completed"}};
    } else if (rs_.open == "message") {
      json part = {{"type", "output_text"}, {"text", rs_.text}, {"annotations", json::array()}};
      responses_event("response.output_text.done",
                      {{"item_id", rs_.item_id}, {"output_index", rs_.output_index}, {"content_index", 0}, {"text", rs_.text}}, out);
      responses_event("response.content_part.done",
                      {{"item_id", rs_.item_id}, {"output_index", rs_.output_index}, {"content_index", 0}, {"part", part}}, out);
      item = {{"type", "message"}, {"id", rs_.item_id},
              {"status", d.finished && d.finish_reason == "length" ? "incomplete" : "completed"}, {"role", "assistant"},
              {"content", json::array({part})}};
    } else {
      responses_event("response.function_call_arguments.done",
                      {{"item_id", rs_.item_id}, {"output_index", rs_.output_index}, {"arguments", rs_.text}}, out);
      item = {{"type", "function_call"}, {"id", rs_.item_id}, {"call_id", rs_.call_id}, {"name", rs_.call_name},
              {"arguments", rs_.text}, {"status", "completed"}};
    }
    responses_event("response.output_item.done", {{"output_index", rs_.output_index}, {"item", item}}, out);
    rs_items_.push_back(item);
    rs_.open.clear();
  };
  auto open = [&](const std::string& kind, json item) {
    close();
    rs_.open = kind;
    rs_.output_index += 1;
    rs_.text.clear();
    rs_.item_id = item["id"].get<std::string>();
    responses_event("response.output_item.added", {{"output_index", rs_.output_index}, {"item", item}}, out);
  };
  if (!d.reasoning.empty() && options_.include_reasoning) {
    if (rs_.open != "reasoning")
      open("reasoning", {{"type", "reasoning"}, {"id", "rs_" + base}, {"summary", json::array()}, {"content", json::array()},
                         {"status", "in_progress"}});
    rs_.text += d.reasoning;
    responses_event("response.reasoning_text.delta",
                    {{"item_id", rs_.item_id}, {"output_index", rs_.output_index}, {"content_index", 0}, {"delta", d.reasoning}},
                    out);
  }
  if (!d.text.empty()) {
    if (rs_.open != "message") {
      open("message", {{"type", "message"}, {"id", "msg_" + base}, {"status", "in_progress"}, {"role", "assistant"},
                       {"content", json::array()}});
      responses_event("response.content_part.added",
                      {{"item_id", rs_.item_id}, {"output_index", rs_.output_index}, {"content_index", 0},
                       {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}},
                      out);
    }
    rs_.text += d.text;
    responses_event("response.output_text.delta",
                    {{"item_id", rs_.item_id}, {"output_index", rs_.output_index}, {"content_index", 0}, {"delta", d.text}}, out);
  }
  for (const auto& c : d.tool_calls) {
    if (!c.id.empty() || rs_.open != "function_call" || rs_.call_index != c.index) {
      open("function_call", {{"type", "function_call"}, {"id", "fc_" + base + "_" + std::to_string(c.index)}, {"call_id", c.id},
                             {"name", c.name}, {"arguments", ""}, {"status", "in_progress"}});
      rs_.call_index = c.index;
      rs_.call_id = c.id;
      rs_.call_name = c.name;
    }
    if (c.arguments.empty()) continue;
    rs_.text += c.arguments;
    responses_event("response.function_call_arguments.delta",
                    {{"item_id", rs_.item_id}, {"output_index", rs_.output_index}, {"delta", c.arguments}}, out);
  }
  if (d.finished) close();
}

void GenerationJob::append_responses_end(std::string& out) {
  json final_obj = responses_object("");
  // The streamed items (same ids) are the output; a response without any gets an empty message.
  if (!rs_items_.empty()) final_obj["output"] = rs_items_;
  const std::string status = final_obj["status"];
  const std::string type = status == "completed" ? "response.completed"
                           : status == "incomplete" ? "response.incomplete"
                                                    : "response.failed";
  responses_event(type, {{"response", final_obj}}, out);
}

// --- OpenAiServer: the routes ---

bool OpenAiServer::handle_responses(const HttpRequest& req, std::shared_ptr<HttpExchange>& exchange) {
  const std::string& path = req.path;
  const std::string route = "/v1/responses";
  if (path != route && path.rfind(route + "/", 0) != 0) return false;
  if (!authorized(req)) {
    send_error(*exchange, route, ApiError::unauthorized("missing or invalid API key: send 'Authorization: Bearer <key>'"));
    return true;
  }
  if (path != route) {
    const std::string id = path.substr(route.size() + 1);
    if (req.method == "GET") {
      auto e = responses_->get(id);
      if (!e) return send_error(*exchange, route, ApiError::not_found("response '" + id + "' not found (or no longer stored)")), true;
      send_json(*exchange, route, e->response);
      return true;
    }
    if (req.method == "DELETE") {
      if (!responses_->erase(id)) return send_error(*exchange, route, ApiError::not_found("response '" + id + "' not found")), true;
      send_json(*exchange, route, {{"id", id}, {"object", "response"}, {"deleted", true}});
      return true;
    }
    send_error(*exchange, route, ApiError::method_not_allowed("GET, DELETE"));
    return true;
  }
  if (req.method != "POST") return send_error(*exchange, route, ApiError::method_not_allowed("POST")), true;
  const auto arrival = GenerationJob::Clock::now();
  json body;
  if (auto e = parse_body(req, body)) return send_error(*exchange, route, *e), true;
  if (!body.is_object()) return send_error(*exchange, route, ApiError::bad_request("the request body must be a JSON object")), true;
  if (auto e = check_request_fields(body, FieldApi::Responses)) return send_error(*exchange, route, *e), true;
  if (!body.contains("input") || body["input"].is_null())
    return send_error(*exchange, route, ApiError::bad_request("'input' is required", "input", "missing_required_field")), true;

  // The conversation: a stored response's, then instructions, then the new input.
  json messages = json::array();
  if (body.contains("previous_response_id") && !body["previous_response_id"].is_null()) {
    if (!body["previous_response_id"].is_string())
      return send_error(*exchange, route, ApiError::bad_request("'previous_response_id' must be a string", "previous_response_id")), true;
    auto prev = responses_->get(body["previous_response_id"].get<std::string>());
    if (!prev)
      return send_error(*exchange, route, ApiError::bad_request("previous response '" + body["previous_response_id"].get<std::string>() +
                                                                    "' is not stored",
                                                                "previous_response_id")), true;
    for (const auto& m : prev->conversation)
      if (m.value("role", "") != "system") messages.push_back(m);
  }
  if (body.contains("instructions") && !body["instructions"].is_null()) {
    if (!body["instructions"].is_string())
      return send_error(*exchange, route, ApiError::bad_request("'instructions' must be a string", "instructions")), true;
    messages.insert(messages.begin(), json{{"role", "system"}, {"content", body["instructions"]}});
  }
  if (auto e = input_to_messages(body["input"], messages)) return send_error(*exchange, route, *e), true;

  // The equivalent chat request.
  json chat = {{"messages", messages}};
  for (const char* k : {"temperature", "top_p", "stream", "user", "metadata", "safety_identifier", "prompt_cache_key",
                        "parallel_tool_calls", "service_tier"}) {
    if (body.contains(k)) chat[k] = body[k];
  }
  if (body.contains("max_output_tokens") && !body["max_output_tokens"].is_null()) chat["max_tokens"] = body["max_output_tokens"];
  if (body.contains("reasoning") && !body["reasoning"].is_null()) chat["reasoning"] = body["reasoning"];
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) return send_error(*exchange, route, ApiError::bad_request("'tools' must be a list", "tools")), true;
    json tools = json::array();
    for (size_t i = 0; i < body["tools"].size(); ++i) {
      const json& t = body["tools"][i];
      const std::string p = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || t.value("type", "") != "function" || !t.contains("name") || !t["name"].is_string())
        return send_error(*exchange, route, ApiError::bad_request(p + " must be {\"type\": \"function\", \"name\": ...} (only function tools are supported)", p)), true;
      if (auto e = check_nested_fields(t, "responses tools[]", p)) return send_error(*exchange, route, *e), true;
      json fn = {{"name", t["name"]}};
      for (const char* k : {"description", "parameters", "strict"})
        if (t.contains(k)) fn[k] = t[k];
      tools.push_back({{"type", "function"}, {"function", fn}});
    }
    chat["tools"] = tools;
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const json& tc = body["tool_choice"];
    if (auto e = check_nested_fields(tc, "responses tool_choice", "tool_choice")) return send_error(*exchange, route, *e), true;
    if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("name"))
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    else
      chat["tool_choice"] = tc;
  }
  if (body.contains("text") && !body["text"].is_null()) {
    const json& t = body["text"];
    if (!t.is_object()) return send_error(*exchange, route, ApiError::bad_request("'text' must be an object", "text")), true;
    for (auto it = t.begin(); it != t.end(); ++it)
      if (it.key() != "format" && it.key() != "verbosity")
        return send_error(*exchange, route, ApiError::bad_request("unrecognized field 'text." + it.key() + "'", "text." + it.key(),
                                                                  "unrecognized_field")), true;
    if (t.contains("verbosity") && !t["verbosity"].is_null())
      return send_error(*exchange, route, ApiError::bad_request("'text.verbosity' is not supported", "text.verbosity",
                                                                "unsupported_field")), true;
    if (t.contains("format") && !t["format"].is_null()) chat["response_format"] = t["format"];
  }
  if (body.contains("store") && !body["store"].is_null() && !body["store"].is_boolean())
    return send_error(*exchange, route, ApiError::bad_request("'store' must be a boolean", "store")), true;
  OpenAiRequest request;
  if (auto e = parse_chat_request(chat, defaults_, request)) {
    // Errors name the Responses fields, not the chat ones they were mapped to.
    ApiError err = *e;
    auto rename = [&](const std::string& from, const std::string& to) {
      if (err.param != from && err.param.rfind(from + ".", 0) != 0 && err.param.rfind(from + "[", 0) != 0) return;
      err.param = to + err.param.substr(from.size());
      for (size_t at = err.message.find(from); at != std::string::npos; at = err.message.find(from, at + to.size()))
        err.message.replace(at, from.size(), to);
    };
    rename("response_format", "text.format");
    rename("max_tokens", "max_output_tokens");
    if (err.param.rfind("messages", 0) == 0) {
      // A message's index differs from its input item's (instructions, previous_response_id).
      err.param = "input";
      err.message = "input: " + err.message;
    }
    return send_error(*exchange, route, err), true;
  }
  request.kind = ApiKind::Responses;
  request.n = 1;
  request.extra = body;
  const bool store = body.value("store", true) == true;
  std::function<void(const json&)> on_response;
  if (store) {
    std::weak_ptr<ResponsesStore> weak = responses_;
    on_response = [weak, messages](const json& response) {
      auto s = weak.lock();
      if (!s) return;
      json conversation = messages;
      // The assistant turn, as a chat message, for previous_response_id.
      json m = {{"role", "assistant"}, {"content", ""}};
      for (const auto& item : response["output"]) {
        const std::string t = item.value("type", "");
        if (t == "message") {
          for (const auto& part : item["content"]) m["content"] = m["content"].get<std::string>() + part.value("text", "");
        } else if (t == "reasoning") {
          std::string r;
          for (const auto& part : item["content"]) r += part.value("text", "");
          m["reasoning_content"] = r;
        } else if (t == "function_call") {
          if (!m.contains("tool_calls")) m["tool_calls"] = json::array();
          m["tool_calls"].push_back({{"id", item["call_id"]}, {"type", "function"},
                                     {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
        }
      }
      conversation.push_back(m);
      s->put(response["id"].get<std::string>(), ResponsesStore::Entry{response, conversation});
    };
  }
  start_request(std::move(request), std::move(exchange), arrival, std::move(on_response));
  return true;
}

}  // namespace deltaserve
