#include "server/request_registry.h"

#include <vector>

namespace deltaserve {

uint64_t RequestRegistry::add(const std::string& rid, Abort abort) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t h = next_++;
  entries_.emplace(h, Entry{rid, std::move(abort)});
  return h;
}

std::optional<uint64_t> RequestRegistry::reserve(const std::string& rid) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [h, e] : entries_)
    if (e.rid == rid) return std::nullopt;
  const uint64_t h = next_++;
  entries_.emplace(h, Entry{rid, nullptr});
  return h;
}

void RequestRegistry::set_abort(uint64_t handle, Abort abort) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = entries_.find(handle); it != entries_.end()) it->second.abort = std::move(abort);
}

void RequestRegistry::remove(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.erase(handle);
}

int RequestRegistry::abort(const std::string& rid, bool all) {
  std::vector<Abort> hits;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [h, e] : entries_)
      if ((all || e.rid == rid) && e.abort) hits.push_back(e.abort);
  }
  for (auto& a : hits) a();  // outside the lock: an abort may finish the job, which removes itself
  return static_cast<int>(hits.size());
}

size_t RequestRegistry::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

}  // namespace deltaserve
