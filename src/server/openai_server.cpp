#include "server/openai_server.h"

#include "server/generation_job.h"
#include "server/json_util.h"
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
  think_end_id_ = tokenizer_.token_id("</think>");
  if (auto eos = tokenizer_.eos_token_id()) {
    bool have = false;
    for (TokenId id : defaults_.eos_token_ids) have = have || id == *eos;
    if (!have) defaults_.eos_token_ids.push_back(*eos);
  }
}

OpenAiServer::~OpenAiServer() { stop(); }

Status OpenAiServer::start() {
  auto kind = tool_parser_kind_from_name(config_.tool_call_parser);
  if (!kind) return kind.status();
  tool_parser_ = *kind;
  if (!config_.reasoning_parser.empty()) {
    if (config_.reasoning_parser != "qwen3" && config_.reasoning_parser != "qwen3-thinking" &&
        config_.reasoning_parser != "deepseek-r1") {
      return error("unknown --reasoning-parser '", config_.reasoning_parser,
                   "' (supported: qwen3)");
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
  http_ = std::make_unique<HttpServer>(hc, [this](HttpRequest&& req,
                                                  std::shared_ptr<HttpExchange> exchange) {
    handle(std::move(req), std::move(exchange));
  });
  return http_->start();
}

int OpenAiServer::port() const { return http_ ? http_->port() : 0; }

void OpenAiServer::stop() {
  if (http_) http_->stop();
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
                              const ApiError& error) {
  metrics_.count_request(route, error.status);
  HttpHeaders headers;
  if (error.status == 401) headers.emplace_back("WWW-Authenticate", "Bearer");
  exchange.respond(error.status, "application/json", error.to_json(), std::move(headers));
}

void OpenAiServer::handle(HttpRequest&& req, std::shared_ptr<HttpExchange> exchange) {
  const std::string& path = req.path;
  bool get = req.method == "GET" || req.method == "HEAD";
  bool post = req.method == "POST";
  if (path == "/health" || path == "/v1/health") {
    if (!get) return send_error(*exchange, path, {405, "use GET", "invalid_request_error", "", ""});
    metrics_.count_request("/health", 200);
    return exchange->respond(200, "application/json", "{}");
  }
  if (path == "/metrics") {
    if (!get) return send_error(*exchange, path, {405, "use GET", "invalid_request_error", "", ""});
    metrics_.count_request("/metrics", 200);
    return exchange->respond(200, "text/plain; version=0.0.4; charset=utf-8",
                             metrics_.render(engine_.stats()));
  }
  if (path == "/v1/server_info" || path == "/server_info" || path == "/get_server_info") {
    // The server's arguments and the engine's allocation (SGLang's /get_server_info), what
    // `deltaserve bench` attaches its results to, and live figures.
    if (!get) return send_error(*exchange, path, {405, "use GET", "invalid_request_error", "", ""});
    const EngineStats st = engine_.stats();
    json info = json::parse(config_.server_info.dump());
    info["launch_id"] = config_.launch_id;
    info["model"] = config_.served_model_name;
    info["context_length"] = engine_.context_length();
    info["speculative_num_steps"] = config_.speculative_num_steps;
    info["requests_running"] = st.requests_running;
    info["requests_waiting"] = st.requests_waiting;
    if (st.spec_verify_steps_total > 0)
      info["accept_length"] = 1.0 + double(st.spec_accepted_tokens_total) / double(st.spec_verify_steps_total);
    metrics_.count_request(path == "/get_server_info" ? "/get_server_info" : "/v1/server_info", 200);
    return exchange->respond(200, "application/json", info.dump());
  }
  bool known = path == "/v1/models" || path == "/v1/chat/completions" || path == "/v1/completions" ||
               path.rfind("/v1/models/", 0) == 0;
  if (!known) {
    return send_error(*exchange, "other",
                      ApiError::not_found("no route for " + req.method + " " + path));
  }
  if (!authorized(req)) {
    return send_error(*exchange, path,
                      ApiError::unauthorized("missing or invalid API key: send "
                                             "'Authorization: Bearer <key>'"));
  }
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
    if (!get) return send_error(*exchange, path, {405, "use GET", "invalid_request_error", "", ""});
    json model = {{"id", config_.served_model_name},
                  {"object", "model"},
                  {"created", created_},
                  {"owned_by", "deltaserve"},
                  {"root", config_.served_model_name},
                  {"max_model_len", engine_.context_length()}};
    if (path != "/v1/models") {
      std::string id = path.substr(std::string("/v1/models/").size());
      if (id != config_.served_model_name)
        return send_error(*exchange, "/v1/models", ApiError::not_found("model '" + id + "' not found"));
      metrics_.count_request("/v1/models", 200);
      return exchange->respond(200, "application/json", safe_dump(model));
    }
    metrics_.count_request("/v1/models", 200);
    return exchange->respond(200, "application/json",
                             safe_dump(json{{"object", "list"}, {"data", json::array({model})}}));
  }
  if (!post) {
    return send_error(*exchange, path,
                      {405, "use POST for " + path, "invalid_request_error", "", ""});
  }
  handle_generate(path == "/v1/chat/completions" ? ApiKind::Chat : ApiKind::Completion, req,
                  std::move(exchange));
}

void OpenAiServer::handle_generate(ApiKind kind, const HttpRequest& req,
                                   std::shared_ptr<HttpExchange> exchange) {
  auto arrival = GenerationJob::Clock::now();
  const std::string route = kind == ApiKind::Chat ? "/v1/chat/completions" : "/v1/completions";
  if (req.body.size() > config_.max_request_bytes) {
    return send_error(*exchange, route, ApiError::too_large("request body too large"));
  }
  if (json_nesting_depth(req.body, config_.max_json_depth) > config_.max_json_depth) {
    return send_error(*exchange, route,
                      ApiError::bad_request("JSON nesting deeper than " +
                                                std::to_string(config_.max_json_depth) + " levels",
                                            "", "invalid_json"));
  }
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) {
    // Say why: re-parse with exceptions for the message (rare path).
    std::string why = "malformed JSON";
    try {
      json ignored = json::parse(req.body);
      (void)ignored;
    } catch (const json::exception& e) {
      why = std::string("malformed JSON: ") + e.what();
    }
    return send_error(*exchange, route, ApiError::bad_request(why, "", "invalid_json"));
  }
  OpenAiRequest request;
  std::optional<ApiError> err = kind == ApiKind::Chat
                                    ? parse_chat_request(body, defaults_, request)
                                    : parse_completion_request(body, defaults_, request);
  if (err) return send_error(*exchange, route, *err);

  // Prompt(s) → token ids. Chat has one prompt; /v1/completions may have a batch.
  std::vector<JobPrompt> prompts;
  const char* prompt_param = kind == ApiKind::Chat ? "messages" : "prompt";
  if (kind == ApiKind::Chat) {
    if (!render_chat_) return send_error(*exchange, route, ApiError::internal("no chat template"));
    // Tools are rendered whenever the request has them (tool_choice "none" already dropped them).
    Result<std::string> text =
        render_chat_(request.messages, request.tools, request.template_kwargs);
    if (!text) {
      return send_error(*exchange, route,
                        ApiError::bad_request("chat template: " + text.status().message(),
                                              "messages"));
    }
    prompts.push_back(JobPrompt{tokenizer_.encode(*text, true), {}, 0});
  } else {
    prompts.reserve(request.prompts.size());
    for (std::size_t p = 0; p < request.prompts.size(); ++p) {
      CompletionPrompt& cp = request.prompts[p];
      JobPrompt jp;
      if (cp.is_ids) {
        jp.ids = std::move(cp.ids);
        int vocab = tokenizer_.vocab_size();
        for (TokenId id : jp.ids) {
          if (id >= vocab) {
            std::string where =
                request.batched_prompt ? "prompt[" + std::to_string(p) + "]: " : std::string();
            return send_error(*exchange, route,
                              ApiError::bad_request(where + "token id " + std::to_string(id) +
                                                        " is outside the vocabulary",
                                                    "prompt"));
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
        request.batched_prompt ? "prompt[" + std::to_string(p) + "]" : "the prompt";
    if (jp.ids.empty()) {
      return send_error(*exchange, route, ApiError::bad_request(which + " is empty", prompt_param));
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
            ApiError::bad_request("max_tokens is " + std::to_string(*request.max_tokens) +
                                      " but " + which + " has " + std::to_string(n_prompt) +
                                      " tokens and the context length is " +
                                      std::to_string(context) + " (at most " +
                                      std::to_string(context - n_prompt) + " new tokens)",
                                  "max_tokens", "context_length_exceeded"));
      }
      jp.max_tokens = *request.max_tokens;
    } else {
      jp.max_tokens =
          context > 0 ? static_cast<int>(std::min<int64_t>(context - n_prompt, INT32_MAX)) : 16;
    }
  }
  request.sampling.max_tokens = prompts.front().max_tokens;  // per prompt: JobPrompt::max_tokens

  ChoiceOptions options;
  options.chat = kind == ApiKind::Chat;
  options.stop = request.stop;
  options.reasoning = options.chat && reasoning_parser_ && request.separate_reasoning;
  options.start_in_reasoning = request.enable_thinking;
  options.count_reasoning_tokens = options.chat && reasoning_parser_ && request.enable_thinking;
  // Without a reasoning parser these are accepted and have nothing to act on.
  options.include_reasoning = request.include_reasoning || !options.reasoning;
  options.stream_reasoning = request.stream_reasoning || !request.stream;
  options.think_end_id = think_end_id_;
  options.tool_parser = options.chat ? tool_parser_ : ToolParserKind::None;
  options.tools = request.tools;
  bool parsers = options.reasoning ||
                 (options.tool_parser != ToolParserKind::None && !request.tools.is_null());
  // The parsers need <think>/<tool_call> in the text, and some tokenizers mark them special.
  options.skip_special = request.skip_special_tokens && !parsers;
  for (TokenId id : defaults_.eos_token_ids) options.hidden_ids.insert(id);
  for (TokenId id : request.sampling.stop_token_ids) options.hidden_ids.insert(id);

  JobEnv env{&engine_, &tokenizer_, &metrics_, &active_jobs_, config_.served_model_name};
  auto job = std::make_shared<GenerationJob>(std::move(env), std::move(request), std::move(prompts),
                                             std::move(options), std::move(exchange), arrival);
  job->start();
}

}  // namespace deltaserve
