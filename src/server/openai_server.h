// OpenAiServer: the OpenAI-compatible HTTP API over an EngineService.
//   POST /v1/chat/completions, POST /v1/completions, GET /v1/models[/{id}], GET /health,
//   GET /metrics, GET /get_server_info (SGLang) and /v1/server_info; the status page (status_page.cpp:
//   GET / and GET /status.json); the OpenAI Responses API
//   (responses_api.cpp: POST /v1/responses, GET /v1/responses/{id}); SGLang's native routes
//   (sglang_routes.cpp: /generate, /abort_request, /flush_cache, /tokenize, /detokenize,
//   /health_generate, /get_model_info, /get_load).
// Requests are parsed and validated at the edge (openai_request.h), rendered with the chat
// template, tokenized, and handed to a GenerationJob that streams the engine's events back.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/engine_service.h"
#include "server/generation_job.h"
#include "server/grammar_service.h"
#include "server/http_server.h"
#include "server/openai_request.h"
#include "server/request_log.h"
#include "server/request_registry.h"
#include "server/server_metrics.h"
#include "server/tool_call_parser.h"
#include "tokenizer/tokenizer.h"
#include "util/task_queue.h"

namespace deltaserve {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 30000;
  int n_http_threads = 4;
  int n_prepare_threads = 2;                    // parse + template + tokenize requests off the io threads
  std::string api_key;                          // "" = no authentication
  std::string served_model_name = "default";
  std::size_t max_request_bytes = 32u << 20;    // larger bodies get 413
  int max_json_depth = 64;                      // deeper bodies get 400
  std::string reasoning_parser;                 // "" | "qwen3"
  std::string tool_call_parser;                 // "" | "qwen3_coder" | "hermes"
  int64_t launch_id = 0;                        // this launch's record (0 = not recorded)
  int speculative_num_steps = 0;                // reported at /v1/server_info
  bool enable_cors = false;                     // CORS headers and OPTIONS preflight answers
  int stream_interval = 1;                      // streams are written every N generated tokens
  RequestLog request_log;                       // --log-requests: a line per generation request and response
  std::vector<std::string> allowed_origins = {"*"};  // with enable_cors
  std::string model_path;                       // reported by /get_model_info
  size_t responses_store_size = 1000;           // /v1/responses kept for retrieval (oldest dropped)
  bool start_loading = false;                   // start in ServeState::Loading (see set_state)
  // /get_server_info (SGLang's route; also merged into /v1/server_info): the effective server
  // arguments and what the engine allocated (max_total_num_tokens, max_running_requests,
  // max_mamba_cache_size, kv_cache_dtype, context_length, ...). Built by cmd_serve.
  nlohmann::ordered_json server_info = nlohmann::ordered_json::object();
  // Recent launches for the status page (/status.json "launches"): a JSON array, newest first.
  // Built by cmd_serve from the launch database (the server layer does not read it). Called on
  // an io thread: keep it quick (cmd_serve caches it). Unset: the page says none are available.
  std::function<Result<nlohmann::ordered_json>()> launch_history;
};

// Renders chat messages (normalized OpenAI messages), tools (array or null) and
// chat_template_kwargs into the prompt text, with add_generation_prompt=true.
using ChatRenderFn = std::function<Result<std::string>(
    const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools, const nlohmann::ordered_json& kwargs)>;

// Loading: the port is open while the model loads; /health and every route but /metrics answer
// 503 (Retry-After). Ready: serving. Draining: after SIGTERM, requests in flight run on, new ones
// get 503 and /health says so (load balancers take the server out).
enum class ServeState { Loading, Ready, Draining };

class OpenAiServer {
 public:
  OpenAiServer(ServerConfig config, EngineService& engine, Tokenizer tokenizer,
               ChatRenderFn render_chat, SamplingDefaults defaults);
  ~OpenAiServer();

