// RequestLog: --log-requests (SGLang's flag, with its --log-requests-level). A generation request
// (chat, completions, /generate, responses) logs one line when its job starts and one when its
// response ends, both written on the connection's strand, never on the engine thread.
//   level 0: metadata (id, route, prompts, prompt / completion tokens, n, stream, status, finish
//            reasons, time to first token and end to end);
//   level 1: and the sampling parameters;
//   level 2: and the prompt and output text, each cut to kPartialTextChars (SGLang's default level);
//   level 3: and the whole texts.
// Texts are JSON-quoted, so a line stays one line whatever the prompt holds.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampling_params.h"

namespace deltaserve {

// Where request-log lines go when not to the INFO log (tests collect them).
class RequestLogSink {
 public:
  virtual ~RequestLogSink() = default;
  virtual void line(const std::string& text) = 0;
};

struct RequestLog {
  static constexpr int kOff = -1;
  static constexpr int kMaxLevel = 3;
  static constexpr std::size_t kPartialTextChars = 2048;

  int level = kOff;
  RequestLogSink* sink = nullptr;  // where lines go (null: the INFO log); outlives the server

  bool on() const { return level >= 0; }
  void write(const std::string& line) const;
  // A text as this level logs it: JSON-quoted, cut (at a character boundary) at level 2, with the
  // number of bytes left out; "" below level 2.
  std::string text(std::string_view s) const;
  // " sampling {...}" at level 1 and up (the parameters and stop strings; max_tokens is metadata,
  // per prompt), else "".
  std::string sampling(const SamplingParams& p, const std::vector<std::string>& stop) const;
};

}  // namespace deltaserve
