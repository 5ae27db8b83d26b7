#include "util/thread_pool.h"

#include <sched.h>

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DS_PAUSE() _mm_pause()
#else
#define DS_PAUSE() ((void)0)
#endif

namespace deltaserve {

int hardware_threads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int idx) {
  uint64_t seen = 0;
  for (;;) {
    // Spin first: kernels in a forward pass follow each other within microseconds.
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < 200000; ++spin) {
      DS_PAUSE();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    (*job_)(idx, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run_on_all(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
  fn(0, n_threads_);
  while (pending_.load(std::memory_order_acquire) != 0) DS_PAUSE();
  job_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int, int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t n_chunks = (n + grain - 1) / grain;
  int used = static_cast<int>(std::min<int64_t>(n_threads_, n_chunks));
  if (used <= 1) {
    fn(0, 0, n);
    return;
  }
  run_on_all([&](int idx, int) {
    if (idx >= used) return;
    int64_t c0 = n_chunks * idx / used;
    int64_t c1 = n_chunks * (idx + 1) / used;
    int64_t b = c0 * grain, e = std::min(n, c1 * grain);
    if (b < e) fn(idx, b, e);
  });
}

}  // namespace deltaserve
