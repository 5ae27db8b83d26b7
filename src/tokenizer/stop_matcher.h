// Stop strings over streamed text. Text is fed in pieces (any split, e.g. per token); the matcher
// returns what is safe to emit and holds back the longest suffix that could still grow into a stop
// string. On a match, the text before the stop string is emitted and the stop string (and anything
// after it) is not.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace deltaserve {

class StopMatcher {
 public:
  struct Output {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string matched; further input is ignored
    int stop_idx = -1;     // which stop string (index into the constructor's list)
    std::size_t n_unchecked = 0;  // text's leading bytes that were pushed with match=false
  };

  // Empty stop strings are ignored.
  explicit StopMatcher(std::vector<std::string> stops);

  // match=false: the text is emitted and held back as usual, but no stop string may end inside it
  // (min_tokens: vLLM checks stop strings only once min_tokens tokens were generated; a stop
  // string that starts there and ends in later text still matches).
  Output push(std::string_view text, bool match = true);
  // End of stream without a match: the held-back text.
  std::string flush();
  bool stopped() const { return stopped_; }
  std::size_t n_held_bytes() const { return held_.size(); }
  // The held bytes' leading ones that were pushed with match=false (flush() returns them first).
  std::size_t n_unchecked_held() const { return unchecked_; }

 private:
  std::vector<std::string> stops_;
  std::size_t max_stop_len_ = 0;
  std::string held_;
  std::size_t unchecked_ = 0;  // held_[0, unchecked_) was pushed with match=false
  bool stopped_ = false;
};

}  // namespace deltaserve
