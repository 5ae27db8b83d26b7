#include "server/openai_server.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <thread>

#include "grammar/regex.h"
#include "server/generation_job.h"
#include "server/json_util.h"
#include "server/request_constraint.h"
#include "server/responses_request.h"
#include "server/tool_call_grammar.h"
#include "util/json_parse.h"
#include "util/task_queue.h"
#include "util/log.h"

namespace deltaserve {

using json = nlohmann::ordered_json;

OpenAiServer::OpenAiServer(ServerConfig config, EngineService& engine, Tokenizer tokenizer,
                           ChatRenderFn render_chat, SamplingDefaults defaults)
    : config_(std::move(config)),
      engine_(engine),
      tokenizer_(std::move(tokenizer)),
      render_chat_(std::move(render_chat)),
      defaults_(std::move(defaults)) {
  created_ = std::chrono::duration_cast<std::chrono::seconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  think_start_id_ = tokenizer_.token_id("<think>");
  think_end_id_ = tokenizer_.token_id("</think>");
  if (auto eos = tokenizer_.eos_token_id()) {
    bool have = false;
    for (TokenId id : defaults_.eos_token_ids) have = have || id == *eos;
    if (!have) defaults_.eos_token_ids.push_back(*eos);
  }
  grammar_ = std::make_unique<GrammarService>(tokenizer_, defaults_.eos_token_ids);
  responses_ = make_responses_store(config_.responses_store_size);
  metrics_.set_model_name(config_.served_model_name);
  if (config_.start_loading) state_.store(ServeState::Loading);
}

void OpenAiServer::set_server_info(int64_t launch_id, int speculative_num_steps, json info) {
  config_.launch_id = launch_id;
  config_.speculative_num_steps = speculative_num_steps;
  config_.server_info = std::move(info);
}

std::size_t OpenAiServer::pending_writes() const { return http_ ? http_->pending_writes() : 0; }

OpenAiServer::~OpenAiServer() { stop(); }

Status OpenAiServer::start() {
  auto kind = tool_parser_kind_from_name(config_.tool_call_parser);
  if (!kind) return kind.status();
  tool_parser_ = *kind;
  if (!config_.reasoning_parser.empty()) {
    if (config_.reasoning_parser != "qwen3" && config_.reasoning_parser != "qwen3-thinking" &&
        config_.reasoning_parser != "deepseek-r1") {
      return error("unknown --reasoning-parser '", config_.reasoning_parser,
                   "' (supported: qwen3, qwen3-thinking, deepseek-r1)");
    }
    reasoning_parser_ = true;
  }
  HttpServerConfig hc;
  hc.host = config_.host;
  hc.port = config_.port;
  hc.n_threads = config_.n_http_threads;
  hc.max_body_bytes = config_.max_request_bytes;
  hc.error_body = [](int status, const std::string& message) {
    ApiError e = status == 413 ? ApiError::too_large(message) : ApiError::bad_request(message);
    e.status = status;
    return e.to_json();
  };
  // Authentication from the request head: a request without the key is answered 401 before its
  // body is read.
  hc.screen = [this](const HttpRequest& head) -> std::optional<HttpEarlyResponse> {
    if (auth_exempt(head) || authorized(head)) return std::nullopt;
    metrics_.count_request(head.path, 401);
    HttpEarlyResponse r;
    r.status = 401;
    r.body = unauthorized_error().to_json();
    r.headers = cors_headers(head);
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return r;
  };
  workers_ = std::make_unique<TaskQueue>(std::max(1, config_.n_prepare_threads));
  http_ = std::make_unique<HttpServer>(hc, [this](HttpRequest&& req,
                                                  std::shared_ptr<HttpExchange> exchange) {
    handle(std::move(req), std::move(exchange));
  });
  return http_->start();
}

int OpenAiServer::port() const { return http_ ? http_->port() : 0; }

void OpenAiServer::stop() {
  if (stopped_.exchange(true)) return;
  if (http_) http_->stop_accepting();
  if (workers_) workers_->stop();  // requests being prepared become jobs (or answers) first
  // A job can outlive its response for a moment (the engine thread drops the last reference after
  // the final event), and its destructor reaches into this server (the job count, the registry,
  // its HTTP connection). Abort what still runs, while the io threads can carry the cancels, and
  // wait until every job is gone.
  if (http_) {
    abort_all();
    const auto deadline = std::chrono::steady_clock::now() + kStopJobWait;
    while (active_jobs_.load() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (const int left = active_jobs_.load(); left > 0)
      log_warn("http: ", left, " request(s) still held by the engine at shutdown (it stopped before the server)");
    http_->stop();
  }
}

void OpenAiServer::stop_accepting() {
  if (http_) http_->stop_accepting();
}

bool OpenAiServer::auth_exempt(const HttpRequest& request) {
  // /health for liveness probes and GET /health_generate for readiness probes (SGLang's API-key
  // middleware lets every /health* path through: an SGLang cluster's probes send no key),
  // /metrics for scrapers (aggregate counters; route labels come from the route table only), CORS
  // preflights (browsers send them without credentials), and the status page itself (GET / is
  // static HTML; its data, /status.json, needs the key).
  const bool get = request.method == "GET" || request.method == "HEAD";
  return request.method == "OPTIONS" || request.path == "/health" || request.path == "/v1/health" ||
         (request.path == "/health_generate" && get) || request.path == "/metrics" || (request.path == "/" && get);
}

ApiError OpenAiServer::unauthorized_error() {
  return ApiError::unauthorized("missing or invalid API key: send 'Authorization: Bearer <key>'");
}

void OpenAiServer::wait() {
  if (http_) http_->wait();
}

bool OpenAiServer::authorized(const HttpRequest& request) const {
  if (config_.api_key.empty()) return true;
  std::string auth = request.header("authorization");
  const std::string prefix = "Bearer ";
  if (auth.size() <= prefix.size() || auth.compare(0, prefix.size(), prefix) != 0) return false;
  std::string token = auth.substr(prefix.size());
  // Constant-time compare.
  if (token.size() != config_.api_key.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < token.size(); ++i) {
    diff |= static_cast<unsigned char>(token[i] ^ config_.api_key[i]);
  }
  return diff == 0;
}

void OpenAiServer::send_error(HttpExchange& exchange, const std::string& route,
                              const ApiError& error_in) {
  // /v1/responses runs as a chat request: its later checks' errors name the Responses fields too.
  const ApiError error = route == "/v1/responses" ? as_responses_error(error_in)
                         : route == "/generate"   ? as_generate_error(error_in)
                                                  : error_in;
  metrics_.count_request(route, error.status);
  HttpHeaders headers;
  if (error.status == 401) headers.emplace_back("WWW-Authenticate", "Bearer");
  if (error.status == 503) headers.emplace_back("Retry-After", "1");
  if (error.status == 405) headers.emplace_back("Allow", error.allow.empty() ? "GET, HEAD, POST" : error.allow);
  exchange.respond(error.status, "application/json", error.to_json(), std::move(headers));
}

namespace {

// Percent-decoding of a path segment ("org%2Fname" -> "org/name"); nullopt if malformed.
std::optional<std::string> url_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i + 1])) ||
        !std::isxdigit(static_cast<unsigned char>(s[i + 2])))
      return std::nullopt;
    out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
    i += 2;
  }
  return out;
}

}  // namespace

