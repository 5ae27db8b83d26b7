#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/unicode.h"
#include "util/mmap_file.h"

namespace deltaserve {

using nlohmann::json;

struct Tokenizer::Impl {
  std::unique_ptr<Bpe> bpe;
  Normalizer normalizer;
  PreTokenizer pretokenizer;
  AddedVocabulary added_vocab;
  std::vector<AddedToken> added_tokens;
  std::vector<std::string> added_bytes;   // decoded bytes of added_tokens[i]
  std::vector<std::int32_t> added_index;  // id -> index into added_tokens, -1 if not added
  std::unordered_map<std::string, TokenId> added_by_content;
  bool ignore_merges = false;
  int vocab_size = 0;
  std::string eos_token, bos_token;
};

namespace {

// The string of a special-token entry in tokenizer_config.json: "x", {"content": "x"} or null.
std::string config_token_string(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return "";
}

bool json_bool(const json& obj, const char* key, bool fallback) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

bool empty_or_null(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty());
}

// obj[key], or null when absent, by reference: copying a deeply nested value is recursive.
const json& member_or_null(const json& obj, const char* key) {
  static const json null_value;
  auto it = obj.find(key);
  return it == obj.end() ? null_value : *it;
}

// Sequence steps nest; the parsers below recurse on them. Real tokenizers nest one or two deep:
// a limit keeps a crafted file (30,000 levels overflowed the stack) an error, not a crash.
constexpr int kMaxNesting = 64;

Status too_deep(const char* what) {
  return error(what, " Sequence is nested too deeply (more than ", kMaxNesting, " levels)");
}

Status parse_normalizer(const json& j, Normalizer& out, int depth = 0) {
  if (j.is_null()) return Status::ok();
  if (depth > kMaxNesting) return too_deep("normalizer");
  const std::string type = j.value("type", "");
  if (type == "NFC") {
    out = Normalizer(NormalizerKind::kNfc);
    return Status::ok();
  }
  if (type == "Sequence") {
    for (const json& n : j.at("normalizers")) DS_RETURN_IF_ERROR(parse_normalizer(n, out, depth + 1));
    return Status::ok();
  }
  return error("normalizer type '", type, "' is not supported (only NFC)");
}

// Collects the regex split patterns of the pre-tokenizer, in application order.
Status parse_pretokenizer(const json& j, std::vector<std::string>& patterns, bool& byte_level,
                          int depth = 0) {
  if (j.is_null()) return Status::ok();
  if (depth > kMaxNesting) return too_deep("pre-tokenizer");
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& p : j.at("pretokenizers"))
      DS_RETURN_IF_ERROR(parse_pretokenizer(p, patterns, byte_level, depth + 1));
    return Status::ok();
  }
  if (type == "ByteLevel") {
    if (json_bool(j, "add_prefix_space", false))
      return error("ByteLevel pre-tokenizer with add_prefix_space is not supported");
    if (json_bool(j, "use_regex", true)) patterns.emplace_back(kGpt2SplitPattern);
    byte_level = true;
    return Status::ok();
  }
  if (type == "Split") {
    if (j.value("behavior", "") != "Isolated")
      return error("Split pre-tokenizer behavior '", j.value("behavior", ""),
                   "' is not supported (only Isolated)");
    if (json_bool(j, "invert", false))
      return error("Split pre-tokenizer with invert is not supported");
    const json& pattern = j.at("pattern");
    if (pattern.contains("Regex")) {
      patterns.push_back(pattern["Regex"].get<std::string>());
    } else if (pattern.contains("String")) {
      patterns.push_back("\\Q" + pattern["String"].get<std::string>() + "\\E");
    } else {
      return error("Split pre-tokenizer has neither a Regex nor a String pattern");
    }
    return Status::ok();
  }
  return error("pre-tokenizer type '", type, "' is not supported");
}

Status parse_decoder(const json& j, int depth = 0) {
  if (depth > kMaxNesting) return too_deep("decoder");
  const std::string type = j.is_null() ? "" : j.value("type", "");
  if (type == "ByteLevel") return Status::ok();
  if (type == "Sequence" && j.at("decoders").size() == 1)
    return parse_decoder(j["decoders"][0], depth + 1);
  return error("decoder '", type, "' is not supported (only ByteLevel)");
}

