#include "server/choice_state.h"

namespace deltaserve {

ChoiceState::ChoiceState(const Tokenizer& tokenizer, ChoiceOptions options)
    : tokenizer_(tokenizer),
      options_(std::move(options)),
      detok_(tokenizer, false),
      stop_(options_.stop) {
  for (const auto& [pattern, grammar] : options_.stop_regex) {
    RegexScan scan;
    scan.stepper = std::make_unique<GrammarStepper>(*grammar);
    MatchFlags flags;
    scan.stepper->initial(scan.cur, flags);
    regex_.push_back(std::move(scan));
  }
  if (options_.chat && options_.reasoning) reasoning_.emplace(options_.start_in_reasoning);
  if (options_.chat && options_.tool_parser != ToolParserKind::None && !options_.tools.is_null()) {
    tools_ = make_tool_call_parser(options_.tool_parser, options_.tools);
  }
}

void ChoiceState::route_text(std::string text, bool at_end, ChoiceDelta& out) {
  if (!options_.chat) {
    out.text += text;
    return;
  }
  std::string content;
  if (reasoning_) {
    ReasoningDelta r = reasoning_->push(text);
    if (at_end) {
      ReasoningDelta tail = reasoning_->finish();
      r.reasoning += tail.reasoning;
      r.content += tail.content;
    }
    if (!options_.include_reasoning) {
      r.reasoning.clear();
    } else if (!options_.stream_reasoning) {
      // SGLang stream_reasoning=false: one reasoning delta once the reasoning is over.
      held_reasoning_ += r.reasoning;
      r.reasoning.clear();
      if (at_end || !reasoning_->in_reasoning()) {
        r.reasoning = std::move(held_reasoning_);
        held_reasoning_.clear();
      }
    }
    out.reasoning += r.reasoning;
    content = std::move(r.content);
  } else {
    content = std::move(text);
  }
  if (tools_) {
    ToolParseDelta t = tools_->push(content);
    if (at_end) t.append(tools_->finish());
    for (auto& c : t.calls)
      if (options_.max_tool_calls < 0 || c.index < options_.max_tool_calls) out.tool_calls.push_back(std::move(c));
    // Content that has been only blanks so far is held while it stays so: a reply whose content is
    // blanks around its tool calls has content "" (as vLLM and SGLang strip it), streamed or not.
    // Once other text comes, the held blanks go out before it (and content has started: acc_text_).
    if (!acc_text_.empty()) {
      out.text += t.content;
    } else {
      held_blank_ += t.content;
      if (held_blank_.find_first_not_of(" \t\r\n") != std::string::npos) {
        out.text += held_blank_;
        held_blank_.clear();
      } else if (at_end) {
        if (acc_calls_.empty() && out.tool_calls.empty()) out.text += held_blank_;
        held_blank_.clear();
      }
    }
  } else {
    out.text += content;
  }
}

void ChoiceState::finish(ChoiceDelta& out, std::string reason, nlohmann::ordered_json matched) {
  // As SGLang: a choice that ends in tool calls reports no matched stop.
  if (reason == "stop" && saw_tool_call()) reason = "tool_calls";
  if (reason != "stop") matched = nullptr;
  finished_ = true;
  finish_reason_ = reason;
  matched_stop_ = matched;
  out.finished = true;
  out.finish_reason = std::move(reason);
  out.matched_stop = std::move(matched);
}

ChoiceDelta ChoiceState::on_event(const TokenEvent& event) {
  const std::size_t n = event.tokens.size();
  if (n <= 1 || (options_.stop.empty() && options_.stop_regex.empty())) return on_tokens(event, 0, n);
  // Several tokens (speculative decoding) and stop strings: token by token, so that a stop string
  // that ends at one of them ends the choice there; the tokens after it are not part of the output
  // (not counted, returned or given logprobs), as when each event carries one token.
  ChoiceDelta out;
  for (std::size_t k = 0; k < n && !out.finished; ++k) out.append(on_tokens(event, k, k + 1));
  if (event.finish != FinishReason::None) accept_length_ = event.accept_length;  // its tail cut by a stop
  return out;
}

ChoiceDelta ChoiceState::on_tokens(const TokenEvent& event, std::size_t begin, std::size_t end) {
  ChoiceDelta out;
  // Every event carries the prompt's counts: the choice may end here (a stop string) and be answered
  // before the engine's final event comes.
  if (event.n_prompt_tokens > 0) {
    n_prompt_ = event.n_prompt_tokens;
    n_cached_ = event.n_cached_tokens;
  }
  if (finished_) return out;
  // `early`: the text of the first min_tokens tokens, where no stop string may end.
  std::string early, text;
  for (std::size_t k = begin; k < end; ++k) {
    TokenId id = event.tokens[k];
    ++n_generated_;
    last_token_ = id;
    if (options_.count_reasoning_tokens && !think_ended_) {
      if (!options_.start_in_reasoning && n_generated_ == 1 && !(options_.think_start_id && id == *options_.think_start_id)) {
        think_ended_ = true;  // neither the prompt nor the reply opened <think>: no reasoning
      } else {
        ++n_reasoning_;
        if (options_.think_end_id && id == *options_.think_end_id) think_ended_ = true;
      }
    }
    if (k < event.logprobs.size()) out.logprobs.push_back(event.logprobs[k]);
    acc_ids_.push_back(id);
    out.token_ids.push_back(id);
    if (options_.hidden_ids.count(id)) continue;
    if (options_.skip_special && tokenizer_.is_special(id) && !options_.keep_special.count(id)) continue;
    (n_generated_ <= options_.min_tokens ? early : text) += detok_.push(id);
  }
  const bool at_end = end == event.tokens.size() && event.finish != FinishReason::None;
  if (at_end) {
    (n_generated_ <= options_.min_tokens ? early : text) += detok_.flush();
    accept_length_ = event.accept_length;
  }
  if (!early.empty()) early = stop_.push(early, /*match=*/false).text;
  StopMatcher::Output s = stop_.push(text);
  s.text.insert(0, early);
  // No stop regex may end in the first min_tokens tokens' text: what this call's early text was,
  // and what the stop matcher held back of earlier early text (it comes out first).
  std::size_t from = early.size() + s.n_unchecked;
  // At the end, the stop matcher's held tail (what could have begun a stop string) is output too,
  // so a stop regex may end in it.
  if (at_end && !s.stopped) {
    if (stop_.n_unchecked_held() > 0) from = s.text.size() + stop_.n_unchecked_held();
    s.text += stop_.flush();
  }
  if (s.stopped) {
    stop_matched_ = true;
    nlohmann::ordered_json matched = nullptr;
    if (s.stop_idx >= 0 && static_cast<std::size_t>(s.stop_idx) < options_.stop.size()) {
      matched = options_.stop[static_cast<std::size_t>(s.stop_idx)];
      if (options_.no_stop_trim) s.text += options_.stop[static_cast<std::size_t>(s.stop_idx)];
    }
    if (std::size_t cut = stop_regex_end(s.text, from); cut != std::string::npos) {
      s.text.resize(cut);
      matched = options_.stop_regex[static_cast<std::size_t>(matched_regex_)].first;
    }
    route_text(std::move(s.text), true, out);
    finish(out, "stop", std::move(matched));
  } else if (std::size_t cut = stop_regex_end(s.text, from); cut != std::string::npos) {
    stop_matched_ = true;
    s.text.resize(cut);
    route_text(std::move(s.text), true, out);
    finish(out, "stop", options_.stop_regex[static_cast<std::size_t>(matched_regex_)].first);
  } else {
    route_text(std::move(s.text), at_end, out);
    if (at_end) {
      if (event.finish == FinishReason::Error) out.error = event.error;
      // The engine ends with Stop on an EOS or stop_token_ids token, and that token is the
      // last one it emitted (it is part of the output, hidden from the text).
      nlohmann::ordered_json matched = nullptr;
      if (event.finish == FinishReason::Stop && last_token_) matched = *last_token_;
      finish(out, finish_reason_name(event.finish), std::move(matched));
    }
  }
  accumulate(out);
  return out;
}

ChoiceDelta ChoiceState::on_closed(const std::string& reason) {
  ChoiceDelta out;
  if (finished_) return out;
  std::string text = detok_.flush();
  StopMatcher::Output s = stop_.push(text);
  text = s.text + (s.stopped ? "" : stop_.flush());
  route_text(std::move(text), true, out);
  finish(out, reason);
  accumulate(out);
  return out;
}

std::size_t ChoiceState::stop_regex_end(std::string_view text, std::size_t from) {
  std::size_t best = std::string::npos;
  for (std::size_t r = 0; r < regex_.size(); ++r) {
    RegexScan& scan = regex_[r];
    if (scan.done) continue;
    for (std::size_t i = 0; i < text.size() && i < best; ++i) {
      MatchFlags flags;
      scan.stepper->step(scan.cur, static_cast<uint8_t>(text[i]), scan.next, flags);
      scan.cur.swap(scan.next);
      if (flags.accept && i + 1 > from) {
        best = i + 1;
        matched_regex_ = static_cast<int>(r);
        scan.done = true;
        break;
      }
    }
  }
  return best;
}

void ChoiceState::accumulate(const ChoiceDelta& d) {
  acc_text_ += d.text;
  acc_reasoning_ += d.reasoning;
  acc_calls_.insert(acc_calls_.end(), d.tool_calls.begin(), d.tool_calls.end());
  acc_logprobs_.insert(acc_logprobs_.end(), d.logprobs.begin(), d.logprobs.end());
}

}  // namespace deltaserve