HttpHeaders OpenAiServer::cors_headers(const HttpRequest& req) const {
  if (!config_.enable_cors) return {};
  const std::string origin = req.header("origin");
  if (origin.empty()) return {};
  bool any = false, listed = false;
  for (const auto& o : config_.allowed_origins) {
    any = any || o == "*";
    listed = listed || o == origin;
  }
  if (!any && !listed) return {};
  HttpHeaders h;
  h.emplace_back("Access-Control-Allow-Origin", any ? "*" : origin);
  if (!any) h.emplace_back("Vary", "Origin");
  return h;
}

void OpenAiServer::send_json(HttpExchange& exchange, const std::string& route, const json& body) {
  metrics_.count_request(route, 200);
  exchange.respond(200, "application/json", safe_dump(body));
}

void OpenAiServer::handle(HttpRequest&& req, std::shared_ptr<HttpExchange> exchange) {
  // Requests with a body (parsing, chat templating, tokenization: up to seconds for a huge
  // prompt) run on the prepare workers, so the io threads keep answering /health and streaming.
  if (const ServeState st = state(); st != ServeState::Ready && req.path != "/metrics" && req.method != "OPTIONS") {
    // Loading or draining: nothing is served (a request already being prepared still is).
    const bool loading = st == ServeState::Loading;
    ApiError e(503, loading ? "the model is loading; retry shortly" : "the server is shutting down",
               "server_unavailable", {}, loading ? "loading" : "shutting_down");
    metrics_.count_request(req.path, 503);
    // A draining server's keep-alive connections close after this answer, so that clients
    // reconnect (to another instance) rather than reuse a connection that can only get 503s.
    if (!loading) exchange->close_after_response();
    if (req.path == "/health" || req.path == "/v1/health") {
      return exchange->respond(503, "application/json",
                               json{{"status", loading ? "loading" : "shutting_down"}}.dump(),
                               {{"Retry-After", "1"}});
    }
    return send_error(*exchange, req.path, e);
  }
  if (req.method == "POST" && workers_) {
    preparing_.fetch_add(1);
    workers_->post([this, req = std::move(req), exchange = std::move(exchange)]() mutable {
      route_guarded(std::move(req), std::move(exchange));
      preparing_.fetch_sub(1);
    });
    return;
  }
  route_guarded(std::move(req), std::move(exchange));
}

