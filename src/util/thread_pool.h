// A fixed pool of worker threads for CPU kernels. parallel_for splits [0, n) into one contiguous
// range per thread (static partition: decode steps are small and uniform, so stealing buys
// nothing). Workers spin briefly before sleeping, so back-to-back kernels pay no wake-up cost.
// Not re-entrant: one parallel_for at a time (the engine thread issues kernels in order).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace deltaserve {

class ThreadPool {
 public:
  // n_threads counts the calling thread: n_threads = 1 runs everything inline.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // fn(thread_idx, begin, end) for each non-empty chunk of [0, n); chunks are multiples of `grain`
  // (except the last). Blocks until all chunks are done.
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int, int64_t, int64_t)>& fn);

  // fn(thread_idx, n_threads) on every thread.
  void run_on_all(const std::function<void(int, int)>& fn);

 private:
  void worker_loop(int idx);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
};

// Number of usable CPUs (affinity mask aware).
int hardware_threads();

}  // namespace deltaserve
