// Sequence: what the scheduler moves around. Tokens are prompt + generated; the first n_computed
// of them have their KV (and GDN state) in the cache. A decoding sequence has exactly one token
// not yet computed: the one it sampled last (plus, under speculative decoding, n_drafts draft
// tokens the speculative decoder holds for it, fed after that token and verified next step).
#pragma once

#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/events.h"

namespace deltaserve {

enum class SeqStatus : uint8_t { Waiting, Running, Finished };

struct Sequence {
  RequestId id = 0;
  std::shared_ptr<RequestStream> stream;
  SamplingParams params;
  std::vector<int32_t> tokens;      // prompt then generated
  int n_prompt = 0;
  int n_computed = 0;               // tokens whose KV/state is in the cache
  std::vector<int32_t> blocks;      // KV block table
  int slot = -1;                    // per-request slot: GDN state, speculative rows (-1: none held)
  SeqStatus status = SeqStatus::Waiting;
  FinishReason finish = FinishReason::None;  // why it finished (status Finished)
  std::mt19937_64 rng;
  int64_t max_total_tokens = 0;     // prompt + max generated (bounded by the context length)
  uint64_t admit_order = 0;         // for preemption: the newest running sequence goes first
  int n_drafts = 0;                 // draft tokens waiting for verification (engine/spec/)
  // Grammar / logit_bias / ... (null: none): applied to every row this sequence samples from,
  // told every token it takes; its state follows `tokens` (drafts are rolled back after drafting).
  std::shared_ptr<TokenConstraint> constraint;
  // Prefix cache.
  std::string cache_namespace;      // GenerateRequest::cache_namespace
  int n_cached = 0;                 // prompt tokens served from the cache at first admission
  int resumed_at = 0;               // where its last admission resumed from a cached checkpoint
  int rolling_slot = -1;            // checkpoint slot with its state after rolling_pos tokens
  int rolling_pos = 0;              //   (decode checkpoints: cached when the sequence finishes)
  uint64_t spec_steps = 0, spec_accepted = 0;  // verification steps, tokens emitted by them

  int n_generated() const { return static_cast<int>(tokens.size()) - n_prompt; }
  // Tells the constraint (if any) the sequence took `token` (engine.cpp).
  void constraint_took(int32_t token);
  std::span<const int32_t> prompt() const { return {tokens.data(), static_cast<size_t>(n_prompt)}; }
  std::span<const int32_t> generated() const {
    return {tokens.data() + n_prompt, tokens.size() - static_cast<size_t>(n_prompt)};
  }
};

}  // namespace deltaserve
