#include "app/launch_history_refresher.h"

#include "deploy/launch_db.h"

namespace deltaserve {

std::function<Result<nlohmann::ordered_json>()> LaunchHistoryRefresher::reader() const {
  return [cache = cache_]() -> Result<nlohmann::ordered_json> {
    std::lock_guard<std::mutex> lock(cache->mutex);
    return cache->value;
  };
}

void LaunchHistoryRefresher::start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] {
    std::string seen = signature();
    refresh();
    auto last_read = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(stop_mutex_);
    while (!stop_cv_.wait_for(lock, kWatch, [this] { return stopping_; })) {
      const std::string now_seen = signature();
      const auto now = std::chrono::steady_clock::now();
      if (now_seen == seen && now - last_read < kPeriod) continue;
      seen = now_seen;
      last_read = now;
      lock.unlock();
      refresh();
      lock.lock();
    }
  });
}

void LaunchHistoryRefresher::stop() {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string LaunchHistoryRefresher::signature() const {
  std::error_code ec;
  const auto file = LaunchDb::file_in(state_dir_);
  const auto t = std::filesystem::last_write_time(file, ec);
  if (ec) return "";
  const auto size = std::filesystem::file_size(file, ec);
  return std::to_string(t.time_since_epoch().count()) + "/" + std::to_string(ec ? 0 : size);
}

void LaunchHistoryRefresher::refresh() {
  Result<nlohmann::ordered_json> fresh = nlohmann::ordered_json::array();
  try {
    auto db = LaunchDb::open_for_reading(state_dir_, kBusyTimeoutMs);
    if (!db) {
      fresh = db.status();
    } else if (*db) {  // (nullptr: no database yet, no launches)
      auto text = recent_launches_json(**db, 10, 5);
      if (!text) fresh = text.status();
      else fresh = nlohmann::ordered_json::parse(*text);
    }
  } catch (const std::exception& e) {
    fresh = error("launch history: ", e.what());
  }
  std::lock_guard<std::mutex> lock(cache_->mutex);
  if (fresh) {
    cache_->value = std::move(fresh);
    cache_->have_good = true;
  } else if (!cache_->have_good) {
    cache_->value = std::move(fresh);
  }  // else: keep showing the last good read (the next one may succeed)
}

}  // namespace deltaserve
