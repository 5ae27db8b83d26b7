// GenerationJob: one accepted /v1/chat/completions or /v1/completions request in flight.
//
// It submits n sequences per prompt to the engine (a batched /v1/completions request has several
// prompts; choice index = prompt_index * n + j) and installs a notification hook on each
// RequestStream's channel. A hook only posts "drain" to the connection's strand (coalesced by a
// flag), so the engine thread never formats or writes anything. drain() pops every queued
// TokenEvent, runs each choice's ChoiceState, and writes the SSE chunks (streaming) or, once every
// choice is finished, the whole JSON response. A client that disconnects cancels every unfinished
// sequence; the job stays alive (owning itself) until the engine has finished them, writing
// nothing.
#pragma once

#include <atomic>
#include <functional>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_service.h"
#include "server/choice_state.h"
#include "server/http_server.h"
#include "server/openai_request.h"
#include "server/request_log.h"
#include "server/request_registry.h"
#include "server/server_metrics.h"

namespace deltaserve {

// Completions logprobs' text_offset: characters (UTF-8 code points) of a choice's text so far.
// take(bytes) gives where a token whose raw bytes are `bytes` starts (a token that completes a
// character split over tokens starts with that character) and counts them.
// Characters of a choice's text so far, as the text decodes its bytes (ill-formed sequences as
// U+FFFD each maximal subpart, Python's errors="replace"): where the next token's text starts.
struct TextOffset {
  int64_t chars = 0;
  int pending = 0;            // continuation bytes the last character still lacks
  unsigned char lo = 0x80, hi = 0xBF;  // the range its next byte must be in
  int64_t take(const std::string& bytes);
};

struct JobEnv {
  EngineService* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  ServerMetrics* metrics = nullptr;
  std::atomic<int>* active_jobs = nullptr;  // incremented while a job lives
  std::string model_name;
  RequestRegistry* registry = nullptr;      // for /abort_request (may be null)
  int stream_interval = 1;                  // a stream is written every N generated tokens (--stream-interval)
  const RequestLog* request_log = nullptr;  // --log-requests (may be null: off)
  // Responses API: the finished response object (for GET /v1/responses/{id}).
  std::function<void(const nlohmann::ordered_json&)> on_response;
};

// One prompt of the request, tokenized and validated.
struct JobPrompt {
  std::vector<TokenId> ids;
  std::string echo_text;  // completions with echo: the prompt text put before each choice's text
  int max_tokens = 16;    // generated tokens at most for this prompt's sequences
};

class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  using Clock = std::chrono::steady_clock;

  GenerationJob(JobEnv env, OpenAiRequest request, std::vector<JobPrompt> prompts,
                ChoiceOptions options, std::shared_ptr<HttpExchange> exchange,
                Clock::time_point arrival);
  ~GenerationJob();

  // The registry entry of the request's rid, reserved by the handler (RequestRegistry::reserve);
  // the job removes it when it ends. Before start().
  void adopt_registry_handle(uint64_t handle) { registry_handle_ = handle; }
  // Call on the exchange's strand (the HTTP handler). Submits the sequences.
  void start();
  // Any thread: cancels every unfinished sequence (POST /abort_request); the response ends with
  // finish_reason "abort".
  void abort();
  const std::string& response_id() const { return response_id_; }

 private:
  struct Choice {
    RequestId id = 0;
    std::size_t prompt = 0;  // index into prompts_
    std::shared_ptr<RequestStream> stream;
    std::unique_ptr<ChoiceState> state;
    bool engine_done = false;  // the engine's final event (or close) arrived
    bool cancelled = false;
    bool role_sent = false;
    TextOffset text_offset;  // completions streaming: the next token's text_offset (echo included)
    Clock::time_point last_token_time;
    bool got_token = false;
    // --stream-interval N > 1: what the choice's events gave since its last chunk, and their tokens.
    ChoiceDelta held;
    int held_tokens = 0;
    bool streamed = false;  // a chunk with tokens went out (the first is never held)
  };

  void schedule_drain();
  void drain();
  void process(std::size_t i, const TokenEvent& event, std::string& out);
  void handle_delta(std::size_t i, const ChoiceDelta& delta, std::string& out);
  // handle_delta every --stream-interval tokens: d is held (merged into the choice's) until n_tokens
  // reach the interval, the choice finishes, or it is the choice's first output.
  void stream_delta(std::size_t i, ChoiceDelta d, int n_tokens, std::string& out);
  void on_disconnect();
  void cancel_choice(Choice& c);
  void finish();
  void release_rid();  // leaves the request registry (once): the rid is free again
  bool all_finished() const;
  void send_error_response(EngineErrorKind kind, const std::string& message);
  bool logging() const { return env_.request_log && env_.request_log->on(); }
  void log_received() const;  // --log-requests: the request's line, at start()
  void log_finished() const;  // and its response's, at finish()

  void append_chat_chunk(std::size_t i, const ChoiceDelta& d, std::string& out);
  void append_completion_chunk(std::size_t i, const ChoiceDelta& d, std::string& out);
  void append_usage_chunk(std::string& out);
  nlohmann::ordered_json current_usage() const;
  int cached_tokens() const;  // usage.prompt_tokens_details.cached_tokens
  std::string full_response() const;
  const std::string& route() const;

  // SGLang /generate output (sglang_routes.cpp).
  nlohmann::ordered_json generate_item(std::size_t i, bool final) const;
  void append_generate_chunk(std::size_t i, const ChoiceDelta& d, std::string& out);
  std::string generate_response() const;
  // Responses API output (responses_api.cpp).
  nlohmann::ordered_json responses_object(const std::string& status) const;
  // The finished response as the client got it (streamed: the streamed items) and as it is stored.
  nlohmann::ordered_json responses_final() const;
  void append_responses_events(const ChoiceDelta& d, std::string& out);
  void append_responses_end(std::string& out);
  void responses_event(const std::string& type, nlohmann::ordered_json payload, std::string& out);

  JobEnv env_;
  OpenAiRequest request_;
  std::vector<JobPrompt> prompts_;
  int n_prompt_tokens_ = 0;  // usage.prompt_tokens: every prompt counted once (not n times)
  ChoiceOptions options_;
  std::shared_ptr<HttpExchange> exchange_;
  Clock::time_point arrival_;
  std::string response_id_;
  int64_t created_ = 0;

  std::vector<Choice> choices_;
  std::shared_ptr<GenerationJob> self_;  // keeps the job alive until every sequence has ended
  std::atomic<bool> drain_scheduled_{false};
  bool head_sent_ = false;
  bool responded_ = false;     // the HTTP response is complete (or abandoned)
  bool disconnected_ = false;
  int status_ = 0;             // the HTTP status sent (0: none yet)
  double ttft_s_ = -1;         // arrival to the first token of any choice (-1: none)
  bool released_ = false;
  uint64_t registry_handle_ = 0;
  // Responses API streaming: the output items opened so far.
  struct ResponsesStream {
    int seq = 0;                 // sequence_number of the next event
    std::string open;            // "", "reasoning", "message", "function_call"
    int output_index = -1;
    std::string item_id, text;   // the open item
    int call_index = -1;         // the open function call's tool-call index
    std::string call_id, call_name;
    int n_messages = 0, n_reasoning = 0;  // items of each kind opened (each gets its own id)
  };
  ResponsesStream rs_;
  nlohmann::ordered_json rs_items_ = nlohmann::ordered_json::array();  // finished output items
};

}  // namespace deltaserve
