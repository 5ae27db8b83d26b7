// RequestRegistry: the requests in flight by id (the request's `rid`, else its response id), so
// that POST /abort_request can cancel them. Thread-safe; jobs register at start and leave at end.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace deltaserve {

class RequestRegistry {
 public:
  using Abort = std::function<void()>;
  // Returns a handle for remove(). Ids the server makes (response ids) are unique by themselves.
  uint64_t add(const std::string& rid, Abort abort);
  // A client's rid: a handle, or nullopt while a request in flight has that rid (SGLang refuses a
  // duplicate too: an abort by rid would cancel both). set_abort() gives it its abort later.
  std::optional<uint64_t> reserve(const std::string& rid);
  void set_abort(uint64_t handle, Abort abort);
  void remove(uint64_t handle);
  // Aborts the requests with this rid (or every request when `all`); returns how many.
  int abort(const std::string& rid, bool all);
  size_t size() const;

 private:
  struct Entry {
    std::string rid;
    Abort abort;
  };
  mutable std::mutex mutex_;
  std::map<uint64_t, Entry> entries_;
  uint64_t next_ = 1;
};

}  // namespace deltaserve
