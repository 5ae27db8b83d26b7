// systemd service notifications (sd_notify through libsystemd, when the build found it):
// READY=1 once the model is loaded and the server answers, STOPPING=1 at shutdown, STATUS= lines,
// and WATCHDOG=1 pings while the engine makes progress. Without libsystemd, or when not started
// by systemd (no $NOTIFY_SOCKET), every call is a no-op.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace deltaserve {

// True if this binary was built with libsystemd (then `systemd-unit` writes Type=notify).
bool service_notify_supported();
void notify_ready(const std::string& status);
void notify_stopping(const std::string& status);
void notify_watchdog();
// The interval systemd expects pings at ($WATCHDOG_USEC, for this process), if any.
std::optional<std::chrono::microseconds> watchdog_interval();

}  // namespace deltaserve
