// User constraints (response_format json_schema / structural_tag, SGLang's regex and ebnf) ->
// Grammar -> CompiledGrammar (the server's limits) -> GrammarMatcher, as a request's decode does it.
//
// Input: byte 0 picks the front-end (its low 7 bits mod 6: JSON Schema, regex, EBNF, structural tag,
// qwen3_coder or hermes tool calls for an OpenAI tools array; bit 7: parallel calls); byte 1 is how
// many of the input's last bytes drive the matcher (the "walk"); the bytes between are the
// constraint text.
// Properties:
// - a constraint compiles or is refused with a message (never a crash, a hang or an unbounded
//   automaton: the compiler's limits hold);
// - at every step the token mask is exactly the set of tokens accept_token takes (each tried and
//   rolled back), EOS included iff can_end(), and never empty (no dead ends);
// - rollback restores the state: the mask after undoing a token equals the mask before it;
// - a walk that ends (EOS) produced what the front-end promises: JSON Schema text is JSON;
//   tool-call text parses, with the server's parser, into calls of the named tools whose
//   arguments are JSON objects, with nothing but blank space around them; regex text matches the
//   pattern under std::regex (ECMAScript), where both are short ASCII without \r (Python's `.`,
//   which we follow, takes \r; ECMAScript's does not).
#include <cstdint>
#include <memory>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "grammar/compiled_grammar.h"
#include "grammar/ebnf.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "grammar/structural_tag.h"
#include "grammar/token_vocabulary.h"
#include "server/tool_call_grammar.h"
#include "server/tool_call_parser.h"
#include "util/json_parse.h"

namespace {

using namespace deltaserve;

// Every single byte (a byte-level BPE vocabulary has them), some longer pieces that cross JSON
// token and UTF-8 boundaries, a special token and an EOS.
std::shared_ptr<const TokenVocabulary> make_vocab() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  for (const char* piece : {"{\"", "\":", "\": ", "\",", "\"}", "true", "false", "null", "  ", "\n  ", "12",
                            "-0.", "e+", "ab", "abc", "name", "\\u00", "\\\"", "é", "中", "\xe4\xb8", "\xad\x96",
                            "<function=", "</function>", "<tool_call>", "\n", "]}", "[{", "0x", "::="})
    tokens.emplace_back(piece);
  std::vector<uint8_t> special(tokens.size(), 0);
  tokens.emplace_back("<|im_end|>");
  special.push_back(1);
  tokens.emplace_back("<|special|>");
  special.push_back(1);
  const int32_t eos = static_cast<int32_t>(tokens.size()) - 2;
  return TokenVocabulary::create(std::move(tokens), std::move(special), {eos});
}

enum FrontEnd { kSchema, kRegex, kEbnf, kStructuralTag, kQwen3CoderTools, kHermesTools, kFrontEnds };

Result<Grammar> build(int front_end, bool parallel, std::string_view text, nlohmann::ordered_json& spec) {
  switch (front_end) {
    case kSchema: return grammar_from_json_schema_text(text);
    case kRegex: return grammar_from_regex(text);
    case kEbnf: return grammar_from_ebnf(text);
    default: break;
  }
  if (!parse_ordered_json(text, spec)) return error("not JSON");
  if (front_end == kStructuralTag) return grammar_from_structural_tag(spec);
  // The server checks the tools array's shape before it builds a grammar (openai_request.cpp).
  if (!spec.is_array() || spec.empty()) return error("tools: not a non-empty array");
  for (const auto& t : spec)
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
        !t["function"].contains("name") || !t["function"]["name"].is_string() ||
        t["function"]["name"].get<std::string>().empty() ||
        (t["function"].contains("parameters") && !t["function"]["parameters"].is_null() &&
         !t["function"]["parameters"].is_object()))
      return error("tools: a tool without function.name, or parameters that are not an object");
  return tool_call_grammar(front_end == kQwen3CoderTools ? ToolParserKind::Qwen3Coder : ToolParserKind::Hermes,
                           spec, parallel);
}

// Printable and blank ASCII but \r (see the file's comment).
bool plain_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80 || c == '\r' || c == 0) return false;
  return true;
}

