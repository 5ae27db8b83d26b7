// Grammar: the byte-level context-free grammar every front-end (JSON Schema, regex, EBNF,
// structural tags, tool-call formats) builds, and CompiledGrammar (compiled_grammar.h) turns into
// automata over the model's vocabulary.
//
// A Grammar is a list of named rules; each rule's body is an Expr tree over *bytes* (text is
// UTF-8; a Unicode character class becomes alternatives of byte sequences, see codepoints()).
// Rules reference each other by index, so recursion (JSON values, EBNF) is natural.
//
//   Grammar g;
//   int value = g.add_rule("value");               // declare first: bodies may refer to it
//   g.set_body(value, Expr::alt({Expr::literal("null"), Expr::seq({Expr::literal("["),
//                                Expr::ref(value), Expr::literal("]")})}));
//   g.root = value;
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deltaserve {

// A set of Unicode code points as sorted, disjoint, inclusive ranges.
using CodepointRanges = std::vector<std::pair<uint32_t, uint32_t>>;

struct Expr {
  enum class Kind : uint8_t {
    Empty,    // matches "" only
    Bytes,    // one byte out of `bytes`
    Seq,      // items in order
    Alt,      // one of items; an Alt with no items matches nothing
    Repeat,   // items[0] repeated min..max times (max < 0: unbounded)
    Ref,      // the rule `rule`
    Exclude,  // any byte string that contains none of `excluded` (each non-empty)
  };
  Kind kind = Kind::Empty;
  std::bitset<256> bytes;
  std::vector<Expr> items;
  int min = 0, max = -1;
  int rule = -1;
  std::vector<std::string> excluded;

  static Expr empty() { return Expr{}; }
  static Expr nothing() { return alt({}); }
  static Expr byte_set(const std::bitset<256>& set);
  static Expr byte_range(unsigned lo, unsigned hi);
  static Expr literal(std::string_view text);  // the exact bytes
  static Expr seq(std::vector<Expr> items);
  static Expr alt(std::vector<Expr> items);
  static Expr repeat(Expr item, int min, int max);
  static Expr star(Expr item) { return repeat(std::move(item), 0, -1); }
  static Expr plus(Expr item) { return repeat(std::move(item), 1, -1); }
  static Expr opt(Expr item) { return repeat(std::move(item), 0, 1); }
  static Expr ref(int rule);
  // UTF-8 encodings of the code points in `ranges` (surrogates excluded); negate: every other
  // scalar value. Each alternative is one to four byte positions.
  static Expr codepoints(const CodepointRanges& ranges, bool negate = false);
  static Expr any_char() { return codepoints({{0, 0x10FFFF}}); }
  static Expr exclude(std::vector<std::string> substrings);

  bool is_nothing() const { return kind == Kind::Alt && items.empty(); }
};

struct GrammarRule {
  std::string name;
  Expr body;
  // Compile as its own automaton even if not recursive: the token masks inside it are then shared
  // by every place that uses it (e.g. the body of a JSON string). Otherwise non-recursive rules
  // are inlined where they are used.
  bool shared = false;
};

class Grammar {
 public:
  // Declares a rule (body: Empty until set_body). Names need not be unique; find() returns the first.
  int add_rule(std::string name, bool shared = false);
  int add_rule(std::string name, Expr body, bool shared = false);
  void set_body(int rule, Expr body) { rules_[static_cast<size_t>(rule)].body = std::move(body); }
  int find(std::string_view name) const;  // -1 if none
  const GrammarRule& rule(int i) const { return rules_[static_cast<size_t>(i)]; }
  GrammarRule& rule(int i) { return rules_[static_cast<size_t>(i)]; }
  int n_rules() const { return static_cast<int>(rules_.size()); }
  // Copies `other`'s rules into this grammar; returns the index of other's root here.
  int import(const Grammar& other);

  int root = 0;

  // EBNF-like text (for error messages and tests).
  std::string to_string() const;

 private:
  std::vector<GrammarRule> rules_;
};

std::string expr_to_string(const Expr& e, const Grammar* g = nullptr);

// Appends the UTF-8 encoding of `cp` (assumed a valid scalar value).
void append_utf8(uint32_t cp, std::string& out);
// UTF-16 surrogates, as \uD83D\uDE00 escapes write a character past U+FFFF (EBNF, regex).
inline bool is_surrogate(uint32_t u) { return u >= 0xD800 && u <= 0xDFFF; }
inline bool is_high_surrogate(uint32_t u) { return u >= 0xD800 && u <= 0xDBFF; }
inline bool is_low_surrogate(uint32_t u) { return u >= 0xDC00 && u <= 0xDFFF; }
inline uint32_t from_surrogates(uint32_t high, uint32_t low) { return 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00); }
// Normalizes ranges: sorted, merged, clipped to [0, 0x10FFFF].
CodepointRanges normalize_ranges(CodepointRanges ranges);

}  // namespace deltaserve
