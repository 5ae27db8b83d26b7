// Reading a fixture directory's reference.safetensors / reference.json in tests.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "util/mmap_file.h"

namespace deltaserve::test {

inline std::filesystem::path source_dir() { return DELTASERVE_SOURCE_DIR; }

struct FixtureCase {
  std::string name;
  int prompt_len = 0;
  std::vector<int32_t> tokens;
  double min_margin_prefill = 0, min_margin_decode = 0;
};

class Fixture {
 public:
  explicit Fixture(const std::filesystem::path& dir) : dir_(dir) {
    auto ck = Checkpoint::open_file(dir / "reference.safetensors");
    if (!ck) throw std::runtime_error(ck.status().message());
    ref_ = std::move(*ck);
    auto text = read_text_file(dir / "reference.json");
    if (!text) throw std::runtime_error(text.status().message());
    json_ = nlohmann::json::parse(*text);
    for (const auto& c : json_["cases"]) {
      FixtureCase fc;
      fc.name = c["name"];
      fc.prompt_len = c["prompt_len"];
      fc.min_margin_prefill = c.value("min_top2_margin_prefill", 0.0);
      fc.min_margin_decode = c.value("min_top2_margin_decode", 0.0);
      const TensorEntry* t = ref_.find(fc.name + ".tokens");
      if (!t) throw std::runtime_error("missing tokens for " + fc.name);
      auto* p = static_cast<const int32_t*>(t->data);
      fc.tokens.assign(p, p + t->numel());
      cases_.push_back(fc);
    }
  }
  const std::vector<FixtureCase>& cases() const { return cases_; }
  const TensorEntry* tensor(const std::string& name) const { return ref_.find(name); }
  const float* f32(const std::string& name) const {
    const TensorEntry* t = ref_.find(name);
    return t ? static_cast<const float*>(t->data) : nullptr;
  }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  Checkpoint ref_;
  nlohmann::json json_;
  std::vector<FixtureCase> cases_;
};

}  // namespace deltaserve::test