void OpenAiServer::route_guarded(HttpRequest&& req, std::shared_ptr<HttpExchange> exchange) {
  const std::string path = req.path;
  try {
    route(std::move(req), exchange);
  } catch (const nlohmann::json::exception& e) {
    // A field of the wrong JSON type that validation did not name: still the client's error.
    send_error(*exchange, path, ApiError::bad_request(std::string("invalid request: ") + e.what()));
  } catch (const std::exception& e) {
    log_warn("http: handler threw: ", e.what());
    send_error(*exchange, path, ApiError::internal(std::string("internal error: ") + e.what()));
  }
}

void OpenAiServer::route(HttpRequest&& req, std::shared_ptr<HttpExchange> exchange) {
  const std::string& path = req.path;
  bool get = req.method == "GET" || req.method == "HEAD";
  bool post = req.method == "POST";
  const HttpHeaders cors = cors_headers(req);
  for (const auto& [k, v] : cors) exchange->add_header(k, v);
  if (req.method == "OPTIONS") {
    // CORS preflight (browsers send it before a cross-origin POST with JSON).
    if (!config_.enable_cors) {
      return send_error(*exchange, "other", {405, "OPTIONS (CORS preflight) needs the server started with --enable-cors",
                                             "invalid_request_error", "", "cors_disabled"});
    }
    if (cors.empty()) {
      return send_error(*exchange, "other", {403, "origin '" + req.header("origin") + "' is not in --allowed-origins",
                                             "invalid_request_error", "", "cors_origin"});
    }
    HttpHeaders h = {{"Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS"},
                     {"Access-Control-Allow-Headers",
                      req.header("access-control-request-headers").empty() ? "authorization, content-type"
                                                                           : req.header("access-control-request-headers")},
                     {"Access-Control-Max-Age", "600"}};
    metrics_.count_request("OPTIONS", 204);
    return exchange->respond(204, "text/plain", "", std::move(h));
  }
  // Every route but /health, /metrics and the page at / needs the key (unknown paths too: 401 before 404).
  if (!auth_exempt(req) && !authorized(req)) return send_error(*exchange, path, unauthorized_error());
  if (path == "/health" || path == "/v1/health") {
    if (!get) return send_error(*exchange, path, ApiError::method_not_allowed("GET"));
    metrics_.count_request("/health", 200);
    return exchange->respond(200, "application/json", "{}");
  }
  if (path == "/metrics") {
    if (!get) return send_error(*exchange, path, ApiError::method_not_allowed("GET"));
    metrics_.count_request("/metrics", 200);
    return exchange->respond(200, "text/plain; version=0.0.4; charset=utf-8",
                             metrics_.render(engine_.stats(), engine_.replica_stats()));
  }
  if (path == "/v1/server_info" || path == "/server_info" || path == "/get_server_info") {
    // The server's arguments and the engine's allocation (SGLang's /get_server_info), what
    // `deltaserve bench` attaches its results to, and live figures.
    if (!get) return send_error(*exchange, path, ApiError::method_not_allowed("GET"));
    const EngineStats st = engine_.stats();
    json info = json::parse(config_.server_info.dump());
    info["launch_id"] = config_.launch_id;
    info["model"] = config_.served_model_name;
    info["context_length"] = engine_.context_length();
    info["speculative_num_steps"] = config_.speculative_num_steps;
    info["requests_running"] = st.requests_running;
    info["requests_waiting"] = st.requests_waiting;
    // The counters too, so that a client (deltaserve bench) can take the accept length of its own
    // requests from their change.
    info["spec_verify_steps_total"] = st.spec_verify_steps_total;
    info["spec_accepted_tokens_total"] = st.spec_accepted_tokens_total;
    json accept = nullptr;
    if (st.spec_verify_steps_total > 0)
      info["accept_length"] = accept = 1.0 + double(st.spec_accepted_tokens_total) / double(st.spec_verify_steps_total);
    // SGLang's per-scheduler states, one per data-parallel replica: its bench_serving reads
    // internal_states[0].avg_spec_accept_length after every run (a KeyError without them).
    std::vector<EngineStats> replicas = engine_.replica_stats();
    if (replicas.empty()) replicas.push_back(st);
    json states = json::array();
    for (const EngineStats& r : replicas)
      states.push_back({{"avg_spec_accept_length",
                         r.spec_verify_steps_total > 0
                             ? json(1.0 + double(r.spec_accepted_tokens_total) / double(r.spec_verify_steps_total))
                             : json(nullptr)}});
    info["internal_states"] = std::move(states);
    if (!info.contains("served_model_name") || info["served_model_name"] == "")
      info["served_model_name"] = config_.served_model_name;
    metrics_.count_request(path == "/get_server_info" ? "/get_server_info" : "/v1/server_info", 200);
    return exchange->respond(200, "application/json", info.dump());
  }
  if (handle_status(req, exchange)) return;
  if (handle_sglang(req, exchange)) return;
  if (handle_responses(req, exchange)) return;
  bool known = path == "/v1/models" || path == "/v1/chat/completions" || path == "/v1/completions" ||
               path.rfind("/v1/models/", 0) == 0;
  if (!known) {
    return send_error(*exchange, path, ApiError::not_found("no route for " + req.method + " " + path));
  }
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
    if (!get) return send_error(*exchange, path, ApiError::method_not_allowed("GET"));
    json model = {{"id", config_.served_model_name},
                  {"object", "model"},
                  {"created", created_},
                  {"owned_by", "deltaserve"},
                  {"root", config_.served_model_name},
                  {"max_model_len", engine_.context_length()}};
    if (path != "/v1/models") {
      // The id may contain slashes, sent raw ("org/name") or encoded ("org%2Fname").
      auto id = url_decode(path.substr(std::string("/v1/models/").size()));
      if (!id) return send_error(*exchange, "/v1/models", ApiError::bad_request("malformed percent-encoding in the model id"));
      if (*id != config_.served_model_name)
        return send_error(*exchange, "/v1/models", ApiError::not_found("model '" + *id + "' not found"));
      metrics_.count_request("/v1/models", 200);
      return exchange->respond(200, "application/json", safe_dump(model));
    }
    metrics_.count_request("/v1/models", 200);
    return exchange->respond(200, "application/json",
                             safe_dump(json{{"object", "list"}, {"data", json::array({model})}}));
  }
  if (!post) {
    return send_error(*exchange, path,
                      ApiError::method_not_allowed("POST"));
  }
  handle_generate(path == "/v1/chat/completions" ? ApiKind::Chat : ApiKind::Completion, req,
                  std::move(exchange));
}

