// <think> reasoning parser: for any text and any split into pushes, the streamed output equals
// the one-shot parse (reasoning_parser.h promises it), and nothing is lost or invented.
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "server/reasoning_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const bool start_in_reasoning = data[0] & 1;
  const std::size_t seed_len = std::min<std::size_t>(data[1] % 8, size - 2);
  std::string_view seed(reinterpret_cast<const char*>(data) + 2, seed_len);
  std::string_view text(reinterpret_cast<const char*>(data) + 2 + seed_len, size - 2 - seed_len);
  const auto whole = deltaserve::ReasoningParser::parse(text, start_in_reasoning);
  deltaserve::ReasoningParser p(start_in_reasoning);
  std::string reasoning, content;
  for (auto part : deltaserve::fuzz::split_by(text, seed)) {
    auto d = p.push(part);
    reasoning += d.reasoning;
    content += d.content;
  }
  auto d = p.finish();
  reasoning += d.reasoning;
  content += d.content;
  FUZZ_CHECK(reasoning == whole.reasoning);
  FUZZ_CHECK(content == whole.content);
  FUZZ_CHECK(reasoning.size() + content.size() <= text.size());
  return 0;
}
