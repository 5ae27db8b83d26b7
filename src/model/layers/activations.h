// Activations: the scratch rows a forward pass works in, sized once for the largest batch
// (Model::reserve), so nothing is allocated per step. f32, [max_tokens, width] each.
#pragma once

#include "backend/backend.h"

namespace deltaserve {

struct Activations {
  int max_tokens = 0;
  int64_t hidden = 0, max_proj = 0, max_mix = 0, intermediate = 0;
  // Tensor parallelism (tp > 1): the vocabulary-parallel logits of one rank and of all ranks.
  int tp = 1;
  int64_t vocab_per_rank = 0;
  int max_logit_rows = 0;
  int64_t draft_rows = 0;  // D_r: this rank's rows of the MTP drafts' token map (0: none)
  DeviceBuffer x;          // [T, H] residual stream
  DeviceBuffer h;          // [T, H] normed input of a block
  DeviceBuffer proj;       // [T, max_proj] a mixer's fused projection
  DeviceBuffer mix;        // [T, max_mix] a mixer's core output
  DeviceBuffer gu;         // [T, 2I] MLP gate | up
  DeviceBuffer act;        // [T, I] silu(gate) * up
  DeviceBuffer rows;       // [T, H] rows picked for logits
  DeviceBuffer rows_norm;  // [T, H] their final norm
  DeviceBuffer mtp_in;     // [T, 2H] MTP head input (only with an MTP head)
  DeviceBuffer logits_local;   // tp > 1: [logit_rows, vocab_per_rank] this rank's logits
  DeviceBuffer logits_gather;  // tp > 1: [tp, logit_rows, vocab_per_rank] every rank's
  DeviceBuffer draft_logits;   // draft_rows > 0: [logit_rows, draft_rows] the token map's scores

  void reserve(Backend& b, int tokens, int logit_rows, bool with_mtp) {
    if (logit_rows > max_logit_rows) {
      max_logit_rows = logit_rows;
      if (tp > 1) {
        logits_local = b.allocate(std::size_t(logit_rows) * vocab_per_rank * 4);
        logits_gather = b.allocate(std::size_t(tp) * logit_rows * vocab_per_rank * 4);
      }
      if (draft_rows > 0) draft_logits = b.allocate(std::size_t(logit_rows) * draft_rows * 4);
    }
    if (tokens <= max_tokens) return;
    max_tokens = tokens;
    const int64_t T = tokens;
    const std::size_t f = sizeof(float);
    x = b.allocate(T * hidden * f);
    h = b.allocate(T * hidden * f);
    proj = b.allocate(T * max_proj * f);
    mix = b.allocate(T * max_mix * f);
    gu = b.allocate(T * 2 * intermediate * f);
    act = b.allocate(T * intermediate * f);
    rows = b.allocate(T * hidden * f);
    rows_norm = b.allocate(T * hidden * f);
    mtp_in = with_mtp ? b.allocate(T * 2 * hidden * f) : DeviceBuffer();
  }
};

}  // namespace deltaserve
