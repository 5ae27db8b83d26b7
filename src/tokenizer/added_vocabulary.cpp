#include "tokenizer/added_vocabulary.h"

#include <algorithm>
#include <cstring>

#include "tokenizer/unicode.h"

namespace deltaserve {

namespace {

// Code point ending at byte `end` (exclusive) of valid UTF-8 text; `start` receives its offset.
char32_t last_char(std::string_view text, std::size_t end, std::size_t& start) {
  start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return utf8_step(text, start).cp;
}

}  // namespace

void AddedVocabulary::add(const AddedToken& token, std::string match_text) {
  if (match_text.empty()) return;  // HF ignores empty added tokens
  Pass& pass = passes_[token.normalized ? 1 : 0];
  pass.first_byte[static_cast<unsigned char>(match_text[0])] = true;
  pass.patterns.push_back(Pattern{std::move(match_text), token});
  std::stable_sort(
      pass.patterns.begin(), pass.patterns.end(), [](const Pattern& a, const Pattern& b) {
        if (a.text[0] != b.text[0])
          return static_cast<unsigned char>(a.text[0]) < static_cast<unsigned char>(b.text[0]);
        return a.text.size() > b.text.size();
      });
}

void AddedVocabulary::split(std::string_view text, bool normalized_pass, bool parse_special,
                            std::vector<Segment>& out) const {
  const Pass& pass = passes_[normalized_pass ? 1 : 0];
  std::size_t start_offset = 0;  // end of the previous emitted segment
  std::size_t pos = 0;           // where the next match search starts
  const std::size_t n = text.size();
  while (pos < n) {
    if (!pass.first_byte[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    // Longest pattern starting here (patterns with the same first byte are longest first).
    const Pattern* match = nullptr;
    for (const Pattern& p : pass.patterns) {
      if (p.text[0] != text[pos]) {
        if (match == nullptr &&
            static_cast<unsigned char>(p.text[0]) > static_cast<unsigned char>(text[pos]))
          break;
        continue;
      }
      if (p.text.size() <= n - pos &&
          std::memcmp(p.text.data(), text.data() + pos, p.text.size()) == 0) {
        match = &p;
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    std::size_t begin = pos, end = pos + match->text.size();
    pos = end;  // matches never overlap, even when this one is rejected below
    const AddedToken& tok = match->token;
    if (tok.special && !parse_special) continue;
    if (tok.single_word) {
      std::size_t unused;
      const bool word_before = begin > 0 && is_unicode_alphanumeric(last_char(text, begin, unused));
      const bool word_after = end < n && is_unicode_alphanumeric(utf8_step(text, end).cp);
      if (word_before || word_after) continue;
    }
    if (tok.lstrip) {
      std::size_t b = begin;
      while (b > start_offset) {
        std::size_t prev;
        if (!is_unicode_whitespace(last_char(text, b, prev))) break;
        b = prev;
      }
      begin = std::max(b, start_offset);
    }
    if (tok.rstrip) {
      while (end < n) {
        const Utf8Step st = utf8_step(text, end);
        if (!st.valid || !is_unicode_whitespace(st.cp)) break;
        end += st.len;
      }
      pos = end;
    }
    if (begin > start_offset) out.push_back(Segment{start_offset, begin, -1});
    out.push_back(Segment{begin, end, tok.id});
    start_offset = end;
  }
  if (start_offset < n) out.push_back(Segment{start_offset, n, -1});
}

}  // namespace deltaserve
