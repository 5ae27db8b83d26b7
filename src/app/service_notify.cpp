#include "app/service_notify.h"

#if DELTASERVE_WITH_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace deltaserve {

#if DELTASERVE_WITH_SYSTEMD
bool service_notify_supported() { return true; }
void notify_ready(const std::string& status) { sd_notifyf(0, "READY=1\nSTATUS=%s", status.c_str()); }
void notify_stopping(const std::string& status) { sd_notifyf(0, "STOPPING=1\nSTATUS=%s", status.c_str()); }
void notify_watchdog() { sd_notify(0, "WATCHDOG=1"); }
std::optional<std::chrono::microseconds> watchdog_interval() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) return std::chrono::microseconds(usec);
  return std::nullopt;
}
#else
bool service_notify_supported() { return false; }
void notify_ready(const std::string&) {}
void notify_stopping(const std::string&) {}
void notify_watchdog() {}
std::optional<std::chrono::microseconds> watchdog_interval() { return std::nullopt; }
#endif

}  // namespace deltaserve
