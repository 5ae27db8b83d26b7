// What crosses between the HTTP side and the engine thread: a GenerateRequest in, TokenEvents out.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/sampling_params.h"
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

const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error", ""

struct GenerateRequest {
  RequestId id = 0;                 // unique; the caller assigns it (Engine::next_request_id())
  std::vector<TokenId> prompt;      // token ids, already templated and encoded
  SamplingParams sampling;
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
  bool queue_full = false;               // finish == Error because the waiting queue is full (HTTP 503)
  int n_prompt_tokens = 0;               // filled on the final event
  int n_generated_tokens = 0;            // filled on the final event
  double accept_length = 0.0;            // mean tokens per verification step (spec decoding), final event
};

// The per-request handle returned by submit(): the owner pops events until one has finish != None.
struct RequestStream {
  RequestId id = 0;
  Channel<TokenEvent> events;
};

}  // namespace deltaserve
