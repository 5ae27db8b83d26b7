// Whether speculative decoding pays on this model and device: with --speculative-algorithm set and
// --speculative-num-steps left to auto, the engine decodes the same greedy probe plainly and with
// its k MTP draft steps, keeps the faster (k, or 0 = plain), and the choice is logged. On a GPU a
// verification of k + 1 tokens costs about one decode step, so MTP wins; on a small CPU model the
// k + 1 token forward plus k draft steps can cost more than the tokens they gain.
#pragma once

#include <string>

#include "engine/engine.h"
#include "options/serve_options.h"

namespace deltaserve {

struct SpeculationChoice {
  bool measured = false;    // false: nothing to choose (off, or the steps were given explicitly)
  int steps = 0;            // the draft steps the engine now runs (0: plain decoding)
  double plain_tok_s = 0;   // decode tokens/s of the probe, plainly
  double spec_tok_s = 0;    // and speculatively
  double accept_length = 0; // the speculative run's accept length
  std::string summary() const;
};

// Runs the probe (the engine must be stopped; it is left stopped, counters and prefix cache as
// new) and sets the engine's speculation. probe_tokens: tokens generated per measured run.
SpeculationChoice choose_speculation(Engine& engine, const ServeOptions& opts, int probe_tokens = 64);

}  // namespace deltaserve
