// The throughput figures of one bench-offline batch (B requests submitted at once), from when the
// engine emitted each sequence's tokens (cmd_bench_offline.cpp).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "engine/events.h"

namespace deltaserve {

struct EmittedTokens {  // one event of a stream that carried tokens
  double time = 0;  // seconds: when the engine emitted it (TokenEvent::emitted_at, now_seconds())
  int tokens = 0;   // tokens in the event (several with speculative decoding)
};

// One request's stream popped until its final event. The times are the engine's (each event's
// emitted_at), not when this reader popped it: with B readers on fewer cores a reader gets round
// to its stream late, and pop times made decode rates vary 2x (once 3.2M tok/s on tiny-coder).
struct DrainedStream {
  std::vector<EmittedTokens> emitted;  // the events that carried tokens
  double accept_length = 0;            // the final event's
  std::string error;                   // "" unless it ended with FinishReason::Error
};
DrainedStream drain_stream(RequestStream& stream, std::size_t expected_events = 0);

struct BatchRates {
  int generated = 0;             // tokens of all sequences
  double prefill_tok_s = 0;      // B prompts over the time to the first sequence's first token
  // Tokens after each sequence's first, from the first token of any sequence to the last token of
  // any: it includes steps shared with other sequences' prefill chunks, and a tail where the first
  // sequences have finished.
  double decode_tok_s = 0;
  // Tokens emitted while all B sequences decode: from the last sequence's first token to the first
  // sequence's last (llama-batched-bench's B sequences decode in lockstep). Long prompts are
  // prefilled a chunk a step, so the first sequences start decoding, and finish, steps before the
  // last; the steps after the first one finishes carry fewer than B rows and are not counted.
  // 0 when no step had all B decoding (a --gen-len shorter than the prompts' stagger).
  double decode_only_tok_s = 0;
};

// events[b]: sequence b's token events in order (its first is its first token). t0: submission.
BatchRates batch_rates(double t0, int prompt_len, const std::vector<std::vector<EmittedTokens>>& events);

}  // namespace deltaserve
