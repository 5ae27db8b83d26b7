// GrammarService: the server's side of structured output. It holds the model's vocabulary as a
// TokenVocabulary (built once from the tokenizer) and compiles ConstraintSpecs (a request's
// response_format / regex / ebnf / json_schema / structural_tag / forced tool call) into
// CompiledGrammars, caching the most recent ones by source text so that repeated schemas cost
// nothing and share their token-mask caches. Thread-safe.
#pragma once

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/compiled_grammar.h"
#include "grammar/json_schema.h"
#include "server/constraint_spec.h"
#include "server/tool_call_parser.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve {

// Added tokens the reasoning and tool-call parsers read as text: grammar text, even where a
// tokenizer marks them special (tiny-coder does).
bool is_parser_tag(std::string_view token_text);

class GrammarService {
 public:
  // eos_ids: the tokens that end generation (allowed exactly when a grammar is complete).
  GrammarService(const Tokenizer& tokenizer, const std::vector<TokenId>& eos_ids, JsonSchemaOptions options = {});

  Result<std::shared_ptr<const CompiledGrammar>> compile(const ConstraintSpec& spec);
  const std::shared_ptr<const TokenVocabulary>& vocab() const { return vocab_; }

  struct Stats {
    uint64_t hits = 0, misses = 0;
    double compile_seconds = 0;
  };
  Stats stats() const;

  // A cached grammar with more interned stack frames than this (~50 MB of them) is not handed out
  // again: compile() makes a fresh one (CompiledGrammar::intern never frees a frame).
  static constexpr int32_t kRetireFrames = int32_t{1} << 20;

 private:
  Result<Grammar> build(const ConstraintSpec& spec) const;

  std::shared_ptr<const TokenVocabulary> vocab_;
  JsonSchemaOptions options_;
  static constexpr size_t kCapacity = 64;
  mutable std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> lru_;
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
  Stats stats_;
};

}  // namespace deltaserve
