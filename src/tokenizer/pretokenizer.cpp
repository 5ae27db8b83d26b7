#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <array>
#include <cstdint>

#include "tokenizer/unicode.h"

namespace deltaserve {

namespace {

// Unicode White_Space, the set Oniguruma's \s matches in Unicode mode.
constexpr std::string_view kWhiteSpaceItems =
    R"(\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

std::string rewrite_whitespace_classes(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      ++i;
      if (n == 'Q') {  // \Q...\E quotes a literal: copy it untouched
        const std::size_t end = p.find("\\E", i + 1);
        const std::size_t stop = end == std::string_view::npos ? p.size() : end + 2;
        out.append(p.substr(i - 1, stop - (i - 1)));
        i = stop - 1;
        continue;
      }
      if (n == 's') {
        if (in_class) {
          out.append(kWhiteSpaceItems);
        } else {
          out.append("[").append(kWhiteSpaceItems).append("]");
        }
      } else if (n == 'S' && !in_class) {
        out.append("[^").append(kWhiteSpaceItems).append("]");
      } else {
        out.push_back(c);
        out.push_back(n);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' (after an optional '^') right at the start of a class is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      // POSIX class [:name:] inside a class: copy through its closing ":]".
      const std::size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

namespace {

// Character classes of kQwenSplitPattern. kSpace is White_Space other than CR and LF.
enum CharClass : std::uint8_t { kOther, kLetter, kNumber, kSpace, kNewline };

struct AsciiClasses {
  std::array<CharClass, 128> cls{};
  AsciiClasses() {
    for (int c = 0; c < 128; ++c) {
      CharClass k = kOther;
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        k = kLetter;
      else if (c >= '0' && c <= '9')
        k = kNumber;
      else if (c == '\r' || c == '\n')
        k = kNewline;
      else if (c == ' ' || c == '\t' || c == 0x0B || c == 0x0C)
        k = kSpace;
      cls[c] = k;
    }
  }
};
const AsciiClasses kAscii;

CharClass classify(char32_t cp) {
  if (cp < 0x80) return kAscii.cls[cp];
  if (is_unicode_whitespace(cp)) return kSpace;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return kLetter;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return kNumber;
    default:
      return kOther;
  }
}

struct CharInfo {
  char32_t cp;
  std::uint8_t len;
  CharClass cls;
};

inline CharInfo char_at(std::string_view t, std::size_t i) {
  const auto b = static_cast<unsigned char>(t[i]);
  if (b < 0x80) return {b, 1, kAscii.cls[b]};
  const Utf8Step st = utf8_step(t, i);
  return {st.cp, st.len, classify(st.cp)};
}

inline CharClass class_at(std::string_view t, std::size_t i) {
  return i < t.size() ? char_at(t, i).cls : kOther;
}

inline std::size_t skip_class(std::string_view t, std::size_t i, CharClass cls) {
  while (i < t.size()) {
    const auto b = static_cast<unsigned char>(t[i]);
    if (b < 0x80) {  // ASCII fast path
      if (kAscii.cls[b] != cls) break;
      ++i;
      continue;
    }
    const CharInfo c = char_at(t, i);
    if (c.cls != cls) break;
    i += c.len;
  }
  return i;
}

// Simple case folding onto ASCII for the contraction letters; U+017F (long s) folds to 's'.
inline char32_t fold(char32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp == 0x17F) return 's';
  return cp;
}

}  // namespace

std::size_t qwen_split_match_end(std::string_view t, std::size_t i) {
  const std::size_t n = t.size();
  const CharInfo c = char_at(t, i);
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (c.cp == '\'' && i + 1 < n) {
    const CharInfo d = char_at(t, i + 1);
    const char32_t l = fold(d.cp);
    const std::size_t after = i + 1 + d.len;
    if (l == 's' || l == 't' || l == 'm' || l == 'd') return after;
    if ((l == 'r' || l == 'v' || l == 'l') && after < n) {
      const CharInfo e = char_at(t, after);
      if (fold(e.cp) == (l == 'l' ? U'l' : U'e')) return after + e.len;
    }
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c.cls == kLetter) return skip_class(t, i, kLetter);
  if ((c.cls == kOther || c.cls == kSpace) && class_at(t, i + c.len) == kLetter)
    return skip_class(t, i + c.len, kLetter);
  // \p{N}
  if (c.cls == kNumber) return i + c.len;
  // ' '?[^\s\p{L}\p{N}]+[\r\n]*
  std::size_t j = i;
  if (c.cp == ' ' && class_at(t, i + 1) == kOther) j = i + 1;
  if (j > i || c.cls == kOther) return skip_class(t, skip_class(t, j, kOther), kNewline);
  // Now `c` is whitespace: [i, e) is the whitespace run.
  std::size_t e = i, last_newline_end = 0, last_start = i;
  while (e < n) {
    const CharInfo w = char_at(t, e);
    if (w.cls != kSpace && w.cls != kNewline) break;
    last_start = e;
    e += w.len;
    if (w.cls == kNewline) last_newline_end = e;
  }
  // \s*[\r\n]+ : backtracking ends the match after the run's last CR/LF.
  if (last_newline_end != 0) return last_newline_end;
  // \s+(?!\S) : the whole run at the end of text, else the run minus its last character.
  if (e == n) return e;
  if (last_start > i) return last_start;
  // \s+
  return e;
}

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

Result<PreTokenizer> PreTokenizer::create(const std::vector<std::string>& patterns,
                                          bool use_builtin) {
  PreTokenizer pt;
  for (const std::string& pattern : patterns) {
    pt.builtin_qwen_.push_back(use_builtin && pattern == kQwenSplitPattern);
    const std::string rewritten = rewrite_whitespace_classes(pattern);
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    auto regex = std::make_shared<Regex>();
    regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
    if (regex->code == nullptr) {
      return error("pre-tokenizer regex does not compile at offset ", err_offset, ": ",
                   pcre2_error_text(err), " (pattern: ", pattern, ")");
    }
    // JIT is an optimisation only: the interpreter gives the same matches if it is unavailable.
    pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);
    pt.regexes_.push_back(std::move(regex));
  }
  return pt;
}

void PreTokenizer::split_level(std::size_t level, std::string_view text, SinkFn sink,
                               void* ctx) const {
  if (text.empty()) return;
  if (level == regexes_.size()) {
    sink(ctx, text);
    return;
  }
  const auto emit = [&](std::string_view piece) { split_level(level + 1, piece, sink, ctx); };
  if (builtin_qwen_[level]) {
    for (std::size_t pos = 0; pos < text.size();) {
      const std::size_t end = qwen_split_match_end(text, pos);
      emit(text.substr(pos, end - pos));
      pos = end;
    }
    return;
  }
  const Regex& regex = *regexes_[level];
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(regex.code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t pos = 0;     // start of the current gap (text not yet emitted)
  std::size_t search = 0;  // where the next match attempt starts
  while (search < text.size()) {
    const int rc =
        pcre2_match(regex.code, subject, text.size(), search, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;  // no further match (or a resource limit): the rest is one gap piece
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const std::size_t start = ov[0], end = ov[1];
    if (end == start) {
      // Empty matches split nothing (HF drops empty pieces): retry one character later.
      search = start + 1;
      while (search < text.size() && (static_cast<unsigned char>(text[search]) & 0xC0) == 0x80)
        ++search;
      continue;
    }
    if (start > pos) emit(text.substr(pos, start - pos));
    emit(text.substr(start, end - start));
    pos = search = end;
  }
  pcre2_match_data_free(md);
  if (pos < text.size()) emit(text.substr(pos));
}

}  // namespace deltaserve
