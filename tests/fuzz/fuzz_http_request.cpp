// HTTP request parsing with the server's limits and checks (server/http_parse.h): any bytes give
// a request, a rejection the server would send, or "need more bytes"; pipelined requests are
// parsed one after another from the rest.
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "server/http_parse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (int n = 0; n < 16 && !bytes.empty(); ++n) {
    auto r = deltaserve::parse_http_request(bytes, 8192, 4096);
    FUZZ_CHECK(r.consumed <= bytes.size());
    if (r.rejection) {
      FUZZ_CHECK(r.rejection->status >= 400 && r.rejection->status < 600);
      FUZZ_CHECK(!r.rejection->message.empty());
      break;
    }
    if (!r.request) {
      FUZZ_CHECK(r.incomplete);
      break;
    }
    FUZZ_CHECK(r.request->body.size() <= 4096);
    FUZZ_CHECK(r.request->target.compare(0, r.request->path.size(), r.request->path) == 0);
    for (const auto& [name, value] : r.request->headers) {
      for (char c : name) FUZZ_CHECK(!(c >= 'A' && c <= 'Z'));
    }
    FUZZ_CHECK(r.consumed > 0);
    bytes.remove_prefix(r.consumed);
  }
  return 0;
}
