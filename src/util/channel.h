// Channel<T>: an unbounded multi-producer queue with close(). The engine thread pushes a request's
// events; the HTTP worker that owns the request pops them (blocking, or with a timeout so it can
// notice a disconnected client). An async consumer (the HTTP server) may instead install a
// notification hook with set_notify() and drain with try_pop() when it fires.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

namespace deltaserve {

template <typename T>
class Channel {
 public:
  // Returns false when the channel is closed (the value is dropped).
  bool push(T value) {
    std::shared_ptr<const std::function<void()>> notify;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) return false;
      items_.push_back(std::move(value));
      notify = notify_;
    }
    cv_.notify_one();
    if (notify) (*notify)();
    return true;
  }
  void close() {
    std::shared_ptr<const std::function<void()>> notify;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
      notify = notify_;
    }
    cv_.notify_all();
    if (notify) (*notify)();
  }
  // Notification hook for async consumers: `notify` runs on the pushing thread, outside the lock,
  // after every push() and close(); it must be cheap and must not block (post work elsewhere).
  // If items are already queued or the channel is closed when the hook is set, it also runs once
  // right away (on this thread), so nothing pushed between submit() and set_notify() is missed.
  // A hook may still run once after being replaced or cleared (it was copied before the change).
  // Pass nullptr to clear it.
  void set_notify(std::function<void()> notify) {
    std::shared_ptr<const std::function<void()>> hook;
    if (notify) hook = std::make_shared<const std::function<void()>>(std::move(notify));
    bool pending = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      notify_ = hook;
      pending = !items_.empty() || closed_;
    }
    if (hook && pending) (*hook)();
  }
  // Blocks until an item arrives or the channel is closed and drained (then nullopt).
  std::optional<T> pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !items_.empty() || closed_; });
    return take(lock);
  }
  // Like pop() but gives up after `timeout` (nullopt, check closed() to tell the two apart).
  template <typename Rep, typename Period>
  std::optional<T> pop_for(std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_for(lock, timeout, [&] { return !items_.empty() || closed_; });
    return take(lock);
  }
  std::optional<T> try_pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    return take(lock);
  }
  bool closed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return closed_ && items_.empty();
  }

 private:
  std::optional<T> take(std::unique_lock<std::mutex>&) {
    if (items_.empty()) return std::nullopt;
    T v = std::move(items_.front());
    items_.pop_front();
    return v;
  }
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<T> items_;
  bool closed_ = false;
  std::shared_ptr<const std::function<void()>> notify_;
};

}  // namespace deltaserve
