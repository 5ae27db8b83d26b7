// LaunchHistoryRefresher: the status page's recent launches (/status.json "launches"), read from
// the launch database by a thread of its own: at once, whenever the database file changes (a stat
// every kWatch: a measurement `deltaserve bench` records shows within it), and at least every
// kPeriod. The server's io thread only copies the last value, so a database locked by another
// process (a bench run writing, `sqlite3` holding a transaction) never holds up /health or the
// page. Each read opens the file read-only and waits at most kBusyTimeoutMs for a lock; a failed
// read keeps the last good value (or reports the error when there is none yet).
#pragma once

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "util/status.h"

namespace deltaserve {

class LaunchHistoryRefresher {
 public:
  static constexpr int kBusyTimeoutMs = 250;
  static constexpr std::chrono::seconds kPeriod{5};
  static constexpr std::chrono::milliseconds kWatch{200};

  explicit LaunchHistoryRefresher(std::filesystem::path state_dir) : state_dir_(std::move(state_dir)) {}
  ~LaunchHistoryRefresher() { stop(); }
  LaunchHistoryRefresher(const LaunchHistoryRefresher&) = delete;
  LaunchHistoryRefresher& operator=(const LaunchHistoryRefresher&) = delete;

  // What ServerConfig::launch_history calls (on an io thread): the cached value, never a read.
  std::function<Result<nlohmann::ordered_json>()> reader() const;
  // Reads now, then as above until stop().
  void start();
  void stop();

 private:
  struct Cache {
    std::mutex mutex;
    bool have_good = false;
    Result<nlohmann::ordered_json> value = error("the launch history has not been read yet");
  };
  std::string signature() const;  // the database file's modification time and size ("" if absent)
  void refresh();

  const std::filesystem::path state_dir_;
  std::shared_ptr<Cache> cache_ = std::make_shared<Cache>();
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace deltaserve
