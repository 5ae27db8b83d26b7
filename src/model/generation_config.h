// generation_config.json: the model's default sampling settings and extra EOS ids. Requests and
// CLI flags override these field by field (as vLLM/SGLang do).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "util/status.h"

namespace deltaserve {

struct GenerationDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::vector<int32_t> eos_token_ids;
};

// A missing file gives empty defaults; a malformed one is an error naming it.
Result<GenerationDefaults> load_generation_defaults(const std::filesystem::path& model_dir);

}  // namespace deltaserve