  Status start();           // binds and serves on background threads
  int port() const;
  void stop();
  void stop_accepting();    // new connections are refused; open ones are still served
  void wait();              // until stop()
  int active_jobs() const { return active_jobs_.load(); }
  // Requests being served: generation jobs plus requests still being prepared (parsed/tokenized).
  int busy() const { return active_jobs_.load() + preparing_.load(); }
  void set_state(ServeState state) { state_.store(state, std::memory_order_release); }
  ServeState state() const { return state_.load(std::memory_order_acquire); }
  // What /get_server_info reports; call before set_state(Ready) (read only once Ready).
  void set_server_info(int64_t launch_id, int speculative_num_steps, nlohmann::ordered_json info);
  // Aborts every generation in flight (they end with finish_reason "abort"); returns how many.
  int abort_all() { return registry_.abort("", true); }
  // Bytes queued or being written to sockets (0: every response so far is on the wire).
  std::size_t pending_writes() const;
  ServerMetrics& metrics() { return metrics_; }

 private:
  void handle(HttpRequest&& request, std::shared_ptr<HttpExchange> exchange);
  void route_guarded(HttpRequest&& request, std::shared_ptr<HttpExchange> exchange);
  void route(HttpRequest&& request, std::shared_ptr<HttpExchange> exchange);
  static bool auth_exempt(const HttpRequest& request);
  static ApiError unauthorized_error();
  void handle_generate(ApiKind kind, const HttpRequest& request,
                       std::shared_ptr<HttpExchange> exchange);
  // Everything after parsing: prompts, limits, constraint plan, output options, the job.
  void start_request(OpenAiRequest request, std::shared_ptr<HttpExchange> exchange,
                     GenerationJob::Clock::time_point arrival,
                     std::function<void(const nlohmann::ordered_json&)> on_response = nullptr);
  std::optional<ApiError> parse_body(const HttpRequest& request, nlohmann::ordered_json& body) const;
  // A tool-call constraint in the server's --tool-call-parser format, named by `param` in errors.
  ConstraintSpec tool_call_constraint(const std::string& param, const nlohmann::ordered_json& tools, bool parallel) const;
  void send_error(HttpExchange& exchange, const std::string& route, const ApiError& error);
  void send_json(HttpExchange& exchange, const std::string& route, const nlohmann::ordered_json& body);
  bool authorized(const HttpRequest& request) const;
  static std::string route_name(ApiKind kind);
  Result<std::shared_ptr<const CompiledGrammar>> compile_stop_regex(const std::string& pattern);
  // CORS: headers for the request's Origin (none if CORS is off or the origin is not allowed).
  HttpHeaders cors_headers(const HttpRequest& request) const;

  // SGLang routes (sglang_routes.cpp): true if the path was one of them.
  bool handle_sglang(const HttpRequest& request, std::shared_ptr<HttpExchange>& exchange);
  void handle_sglang_generate(const HttpRequest& request, std::shared_ptr<HttpExchange> exchange);
  void handle_health_generate(const HttpRequest& request, std::shared_ptr<HttpExchange> exchange);
  // The status page (status_page.cpp): GET / (HTML) and GET /status.json; true if it was one.
  bool handle_status(const HttpRequest& request, std::shared_ptr<HttpExchange>& exchange);
  nlohmann::ordered_json status_json();
  // OpenAI Responses API (responses_api.cpp): true if the path was one of its routes.
  bool handle_responses(const HttpRequest& request, std::shared_ptr<HttpExchange>& exchange);

  ServerConfig config_;
  EngineService& engine_;
  Tokenizer tokenizer_;
  ChatRenderFn render_chat_;
  SamplingDefaults defaults_;
  ToolParserKind tool_parser_ = ToolParserKind::None;
  bool reasoning_parser_ = false;
  std::optional<TokenId> think_start_id_, think_end_id_;
  ServerMetrics metrics_;
  std::unique_ptr<GrammarService> grammar_;
  RequestRegistry registry_;
  class ResponsesStore;
  static std::shared_ptr<ResponsesStore> make_responses_store(size_t capacity);
  std::shared_ptr<ResponsesStore> responses_;
  std::atomic<int> active_jobs_{0};
  std::atomic<bool> stopped_{false};
  static constexpr std::chrono::seconds kStopJobWait{2};  // stop(): the most it waits for jobs to end
  std::atomic<int> preparing_{0};
  std::atomic<ServeState> state_{ServeState::Ready};
  int64_t created_ = 0;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::unique_ptr<TaskQueue> workers_;  // prepare workers (see handle())
  std::unique_ptr<HttpServer> http_;
};

}  // namespace deltaserve
