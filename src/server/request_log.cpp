#include "server/request_log.h"

#include <nlohmann/json.hpp>

#include "server/json_util.h"
#include "util/log.h"

namespace deltaserve {

void RequestLog::write(const std::string& line) const {
  if (sink) sink->line(line);
  else log_info(line);
}

std::string RequestLog::text(std::string_view s) const {
  if (level < 2) return "";
  if (level >= 3 || s.size() <= kPartialTextChars) return safe_dump(std::string(s));
  const std::size_t keep = utf8_complete_prefix(s.substr(0, kPartialTextChars));
  return str_cat(safe_dump(std::string(s.substr(0, keep))), " (+", s.size() - keep, " bytes)");
}

std::string RequestLog::sampling(const SamplingParams& p, const std::vector<std::string>& stop) const {
  if (level < 1) return "";
  nlohmann::ordered_json j;
  j["temperature"] = json_float(p.temperature);
  j["top_p"] = json_float(p.top_p);
  j["top_k"] = p.top_k;
  j["min_p"] = json_float(p.min_p);
  j["presence_penalty"] = json_float(p.presence_penalty);
  j["frequency_penalty"] = json_float(p.frequency_penalty);
  j["repetition_penalty"] = json_float(p.repetition_penalty);
  if (p.seed) j["seed"] = *p.seed;
  if (!stop.empty()) j["stop"] = stop;
  if (!p.stop_token_ids.empty()) j["stop_token_ids"] = p.stop_token_ids;
  if (p.ignore_eos) j["ignore_eos"] = true;
  if (p.top_logprobs >= 0) j["top_logprobs"] = p.top_logprobs;
  return " sampling " + safe_dump(j);
}

}  // namespace deltaserve
