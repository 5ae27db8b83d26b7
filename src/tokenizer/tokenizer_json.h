// Reads tokenizer.json in one SAX pass. The large model.vocab (~150k entries) and model.merges
// arrays are streamed straight into flat vectors; everything else becomes a small nlohmann DOM.
// Building the full DOM of Qwen's 11 MB file takes over a second; this keeps loading fast.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace deltaserve {

struct TokenizerJson {
  nlohmann::json rest;  // the document without model.vocab and model.merges
  std::vector<std::pair<std::string, long long>> vocab;     // (token, id) in file order
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order, as spelled in the file
  bool has_vocab = false, has_merges = false;
};

Result<TokenizerJson> read_tokenizer_json(std::string_view text);

}  // namespace deltaserve
