// Per-request sampling settings, native types only (the server validates and converts JSON).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace deltaserve {

// Temperatures below this sample greedily (vLLM's _SAMPLING_EPS): 1/T would overflow the logits.
inline constexpr float kGreedyTemperature = 1e-5f;

struct SamplingParams {
  bool greedy() const { return temperature < kGreedyTemperature || top_k == 1; }
  float temperature = 1.0f;         // below kGreedyTemperature (e.g. 0) = greedy
  float top_p = 1.0f;               // (0, 1]
  int top_k = -1;                   // -1 or 0 = off
  float min_p = 0.0f;               // [0, 1]
  float presence_penalty = 0.0f;    // OpenAI semantics, over generated tokens
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // HF/vLLM semantics, over prompt + generated tokens
  std::optional<uint64_t> seed;     // same seed, same output
  int max_tokens = 16;              // generated tokens at most
  std::vector<int32_t> stop_token_ids;  // finish (reason "stop") when sampled; included in output
  bool ignore_eos = false;
  int top_logprobs = -1;            // -1: no logprobs; 0..20: sampled token's logprob + that many top
};

}  // namespace deltaserve