// The post-processor adds tokens when encoding with special tokens (HF's add_special_tokens=True,
// what a completion prompt gets). None is implemented, so only post-processors that add nothing
// are accepted: ByteLevel (it only trims offsets) and a TemplateProcessing whose single-sequence
// template is the sequence alone. Any other would be silently not applied.
Status parse_post_processor(const json& j, int depth = 0) {
  if (j.is_null()) return Status::ok();
  if (depth > kMaxNesting) return too_deep("post-processor");
  const std::string type = j.value("type", "");
  if (type == "ByteLevel") return Status::ok();
  if (type == "Sequence") {
    for (const json& p : j.at("processors")) DS_RETURN_IF_ERROR(parse_post_processor(p, depth + 1));
    return Status::ok();
  }
  if (type == "TemplateProcessing") {
    // Pair templates are never used: only single sequences are encoded.
    const json& single = member_or_null(j, "single");
    if (single.is_array()) {
      std::string added;
      for (const json& piece : single) {
        if (piece.is_object() && piece.contains("Sequence")) continue;
        if (piece.is_object() && piece.contains("SpecialToken") && piece["SpecialToken"].is_object())
          added += str_cat(added.empty() ? "" : ", ", piece["SpecialToken"].value("id", "?"));
        else
          added += added.empty() ? "?" : ", ?";
      }
      if (added.empty()) return Status::ok();
      return error("post-processor TemplateProcessing adds special tokens (", added,
                   ") to every sequence; this is not supported");
    }
    return error("post-processor TemplateProcessing has no single-sequence template");
  }
  return error("post-processor '", type, "' is not supported (only ByteLevel, or a TemplateProcessing "
               "that adds no tokens)");
}

Status parse_model(TokenizerJson& tj, Tokenizer::Impl& impl) {
  const json& m = tj.rest.at("model");
  if (m.value("type", "BPE") != "BPE")
    return error("model type '", m.value("type", ""), "' is not BPE");
  if (json_bool(m, "byte_fallback", false)) return error("BPE byte_fallback is not supported");
  if (m.contains("dropout") && !m["dropout"].is_null())
    return error("BPE dropout is not supported");
  if (!empty_or_null(m, "continuing_subword_prefix") || !empty_or_null(m, "end_of_word_suffix"))
    return error("BPE continuing_subword_prefix/end_of_word_suffix are not supported");
  if (!tj.has_vocab || !tj.has_merges) return error("model has no vocab or no merges");
  impl.ignore_merges = json_bool(m, "ignore_merges", false);

  std::vector<std::string> token_bytes;
  std::string bytes;
  for (auto& [token, id] : tj.vocab) {
    // Ids run 0..n-1 (a gap or two at most): one far past the entries would size tables to it.
    if (id < 0 || id >= int64_t(tj.vocab.size()) + (int64_t(1) << 16))
      return error("vocab id ", id, " is out of range (", tj.vocab.size(), " entries)");
    const auto idx = static_cast<std::size_t>(id);
    if (idx >= token_bytes.size()) token_bytes.resize(idx + 1);
    // Entries outside the byte-level alphabet are kept verbatim, as HF's decoder does.
    if (!byte_level_decode(token, token_bytes[idx])) token_bytes[idx] = std::move(token);
  }
  tj.vocab.clear();

  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(tj.merges.size());
  std::string left, right;
  for (auto& [a, b] : tj.merges) {
    if (b.empty()) {  // the older "a b" spelling
      const std::string s = std::move(a);
      const auto space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        return error("merge '", s, "' is not two tokens separated by one space");
      a = s.substr(0, space), b = s.substr(space + 1);
    }
    if (!byte_level_decode(a, left)) left = a;
    if (!byte_level_decode(b, right)) right = b;
    merges.emplace_back(left, right);
  }
  tj.merges.clear();
  DS_ASSIGN_OR_RETURN(impl.bpe, Bpe::create(std::move(token_bytes), merges));
  return Status::ok();
}

AddedToken parse_added_token(const json& t, TokenId id) {
  AddedToken tok;
  tok.id = id;
  tok.content = t.at("content").get<std::string>();
  tok.special = json_bool(t, "special", false);
  tok.lstrip = json_bool(t, "lstrip", false);
  tok.rstrip = json_bool(t, "rstrip", false);
  tok.single_word = json_bool(t, "single_word", false);
  // HF's default: special tokens are matched in the raw text, others in the normalized text.
  tok.normalized = json_bool(t, "normalized", !tok.special);
  return tok;
}

