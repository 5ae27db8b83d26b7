// A fixed pool of worker threads for CPU kernels. parallel_for splits [0, n) into one contiguous
// range per thread (static partition: decode steps are small and uniform, so stealing buys
// nothing). Workers spin (about 2 ms) before sleeping on a futex, so back-to-back kernels pay no
// wake-up cost: a fork/join is a few cache-line transfers between cores (~0.4 us here). The
// ranges are claimed, not assigned: on an oversubscribed machine the caller runs the share of a
// worker that has not started yet, instead of waiting a scheduler time slice for it. So
// thread_idx names the share (use it to index per-share scratch), not a particular OS thread.
// Not re-entrant: one parallel_for at a time (the engine thread issues kernels in order).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
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
  // A type-erased job: fn(ctx, thread_idx, n_threads). Plain pointers, so dispatching a kernel
  // never allocates (a std::function holding a [&] lambda of several captures would).
  using JobFn = void (*)(const void* ctx, int thread_idx, int n_threads);
  void run(JobFn fn, const void* ctx);
  void run_shares(uint32_t gen);
  void worker_loop(int idx);

  int n_threads_;
  std::vector<std::thread> workers_;
  JobFn job_fn_ = nullptr;
  const void* job_ctx_ = nullptr;
  // Each on its own cache line. A job has n_threads_ shares (thread_idx 0..n-1); whoever comes
  // first claims the next one (claim_ = generation << 32 | next share), so a worker that the OS
  // has preempted delays nobody: the caller runs the shares it did not get to.
  alignas(64) std::atomic<uint32_t> generation_{0};  // +1 per job; wakes the workers
  alignas(64) std::atomic<uint64_t> claim_{0};
  alignas(64) std::atomic<int> done_{0};              // finished shares of the current job
  alignas(64) std::atomic<int> n_sleeping_{0};        // workers blocked in generation_.wait()
  std::atomic<bool> stop_{false};
};

// Number of usable CPUs (affinity mask aware).
int hardware_threads();

}  // namespace deltaserve
