// ApiError: an OpenAI-style error, {"error": {"message", "type", "param", "code"}}, with its HTTP
// status. Validation functions return Result<T> whose error Status carries no structure, so the
// request parsers use ApiError directly.
#pragma once

#include <string>

namespace deltaserve {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty = null
  std::string code;   // empty = null

  static ApiError bad_request(std::string message, std::string param = {},
                              std::string code = "invalid_value") {
    return ApiError{400, std::move(message), "invalid_request_error", std::move(param),
                    std::move(code)};
  }
  static ApiError not_found(std::string message) {
    return ApiError{404, std::move(message), "not_found_error", {}, "not_found"};
  }
  static ApiError unauthorized(std::string message) {
    return ApiError{401, std::move(message), "authentication_error", {}, "invalid_api_key"};
  }
  static ApiError too_large(std::string message) {
    return ApiError{413, std::move(message), "invalid_request_error", {}, "request_too_large"};
  }
  static ApiError overloaded(std::string message) {
    return ApiError{503, std::move(message), "server_overloaded", {}, "queue_full"};
  }
  static ApiError internal(std::string message) {
    return ApiError{500, std::move(message), "internal_error", {}, "internal_error"};
  }

  std::string to_json() const;  // the response body
};

}  // namespace deltaserve
