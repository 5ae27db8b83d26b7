// ReasoningParser (`--reasoning-parser qwen3`): splits model output into reasoning_content and
// content at `</think>`, as SGLang's Qwen3Detector does (qwen-chat-protocol.md §3).
//
// * Started "in reasoning" when thinking is on (the prompt opened `<think>`); otherwise text is
//   content unless the output itself opens with `<think>`.
// * Leading `<think>` tags are stripped (repeated ones too, as SGLang does).
// * `</think>` ends reasoning; the text after it is content (the usual "\n\n" is kept).
// * `<tool_call>` while in reasoning also ends it, and stays in the content for the tool parser
//   (a bare `<function=` does not: it is text, as in SGLang's and vLLM's detectors).
//
// push() may be fed any split of the text; a suffix that could still become a tag is held back,
// so the concatenated outputs are the same for every split. finish() releases what is held.
#pragma once

#include <string>
#include <string_view>

namespace deltaserve {

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  explicit ReasoningParser(bool start_in_reasoning)
      : state_(State::Start), force_(start_in_reasoning) {}

  ReasoningDelta push(std::string_view text);
  ReasoningDelta finish();
  bool in_reasoning() const {
    return state_ == State::Reasoning || state_ == State::Opened || (state_ == State::Start && force_);
  }

  // One-shot convenience: push(text) + finish().
  static ReasoningDelta parse(std::string_view text, bool start_in_reasoning);

 private:
  enum class State { Start, Opened /* a leading <think> was stripped */, Reasoning, Content };
  void step(ReasoningDelta& out, bool at_end);

  State state_;
  bool force_;
  std::string buffer_;  // held-back text
};

}  // namespace deltaserve
