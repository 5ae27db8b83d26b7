#include "server/grammar_service.h"

#include <chrono>

#include "grammar/ebnf.h"
#include "grammar/regex.h"
#include "grammar/structural_tag.h"
#include "server/tool_call_grammar.h"

namespace deltaserve {

std::string ConstraintSpec::cache_key() const {
  std::string key = std::to_string(static_cast<int>(kind)) + "\n";
  if (kind == Kind::Regex || kind == Kind::Ebnf) return key + text;
  return key + json.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

bool is_parser_tag(std::string_view t) {
  return t == "<think>" || t == "</think>" || t == "<tool_call>" || t == "</tool_call>" || t == "<tool_response>" ||
         t == "</tool_response>";
}

GrammarService::GrammarService(const Tokenizer& tokenizer, const std::vector<TokenId>& eos_ids, JsonSchemaOptions options)
    : options_(options) {
  const int n = tokenizer.vocab_size();
  std::vector<std::string> bytes(static_cast<size_t>(n));
  std::vector<uint8_t> special(static_cast<size_t>(n), 0);
  for (int id = 0; id < n; ++id) {
    bytes[static_cast<size_t>(id)] = tokenizer.token_text(id);
    special[static_cast<size_t>(id)] = tokenizer.is_special(id) && !is_parser_tag(bytes[static_cast<size_t>(id)]) ? 1 : 0;
  }
  vocab_ = TokenVocabulary::create(std::move(bytes), std::move(special), eos_ids);
}

Result<Grammar> GrammarService::build(const ConstraintSpec& spec) const {
  switch (spec.kind) {
    case ConstraintSpec::Kind::JsonSchema: return grammar_from_json_schema(spec.json, options_);
    case ConstraintSpec::Kind::JsonObject: return json_object_grammar(options_);
    case ConstraintSpec::Kind::Regex: return grammar_from_regex(spec.text);
    case ConstraintSpec::Kind::Ebnf: return grammar_from_ebnf(spec.text);
    case ConstraintSpec::Kind::StructuralTag: return grammar_from_structural_tag(spec.json, options_);
    case ConstraintSpec::Kind::Choice: {
      Grammar g;
      std::vector<Expr> alts;
      for (const auto& s : spec.json) alts.push_back(Expr::literal(s.get<std::string>()));
      g.root = g.add_rule("root", Expr::alt(std::move(alts)));
      return g;
    }
    case ConstraintSpec::Kind::ToolCall: {
      auto kind = tool_parser_kind_from_name(spec.json.value("format", ""));
      if (!kind) return kind.status();
      return tool_call_grammar(*kind, spec.json["tools"], spec.json.value("parallel", true), options_,
                               spec.json.value("after_text", false) ? ToolCallMode::AfterText : ToolCallMode::Forced,
                               spec.json.value("answer_schema", nlohmann::ordered_json()));
    }
    case ConstraintSpec::Kind::None: break;
  }
  return error("no constraint");
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarService::compile(const ConstraintSpec& spec) {
  const std::string key = spec.cache_key();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    // A grammar whose frame arena has grown past kRetireFrames (a recursive one, long in use) is
    // compiled afresh for new requests; those still using it keep it until they end.
    if (it != index_.end() && it->second->second->n_frames() > kRetireFrames) {
      lru_.erase(it->second);
      index_.erase(it);
      it = index_.end();
    }
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++stats_.hits;
      return it->second->second;
    }
    ++stats_.misses;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto g = build(spec);
  if (!g) return g.status();
  auto compiled = CompiledGrammar::compile(*g, vocab_);
  if (!compiled) return compiled.status();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.compile_seconds += dt;
  if (index_.count(key)) return index_[key]->second;  // compiled twice at once: keep the first
  lru_.emplace_front(key, *compiled);
  index_[key] = lru_.begin();
  while (lru_.size() > kCapacity) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return *compiled;
}

GrammarService::Stats GrammarService::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace deltaserve
