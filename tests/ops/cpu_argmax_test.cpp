// Kernels::argmax_rows on the CPU (vec::argmax): the first index of the largest number, NaNs
// skipped, 0 when a row is all NaN; ties, -inf rows, rows shorter than a vector and past one.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/backend.h"

namespace deltaserve {
namespace {

int64_t reference(const float* row, int64_t V) {
  int64_t want = -1;
  for (int64_t i = 0; i < V; ++i)
    if (!std::isnan(row[i]) && (want < 0 || row[i] > row[want])) want = i;
  return want < 0 ? 0 : want;
}

TEST(CpuArgmax, FirstLargestSkippingNans) {
  auto backend = make_cpu_backend(1);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  int checked = 0;
  for (int64_t V : {int64_t(1), int64_t(7), int64_t(16), int64_t(17), int64_t(1000), int64_t(8192)}) {
    const int64_t R = 8;
    std::vector<float> x(static_cast<size_t>(R * V));
    for (auto& v : x) v = u(rng);
    auto at = [&](int64_t r, int64_t i) -> float& { return x[static_cast<size_t>(r * V + std::min(i, V - 1))]; };
    at(1, V / 2) = 9.f, at(1, V - 1) = 9.f;                        // a tie: the first wins
    for (int64_t i = 0; i < V; ++i) at(2, i) = -1.f;               // all equal: 0
    for (int64_t i = 0; i < V; ++i) at(3, i) = -inf;               // all -inf: 0
    for (int64_t i = 0; i < V; ++i) at(4, i) = nan;                // all NaN: 0
    at(5, 0) = nan, at(5, V / 3) = 30.f, at(5, V - 1) = nan;       // NaNs around the largest
    for (int64_t i = 0; i < V; ++i) at(6, i) = i % 2 ? nan : -inf;  // -inf among NaNs: the first -inf
    at(7, V - 1) = 50.f;                                           // the last element
    std::vector<int32_t> out(R, -7);
    backend->kernels().argmax_rows(Tensor(x.data(), DType::F32, {R, V}), Tensor(out.data(), DType::I32, {R}));
    for (int64_t r = 0; r < R; ++r) {
      EXPECT_EQ(out[r], reference(x.data() + r * V, V)) << "V " << V << " row " << r;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 48);
}

}  // namespace
}  // namespace deltaserve
