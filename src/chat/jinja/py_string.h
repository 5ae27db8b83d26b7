// Python str semantics on UTF-8 std::string: lengths, indices and slices count code points, and
// strip()/split() use Python's Unicode whitespace set. Chat templates mostly use ASCII separators,
// but |length, [i] and trim on user text must agree with HF for non-ASCII content too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deltaserve::jinja {

std::u32string utf8_decode(std::string_view s);  // invalid bytes decode as U+FFFD
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t cp);
std::size_t utf8_length(std::string_view s);  // number of code points
bool is_ascii(std::string_view s);

bool py_isspace(char32_t cp);
// str.strip/lstrip/rstrip; chars == nullopt means whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right);
// str.split(sep, maxsplit); sep == nullopt splits on whitespace runs. Empty sep is an error
// reported by the caller.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  std::int64_t maxsplit);
std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep,
                                   std::int64_t maxsplit);
std::string py_replace(std::string_view s, std::string_view old_s, std::string_view new_s,
                       std::int64_t count);
// Case mapping is ASCII-only (documented limitation; Python maps all of Unicode).
std::string ascii_upper(std::string_view s);
std::string ascii_lower(std::string_view s);
std::string py_capitalize(std::string_view s);
std::string py_title(std::string_view s);

// JSON string literal as json.dumps(ensure_ascii=False) writes it.
void append_json_string(std::string& out, std::string_view s);
// Python repr() of a str: single quotes unless the text has ' and no ".
void append_py_repr_string(std::string& out, std::string_view s);

}  // namespace deltaserve::jinja