// What an ended walk's text must be.
void check_output(int front_end, std::string_view constraint, const nlohmann::ordered_json& spec,
                  const std::string& text) {
  if (front_end == kRegex && plain_ascii(constraint) && plain_ascii(text) && constraint.size() <= 64 &&
      text.size() <= 128) {
    std::regex re;
    try {
      re = std::regex(std::string(constraint), std::regex::ECMAScript);
    } catch (const std::regex_error&) {
      return;  // syntax std::regex lacks (Python's (?P<n>...), \u{...}); no reference
    }
    if (!std::regex_match(text, re))
      std::fprintf(stderr, "pattern %s produced %s\n", std::string(constraint).c_str(), text.c_str());
    FUZZ_CHECK(std::regex_match(text, re));
  } else if (front_end == kSchema) {
    nlohmann::ordered_json value;
    FUZZ_CHECK(parse_ordered_json(text, value));
  } else if (front_end == kQwen3CoderTools || front_end == kHermesTools) {
    auto parser = make_tool_call_parser(
        front_end == kQwen3CoderTools ? ToolParserKind::Qwen3Coder : ToolParserKind::Hermes, spec);
    ToolParseDelta out = parser->push(text);
    out.append(parser->finish());
    FUZZ_CHECK(out.content.find_first_not_of(" \t\r\n") == std::string::npos);
    const std::vector<ToolCall> calls = merge_tool_call_deltas(out.calls);
    FUZZ_CHECK(!calls.empty());
    for (const ToolCall& call : calls) {
      bool known = false;
      for (const auto& t : spec) known = known || t["function"]["name"].get<std::string>() == call.name;
      FUZZ_CHECK(known);
      nlohmann::ordered_json args;
      FUZZ_CHECK(parse_ordered_json(call.arguments, args) && args.is_object());
    }
  }
}

std::vector<uint64_t> mask_words(const TokenBitset& mask, int32_t n) {
  std::vector<uint64_t> bits((static_cast<size_t>(n) + 63) / 64, 0);
  for (int32_t i = 0; i < n; ++i)
    if (mask.test(i)) bits[static_cast<size_t>(i) >> 6] |= uint64_t{1} << (i & 63);
  return bits;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::shared_ptr<const TokenVocabulary> vocab = make_vocab();
  if (size < 2) return 0;
  const int front_end = (data[0] & 0x7F) % kFrontEnds;
  const bool parallel = (data[0] & 0x80) != 0;
  const size_t walk_len = std::min<size_t>(data[1], size - 2);
  std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2 - walk_len);
  std::string_view walk(reinterpret_cast<const char*>(data) + size - walk_len, walk_len);

  nlohmann::ordered_json spec;
  Result<Grammar> grammar = build(front_end, parallel, text, spec);
  if (!grammar.is_ok()) {
    FUZZ_CHECK(!grammar.status().message().empty());
    return 0;
  }
  auto compiled = CompiledGrammar::compile(*grammar, vocab);
  if (!compiled.is_ok()) {
    FUZZ_CHECK(!compiled.status().message().empty());
    return 0;
  }
  GrammarMatcher m(*compiled);
  const int32_t n = vocab->size();
  std::vector<int32_t> taken;  // the accepted tokens
  for (size_t step = 0; step < walk.size() && !m.is_terminated(); ++step) {
    const std::vector<uint64_t> before = mask_words(m.next_token_mask(), n);
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < n; ++id) {
      const bool in_mask = (before[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1u;
      const bool accepted = m.accept_token(id);
      if (accepted) m.rollback(1);
      FUZZ_CHECK(in_mask == accepted);
      if (vocab->is_eos(id)) FUZZ_CHECK(in_mask == m.can_end());
      if (accepted) allowed.push_back(id);
    }
    FUZZ_CHECK(mask_words(m.next_token_mask(), n) == before);
    // Every prefix the matcher took can be completed: something (text or EOS) is always allowed.
    FUZZ_CHECK(!allowed.empty());
    const uint8_t choice = static_cast<uint8_t>(walk[step]);
    // Ending when the grammar allows it, for one choice in four, so that walks reach their end.
    const int32_t eos = vocab->eos_ids()[0];
    const int32_t id = (choice & 0x30) == 0x30 && m.can_end() ? eos : allowed[choice % allowed.size()];
    FUZZ_CHECK(m.accept_token(id));
    if ((choice & 0xC0) == 0xC0) {  // sometimes undo it and check the state came back
      m.rollback(1);
      FUZZ_CHECK(mask_words(m.next_token_mask(), n) == before);
      FUZZ_CHECK(m.accept_token(id));
    }
    taken.push_back(id);
  }
  if (m.is_terminated()) {
    std::string text_out;
    for (int32_t id : taken)
      if (!vocab->is_eos(id)) text_out += vocab->bytes(id);
    check_output(front_end, text, spec, text_out);
  }
  return 0;
}
