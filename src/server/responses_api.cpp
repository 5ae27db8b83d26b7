// The OpenAI Responses API on OpenAiServer, and GenerationJob's Responses output format:
//
//   POST   /v1/responses       {model, input, instructions, tools, tool_choice, text.format, stream, store,
//                              previous_response_id, max_output_tokens, temperature, top_p, reasoning, ...}
//   GET    /v1/responses/{id}  a stored response
//   DELETE /v1/responses/{id}
//
// A request becomes a chat request (responses_request.h: instructions -> system message, input
// items -> messages, flat function tools -> chat tools, text.format -> response_format) and runs
// through the chat path (template, reasoning and tool-call parsers, constraints). Output items:
// reasoning (when the reasoning parser split some), message (output_text), function_call (one per
// call). Streaming sends response.created / in_progress, per item output_item.added, content
// deltas and .done events, then response.completed (or .incomplete / .failed), each with a
// sequence_number.
// Responses are kept (store, default true) in a bounded in-memory store, oldest dropped first;
// previous_response_id replays that conversation before the new input.
#include <deque>
#include <mutex>
#include <unordered_map>

#include "server/generation_job.h"
#include "server/json_util.h"
#include "server/openai_server.h"
#include "server/responses_request.h"

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

// The output items of a finished choice that streamed none (no reasoning, text or call: the
// response still holds a message, empty). A choice that streamed anything has its items from
// append_responses_events, streamed or not (responses_final), so both give the same items.
json output_items(const std::string& rid, const ChoiceState& s) {
  const std::string base = rid.size() > 5 ? rid.substr(5) : rid;  // after "resp_"
  // Cut off by max_output_tokens: the message is incomplete, as the response.
  const char* status = s.finish_reason() == "length" ? "incomplete" : "completed";
  return json::array({{{"type", "message"}, {"id", "msg_" + base}, {"status", status}, {"role", "assistant"},
                       {"content", json::array({{{"type", "output_text"}, {"text", s.text()}, {"annotations", json::array()}}})}}});
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
  if (s && status_in.empty()) out = output_items(response_id_, *s);
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
               {"store", responses_store(req)},
               {"temperature", json_float(request_.sampling.temperature)},
               {"text", req.value("text", json{{"format", {{"type", "text"}}}})},
               {"tool_choice", req.value("tool_choice", json("auto"))},
               {"tools", req.value("tools", json::array())},
               {"top_p", json_float(request_.sampling.top_p)},
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
  if (!request_.stream) return;  // a whole response builds its items from the same deltas, sends no event
  json e = {{"type", type}, {"sequence_number", rs_.seq++}};
  for (auto it = payload.begin(); it != payload.end(); ++it) e[it.key()] = it.value();
  out += "event: " + type + "\ndata: " + safe_dump(e) + "\n\n";
}

void GenerationJob::append_responses_events(const ChoiceDelta& d, std::string& out) {
  const std::string base = response_id_.substr(5);
  auto close = [&] {
    if (rs_.open.empty()) return;
    // The item open when max_output_tokens cuts the choice off is incomplete, whatever its kind.
    const char* status = d.finished && d.finish_reason == "length" ? "incomplete" : "completed";
    json item;
    if (rs_.open == "reasoning") {
      responses_event("response.reasoning_text.done",
                      {{"item_id", rs_.item_id}, {"output_index", rs_.output_index}, {"content_index", 0}, {"text", rs_.text}}, out);
      item = {{"type", "reasoning"}, {"id", rs_.item_id}, {"summary", json::array()},
              {"content", json::array({{{"type", "reasoning_text"}, {"text", rs_.text}}})}, {"status", status}};
    } else if (rs_.open == "message") {
      json part = {{"type", "output_text"}, {"text", rs_.text}, {"annotations", json::array()}};
      responses_event("response.output_text.done",
                      {{"item_id", rs_.item_id}, {"output_index", rs_.output_index}, {"content_index", 0}, {"text", rs_.text}}, out);
      responses_event("response.content_part.done",
                      {{"item_id", rs_.item_id}, {"output_index", rs_.output_index}, {"content_index", 0}, {"part", part}}, out);
      item = {{"type", "message"}, {"id", rs_.item_id}, {"status", status}, {"role", "assistant"},
              {"content", json::array({part})}};
    } else {
      responses_event("response.function_call_arguments.done",
                      {{"item_id", rs_.item_id}, {"output_index", rs_.output_index}, {"arguments", rs_.text}}, out);
      item = {{"type", "function_call"}, {"id", rs_.item_id}, {"call_id", rs_.call_id}, {"name", rs_.call_name},
              {"arguments", rs_.text}, {"status", status}};
    }
    responses_event("response.output_item.done", {{"output_index", rs_.output_index}, {"item", item}}, out);
    rs_items_.push_back(item);
    rs_.open.clear();
  };
  // An item's id: prefix + the response's, and _N for the kind's N-th item after the first (text
  // after a tool call opens a second message item; ids are unique within the response).
  auto item_id = [&](const char* prefix, int& n) {
    const int k = n++;
    return prefix + base + (k > 0 ? "_" + std::to_string(k) : "");
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
      open("reasoning", {{"type", "reasoning"}, {"id", item_id("rs_", rs_.n_reasoning)}, {"summary", json::array()},
                         {"content", json::array()}, {"status", "in_progress"}});
    rs_.text += d.reasoning;
    responses_event("response.reasoning_text.delta",
                    {{"item_id", rs_.item_id}, {"output_index", rs_.output_index}, {"content_index", 0}, {"delta", d.reasoning}},
                    out);
  }
  if (!d.text.empty()) {
    if (rs_.open != "message") {
      open("message", {{"type", "message"}, {"id", item_id("msg_", rs_.n_messages)}, {"status", "in_progress"},
                       {"role", "assistant"}, {"content", json::array()}});
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

json GenerationJob::responses_final() const {
  json final_obj = responses_object("");
  // The items append_responses_events built (their ids and order, streamed or not) are the output,
  // for the client and the store alike; a response without any keeps output_items' empty message.
  if (!rs_items_.empty()) final_obj["output"] = rs_items_;
  return final_obj;
}

void GenerationJob::append_responses_end(std::string& out) {
  json final_obj = responses_final();
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
    if (id.find('/') != std::string::npos)  // e.g. /v1/responses/{id}/input_items
      return send_error(*exchange, route,
                        ApiError::not_found("GET/DELETE /v1/responses/{id} are served; '" + path.substr(route.size()) +
                                            "' is not (input_items and cancel are not built)")),
             true;
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
  json messages;
  OpenAiRequest request;
  auto previous = [this](const std::string& id) -> std::optional<json> {
    auto e = responses_->get(id);
    if (!e) return std::nullopt;
    return e->conversation;
  };
  if (auto e = parse_responses_request(body, defaults_, previous, request, messages))
    return send_error(*exchange, route, *e), true;
  const bool store = responses_store(body);
  std::function<void(const json&)> on_response;
  if (store) {
    std::weak_ptr<ResponsesStore> weak = responses_;
    // The conversation is kept without this request's instructions (the first message): a later
    // request's instructions replace them, and the input's own system messages stay.
    const bool instructions = body.contains("instructions") && !body["instructions"].is_null();
    on_response = [weak, messages, instructions](const json& response) {
      auto s = weak.lock();
      if (!s) return;
      json conversation = messages;
      if (instructions && !conversation.empty()) conversation.erase(conversation.begin());
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
