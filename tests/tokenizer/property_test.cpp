// Round-trip properties of the byte-level tokenizer on random input.
#include <gtest/gtest.h>
#include <utf8proc.h>

#include <cstdlib>

#include "random_text.h"
#include "test_tokenizers.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"

namespace deltaserve::testing {
namespace {

TEST(TokenizerProperty, DecodeEncodeIsNfcForRandomUnicode) {
  std::mt19937 rng(1234);
  for (const Tokenizer* tok : {&qwen3(), &tiny_coder()}) {
    for (int i = 0; i < 3000; ++i) {
      const std::string s = random_unicode_string(rng, 40);
      ASSERT_EQ(tok->decode(tok->encode(s)), nfc(s)) << "case " << i;
    }
  }
}

TEST(NormalizerProperty, PiecewiseNfcEqualsWholeStringNfc) {
  // Normalizer::apply only runs utf8proc around unstable code points; the result must equal NFC
  // of the whole string. Dense combining marks, jamo and decomposable letters stress the splits.
  static constexpr char32_t kTricky[] = {
      0x301,  0x308,  0x323,  0x327,  0x345,  0x344,  0x340,   0x1100,  0x1161,  0x11A8, 0xAC00,
      0xAC01, 0x3099, 0x304B, 0x653,  0x654,  0x627,  0x6D2,   0x93C,   0x928,   0x9BE,  0x9C7,
      0xE9,   0x65,   0x212B, 0x2126, 0xF900, 0x1E0A, 0x1D15E, 0x110BA, 0x11099, 0x0F73, 0x0F40};
  std::mt19937 rng(11);
  const Normalizer norm(NormalizerKind::kNfc);
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    const int n = std::uniform_int_distribution<int>(0, 12)(rng);
    for (int k = 0; k < n; ++k) {
      if (rng() % 2) {
        append_utf8(s, kTricky[rng() % std::size(kTricky)]);
      } else {
        append_utf8(s, random_code_point(rng));
      }
    }
    std::string scratch;
    ASSERT_EQ(std::string(norm.apply(s, scratch)), nfc(s)) << "case " << i;
  }
}

// nfc() orders marks itself (a stable sort) and composes with utf8proc: the same text as
// utf8proc_map's NFC on random strings dense in marks, jamo and composable letters.
TEST(NormalizerProperty, NfcEqualsUtf8procsNfc) {
  static constexpr char32_t kMarks[] = {0x301, 0x308, 0x323, 0x327, 0x345, 0x344, 0x340, 0x1100, 0x1161, 0x11A8,
                                        0xAC00, 0x3099, 0x304B, 0x653, 0x654, 0x627, 0x93C, 0x928, 0x9BE, 0x9C7,
                                        0x65, 0x41, 0x212B, 0xF900, 0x1D15E, 0x110BA, 0x0F73, 0x0F71, 0x0F72, 0x5B0,
                                        0x5B1, 0x5BC, 0x5C1, 0x334, 0x35C, 0x1DCE, 0x20D2};
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    const int n = std::uniform_int_distribution<int>(0, 16)(rng);
    for (int k = 0; k < n; ++k) append_utf8(s, rng() % 4 ? kMarks[rng() % std::size(kMarks)] : random_code_point(rng));
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                              static_cast<utf8proc_ssize_t>(s.size()), &out,
                                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    ASSERT_GE(len, 0);
    const std::string want(reinterpret_cast<const char*>(out), static_cast<std::size_t>(len));
    std::free(out);
    ASSERT_EQ(nfc(s), want) << "case " << i;
  }
}

// Found by review (stop 55): utf8proc_map's reordering is quadratic in a run of marks out of
// canonical order; 200k of them took 105 s, with the server's prepare workers held. NFC of
// "e" + (U+0301 U+0323) x n: the dot below (class 220) sorts before the acute (230) and composes
// with the e (U+1EB9); the other dots and every acute stay.
TEST(NormalizerProperty, LongRunOfMarksOutOfOrder) {
  constexpr int n = 100000;
  std::string s = "e", want;
  for (int i = 0; i < n; ++i) {
    append_utf8(s, 0x301);
    append_utf8(s, 0x323);
  }
  append_utf8(want, 0x1EB9);
  for (int i = 1; i < n; ++i) append_utf8(want, 0x323);
  for (int i = 0; i < n; ++i) append_utf8(want, 0x301);
  EXPECT_TRUE(nfc(s) == want);
  std::string scratch;
  EXPECT_TRUE(std::string(Normalizer(NormalizerKind::kNfc).apply(s, scratch)) == want);
}

TEST(TokenizerProperty, LongRunsRoundTrip) {
  // Long whitespace / punctuation / digit runs exercise the heap merge path and the regex.
  for (const std::string unit : {" ", "\n", "=", "ab", "1", "\t ", "日本", "🚀"}) {
    std::string s;
    for (int i = 0; i < 5000; ++i) s += unit;
    s += "x";
    EXPECT_EQ(qwen3().decode(qwen3().encode(s)), s) << unit;
  }
}

TEST(TokenizerProperty, ArbitraryBytesNeverCrash) {
  std::mt19937 rng(99);
  for (int i = 0; i < 3000; ++i) {
    const std::string bytes = random_bytes(rng, 48);
    const auto ids = qwen3().encode(bytes);
    // Invalid sequences became U+FFFD first (Python's errors="replace").
    std::string lossy;
    append_utf8_lossy(lossy, bytes);
    ASSERT_EQ(qwen3().decode(ids), nfc(lossy)) << "case " << i;
  }
}

