// ThreadPool: every index covered exactly once, chunk alignment, many back-to-back regions (the
// spin/sleep hand-over), and waking up after the workers went to sleep.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "util/thread_pool.h"

namespace deltaserve {
namespace {

TEST(ThreadPool, ParallelForCoversEachIndexOnce) {
  for (int n_threads : {1, 2, 3, 8}) {
    ThreadPool pool(n_threads);
    for (int64_t n : {1, 2, 7, 64, 1000}) {
      for (int64_t grain : {1, 4, 16}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, grain, [&](int t, int64_t b, int64_t e) {
          EXPECT_GE(t, 0);
          EXPECT_LT(t, n_threads);
          EXPECT_EQ(b % grain, 0);
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
      }
    }
  }
}

TEST(ThreadPool, ManyBackToBackRegions) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int it = 0; it < 100000; ++it)
    pool.run_on_all([&](int t, int n) {
      EXPECT_EQ(n, 2);
      sum += t + 1;
    });
  EXPECT_EQ(sum.load(), 300000);
}

TEST(ThreadPool, WakesSleepingWorkers) {
  ThreadPool pool(3);
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin window
    std::atomic<int> ran{0};
    pool.run_on_all([&](int, int) { ran++; });
    EXPECT_EQ(ran.load(), 3);
  }
}

}  // namespace
}  // namespace deltaserve