Status build(TokenizerJson& tj, const json& config, Tokenizer::Impl& impl) {
  const json& tok_json = tj.rest;
  if (!tok_json.is_object() || !tok_json.contains("model")) return error("no \"model\" object");
  DS_RETURN_IF_ERROR(parse_model(tj, impl));
  DS_RETURN_IF_ERROR(parse_normalizer(member_or_null(tok_json, "normalizer"), impl.normalizer));
  std::vector<std::string> patterns;
  bool byte_level = false;
  DS_RETURN_IF_ERROR(
      parse_pretokenizer(member_or_null(tok_json, "pre_tokenizer"), patterns, byte_level));
  if (!byte_level)
    return error("pre-tokenizer has no ByteLevel step; only byte-level BPE is supported");
  DS_ASSIGN_OR_RETURN(impl.pretokenizer, PreTokenizer::create(patterns));
  DS_RETURN_IF_ERROR(parse_decoder(member_or_null(tok_json, "decoder")));
  DS_RETURN_IF_ERROR(parse_post_processor(member_or_null(tok_json, "post_processor")));

  // Added tokens; tokenizer_config.json's added_tokens_decoder overrides their flags (transformers
  // re-adds those entries, replacing the ones from tokenizer.json).
  std::vector<AddedToken> added;
  if (tok_json.contains("added_tokens")) {
    for (const json& t : tok_json["added_tokens"]) {
      // get<TokenId> would truncate 5.5 and wrap 2^32 + 5 to 5, shadowing another token.
      const json& id = member_or_null(t, "id");
      const bool in_range = (id.is_number_unsigned() && id.get<uint64_t>() <= INT32_MAX) ||
                            (id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= INT32_MAX);
      if (!in_range)
        return error("added token '", t.is_object() ? t.value("content", "?") : "?",
                     "' has id ", id.is_structured() ? id.type_name() : id.dump(), ", not an integer in [0, ",
                     INT32_MAX, "]");
      added.push_back(parse_added_token(t, id.get<TokenId>()));
    }
  }
  if (config.is_object() && config.contains("added_tokens_decoder")) {
    for (auto it = config["added_tokens_decoder"].begin();
         it != config["added_tokens_decoder"].end(); ++it) {
      const std::string& key = it.key();
      if (key.empty() || key.size() > 10 || key.find_first_not_of("0123456789") != std::string::npos ||
          std::stoll(key) > INT32_MAX)
        return error("tokenizer_config.json: added_tokens_decoder key '", key, "' is not a token id");
      const AddedToken tok = parse_added_token(it.value(), static_cast<TokenId>(std::stoll(key)));
      auto same = std::find_if(added.begin(), added.end(),
                               [&](const AddedToken& a) { return a.id == tok.id; });
      if (same != added.end()) {
        *same = tok;
      } else {
        added.push_back(tok);
      }
    }
  }
  // Added tokens follow the base vocabulary, with room for gaps (reserved ids); an id far beyond
  // would size every per-token table to it (2^31 - 1: an overflow; 2.5e8: a gigabyte).
  const int64_t id_limit = int64_t(impl.bpe->size()) + int64_t(added.size()) + (int64_t(1) << 16);
  for (const AddedToken& t : added)
    if (t.id >= id_limit)
      return error("added token '", t.content, "' has id ", t.id, ", beyond the ", impl.bpe->size(),
                   " tokens of the vocabulary and its ", added.size(), " added ones");
  int vocab_size = impl.bpe->size();
  for (const AddedToken& t : added) vocab_size = std::max(vocab_size, t.id + 1);
  impl.vocab_size = vocab_size;
  impl.added_index.assign(static_cast<std::size_t>(vocab_size), -1);
  std::string scratch, bytes;
  for (const AddedToken& t : added) {
    if (t.id < 0) return error("added token '", t.content, "' has a negative id");
    impl.added_index[static_cast<std::size_t>(t.id)] =
        static_cast<std::int32_t>(impl.added_tokens.size());
    impl.added_tokens.push_back(t);
    // HF's ByteLevel decoder maps every character back to its byte, or keeps the token's UTF-8
    // when some character is outside the byte-level alphabet.
    if (!byte_level_decode(t.content, bytes)) bytes = t.content;
    impl.added_bytes.push_back(bytes);
    impl.added_by_content.emplace(t.content, t.id);
    std::string match = t.content;
    if (t.normalized) match = std::string(impl.normalizer.apply(t.content, scratch));
    impl.added_vocab.add(t, std::move(match));
  }

  if (config.is_object()) {
    impl.eos_token = config_token_string(config, "eos_token");
    impl.bos_token = config_token_string(config, "bos_token");
  }
  return Status::ok();
}

Result<json> parse_json(std::string_view text, const std::string& what) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return error(what, ": invalid JSON: ", e.what());
  }
}

}  // namespace

Result<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json,
                                       std::string_view tokenizer_config_json) {
  auto tok = read_tokenizer_json(tokenizer_json);
  if (!tok) return error("tokenizer.json: ", tok.status().message());
  json config;
  if (!tokenizer_config_json.empty()) {
    DS_ASSIGN_OR_RETURN(config, parse_json(tokenizer_config_json, "tokenizer_config.json"));
  }
  auto impl = std::make_shared<Impl>();
  try {
    const Status st = build(*tok, config, *impl);
    if (!st) return error("tokenizer.json: ", st.message());
  } catch (const json::exception& e) {
    return error("unexpected tokenizer.json/tokenizer_config.json structure: ", e.what());
  } catch (const std::exception& e) {
    return error("bad tokenizer files: ", e.what());
  }
  return Tokenizer(std::move(impl));
}

