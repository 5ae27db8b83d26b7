// TaskQueue: a few threads that run posted std::function tasks in FIFO order. For blocking work
// that must stay off the io threads (request parsing, chat templating, tokenization), unlike
// ThreadPool, which splits one kernel across cores.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace deltaserve {

class TaskQueue {
 public:
  explicit TaskQueue(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    for (int i = 0; i < n_threads; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~TaskQueue() { stop(); }
  TaskQueue(const TaskQueue&) = delete;
  TaskQueue& operator=(const TaskQueue&) = delete;

  // Queues `fn`. After stop() it runs inline (nothing is dropped).
  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!stopping_) {
        tasks_.push_back(std::move(fn));
        cv_.notify_one();
        return;
      }
    }
    fn();
  }
  // Runs what is queued, then joins the threads. Safe to call twice.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }
  std::size_t pending() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return tasks_.size();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        fn = std::move(tasks_.front());
        tasks_.pop_front();
      }
      fn();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
};

}  // namespace deltaserve
