// The throughput figures of one bench-offline batch (B requests submitted at once), from when the
// engine emitted each sequence's tokens (cmd_bench_offline.cpp).
#pragma once

#include <vector>

namespace deltaserve {

struct EmittedTokens {  // one event of a stream that carried tokens
  double time = 0;  // seconds
  int tokens = 0;   // tokens in the event (several with speculative decoding)
};

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
