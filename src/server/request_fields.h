// Every request field the server knows, per API, and what it does with it: the one table behind
// "nothing silently ignored" (docs/api-fields.md is its human-readable copy; a test walks both).
//
//   Honoured        the field works as SGLang / vLLM / OpenAI define it
//   NoEffect        accepted, and by definition changes nothing here (e.g. `user`, a cache hint
//                   while there is no prefix cache); the note says why
//   OnlyDefault     accepted only with one of `accepted` values (the defaults); anything else is a
//                   400 naming the field
//
// A field not in the table is a 400 ("unrecognized request field"), as OpenAI answers.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace deltaserve {

enum class FieldApi : uint8_t {
  Chat = 1,            // POST /v1/chat/completions
  Completion = 2,      // POST /v1/completions
  Generate = 4,        // POST /generate (top level)
  GenerateSampling = 8,  // POST /generate: sampling_params
  Responses = 16,      // POST /v1/responses
};

enum class FieldSupport : uint8_t { Honoured, NoEffect, OnlyDefault };

struct RequestField {
  const char* name;
  uint8_t apis;          // FieldApi bits
  FieldSupport support;
  const char* accepted;  // OnlyDefault: JSON array of the accepted values
  const char* example;   // JSON: a value the table test sends (non-default for OnlyDefault)
  const char* note;      // what it does / why it is refused
};

std::span<const RequestField> request_fields();

// 400 for an unknown field, or an OnlyDefault field with another value. `where` prefixes the
// param name ("sampling_params." for /generate).
std::optional<ApiError> check_request_fields(const nlohmann::ordered_json& body, FieldApi api,
                                             const std::string& where = "");

// The same rule inside the request's objects: 400 naming `path.key` for a key that the object
// `object` (a name of the nested table in request_fields.cpp, e.g. "message", "tools[].function")
// does not have. Keys clients send back from a response (an assistant message's `refusal`) are
// accepted only as null or empty.
std::optional<ApiError> check_nested_fields(const nlohmann::ordered_json& obj, std::string_view object,
                                            const std::string& path);

}  // namespace deltaserve
