#include "server/reasoning_parser.h"

#include <algorithm>

namespace deltaserve {

namespace {

constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kToolCall = "<tool_call>";

bool is_proper_prefix(std::string_view text, std::string_view tag) {
  return text.size() < tag.size() && tag.substr(0, text.size()) == text;
}

// Length of the longest suffix of `text` that is a proper prefix of one of the tags.
std::size_t held_suffix(std::string_view text) {
  std::size_t best = 0;
  for (std::string_view tag : {kThinkEnd, kToolCall}) {
    std::size_t max_len = std::min(text.size(), tag.size() - 1);
    for (std::size_t len = max_len; len > best; --len) {
      if (text.substr(text.size() - len) == tag.substr(0, len)) {
        best = len;
        break;
      }
    }
  }
  return best;
}

}  // namespace

void ReasoningParser::step(ReasoningDelta& out, bool at_end) {
  if (state_ == State::Start || state_ == State::Opened) {
    // Leading <think> tags are stripped, repeated ones too (as SGLang does): "<think><think>x"
    // and "<think>\n<think>x" both start the reasoning at "x" (blank space between two tags
    // goes with them; blank space after the last tag stays).
    for (;;) {
      std::string_view view = buffer_;
      size_t ws = 0;
      if (state_ == State::Opened)
        while (ws < view.size() && (view[ws] == '\n' || view[ws] == ' ' || view[ws] == '\t' || view[ws] == '\r')) ++ws;
      std::string_view rest = view.substr(ws);
      if (rest.substr(0, kThinkStart.size()) == kThinkStart) {
        buffer_.erase(0, ws + kThinkStart.size());
        state_ = State::Opened;
        continue;
      }
      if (!at_end && (ws == view.size() || is_proper_prefix(rest, kThinkStart))) return;  // wait for more
      break;
    }
    state_ = state_ == State::Opened || force_ ? State::Reasoning : State::Content;
  }
  if (state_ == State::Content) {
    out.content += buffer_;
    buffer_.clear();
    return;
  }
  // In reasoning: find the earliest end marker.
  std::size_t end_pos = buffer_.find(kThinkEnd);
  // <tool_call> also ends the reasoning (and goes on to the tool parser). A bare <function= does
  // not: reasoning that writes about tool-call markup stays reasoning (qwen-chat-protocol.md §4.6).
  std::size_t tool_pos = buffer_.find(kToolCall);
  if (end_pos != std::string::npos && (tool_pos == std::string::npos || end_pos < tool_pos)) {
    out.reasoning += buffer_.substr(0, end_pos);
    out.content += buffer_.substr(end_pos + kThinkEnd.size());
    buffer_.clear();
    state_ = State::Content;
    return;
  }
  if (tool_pos != std::string::npos) {
    out.reasoning += buffer_.substr(0, tool_pos);
    out.content += buffer_.substr(tool_pos);
    buffer_.clear();
    state_ = State::Content;
    return;
  }
  std::size_t hold = at_end ? 0 : held_suffix(buffer_);
  out.reasoning += buffer_.substr(0, buffer_.size() - hold);
  buffer_.erase(0, buffer_.size() - hold);
}

ReasoningDelta ReasoningParser::push(std::string_view text) {
  ReasoningDelta out;
  if (state_ == State::Content) {
    out.content.assign(text);
    return out;
  }
  buffer_ += text;
  step(out, false);
  return out;
}

ReasoningDelta ReasoningParser::finish() {
  ReasoningDelta out;
  step(out, true);
  return out;
}

ReasoningDelta ReasoningParser::parse(std::string_view text, bool start_in_reasoning) {
  ReasoningParser p(start_in_reasoning);
  ReasoningDelta a = p.push(text);
  ReasoningDelta b = p.finish();
  a.reasoning += b.reasoning;
  a.content += b.content;
  return a;
}

}  // namespace deltaserve
