#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tokenizer/unicode.h"

namespace deltaserve {

namespace {

// Code points after which nothing from the left can change under NFC, and which nothing on the
// left changes: combining class 0, unchanged by NFC, never the second half of a canonical
// composition (nor is the first character of their decomposition). Splitting text just before
// such a character and normalizing the parts separately gives NFC of the whole: canonical
// reordering never crosses a class-0 character and no composition spans the split.
// Computed once from utf8proc's tables (~1.1M code points, a few milliseconds).
class NfcStableTable {
 public:
  NfcStableTable() : stable_(kSize / 64, 0) {
    std::vector<bool> second(kSize, false);
    utf8proc_int32_t seq[32];
    for (char32_t cp = 0; cp < kSize; ++cp) {
      if (is_canonically_decomposable(cp) && !is_hangul_syllable(cp)) {
        const auto n = decompose(cp, seq);
        for (utf8proc_ssize_t k = 1; k < n; ++k) second[static_cast<std::size_t>(seq[k])] = true;
      }
    }
    // Hangul syllables decompose algorithmically: vowel and trailing jamo compose onto the left.
    for (char32_t cp = 0x1161; cp <= 0x1175; ++cp) second[cp] = true;
    for (char32_t cp = 0x11A8; cp <= 0x11C2; ++cp) second[cp] = true;
    for (char32_t cp = 0; cp < kSize; ++cp) {
      bool ok = cp < 0x300 || (ccc(cp) == 0 && !second[cp]);
      if (ok && cp >= 0x300 && is_canonically_decomposable(cp) && !is_hangul_syllable(cp)) {
        const auto n = decompose(cp, seq);
        const auto first = static_cast<char32_t>(seq[0]);
        std::string one;
        append_utf8(one, cp);
        ok = n > 0 && ccc(first) == 0 && !second[first] && nfc(one) == one;
      }
      if (ok) stable_[cp / 64] |= std::uint64_t{1} << (cp % 64);
    }
  }
  bool stable(char32_t cp) const { return cp < kSize && ((stable_[cp / 64] >> (cp % 64)) & 1); }

 private:
  static constexpr char32_t kSize = 0x110000;
  static bool is_hangul_syllable(char32_t cp) { return cp >= 0xAC00 && cp <= 0xD7A3; }
  static int ccc(char32_t cp) {
    return utf8proc_get_property(static_cast<utf8proc_int32_t>(cp))->combining_class;
  }
  static bool is_canonically_decomposable(char32_t cp) {
    const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
    return p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0;
  }
  static utf8proc_ssize_t decompose(char32_t cp, utf8proc_int32_t (&seq)[32]) {
    int boundclass = 0;
    return utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), seq, 32, UTF8PROC_DECOMPOSE,
                                   &boundclass);
  }
  std::vector<std::uint64_t> stable_;
};

bool is_nfc_stable(char32_t cp) {
  // ASCII through U+02FF never interacts (combining marks start at U+0300).
  if (cp < 0x300) return true;
  static const NfcStableTable table;
  return table.stable(cp);
}

}  // namespace

// Offset of the first code point that is not NFC-stable, or text.size().
std::size_t first_unstable(std::string_view text, std::size_t from) {
  std::size_t i = from;
  while (i < text.size()) {
    while (i + 8 <= text.size()) {  // ASCII fast path
      std::uint64_t w;
      std::memcpy(&w, text.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= text.size()) break;
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step st = utf8_step(text, i);
    if (!st.valid || !is_nfc_stable(st.cp)) return i;
    i += st.len;
  }
  return text.size();
}

bool is_nfc_quick(std::string_view text) { return first_unstable(text, 0) == text.size(); }

std::string nfc(std::string_view text) {
  // Canonical decomposition a code point at a time, canonical ordering by a stable sort of each run
  // of non-starters, then composition (utf8proc_reencode). utf8proc_map would order the marks by a
  // gnome sort, quadratic in a run of marks out of order: 50k alternating U+0301 U+0323 took 8 s.
  std::vector<utf8proc_int32_t> cps;
  cps.reserve(text.size() + 8);
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  const auto len = static_cast<utf8proc_ssize_t>(text.size());
  utf8proc_int32_t seq[32];
  for (utf8proc_ssize_t i = 0; i < len;) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(p + i, len - i, &cp);
    if (n <= 0) return std::string(text);  // only on invalid input, which callers never pass
    i += n;
    int boundclass = 0;
    const utf8proc_ssize_t m = utf8proc_decompose_char(cp, seq, 32, UTF8PROC_DECOMPOSE, &boundclass);
    if (m < 0 || m > 32) return std::string(text);
    cps.insert(cps.end(), seq, seq + m);
  }
  auto ccc = [](utf8proc_int32_t cp) { return utf8proc_get_property(cp)->combining_class; };
  for (std::size_t i = 0; i < cps.size();) {
    if (ccc(cps[i]) == 0) {
      ++i;
      continue;
    }
    std::size_t j = i + 1;
    while (j < cps.size() && ccc(cps[j]) != 0) ++j;
    if (j - i > 1)
      std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j),
                       [&](utf8proc_int32_t a, utf8proc_int32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
  // Composes in place and writes UTF-8 over the buffer (at most 4 bytes a code point: it fits).
  const utf8proc_ssize_t n = utf8proc_reencode(cps.data(), static_cast<utf8proc_ssize_t>(cps.size()),
                                               static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(text);
  return std::string(reinterpret_cast<const char*>(cps.data()), static_cast<std::size_t>(n));
}

Normalizer::Normalizer(NormalizerKind kind) : kind_(kind) {
  if (kind_ == NormalizerKind::kNfc) (void)is_nfc_stable(0x300);
}

std::string_view Normalizer::apply(std::string_view text, std::string& scratch) const {
  if (kind_ == NormalizerKind::kNone) return text;
  std::size_t bad = first_unstable(text, 0);
  if (bad == text.size()) return text;
  // Normalize only the regions around unstable code points. Splitting the text just before a
  // stable code point is safe: it has combining class 0 (canonical reordering never crosses it)
  // and never composes with what precedes it, so NFC of the parts equals NFC of the whole.
  scratch.clear();
  scratch.reserve(text.size() + 16);
  std::size_t copied = 0;
  while (bad < text.size()) {
    // The region starts at the character before the unstable one (it may be the starter that the
    // unstable one composes with) and ends at the next stable character.
    std::size_t begin = bad;
    if (begin > copied) {
      do --begin;
      while (begin > copied && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80);
    }
    std::size_t end = bad;
    while (end < text.size()) {
      const Utf8Step st = utf8_step(text, end);
      if (st.valid && is_nfc_stable(st.cp)) break;
      end += st.len;
    }
    scratch.append(text.substr(copied, begin - copied));
    scratch.append(nfc(text.substr(begin, end - begin)));
    copied = end;
    bad = first_unstable(text, end);
  }
  scratch.append(text.substr(copied));
  return scratch;
}

}  // namespace deltaserve
