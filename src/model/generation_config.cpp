#include "model/generation_config.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "util/mmap_file.h"

namespace deltaserve {

Result<GenerationDefaults> load_generation_defaults(const std::filesystem::path& model_dir) {
  GenerationDefaults d;
  const auto path = model_dir / "generation_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return d;
  DS_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return error(path.string(), ": invalid JSON: ", e.what());
  }
  if (!j.is_object()) return error(path.string(), ": expected an object");
  auto num = [&](const char* key) -> std::optional<float> {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number()) return std::nullopt;
    return it->get<float>();
  };
  // do_sample=false means greedy in HF; honour it.
  if (j.contains("do_sample") && !j["do_sample"].is_null() && !j["do_sample"].is_boolean())
    return error(path.string(), ": do_sample must be true or false");
  const bool do_sample = !j.contains("do_sample") || j["do_sample"].is_null() || j["do_sample"].get<bool>();
  d.temperature = do_sample ? num("temperature") : std::optional<float>(0.0f);
  d.top_p = num("top_p");
  d.min_p = num("min_p");
  d.repetition_penalty = num("repetition_penalty");
  if (auto it = j.find("top_k"); it != j.end() && it->is_number_integer()) d.top_k = it->get<int>();
  if (auto it = j.find("eos_token_id"); it != j.end()) {
    if (it->is_number_integer()) d.eos_token_ids.push_back(it->get<int32_t>());
    else if (it->is_array())
      for (const auto& x : *it)
        if (x.is_number_integer()) d.eos_token_ids.push_back(x.get<int32_t>());
  }
  for (int32_t id : d.eos_token_ids)
    if (id < 0) return error(path.string(), ": eos_token_id ", id, " is negative");
  return d;
}

std::vector<int32_t> end_token_ids(const std::vector<int32_t>& config_eos, const GenerationDefaults& generation,
                                   std::optional<int32_t> tokenizer_eos) {
  std::vector<int32_t> ids;
  auto add = [&](int32_t id) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  };
  for (int32_t id : generation.eos_token_ids) add(id);
  for (int32_t id : config_eos) add(id);
  if (tokenizer_eos) add(*tokenizer_eos);
  return ids;
}

}  // namespace deltaserve
