// How many MTP draft steps pay on this model and device: with --speculative-algorithm set and
// --speculative-num-steps left to auto, the engine decodes the same greedy probe plainly and with
// each k from its config's steps (3) down to 1 (two interleaved rounds, averaged), keeps the
// fastest k if it beats plain decoding by 3% (else 0 = plain), and the choice is logged with every
// figure. On a GPU a verification of k + 1 tokens costs about one decode step,
// so the most steps win; on a small CPU model each draft step and each verified token cost a good
// part of a decode step, and one step may pay where three lose.
#pragma once

#include <string>
#include <vector>

#include "engine/engine.h"
#include "options/serve_options.h"

namespace deltaserve {

// One measured probe run.
struct SpeculationProbe {
  int steps = 0;             // draft steps (0: plain)
  double tok_s = 0;          // decode tokens/s from the first token to the last
  double accept_length = 0;  // tokens per verification (0 plainly)
};

struct SpeculationChoice {
  bool measured = false;    // false: nothing to choose (off, or the steps were given explicitly)
  int steps = 0;            // the draft steps the engine now runs (0: plain decoding)
  std::vector<SpeculationProbe> probes;  // plain first, then k = the config's steps .. 1
  std::string note;         // why auto did not measure (a context too short for the probe)
  std::string summary() const;
};

// Runs the probe (the engine must be stopped; it is left stopped, counters and prefix cache as
// new) and sets the engine's speculation. probe_tokens: tokens generated per measured run at least
// (more where plain decoding makes them in under 0.1 s, up to 1,024 and the context).
SpeculationChoice choose_speculation(Engine& engine, const ServeOptions& opts, int probe_tokens = 64);

}  // namespace deltaserve
