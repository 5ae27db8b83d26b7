// ApiError: an OpenAI-style error, {"error": {"message", "type", "param", "code"}}, with its HTTP
// status. Validation functions return Result<T> whose error Status carries no structure, so the
// request parsers use ApiError directly.
#pragma once

#include <string>
#include <utility>

namespace deltaserve {

struct ApiError {
  ApiError() = default;
  ApiError(int status_, std::string message_, std::string type_ = "invalid_request_error",
           std::string param_ = {}, std::string code_ = {}, std::string allow_ = {})
      : status(status_), message(std::move(message_)), type(std::move(type_)), param(std::move(param_)),
        code(std::move(code_)), allow(std::move(allow_)) {}

  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty = null
  std::string code;   // empty = null
  std::string allow;  // 405: the Allow header (the methods the route takes)

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
  // 405 for a route that takes `methods` ("GET", "POST", "GET, DELETE"); GET implies HEAD.
  static ApiError method_not_allowed(std::string methods) {
    std::string allow = methods;
    if (allow.rfind("GET", 0) == 0) allow.insert(3, ", HEAD");
    return ApiError{405, "use " + methods, "invalid_request_error", {}, {}, std::move(allow)};
  }
  static ApiError internal(std::string message) {
    return ApiError{500, std::move(message), "internal_error", {}, "internal_error"};
  }

  std::string to_json() const;  // the response body
};

}  // namespace deltaserve
