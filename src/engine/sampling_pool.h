// SamplingPool: host sampling spread over sequences. With a GPU the host cores are free while the
// engine samples (a step of 64 sequences over a 248k vocabulary is worth spreading); on the CPU
// backend the compute pool owns the cores, so this pool has one thread and runs inline. Each
// share has its own Sampler and probability buffer, so tasks of different sequences never share
// scratch.
#pragma once

#include <memory>
#include <vector>

#include "engine/sampler.h"
#include "util/thread_pool.h"

namespace deltaserve {

class SamplingPool {
 public:
  SamplingPool(int n_threads, int64_t vocab) : pool_(n_threads), probs_(static_cast<size_t>(n_threads)) {
    for (int i = 0; i < n_threads; ++i) samplers_.push_back(std::make_unique<Sampler>(vocab));
  }
  // A sampler for work on the calling thread (not during for_each).
  Sampler& first() { return *samplers_[0]; }
  // fn(sampler, probs, i) for i in [0, n); i's of different shares run in parallel.
  template <typename Fn>
  void for_each(int n, Fn&& fn) {
    if (n <= 0) return;
    if (pool_.n_threads() == 1 || n == 1) {
      for (int i = 0; i < n; ++i) fn(*samplers_[0], probs_[0], i);
      return;
    }
    pool_.parallel_for(n, 1, [&](int share, int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) fn(*samplers_[share], probs_[share], static_cast<int>(i));
    });
  }

 private:
  ThreadPool pool_;
  std::vector<std::unique_ptr<Sampler>> samplers_;
  std::vector<std::vector<float>> probs_;
};

}  // namespace deltaserve
