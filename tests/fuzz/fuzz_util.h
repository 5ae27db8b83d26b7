// Shared helpers for the libFuzzer targets (tests/fuzz/README.md).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace deltaserve::fuzz {

// A failed property is a finding: print it and abort so libFuzzer saves the input.
#define FUZZ_CHECK(cond)                                                             \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)

// Cuts `text` into pieces whose lengths come from `seed` bytes (1..16 each, cycling), for
// streaming parsers that must give the same result for every split.
inline std::vector<std::string_view> split_by(std::string_view text, std::string_view seed) {
  std::vector<std::string_view> parts;
  std::size_t i = 0, k = 0;
  while (i < text.size()) {
    std::size_t n = seed.empty() ? 1 : 1 + static_cast<unsigned char>(seed[k++ % seed.size()]) % 16;
    n = std::min(n, text.size() - i);
    parts.push_back(text.substr(i, n));
    i += n;
  }
  return parts;
}

}  // namespace deltaserve::fuzz
