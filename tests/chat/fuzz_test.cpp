// Fuzz-ish robustness: random, truncated and mutated template sources must parse or fail with a
// Status, and whatever parses must render or fail with a Status; never crash or hang.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "chat/chat_template.h"
#include "chat/jinja/template.h"
#include "util/mmap_file.h"

namespace deltaserve::jinja {
namespace {

Object fuzz_context() {
  auto j = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                 {"role": "assistant", "content": "<think>r</think>a", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
                 {"role": "tool", "content": "t"}],
    "tools": [{"type": "function", "function": {"name": "f"}}], "add_generation_prompt": true, "x": [1, "a", null]})");
  return Value::from_json(j).obj();
}

void exercise(const std::string& src, const Object& ctx) {
  auto t = Template::parse(src);
  if (!t) {
    EXPECT_FALSE(t.status().message().empty());
    return;
  }
  RenderLimits limits;
  limits.max_steps = 200000;
  limits.max_output_bytes = 1 << 20;
  auto r = t->render(ctx, limits);
  if (!r) {
    EXPECT_FALSE(r.status().message().empty());
  }
}

std::string corpus() {
  std::string qwen = *read_text_file(std::filesystem::path(DELTASERVE_SOURCE_DIR) / "tests/fixtures/qwen3.6-chat_template.jinja");
  return qwen +
         "{% macro m(a, b=1) %}{{ caller() if caller is defined }}{% endmacro %}{% call m(1) %}x{% endcall %}"
         "{% set ns = namespace(a=[]) %}{% for k, v in {'a': 1}|items if v %}{{ loop.cycle('x','y') }}{% else %}e{% endfor %}"
         "{{ x[::-1]|tojson(indent=2) }}{{ 'a' ~ 1 | string }}{% raw %}{{ raw }}{% endraw %}{# c #}"
         "{{ (1 + 2) * 3 // 4 ** 2 % 5 }}{{ [1,2][1:] }}{{ {'k': [1]}.k }}{{ 'x'.split('y') }}";
}

TEST(JinjaFuzz, TruncatedSourcesNeverCrash) {
  const Object ctx = fuzz_context();
  const std::string src = corpus();
  for (std::size_t n = 0; n <= src.size(); n += 7) exercise(src.substr(0, n), ctx);
}

TEST(JinjaFuzz, MutatedSourcesNeverCrash) {
  const Object ctx = fuzz_context();
  const std::string src = corpus();
  std::mt19937 rng(1234);
  const std::string alphabet = "{}%#-+()[]'\",.|:=~*/ \n\tabcdefghijklmnopqrstuvwxyz0123456789_\\";
  for (int iter = 0; iter < 1500; ++iter) {
    std::string s = src;
    int n_edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < n_edits && !s.empty(); ++e) {
      std::size_t pos = rng() % s.size();
      switch (rng() % 4) {
        case 0: s.erase(pos, 1 + rng() % 5); break;
        case 1: s.insert(pos, 1, alphabet[rng() % alphabet.size()]); break;
        case 2: s[pos] = alphabet[rng() % alphabet.size()]; break;
        default: {  // duplicate a chunk (creates odd nesting)
          std::size_t len = std::min<std::size_t>(1 + rng() % 40, s.size() - pos);
          s.insert(rng() % s.size(), s.substr(pos, len));
        }
      }
    }
    exercise(s, ctx);
  }
}

TEST(JinjaFuzz, RandomBytesNeverCrash) {
  const Object ctx = fuzz_context();
  std::mt19937 rng(99);
  const char* pieces[] = {"{{", "}}", "{%", "%}", "{#", "#}", "-", "+", "if", "for", "in", "endif", "endfor",
                          "set", "x", "=", "(", ")", "[", "]", "'", "\"", "|", "tojson", "is", "not", "defined",
                          "macro", "endmacro", "loop", ".", ",", " ", "\n", "1", "\xff", "\xe2\x82", "\\"};
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s;
    int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) s += pieces[rng() % (sizeof(pieces) / sizeof(pieces[0]))];
    exercise(s, ctx);
  }
}

}  // namespace
}  // namespace deltaserve::jinja
