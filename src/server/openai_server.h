// OpenAiServer: the OpenAI-compatible HTTP API over an EngineService.
//   POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics,
//   GET /get_server_info (SGLang) and /v1/server_info.
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
#include "server/http_server.h"
#include "server/openai_request.h"
#include "server/server_metrics.h"
#include "server/tool_call_parser.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 30000;
  int n_http_threads = 4;
  std::string api_key;                          // "" = no authentication
  std::string served_model_name = "default";
  std::size_t max_request_bytes = 32u << 20;    // larger bodies get 413
  int max_json_depth = 64;                      // deeper bodies get 400
  std::string reasoning_parser;                 // "" | "qwen3"
  std::string tool_call_parser;                 // "" | "qwen3_coder" | "hermes"
  int64_t launch_id = 0;                        // this launch's record (0 = not recorded)
  int speculative_num_steps = 0;                // reported at /v1/server_info
  // /get_server_info (SGLang's route; also merged into /v1/server_info): the effective server
  // arguments and what the engine allocated (max_total_num_tokens, max_running_requests,
  // max_mamba_cache_size, kv_cache_dtype, context_length, ...). Built by cmd_serve.
  nlohmann::ordered_json server_info = nlohmann::ordered_json::object();
};

// Renders chat messages (normalized OpenAI messages), tools (array or null) and
// chat_template_kwargs into the prompt text, with add_generation_prompt=true.
using ChatRenderFn = std::function<Result<std::string>(
    const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools, const nlohmann::ordered_json& kwargs)>;

class OpenAiServer {
 public:
  OpenAiServer(ServerConfig config, EngineService& engine, Tokenizer tokenizer,
               ChatRenderFn render_chat, SamplingDefaults defaults);
  ~OpenAiServer();

  Status start();           // binds and serves on background threads
  int port() const;
  void stop();
  void wait();              // until stop()
  int active_jobs() const { return active_jobs_.load(); }
  ServerMetrics& metrics() { return metrics_; }

 private:
  void handle(HttpRequest&& request, std::shared_ptr<HttpExchange> exchange);
  void handle_generate(ApiKind kind, const HttpRequest& request,
                       std::shared_ptr<HttpExchange> exchange);
  void send_error(HttpExchange& exchange, const std::string& route, const ApiError& error);
  bool authorized(const HttpRequest& request) const;

  ServerConfig config_;
  EngineService& engine_;
  Tokenizer tokenizer_;
  ChatRenderFn render_chat_;
  SamplingDefaults defaults_;
  ToolParserKind tool_parser_ = ToolParserKind::None;
  bool reasoning_parser_ = false;
  std::optional<TokenId> think_end_id_;
  ServerMetrics metrics_;
  std::atomic<int> active_jobs_{0};
  int64_t created_ = 0;
  std::unique_ptr<HttpServer> http_;
};

}  // namespace deltaserve
