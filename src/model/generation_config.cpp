#include "model/generation_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "util/mmap_file.h"

namespace deltaserve {

Result<GenerationDefaults> load_generation_defaults(const std::filesystem::path& model_dir, int64_t vocab_size) {
  GenerationDefaults d;
  const auto path = model_dir / "generation_config.json";
  const std::string source = path.string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return d;
  DS_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return error(source, ": invalid JSON: ", e.what());
  }
  if (!j.is_object()) return error(source, ": expected an object");
  // The request's ranges (server/openai_request.cpp): a default the request parser would refuse is
  // refused here, with the file and key named, rather than applied to every request.
  auto num = [&](const char* key, double lo, double hi, bool lo_open) -> Result<std::optional<float>> {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::optional<float>();
    if (!it->is_number()) return error(source, ": '", key, "' must be a number, got ", it->type_name());
    const double v = it->get<double>();
    if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo))
      return error(source, ": '", key, "' must be in ", lo_open ? "(" : "[", lo, ", ", hi, "], got ", json_value_for_message(*it));
    return std::optional<float>(static_cast<float>(v));
  };
  // do_sample=false means greedy in HF; honour it.
  if (j.contains("do_sample") && !j["do_sample"].is_null() && !j["do_sample"].is_boolean())
    return error(source, ": do_sample must be true or false");
  const bool do_sample = !j.contains("do_sample") || j["do_sample"].is_null() || j["do_sample"].get<bool>();
  DS_ASSIGN_OR_RETURN(d.temperature, num("temperature", 0.0, kMaxLogitScale, false));
  if (!do_sample) d.temperature = 0.0f;
  DS_ASSIGN_OR_RETURN(d.top_p, num("top_p", 0.0, 1.0, true));
  DS_ASSIGN_OR_RETURN(d.min_p, num("min_p", 0.0, 1.0, false));
  DS_ASSIGN_OR_RETURN(d.repetition_penalty, num("repetition_penalty", 0.0, kMaxLogitScale, true));
  if (auto it = j.find("top_k"); it != j.end() && !it->is_null()) {
    const double v = it->is_number() ? it->get<double>() : -2.0;
    if (!it->is_number() || v != std::floor(v) || v < -1 || v > INT32_MAX)
      return error(source, ": 'top_k' must be an integer in [-1, ", INT32_MAX, "], got ", json_value_for_message(*it));
    d.top_k = static_cast<int>(v);
  }
  if (auto it = j.find("eos_token_id"); it != j.end()) {
    DS_ASSIGN_OR_RETURN(d.eos_token_ids, parse_token_id_list(*it, "eos_token_id", source));
  }
  for (int32_t id : d.eos_token_ids)
    if (vocab_size > 0 && id >= vocab_size)
      return error(source, ": eos_token_id ", id, " is outside the vocabulary [0, ", vocab_size, ")");
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
