// Shared fixtures for the tokenizer tests: each tokenizer is loaded once per process.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/tokenizer.h"
#include "util/mmap_file.h"

namespace deltaserve::testing {

inline std::filesystem::path source_dir() { return DELTASERVE_SOURCE_DIR; }
inline std::filesystem::path qwen3_dir() { return source_dir() / "tests/fixtures/tokenizer-qwen3"; }
inline std::filesystem::path tiny_coder_dir() { return source_dir() / "models/tiny-coder"; }

inline const Tokenizer& load_or_die(const std::filesystem::path& dir) {
  auto tok = Tokenizer::load(dir);
  if (!tok) {
    ADD_FAILURE() << tok.status().message();
    std::abort();
  }
  return *new Tokenizer(std::move(*tok));  // lives for the whole test process
}

inline const Tokenizer& qwen3() {
  static const Tokenizer& tok = load_or_die(qwen3_dir());
  return tok;
}

inline const Tokenizer& tiny_coder() {
  static const Tokenizer& tok = load_or_die(tiny_coder_dir());
  return tok;
}

inline nlohmann::json read_json(const std::filesystem::path& path) {
  auto text = read_text_file(path);
  if (!text) {
    ADD_FAILURE() << text.status().message();
    return {};
  }
  return nlohmann::json::parse(*text);
}

}  // namespace deltaserve::testing