// Replaces code points whose letter/number class differs between utf8proc's and PCRE2's Unicode
// tables (different Unicode versions): the comparison below is about matching logic, not tables.
std::string same_tables_only(const std::string& s) {
  static const auto letter = PreTokenizer::create({"\\p{L}"}, false);
  static const auto number = PreTokenizer::create({"\\p{N}"}, false);
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const Utf8Step st = utf8_step(s, i);
    const std::string_view ch(s.data() + i, st.len);
    // Split "c" + "c": a class match makes two pieces, a miss one gap piece.
    const std::string twice = std::string(ch) + std::string(ch);
    std::vector<std::string_view> lp, np;
    letter->split(twice, lp);
    number->split(twice, np);
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(st.cp));
    const bool u_letter = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
    const bool u_number = cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO;
    const bool same = (lp.size() == 2) == u_letter && (np.size() == 2) == u_number;
    if (same) {
      out.append(ch);
    } else {
      out.push_back('x');
    }
    i += st.len;
  }
  return out;
}

TEST(PreTokenizerProperty, BuiltinQwenSplitMatchesPcre2) {
  auto builtin = PreTokenizer::create({std::string(kQwenSplitPattern)}, /*use_builtin=*/true);
  auto regex = PreTokenizer::create({std::string(kQwenSplitPattern)}, /*use_builtin=*/false);
  ASSERT_TRUE(builtin.is_ok() && regex.is_ok());
  std::mt19937 rng(77);
  std::vector<std::string> texts;
  // The document must outlive the loop: `for (x : temp().at(k))` iterates into a temporary that
  // is destroyed before the first iteration (before C++23).
  const auto reference = read_json(qwen3_dir() / "reference.json");
  for (const auto& c : reference.at("encode")) texts.push_back(c.at("text").get<std::string>());
  // Contractions with case and long s, whitespace mixes around letters and punctuation.
  texts.push_back("I'M HE'LL 'S 'Re 'vE 'Ll 'ſ 'x ''s");
  texts.push_back(" \t\n  \r\n x\u3000y  \u00a0z\n\n \t");
  for (int i = 0; i < 20000; ++i) texts.push_back((random_unicode_string(rng, 24)));
  for (auto& t : texts) t = same_tables_only(t);
  for (const std::string& text : texts) {
    std::vector<std::string_view> a, b;
    builtin->split(text, a);
    regex->split(text, b);
    ASSERT_EQ(a, b) << text;
  }
}

TEST(PreTokenizerProperty, RegexPathHandlesLongRuns) {
  // The PCRE2 path (used for patterns other than Qwen's) must not hit JIT stack limits on long
  // runs; it must split exactly like the built-in matcher.
  auto builtin = PreTokenizer::create({std::string(kQwenSplitPattern)}, /*use_builtin=*/true);
  auto regex = PreTokenizer::create({std::string(kQwenSplitPattern)}, /*use_builtin=*/false);
  auto gpt2 = PreTokenizer::create({std::string(kGpt2SplitPattern)});
  ASSERT_TRUE(builtin.is_ok() && regex.is_ok() && gpt2.is_ok());
  for (const std::string unit : {" ", " \n", "=", "ab", "1", "\t ", "日本", "🚀", "'s"}) {
    std::string s;
    for (int i = 0; i < 100000; ++i) s += unit;
    s += "x";
    std::vector<std::string_view> a, b, c;
    builtin->split(s, a);
    regex->split(s, b);
    ASSERT_EQ(a, b) << unit;
    gpt2->split(s, c);
    std::string joined;
    for (auto p : c) joined += p;
    ASSERT_EQ(joined, s);
  }
}

TEST(BpeProperty, QuadraticAndHeapMergesAgree) {
  // Build the BPE model of tiny-coder directly and compare its two merge paths on random words.
  const auto json = read_json(tiny_coder_dir() / "tokenizer.json");
  std::vector<std::string> token_bytes;
  std::string bytes;
  for (auto it = json["model"]["vocab"].begin(); it != json["model"]["vocab"].end(); ++it) {
    const auto id = it.value().get<std::size_t>();
    if (id >= token_bytes.size()) token_bytes.resize(id + 1);
    ASSERT_TRUE(byte_level_decode(it.key(), bytes));
    token_bytes[id] = bytes;
  }
  std::vector<std::pair<std::string, std::string>> merges;
  std::string a, b;
  for (const auto& m : json["model"]["merges"]) {
    ASSERT_TRUE(byte_level_decode(m[0].get<std::string>(), a));
    ASSERT_TRUE(byte_level_decode(m[1].get<std::string>(), b));
    merges.emplace_back(a, b);
  }
  auto bpe = Bpe::create(std::move(token_bytes), merges);
  ASSERT_TRUE(bpe.is_ok()) << bpe.status().message();
  std::mt19937 rng(7);
  static constexpr std::string_view kAlphabet = "  eeettaoinsrhl_()=:.\n";
  for (int i = 0; i < 3000; ++i) {
    std::string word;
    const int n = std::uniform_int_distribution<int>(2, 60)(rng);
    for (int k = 0; k < n; ++k)
      word.push_back(
          kAlphabet[std::uniform_int_distribution<std::size_t>(0, kAlphabet.size() - 1)(rng)]);
    std::vector<TokenId> fast, heap;
    (*bpe)->encode(word, fast);
    (*bpe)->encode_with_heap(word, heap);
    ASSERT_EQ(fast, heap) << word;
    std::string joined;
    for (TokenId id : fast) joined += (*bpe)->token_bytes(id);
    ASSERT_EQ(joined, word);
  }
}

}  // namespace
}  // namespace deltaserve::testing
