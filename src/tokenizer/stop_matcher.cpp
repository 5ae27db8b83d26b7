#include "tokenizer/stop_matcher.h"

#include <algorithm>

namespace deltaserve {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    max_stop_len_ = std::max(max_stop_len_, s.size());
    stops_.push_back(std::move(s));  // keep empty ones so stop_idx matches the caller's list
  }
}

StopMatcher::Output StopMatcher::push(std::string_view text, bool match) {
  Output out;
  if (stopped_) {
    out.stopped = true;
    return out;
  }
  held_.append(text);
  if (!match) unchecked_ = held_.size();
  // Earliest occurrence wins; `held_` never contains a complete stop string from earlier pushes
  // (but for unchecked text: a match must end after it).
  std::size_t best_pos = std::string::npos;
  for (std::size_t i = 0; i < stops_.size() && match; ++i) {
    if (stops_[i].empty()) continue;
    const std::size_t from = unchecked_ >= stops_[i].size() ? unchecked_ - stops_[i].size() + 1 : 0;
    const std::size_t pos = held_.find(stops_[i], from);
    if (pos < best_pos) {
      best_pos = pos;
      out.stop_idx = static_cast<int>(i);
    }
  }
  if (best_pos != std::string::npos) {
    out.text = held_.substr(0, best_pos);
    out.n_unchecked = std::min(unchecked_, best_pos);
    out.stopped = stopped_ = true;
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string. Stop strings are
  // valid UTF-8, so such a suffix always starts on a character boundary.
  std::size_t keep = 0;
  const std::size_t max_keep = std::min(held_.size(), max_stop_len_ ? max_stop_len_ - 1 : 0);
  for (std::size_t len = max_keep; len > 0 && keep == 0; --len) {
    const std::string_view suffix = std::string_view(held_).substr(held_.size() - len);
    for (const std::string& s : stops_) {
      if (s.size() > len && std::string_view(s).substr(0, len) == suffix) {
        keep = len;
        break;
      }
    }
  }
  const std::size_t emitted = held_.size() - keep;
  out.text = held_.substr(0, emitted);
  out.n_unchecked = std::min(unchecked_, emitted);
  held_.erase(0, emitted);
  unchecked_ = unchecked_ > emitted ? unchecked_ - emitted : 0;
  return out;
}

std::string StopMatcher::flush() {
  std::string out = std::move(held_);
  held_.clear();
  unchecked_ = 0;
  return out;
}

}  // namespace deltaserve
