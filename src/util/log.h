// Leveled logging to stderr. The engine thread never formats JSON; this is plain text.
#pragma once

#include <string>
#include <string_view>

#include "util/status.h"

namespace deltaserve {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 };

// The level is process-wide configuration set once at start-up by the app.
void set_log_level(LogLevel level);
// By the --log-level flag's names: "debug", "info", "warning" or "error"; false (level unchanged)
// for any other.
bool set_log_level(std::string_view name);
LogLevel log_level();
void log_line(LogLevel level, const std::string& message);

template <typename... Args>
void log_info(const Args&... args) {
  if (log_level() <= LogLevel::Info) log_line(LogLevel::Info, str_cat(args...));
}
template <typename... Args>
void log_warn(const Args&... args) {
  if (log_level() <= LogLevel::Warn) log_line(LogLevel::Warn, str_cat(args...));
}
template <typename... Args>
void log_error(const Args&... args) {
  log_line(LogLevel::Error, str_cat(args...));
}
template <typename... Args>
void log_debug(const Args&... args) {
  if (log_level() <= LogLevel::Debug) log_line(LogLevel::Debug, str_cat(args...));
}

}  // namespace deltaserve
