// Request bodies -> OpenAiRequest, as the server does it: depth guard, JSON parse, then by the
// first byte mod 4 parse_chat_request, parse_completion_request, SGLang's parse_generate_request or
// the Responses API's parse_responses_request (with one stored conversation, "resp_stored", for
// previous_response_id). Every rejection must be a 4xx with a message; nothing may throw.
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "server/json_util.h"
#include "server/openai_request.h"
#include "server/responses_request.h"
#include "util/json_parse.h"

namespace {

using json = nlohmann::ordered_json;

std::optional<json> stored(const std::string& id) {
  if (id != "resp_stored") return std::nullopt;
  return json::parse(R"([{"role": "system", "content": "be brief"}, {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "", "reasoning_content": "use the tool",
     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}])");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int api = data[0] % 4;
  std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (deltaserve::json_nesting_depth(text, 64) > 64) return 0;
  json body;
  if (!deltaserve::parse_ordered_json(text, body)) return 0;
  deltaserve::SamplingDefaults defaults;
  deltaserve::OpenAiRequest req;
  json messages;
  auto err = api == 0   ? deltaserve::parse_chat_request(body, defaults, req)
             : api == 1 ? deltaserve::parse_completion_request(body, defaults, req)
             : api == 2 ? deltaserve::parse_generate_request(body, defaults, req)
                        : deltaserve::parse_responses_request(body, defaults, stored, req, messages);
  if (err) {
    FUZZ_CHECK(err->status >= 400 && err->status < 500);
    FUZZ_CHECK(!err->message.empty());
  }
  return 0;
}
