#include "util/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DS_PAUSE() _mm_pause()
#else
#define DS_PAUSE() ((void)0)
#endif

namespace deltaserve {

namespace {

// A worker spins this long after its last job before it sleeps: a forward pass issues kernels
// microseconds apart, and decode steps follow each other within a few hundred microseconds.
constexpr auto kSpinBeforeSleep = std::chrono::milliseconds(2);
// The caller waiting for a worker still inside its share yields after this many pauses (the
// machine may be oversubscribed, and a preempted worker needs a core back).
constexpr int kJoinSpinsBeforeYield = 1 << 12;

}  // namespace

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
  stop_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);  // claim_ keeps the old generation: no share
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int idx) {
  (void)idx;
  uint32_t seen = 0;
  for (;;) {
    uint32_t gen = generation_.load(std::memory_order_acquire);
    if (gen == seen) {
      // Spin, checking the clock only every 256 pauses.
      auto deadline = std::chrono::steady_clock::now() + kSpinBeforeSleep;
      for (int spin = 1; gen == seen; ++spin) {
        DS_PAUSE();
        gen = generation_.load(std::memory_order_acquire);
        // Every 256 pauses, give the core to any runnable thread (HTTP, clients): on a machine
        // with as many compute threads as cores, a spinning worker would otherwise delay them.
        if ((spin & 255) == 0 && gen == seen) sched_yield();
        if ((spin & 255) == 0 && gen == seen && std::chrono::steady_clock::now() > deadline) {
          // Sleep. Dekker with run(): we publish n_sleeping_ before re-reading generation_
          // (inside wait), run() bumps generation_ before reading n_sleeping_; seq_cst on both
          // sides means at least one of us sees the other, so no wake-up is lost.
          n_sleeping_.fetch_add(1, std::memory_order_seq_cst);
          generation_.wait(seen, std::memory_order_seq_cst);
          n_sleeping_.fetch_sub(1, std::memory_order_seq_cst);
          gen = generation_.load(std::memory_order_acquire);
          deadline = std::chrono::steady_clock::now() + kSpinBeforeSleep;
        }
      }
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    run_shares(gen);
  }
}

// Claims and runs shares of job `gen` until none is left. A claim of a finished or newer job
// fails on the generation half of claim_, so job_fn_ is only read while its job is live.
void ThreadPool::run_shares(uint32_t gen) {
  const uint64_t n_shares = static_cast<uint64_t>(n_threads_);
  uint64_t c = claim_.load(std::memory_order_acquire);
  for (;;) {
    if ((c >> 32) != gen || (c & 0xffffffffu) >= n_shares) return;
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire))
      continue;  // c was reloaded
    job_fn_(job_ctx_, static_cast<int>(c & 0xffffffffu), n_threads_);
    done_.fetch_add(1, std::memory_order_release);
    c = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::run(JobFn fn, const void* ctx) {
  if (n_threads_ == 1) {
    fn(ctx, 0, 1);
    return;
  }
  const uint32_t gen = generation_.load(std::memory_order_relaxed) + 1;
  job_fn_ = fn;
  job_ctx_ = ctx;
  done_.store(0, std::memory_order_relaxed);
  claim_.store(static_cast<uint64_t>(gen) << 32 | 1u, std::memory_order_relaxed);  // share 0: us
  generation_.store(gen, std::memory_order_seq_cst);  // publishes job_*, done_, claim_
  if (n_sleeping_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
  fn(ctx, 0, n_threads_);
  done_.fetch_add(1, std::memory_order_release);
  run_shares(gen);  // whatever the workers have not claimed yet
  for (int spin = 1; done_.load(std::memory_order_acquire) != n_threads_; ++spin) {
    DS_PAUSE();
    if (spin % kJoinSpinsBeforeYield == 0) sched_yield();
  }
}

void ThreadPool::run_on_all(const std::function<void(int, int)>& fn) {
  run([](const void* ctx, int idx, int n) {
        (*static_cast<const std::function<void(int, int)>*>(ctx))(idx, n);
      },
      &fn);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int, int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t n_chunks = (n + grain - 1) / grain;
  const int used = static_cast<int>(std::min<int64_t>(n_threads_, n_chunks));
  if (used <= 1) {
    fn(0, 0, n);
    return;
  }
  struct Split {
    int64_t n, grain, n_chunks;
    int used;
    const std::function<void(int, int64_t, int64_t)>* fn;
  } split{n, grain, n_chunks, used, &fn};
  run([](const void* ctx, int idx, int) {
        const Split& s = *static_cast<const Split*>(ctx);
        if (idx >= s.used) return;
        const int64_t c0 = s.n_chunks * idx / s.used, c1 = s.n_chunks * (idx + 1) / s.used;
        const int64_t b = c0 * s.grain, e = std::min(s.n, c1 * s.grain);
        if (b < e) (*s.fn)(idx, b, e);
      },
      &split);
}

}  // namespace deltaserve
