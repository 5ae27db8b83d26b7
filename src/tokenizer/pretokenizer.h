// The pre-tokenizer of tokenizer.json: regex `Split` steps (behavior "Isolated": matches and the
// gaps between them both become pieces), as used by Qwen's GPT-4-style pattern, or the GPT-2
// pattern of `ByteLevel` with use_regex. Patterns are Oniguruma syntax in HF; we run them with
// PCRE2 (UTF + UCP, JIT), after rewriting `\s`/`\S` to Oniguruma's White_Space set, which differs
// from PCRE2's (PCRE2 also matches U+180E).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace deltaserve {

// The GPT-2 split pattern that HF's ByteLevel pre-tokenizer uses when use_regex is true.
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The split pattern of Qwen2/2.5/3/3.5 tokenizer.json (GPT-4 style). It gets a hand-written
// matcher (QwenSplitter), several times faster than the regex engine; PCRE2 runs anything else.
inline constexpr std::string_view kQwenSplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// End of the kQwenSplitPattern match that starts at `pos` of valid UTF-8 `text` (pos < size).
// The pattern matches at every position, so there are never gaps.
std::size_t qwen_split_match_end(std::string_view text, std::size_t pos);

// Rewrites `\s` / `\S` (outside classes) and `\s` (inside classes) into explicit White_Space sets.
std::string rewrite_whitespace_classes(std::string_view pattern);

class PreTokenizer {
 public:
  // Each pattern splits every piece produced by the previous one. No patterns: one piece.
  // `use_builtin`: use the hand-written matcher for kQwenSplitPattern (tests turn it off to
  // compare).
  static Result<PreTokenizer> create(const std::vector<std::string>& patterns,
                                     bool use_builtin = true);

  // Calls `sink(piece)` for each piece of valid UTF-8 `text`: views into `text`, in order, covering
  // all of it, none empty. Streaming avoids materialising a piece list for long inputs.
  template <typename Sink>
  void split(std::string_view text, Sink&& sink) const {
    split_level(
        0, text, [](void* ctx, std::string_view piece) { (*static_cast<Sink*>(ctx))(piece); },
        &sink);
  }
  // Appends the pieces to `pieces`.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const {
    split(text, [&](std::string_view piece) { pieces.push_back(piece); });
  }

 private:
  using SinkFn = void (*)(void* ctx, std::string_view piece);
  void split_level(std::size_t level, std::string_view text, SinkFn sink, void* ctx) const;

  struct Regex;
  std::vector<std::shared_ptr<const Regex>> regexes_;
  std::vector<bool> builtin_qwen_;  // per level: use qwen_split_match_end instead of the regex
};

}  // namespace deltaserve