Result<Tokenizer> Tokenizer::load(const std::filesystem::path& model_dir) {
  const std::filesystem::path tok_path = model_dir / "tokenizer.json";
  const std::filesystem::path config_path = model_dir / "tokenizer_config.json";
  auto tok_file = MmapFile::open(tok_path);
  if (!tok_file) return tok_file.status();  // the message names the file
  std::string config_text;
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    auto text = read_text_file(config_path);
    if (!text) return text.status();
    config_text = std::move(*text);
  }
  auto tok = from_json(tok_file->view(), config_text);
  if (!tok) return error(model_dir.string(), ": ", tok.status().message());
  return tok;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const Impl& impl = *impl_;
  std::string sanitized;
  if (!is_valid_utf8(text)) {
    append_utf8_lossy(sanitized, text);
    text = sanitized;
  }
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<AddedVocabulary::Segment> segments, inner;
  std::string normalized_scratch;
  impl.added_vocab.split(text, /*normalized_pass=*/false, parse_special, segments);
  for (const auto& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    const std::string_view normalized =
        impl.normalizer.apply(text.substr(seg.begin, seg.end - seg.begin), normalized_scratch);
    inner.clear();
    if (impl.added_vocab.has_normalized_tokens()) {
      impl.added_vocab.split(normalized, /*normalized_pass=*/true, parse_special, inner);
    } else {
      inner.push_back({0, normalized.size(), -1});
    }
    for (const auto& sub : inner) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
        continue;
      }
      impl.pretokenizer.split(normalized.substr(sub.begin, sub.end - sub.begin),
                              [&](std::string_view piece) {
                                if (impl.ignore_merges) {
                                  if (auto id = impl.bpe->find(piece)) {
                                    ids.push_back(*id);
                                    return;
                                  }
                                }
                                impl.bpe->encode(piece, ids);
                              });
    }
  }
  return ids;
}

void Tokenizer::append_token_bytes(TokenId id, bool skip_special, std::string& out) const {
  const Impl& impl = *impl_;
  if (id < 0 || id >= impl.vocab_size) return;
  const std::int32_t added = impl.added_index[static_cast<std::size_t>(id)];
  if (added >= 0) {
    if (skip_special && impl.added_tokens[static_cast<std::size_t>(added)].special) return;
    out.append(impl.added_bytes[static_cast<std::size_t>(added)]);
    return;
  }
  out.append(impl.bpe->token_bytes(id));
}

std::string Tokenizer::token_string(TokenId id) const {
  const Impl& impl = *impl_;
  std::string out;
  if (id < 0 || id >= impl.vocab_size) return out;
  const std::int32_t added = impl.added_index[static_cast<std::size_t>(id)];
  if (added >= 0) return impl.added_tokens[static_cast<std::size_t>(added)].content;
  for (unsigned char b : impl.bpe->token_bytes(id)) append_utf8(out, byte_to_unicode()[b]);
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (TokenId id : ids) append_token_bytes(id, skip_special, bytes);
  if (is_valid_utf8(bytes)) return bytes;
  std::string out;
  append_utf8_lossy(out, bytes);
  return out;
}

std::string Tokenizer::token_text(TokenId id) const {
  std::string out;
  append_token_bytes(id, /*skip_special=*/false, out);
  return out;
}

int Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<TokenId> Tokenizer::token_id(std::string_view token) const {
  const Impl& impl = *impl_;
  if (auto it = impl.added_by_content.find(std::string(token)); it != impl.added_by_content.end())
    return it->second;
  std::string bytes;
  if (!byte_level_decode(token, bytes)) bytes = std::string(token);
  auto id = impl.bpe->find(bytes);
  // A vocab id shadowed by an added token is not reachable by its vocab string.
  if (id && impl.added_index[static_cast<std::size_t>(*id)] >= 0) return std::nullopt;
  return id;
}

bool Tokenizer::is_special(TokenId id) const {
  const Impl& impl = *impl_;
  if (id < 0 || id >= impl.vocab_size) return false;
  const std::int32_t added = impl.added_index[static_cast<std::size_t>(id)];
  return added >= 0 && impl.added_tokens[static_cast<std::size_t>(added)].special;
}

std::optional<TokenId> Tokenizer::eos_token_id() const {
  if (impl_->eos_token.empty()) return std::nullopt;
  return token_id(impl_->eos_token);
}

std::optional<TokenId> Tokenizer::bos_token_id() const {
  if (impl_->bos_token.empty()) return std::nullopt;
  return token_id(impl_->bos_token);
}

std::string Tokenizer::eos_token() const { return impl_->eos_token; }
std::string Tokenizer::bos_token() const { return impl_->bos_token; }

}  // namespace deltaserve
