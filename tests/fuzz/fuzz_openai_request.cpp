// Request bodies -> OpenAiRequest, as the server does it: depth guard, JSON parse, then by the
// first byte mod 3 parse_chat_request, parse_completion_request or SGLang's
// parse_generate_request. Every rejection must be a 4xx with a message.
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "server/json_util.h"
#include "server/openai_request.h"
#include "util/json_parse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int api = data[0] % 3;
  std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (deltaserve::json_nesting_depth(text, 64) > 64) return 0;
  nlohmann::ordered_json body;
  if (!deltaserve::parse_ordered_json(text, body)) return 0;
  deltaserve::SamplingDefaults defaults;
  deltaserve::OpenAiRequest req;
  auto err = api == 0   ? deltaserve::parse_chat_request(body, defaults, req)
             : api == 1 ? deltaserve::parse_completion_request(body, defaults, req)
                        : deltaserve::parse_generate_request(body, defaults, req);
  if (err) {
    FUZZ_CHECK(err->status >= 400 && err->status < 500);
    FUZZ_CHECK(!err->message.empty());
  }
  return 0;
}