std::optional<ApiError> OpenAiServer::parse_body(const HttpRequest& req, json& body) const {
  if (req.body.size() > config_.max_request_bytes) return ApiError::too_large("request body too large");
  if (json_nesting_depth(req.body, config_.max_json_depth) > config_.max_json_depth) {
    return ApiError::bad_request("JSON nesting deeper than " + std::to_string(config_.max_json_depth) + " levels", "",
                                 "invalid_json");
  }
  // Linear-time parse into ordered_json (key order kept for schemas and tool arguments).
  std::string why;
  if (!parse_ordered_json(req.body, body, &why, config_.max_json_depth)) {
    return ApiError::bad_request("malformed JSON: " + why, "", "invalid_json");
  }
  return std::nullopt;
}

void OpenAiServer::handle_generate(ApiKind kind, const HttpRequest& req,
                                   std::shared_ptr<HttpExchange> exchange) {
  auto arrival = GenerationJob::Clock::now();
  const std::string route = kind == ApiKind::Chat ? "/v1/chat/completions" : "/v1/completions";
  json body;
  if (auto e = parse_body(req, body)) return send_error(*exchange, route, *e);
  OpenAiRequest request;
  std::optional<ApiError> err = kind == ApiKind::Chat
                                    ? parse_chat_request(body, defaults_, request)
                                    : parse_completion_request(body, defaults_, request);
  if (err) return send_error(*exchange, route, *err);
  start_request(std::move(request), std::move(exchange), arrival);
}

std::string OpenAiServer::route_name(ApiKind kind) {
  switch (kind) {
    case ApiKind::Chat: return "/v1/chat/completions";
    case ApiKind::Completion: return "/v1/completions";
    case ApiKind::Generate: return "/generate";
    case ApiKind::Responses: return "/v1/responses";
  }
  return "other";
}

namespace {

// allowed_token_ids that the other rules exclude from the first token on: a 400 naming the
// conflict, not a request that can only end in an error. (Conflicts that arise later, from a
// grammar's path or multi-token bad words, end the request with an error: exhausted_at.)
std::optional<ApiError> check_allowed_ids(const ConstraintPlan& plan, bool generate) {
  if (plan.allowed_ids.empty()) return std::nullopt;
  std::vector<TokenId> usable;
  for (TokenId id : plan.allowed_ids) {
    bool banned = false;  // a one-token bad word is never generated
    for (const auto& w : plan.bad_words) banned = banned || (w.size() == 1 && w[0] == id);
    if (!banned) usable.push_back(id);
  }
  if (usable.empty())
    return ApiError::bad_request("every id in allowed_token_ids is a bad word (bad_words): no token can be generated",
                                 "allowed_token_ids");
  auto is_end = [&](TokenId id) { return std::find(plan.end_ids.begin(), plan.end_ids.end(), id) != plan.end_ids.end(); };
  if (plan.min_tokens > 0 && std::all_of(usable.begin(), usable.end(), is_end))
    return ApiError::bad_request("allowed_token_ids holds only end ids (EOS, stop_token_ids), which min_tokens (" +
                                     std::to_string(plan.min_tokens) + ") bans for the first tokens",
                                 generate ? "sampling_params.min_new_tokens" : "min_tokens");
  if (plan.grammar && !plan.grammar_after) {
    GrammarMatcher m(plan.grammar);
    const TokenBitset& mask = m.next_token_mask();
    const bool any = std::any_of(usable.begin(), usable.end(), [&](TokenId id) {
      return (id < mask.size() && mask.test(id)) || (m.can_end() && is_end(id));
    });
    if (!any)
      return ApiError::bad_request("no id in allowed_token_ids can begin the structured output the request asks for",
                                   "allowed_token_ids");
  }
  return std::nullopt;
}

}  // namespace

