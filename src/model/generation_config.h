// generation_config.json: the model's default sampling settings and extra EOS ids. Requests and
// CLI flags override these field by field (as vLLM/SGLang do).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "util/status.h"

namespace deltaserve {

// Temperature and repetition_penalty scale logits in f32: past this the result is uniform (or the
// penalty total) anyway, and 1/T or the product would round to 0 or inf (1e300 was greedy). The
// bound of a request's value (server/openai_request.cpp) and of a default here.
inline constexpr double kMaxLogitScale = 1e6;

struct GenerationDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::vector<int32_t> eos_token_ids;
};

// A missing file gives empty defaults; a malformed one, a value a request could not set (top_p 5)
// or an EOS id outside [0, vocab_size) (vocab_size 0: unchecked) is an error naming the file and key.
Result<GenerationDefaults> load_generation_defaults(const std::filesystem::path& model_dir, int64_t vocab_size);

// The ids that end a reply, without repeats: generation_config.json's eos_token_id, then
// config.json's (`config_eos`), then the tokenizer's EOS (SGLang stops on all three). The engine
// stops on these, and the server bans them under min_tokens and keeps them out of the text: one set
// for both, or a reply could run past an end the text hides. The first is the end a constrained
// reply is given when its grammar is done (Qwen3.6: <|im_end|>, generation_config's first).
std::vector<int32_t> end_token_ids(const std::vector<int32_t>& config_eos, const GenerationDefaults& generation,
                                   std::optional<int32_t> tokenizer_eos);

}  // namespace deltaserve
