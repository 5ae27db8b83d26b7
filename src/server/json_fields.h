// JsonFields: typed getters over a request object's fields, for every route's parser. A field that
// is absent or null gives nullopt; a wrong type or a value out of range sets `err`, an ApiError
// naming the field, and later getters then return nullopt too.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace deltaserve {

struct JsonFields {
  using json = nlohmann::ordered_json;
  const json& body;
  std::optional<ApiError> err;

  bool has(const char* key) const { return body.contains(key) && !body[key].is_null(); }

  std::optional<double> number(const char* key, double lo, double hi) {
    if (err || !has(key)) return std::nullopt;
    const json& v = body[key];
    if (!v.is_number()) {
      err = ApiError::bad_request(std::string("'") + key + "' must be a number", key);
      return std::nullopt;
    }
    double d = v.get<double>();
    if (!std::isfinite(d) || d < lo || d > hi) {
      err = ApiError::bad_request(std::string("'") + key + "' must be a finite number in [" +
                                      fmt(lo) + ", " + fmt(hi) + "], got " + v.dump(),
                                  key);
      return std::nullopt;
    }
    return d;
  }
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) {
    if (err || !has(key)) return std::nullopt;
    const json& v = body[key];
    bool whole_float = v.is_number_float() && std::isfinite(v.get<double>()) &&
                       std::floor(v.get<double>()) == v.get<double>() &&
                       std::fabs(v.get<double>()) < 9e18;
    if (!v.is_number_integer() && !whole_float) {
      err = ApiError::bad_request(std::string("'") + key + "' must be an integer", key);
      return std::nullopt;
    }
    // Above INT64_MAX is out of every range (a seed is not clamped into another value: vLLM's
    // range is int64 too).
    const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX);
    int64_t i = too_big                   ? INT64_MAX
                : v.is_number_integer() ? v.get<int64_t>()
                                        : static_cast<int64_t>(v.get<double>());
    if (too_big || i < lo || i > hi) {
      err = ApiError::bad_request(std::string("'") + key + "' must be in [" + std::to_string(lo) +
                                      ", " + std::to_string(hi) + "], got " + v.dump(),
                                  key);
      return std::nullopt;
    }
    return i;
  }
  std::optional<bool> boolean(const char* key) {
    if (err || !has(key)) return std::nullopt;
    if (!body[key].is_boolean()) {
      err = ApiError::bad_request(std::string("'") + key + "' must be a boolean", key);
      return std::nullopt;
    }
    return body[key].get<bool>();
  }
  std::optional<std::string> string(const char* key) {
    if (err || !has(key)) return std::nullopt;
    if (!body[key].is_string()) {
      err = ApiError::bad_request(std::string("'") + key + "' must be a string", key);
      return std::nullopt;
    }
    return body[key].get<std::string>();
  }
  static std::string fmt(double d) {
    if (d == std::numeric_limits<double>::max()) return "inf";
    if (d == -std::numeric_limits<double>::max()) return "-inf";
    std::string s = json(d).dump();
    return s;
  }
};

}  // namespace deltaserve
