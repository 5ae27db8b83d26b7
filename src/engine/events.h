// What crosses between the HTTP side and the engine thread: a GenerateRequest in, TokenEvents out.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/sampling_params.h"
#include "engine/token_constraint.h"
#include "util/channel.h"

namespace deltaserve {

using RequestId = uint64_t;
using TokenId = int32_t;

enum class FinishReason : uint8_t {
  None,    // still running
  Stop,    // EOS or a stop token id (the server also ends with Stop when it matches a stop string)
  Length,  // max_tokens or the context length
  Abort,   // cancelled (client gone) or engine shutting down
  Error,   // could not be served (see TokenEvent::error)
};

// "stop", "length", "abort", "error", "".
inline const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    case FinishReason::Error: return "error";
  }
  return "";
}

// Why a request ended with FinishReason::Error. The server maps each kind to one HTTP status
// (server/generation_job.cpp: BadRequest and TooLong 400, Overloaded 503, Internal 500).
enum class EngineErrorKind : uint8_t {
  None,
  BadRequest,  // the request itself is invalid (empty prompt, token id outside the vocabulary)
  TooLong,     // prompt (+ max_tokens) beyond the context length or the whole KV cache
  Overloaded,  // the waiting queue is full: retry later
  Internal,    // the engine failed while serving it
};
// "bad_request", "too_long", "overloaded", "internal", "".
inline const char* engine_error_kind_name(EngineErrorKind k) {
  switch (k) {
    case EngineErrorKind::None: return "";
    case EngineErrorKind::BadRequest: return "bad_request";
    case EngineErrorKind::TooLong: return "too_long";
    case EngineErrorKind::Overloaded: return "overloaded";
    case EngineErrorKind::Internal: return "internal";
  }
  return "";
}

struct GenerateRequest {
  RequestId id = 0;                 // unique; the caller assigns it (Engine::next_request_id())
  std::vector<TokenId> prompt;      // token ids, already templated and encoded
  SamplingParams sampling;
  // Grammar / logit_bias / allowed ids / min_tokens for this sequence (null: none); one object
  // per sequence, the engine calls it on the sampling path (engine/token_constraint.h).
  std::shared_ptr<TokenConstraint> constraint;
  // Prefix-cache namespace (vLLM cache_salt, SGLang extra_key): cached prefixes are shared only
  // between requests with the same one ("" the default).
  std::string cache_namespace;
};

struct TokenLogprob {
  TokenId token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<TokenId, float>> top;  // top_logprobs alternatives, best first
};

// One step's output for one request. Tokens arrive in order; the last event has finish != None.
struct TokenEvent {
  std::vector<TokenId> tokens;           // new tokens (may be several with speculative decoding)
  std::vector<TokenLogprob> logprobs;    // one per token when requested
  FinishReason finish = FinishReason::None;
  std::string error;                     // when finish == Error
  EngineErrorKind error_kind = EngineErrorKind::None;  // when finish == Error
  int n_prompt_tokens = 0;               // filled on every token event and the final one
  int n_cached_tokens = 0;               // prompt tokens served from the prefix cache (the same; a
                                         // server that stops a request itself has no final event)
  int n_generated_tokens = 0;            // filled on the final event
  double accept_length = 0.0;            // mean tokens per verification step (spec decoding), final event
  // When the engine pushed the event: util/timer.h's now_seconds() (steady clock), taken once per
  // step and shared by that step's events; 0 on an event the engine did not make. Readers time
  // tokens by it, not by when they popped the event (bench-offline's decode rates).
  double emitted_at = 0.0;
};

// The per-request handle returned by submit(): the owner pops events until one has finish != None.
struct RequestStream {
  RequestId id = 0;
  Channel<TokenEvent> events;
};

}  // namespace deltaserve