// The grammar of tool calls in the server's --tool-call-parser format (GrammarService::build,
// tool_call_grammar.h); `param` is the field errors name.
ConstraintSpec OpenAiServer::tool_call_constraint(const std::string& param, const json& tools, bool parallel) const {
  ConstraintSpec c;
  c.kind = ConstraintSpec::Kind::ToolCall;
  c.param = param;
  c.json = {{"format", config_.tool_call_parser}, {"tools", tools}, {"parallel", parallel}};
  return c;
}

void OpenAiServer::start_request(OpenAiRequest request, std::shared_ptr<HttpExchange> exchange,
                                 GenerationJob::Clock::time_point arrival, std::function<void(const json&)> on_response) {
  const ApiKind kind = request.kind;
  const bool chat = is_chat_like(kind);
  const std::string route = route_name(kind);
  const int vocab = tokenizer_.vocab_size();

  // A forced tool call becomes the request's grammar, in the format the tool parser reads.
  const bool forced_call = chat && !request.tools.is_null() &&
                           (request.tool_choice == "required" || request.tool_choice == "function");
  if (forced_call) {
    if (tool_parser_ == ToolParserKind::None) {
      return send_error(*exchange, route,
                        ApiError::bad_request("tool_choice '" + request.tool_choice +
                                                  "' forces a tool call, which needs the server started with "
                                                  "--tool-call-parser (qwen3_coder or hermes)",
                                              "tool_choice"));
    }
    if (!request.constraint.empty()) {
      return send_error(*exchange, route,
                        ApiError::bad_request("tool_choice '" + request.tool_choice + "' and '" + request.constraint.param +
                                                  "' both constrain the output; give only one",
                                              "tool_choice"));
    }
    request.constraint = tool_call_constraint("tool_choice", request.tools,
                                              request.parallel_tool_calls && request.tool_choice == "required");
  }

  // Tools the model may call ("auto"): without a parser the calls would come back as plain text
  // (vLLM refuses the same: "auto" tool choice requires --tool-call-parser).
  const bool auto_tools = chat && !forced_call && request.tools.is_array() && !request.tools.empty();
  if (auto_tools && tool_parser_ == ToolParserKind::None) {
    return send_error(*exchange, route,
                      ApiError::bad_request("'tools' needs the server started with --tool-call-parser (qwen3_coder or "
                                            "hermes): without it the model's calls would come back as text",
                                            "tools"));
  }
  // Strict tools under "auto" (OpenAI's `function.strict`): text, then optionally calls whose
  // arguments follow the strict tools' schemas (tool_call_grammar.h, ToolCallMode::AfterText).
  // With a JSON response_format the output is that answer or the calls.
  if (auto_tools && any_strict_tool(request.tools)) {
    json answer;  // null: free text before the calls
    if (request.constraint.kind == ConstraintSpec::Kind::JsonSchema) answer = request.constraint.json;
    else if (request.constraint.kind == ConstraintSpec::Kind::JsonObject) answer = {{"type", "object"}};
    else if (!request.constraint.empty()) {
      return send_error(*exchange, route,
                        ApiError::bad_request("tools with 'strict': true and '" + request.constraint.param +
                                                  "' both constrain the output; give only one",
                                              "tools"));
    }
    request.constraint = tool_call_constraint("tools", request.tools, request.parallel_tool_calls);
    request.constraint.json["after_text"] = true;
    request.constraint.json["answer_schema"] = std::move(answer);
  }

  // Prompt(s) → token ids. Chat has one prompt; /v1/completions may have a batch.
  std::vector<JobPrompt> prompts;
  const char* prompt_param = chat ? "messages" : kind == ApiKind::Generate ? "text" : "prompt";
  bool prompt_opens_think = false;
  if (chat) {
    if (!render_chat_) {
      return send_error(*exchange, route,
                        ApiError::bad_request("the model has no chat template: start the server with --chat-template "
                                              "FILE, or send the prompt to /v1/completions",
                                              "messages"));
    }
    if (!request.add_generation_prompt) request.template_kwargs["add_generation_prompt"] = false;
    // Tools are rendered whenever the request has them (tool_choice "none" already dropped them).
    Result<std::string> text =
        render_chat_(request.messages, request.tools, request.template_kwargs);
    if (!text) {
      return send_error(*exchange, route,
                        ApiError::bad_request("chat template: " + text.status().message(),
                                              "messages"));
    }
    if (request.continue_final_message) {
      // vLLM's (transformers') way: render the conversation closed, then cut after the final
      // message's text. Templates often trim it (Qwen's `|trim`), so it is found without its outer
      // whitespace, and the cut keeps its trailing whitespace only where the template kept it.
      const std::string final_text = request.messages.back().value("content", "");
      const char* kSpace = " \t\n\r\v\f";
      const size_t first = final_text.find_first_not_of(kSpace);
      const std::string lstripped = first == std::string::npos ? std::string() : final_text.substr(first);
      const std::string stripped = lstripped.substr(0, lstripped.find_last_not_of(kSpace) + 1);
      // Where the final message's text ends: the template's text after it, rendered with a marker in
      // its place, is what follows it here. (A plain rfind matched inside that closing text: "m" in
      // "<|im_end|>".) A template whose closing text depends on the message falls back to rfind.
      size_t end = std::string::npos;
      if (!stripped.empty()) {
        static constexpr std::string_view kMarker = "\x1f" "deltaserve:final-message" "\x1f";
        json marked = request.messages;
        marked.back()["content"] = std::string(kMarker);
        Result<std::string> m = render_chat_(marked, request.tools, request.template_kwargs);
        const size_t mark = m ? m->rfind(kMarker) : std::string::npos;
        if (mark != std::string::npos) {
          const std::string_view after = std::string_view(*m).substr(mark + kMarker.size());
          if (std::string_view(*text).ends_with(after)) end = text->size() - after.size();
        }
      }
      const size_t at = stripped.empty() ? std::string::npos
                        : end == std::string::npos ? text->rfind(stripped)
                        : end < stripped.size()    ? std::string::npos
                                                   : text->rfind(stripped, end - stripped.size());
      if (at == std::string::npos) {
        return send_error(*exchange, route,
                          ApiError::bad_request("continue_final_message: the final assistant message must have text "
                                                "that the chat template renders",
                                                "continue_final_message"));
      }
      text->resize(at + (text->compare(at, lstripped.size(), lstripped) == 0 ? lstripped.size() : stripped.size()));
    }
    // Thinking on: the prompt opened <think> (the grammar then starts after </think>).
    const size_t open = text->rfind("<think>"), close = text->rfind("</think>");
    prompt_opens_think = open != std::string::npos && (close == std::string::npos || close < open);
    prompts.push_back(JobPrompt{tokenizer_.encode(*text, true), {}, 0});
  } else {
    prompts.reserve(request.prompts.size());
    for (std::size_t p = 0; p < request.prompts.size(); ++p) {
      CompletionPrompt& cp = request.prompts[p];
      JobPrompt jp;
      if (cp.is_ids) {
        jp.ids = std::move(cp.ids);
        for (TokenId id : jp.ids) {
          if (id >= vocab) {
            std::string where =
                request.batched_prompt ? std::string(prompt_param) + "[" + std::to_string(p) + "]: " : std::string();
            return send_error(*exchange, route,
                              ApiError::bad_request(where + "token id " + std::to_string(id) +
                                                        " is outside the vocabulary",
                                                    kind == ApiKind::Generate ? "input_ids" : "prompt"));
          }
        }
        if (request.echo) jp.echo_text = tokenizer_.decode(jp.ids, false);
      } else {
        jp.ids = tokenizer_.encode(cp.text, true);
        if (request.echo) jp.echo_text = std::move(cp.text);
      }
      prompts.push_back(std::move(jp));
    }
  }
  // Every prompt: non-empty, fits the context, and leaves room for max_tokens.
  const int64_t context = engine_.context_length();
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    JobPrompt& jp = prompts[p];
    // Batched prompts: errors say which one ("prompt[2] has ...").
    const std::string which =
        request.batched_prompt ? std::string(prompt_param) + "[" + std::to_string(p) + "]" : "the prompt";
    if (jp.ids.empty()) {
      return send_error(*exchange, route, ApiError::bad_request(which + " is empty", prompt_param));
    }
    if (request.truncate_prompt_tokens) {
      // vLLM: keep the last N tokens (-1: as many as leave room for one new token).
      int64_t keep = *request.truncate_prompt_tokens;
      if (keep < 0) keep = context > 0 ? context - 1 : static_cast<int64_t>(jp.ids.size());
      if (static_cast<int64_t>(jp.ids.size()) > keep) {
        jp.ids.erase(jp.ids.begin(), jp.ids.end() - keep);
        if (request.echo) jp.echo_text = tokenizer_.decode(jp.ids, false);  // vLLM echoes what the model saw
      }
    }
    const auto n_prompt = static_cast<int64_t>(jp.ids.size());
    if (context > 0 && n_prompt >= context) {
      return send_error(*exchange, route,
                        ApiError::bad_request(which + " has " + std::to_string(n_prompt) +
                                                  " tokens but the context length is " +
                                                  std::to_string(context) + " tokens",
                                              prompt_param, "context_length_exceeded"));
    }
    if (request.max_tokens) {
      if (context > 0 && n_prompt + *request.max_tokens > context) {
        return send_error(
            *exchange, route,
            ApiError::bad_request(request.max_tokens_param + " is " + std::to_string(*request.max_tokens) +
                                      " but " + which + " has " + std::to_string(n_prompt) +
                                      " tokens and the context length is " +
                                      std::to_string(context) + " (at most " +
                                      std::to_string(context - n_prompt) + " new tokens)",
                                  request.max_tokens_param, "context_length_exceeded"));
      }
      jp.max_tokens = *request.max_tokens;
    } else {
      // Chat: up to the context. Completions and /generate: a small default (16, SGLang's 128).
      const int64_t room = context > 0 ? context - n_prompt : INT32_MAX;
      const int64_t dflt = kind == ApiKind::Completion ? kDefaultCompletionMaxTokens
                           : kind == ApiKind::Generate ? 128
                                                       : room;
      jp.max_tokens = static_cast<int>(std::min<int64_t>({room, dflt, INT32_MAX}));
    }
    if (request.min_tokens > jp.max_tokens) {
      return send_error(*exchange, route,
                        ApiError::bad_request("min_tokens (" + std::to_string(request.min_tokens) +
                                                  ") is larger than " + request.max_tokens_param + " (" +
                                                  std::to_string(jp.max_tokens) + ")",
                                              "min_tokens"));  // (/generate's name: as_generate_error)
    }
  }
  request.sampling.max_tokens = prompts.front().max_tokens;  // per prompt: JobPrompt::max_tokens

  // Structured output, forced tool calls and logits processing → one plan, a constraint per sequence.
  auto plan = std::make_shared<ConstraintPlan>();
  if (!request.constraint.empty()) {
    auto g = grammar_->compile(request.constraint);
    if (!g) {
      return send_error(*exchange, route,
                        ApiError::bad_request("'" + request.constraint.param + "': " + g.status().message(),
                                              request.constraint.param));
    }
    plan->grammar = *g;
    if (prompt_opens_think && think_end_id_) plan->grammar_after = think_end_id_;
  }
  for (const auto& [id, bias] : request.logit_bias) {
    if (id >= vocab)
      return send_error(*exchange, route,
                        ApiError::bad_request("logit_bias: token id " + std::to_string(id) + " is outside the vocabulary",
                                              "logit_bias"));
    plan->logit_bias.emplace_back(id, bias);
  }
  for (TokenId id : request.sampling.stop_token_ids) {
    if (id >= vocab)
      return send_error(*exchange, route,
                        ApiError::bad_request("stop_token_ids: token id " + std::to_string(id) +
                                                  " is outside the vocabulary",
                                              kind == ApiKind::Generate ? "sampling_params.stop_token_ids"
                                                                        : "stop_token_ids"));
  }
  for (TokenId id : request.allowed_token_ids) {
    if (id >= vocab)
      return send_error(*exchange, route,
                        ApiError::bad_request("allowed_token_ids: token id " + std::to_string(id) +
                                                  " is outside the vocabulary",
                                              "allowed_token_ids"));
  }
  plan->allowed_ids = request.allowed_token_ids;
  std::sort(plan->allowed_ids.begin(), plan->allowed_ids.end());
  plan->allowed_ids.erase(std::unique(plan->allowed_ids.begin(), plan->allowed_ids.end()), plan->allowed_ids.end());
  // vLLM's bad_words: the word without its leading blanks, and with one space before it when that
  // spells a different first token in as many tokens (" Hello" is one token, "Hello" another);
  // special tokens are read as such (tokenizer.encode(add_special_tokens=False) parses them).
  for (const auto& word : request.bad_words) {
    const std::string bare = word.substr(std::min(word.size(), word.find_first_not_of(" \t\n\r\f\v")));
    std::vector<TokenId> plain = tokenizer_.encode(bare, true), spaced = tokenizer_.encode(" " + bare, true);
    if (!plain.empty()) plan->bad_words.push_back(plain);
    if (!spaced.empty() && !plain.empty() && spaced.size() == plain.size() && spaced[0] != plain[0])
      plan->bad_words.push_back(std::move(spaced));
  }
  plan->min_tokens = request.min_tokens;
  plan->end_ids = defaults_.eos_token_ids;
  for (TokenId id : request.sampling.stop_token_ids) plan->end_ids.push_back(id);
  if (auto e = check_allowed_ids(*plan, kind == ApiKind::Generate)) return send_error(*exchange, route, *e);
  if (!plan->empty()) request.plan = std::move(plan);

  ChoiceOptions options;
  options.chat = chat;
  options.stop = request.stop;
  options.reasoning = options.chat && reasoning_parser_ && request.separate_reasoning;
  // In reasoning from the first token when the rendered prompt opened <think> (the template's own
  // default and the request's kwargs both decided that), not from enable_thinking alone: a template
  // that defaults thinking off would otherwise put the whole answer in reasoning (SGLang #20786).
  options.start_in_reasoning = prompt_opens_think;
  options.count_reasoning_tokens = options.chat && reasoning_parser_;
  options.think_start_id = think_start_id_;
  // Without a reasoning parser these are accepted and have nothing to act on.
  options.include_reasoning = request.include_reasoning || !options.reasoning;
  options.stream_reasoning = request.stream_reasoning || !request.stream;
  options.think_end_id = think_end_id_;
  options.tool_parser = options.chat ? tool_parser_ : ToolParserKind::None;
  options.tools = request.tools;
  options.max_tool_calls = request.parallel_tool_calls ? -1 : 1;
  bool parsers = options.reasoning ||
                 (options.tool_parser != ToolParserKind::None && !request.tools.is_null());
  options.skip_special = request.skip_special_tokens;
  // The parsers read <think>/<tool_call> in the text, and some tokenizers mark them special.
  if (parsers) {
    for (const char* tag : {"<think>", "</think>", "<tool_call>", "</tool_call>"})
      if (auto id = tokenizer_.token_id(tag)) options.keep_special.insert(*id);
  }
  options.no_stop_trim = request.no_stop_trim;
  options.min_tokens = request.min_tokens;
  for (const auto& pattern : request.stop_regex) {
    auto compiled = compile_stop_regex(pattern);
    if (!compiled) {
      return send_error(*exchange, route,
                        ApiError::bad_request("stop_regex '" + pattern + "': " + compiled.status().message(),
                                              "stop_regex"));
    }
    options.stop_regex.emplace_back(pattern, *compiled);
  }
  // The EOS that ends a choice is not its text; with ignore_eos an EOS ends nothing and is text like
  // any token (shown unless skip_special_tokens drops it, as vLLM).
  if (!request.sampling.ignore_eos)
    for (TokenId id : defaults_.eos_token_ids) options.hidden_ids.insert(id);
  if (!request.no_stop_trim)
    for (TokenId id : request.sampling.stop_token_ids) options.hidden_ids.insert(id);

  // A client's rid names one request in flight (/abort_request cancels by it).
  std::optional<uint64_t> rid_handle;
  if (!request.rid.empty()) {
    rid_handle = registry_.reserve(request.rid);
    if (!rid_handle)
      return send_error(*exchange, route,
                        ApiError::bad_request("rid '" + request.rid + "' is already used by a request in flight", "rid"));
  }
  JobEnv env{&engine_, &tokenizer_, &metrics_, &active_jobs_, config_.served_model_name, &registry_,
             config_.stream_interval, &config_.request_log, std::move(on_response)};
  auto strand = exchange;
  auto job = std::make_shared<GenerationJob>(std::move(env), std::move(request), std::move(prompts),
                                             std::move(options), std::move(exchange), arrival);
  if (rid_handle) job->adopt_registry_handle(*rid_handle);
  // Started on the connection's strand: its disconnect hook and drains run there too.
  strand->post([job] { job->start(); });
}

Result<std::shared_ptr<const CompiledGrammar>> OpenAiServer::compile_stop_regex(const std::string& pattern) {
  auto e = regex_to_expr(pattern);
  if (!e) return e.status();
  // Anything, then the pattern: the scan's state accepts exactly where a match ends. The scan
  // asks at the end of the output so far, so a final '$' says nothing more and is dropped, and a
  // leading '^' anchors the match at the output's start (no "anything" before it).
  std::string body = pattern;
  const bool at_start = !body.empty() && body.front() == '^';
  if (at_start) body.erase(0, 1);
  std::size_t slashes = 0;
  while (body.size() >= 2 + slashes && body[body.size() - 2 - slashes] == '\\') ++slashes;
  if (!body.empty() && body.back() == '$' && slashes % 2 == 0) body.pop_back();
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::Regex;
  spec.text = (at_start ? "(" : "[\\s\\S]*(") + body + ")";
  return grammar_->compile(spec);
}

}  // namespace deltaserve
