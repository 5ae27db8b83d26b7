// Byte-level BPE tokenizer loaded from a Hugging Face model directory (tokenizer.json +
// tokenizer_config.json), byte-exact with HF `tokenizers` for the Qwen3 / Qwen3.5 family:
//   added tokens -> NFC (if asked) -> regex pre-tokenizer -> byte-level BPE,
// and the ByteLevel decoder with errors="replace" for decoding.
//
// A Tokenizer is an immutable value sharing its tables: copies are cheap and every const method
// may be called from any number of threads at once.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/token_id.h"
#include "util/status.h"

namespace deltaserve {

class Tokenizer {
 public:
  // Reads `model_dir`/tokenizer.json (required) and `model_dir`/tokenizer_config.json (optional:
  // eos/bos tokens and added-token flag overrides). Errors name the file and what is wrong with it.
  static Result<Tokenizer> load(const std::filesystem::path& model_dir);
  // Same from JSON text; `tokenizer_config_json` may be empty.
  static Result<Tokenizer> from_json(std::string_view tokenizer_json,
                                     std::string_view tokenizer_config_json);

  // HF `tokenizer.encode(text, add_special_tokens=False)`; parse_special=false is HF
  // `split_special_tokens=True`: special added tokens are tokenized as plain text (non-special
  // added tokens such as <think> are still matched, as in HF). Invalid UTF-8 in `text` is first
  // replaced by U+FFFD (Python's errors="replace"), so any bytes are accepted.
  std::vector<TokenId> encode(std::string_view text, bool parse_special = true) const;

  // HF `tokenizer.decode(ids, skip_special_tokens=skip_special)`: token bytes concatenated, then
  // ill-formed UTF-8 replaced by U+FFFD. Ids outside the vocabulary are skipped.
  std::string decode(std::span<const TokenId> ids, bool skip_special = false) const;

  // Raw bytes of one token (may be a fragment of a UTF-8 character); empty for an unknown id.
  std::string token_text(TokenId id) const;
  // HF `convert_ids_to_tokens`: an added token's content, or the vocab entry in the byte-level
  // alphabet ("Ġworld" for " world"; a piece of a character is its own string); "" if unknown.
  std::string token_string(TokenId id) const;
  // Appends the raw bytes of `id` to `out`, unless it is unknown or (skip_special) special.
  void append_token_bytes(TokenId id, bool skip_special, std::string& out) const;

  // Number of ids including added tokens (max id + 1).
  int vocab_size() const;
  // HF `convert_tokens_to_ids`: an added token's content, or a vocab entry as written in
  // tokenizer.json (byte-level alphabet, e.g. "Ġthe" for " the"). A string with characters outside
  // that alphabet is looked up by its raw bytes instead (" the" also finds "Ġthe").
  std::optional<TokenId> token_id(std::string_view token) const;
  bool is_special(TokenId id) const;

  std::optional<TokenId> eos_token_id() const;
  std::optional<TokenId> bos_token_id() const;
  // Token strings for chat templates; "" if the tokenizer has none.
  std::string eos_token() const;
  std::string bos_token() const;

 public:
  struct Impl;  // opaque; declared public only so the loader's helpers in tokenizer.cpp can fill it

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace deltaserve
