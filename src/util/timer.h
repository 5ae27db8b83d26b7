// Steady-clock helpers for step metrics and benchmarks.
#pragma once

#include <chrono>

namespace deltaserve {

inline double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

class Stopwatch {
 public:
  Stopwatch() : start_(now_seconds()) {}
  double seconds() const { return now_seconds() - start_; }
  void reset() { start_ = now_seconds(); }

 private:
  double start_;
};

}  // namespace deltaserve
