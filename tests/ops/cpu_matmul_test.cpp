// cpu_matmul / cpu_matmul_multi against a double-precision reference, for every kernel family this
// CPU can run (the others are reported as skipped), bf16 / f32 / f16 weights, odd shapes, row
// strides, accumulate and 1 or 2 threads.
//
// Tolerance: |out - ref| <= kRelTol * sqrt(k) * (sum_t |x_t * w_t| + |out_before|), i.e. relative to
// the magnitude of the terms (the result itself may cancel to ~0). f32 accumulation over k terms
// in a handful of chains gives ~eps_f32 * sqrt(k) typically; kRelTol = 1e-6 (~8 eps) leaves room
// while catching any wrong, missing or doubled term (each term is >= 0.01 of the sum's scale / k).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_matmul_internal.h"
#include "core/dtype.h"
#include "util/thread_pool.h"

namespace deltaserve {
namespace {

constexpr double kRelTol = 1e-6;

// Nonzero values in [-1, -0.1] U [0.1, 1].
float nonzero(std::mt19937& rng) {
  std::uniform_real_distribution<float> mag(0.1f, 1.0f);
  return (rng() & 1) ? mag(rng) : -mag(rng);
}

uint16_t f32_to_f16(float f) {  // round-to-nearest for |f| in the normal f16 range
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffffu;
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  if ((mant >> 12) & 1) ++h;  // round half up: fine for test data
  return static_cast<uint16_t>(h);
}

// A random [n, k] weight in `dtype`, plus its exact values as double.
struct TestWeight {
  CpuWeight w;
  std::vector<double> values;  // [n, k]
};

TestWeight make_weight(DType dtype, int64_t n, int64_t k, std::mt19937& rng) {
  TestWeight t;
  t.values.resize(static_cast<size_t>(n * k));
  if (dtype == DType::BF16 || dtype == DType::F16) {
    std::vector<uint16_t> raw(static_cast<size_t>(n * k));
    for (size_t i = 0; i < raw.size(); ++i) {
      float f = nonzero(rng);
      raw[i] = dtype == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f);
      t.values[i] = dtype == DType::BF16 ? bf16_to_f32(raw[i]) : f16_to_f32(raw[i]);
    }
    t.w = CpuWeight::from(raw.data(), dtype, n, k);
  } else {
    std::vector<float> raw(static_cast<size_t>(n * k));
    for (size_t i = 0; i < raw.size(); ++i) t.values[i] = raw[i] = nonzero(rng);
    t.w = CpuWeight::from(raw.data(), dtype, n, k);
  }
  EXPECT_EQ(t.w.n(), n);
  EXPECT_EQ(t.w.k(), k);
  return t;
}

// x: [m, k] with row stride ldx; the padding columns hold NaN so a kernel reading past k fails.
std::vector<float> make_x(int64_t m, int64_t k, int64_t ldx, std::mt19937& rng) {
  std::vector<float> x(static_cast<size_t>(m * ldx), std::numeric_limits<float>::quiet_NaN());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t t = 0; t < k; ++t) x[i * ldx + t] = nonzero(rng);
  return x;
}

constexpr float kSentinel = 12345.0f;

// out: [m + 1, ldo] pre-filled with values (accumulate) or sentinels; checks the m x n results and
// that the padding columns and the extra row are untouched.
void check_result(const std::vector<float>& x, int64_t m, int64_t k, int64_t ldx,
                  const TestWeight& tw, const std::vector<float>& before,
                  const std::vector<float>& out, int64_t ldo, bool accumulate,
                  const std::string& what) {
  const int64_t n = tw.w.n();
  double worst = 0;
  int n_bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0, mag = 0;
      for (int64_t t = 0; t < k; ++t) {
        double term = static_cast<double>(x[i * ldx + t]) * tw.values[j * k + t];
        ref += term;
        mag += std::fabs(term);
      }
      if (accumulate) {
        ref += before[i * ldo + j];
        mag += std::fabs(before[i * ldo + j]);
      }
      double err = std::fabs(out[i * ldo + j] - ref) / (mag * std::sqrt(static_cast<double>(k)));
      if (!(err <= kRelTol)) {  // also catches NaN
        if (++n_bad <= 5)
          ADD_FAILURE() << what << " out[" << i << "][" << j << "] = " << out[i * ldo + j]
                        << " ref " << ref << " scaled err " << err;
      }
      if (err > worst) worst = err;
    }
    for (int64_t j = n; j < ldo; ++j)
      if (out[i * ldo + j] != before[i * ldo + j]) {
        ADD_FAILURE() << what << " wrote padding column " << j << " of row " << i;
        return;
      }
  }
  for (int64_t j = 0; j < ldo; ++j)
    if (out[m * ldo + j] != before[m * ldo + j]) {
      ADD_FAILURE() << what << " wrote row m = " << m;
      return;
    }
  EXPECT_EQ(n_bad, 0) << what << " (worst scaled error " << worst << ")";
}

struct Case {
  CpuIsa isa;
  DType dtype;
  int64_t n, k;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(cpu_isa_name(c.isa)) + "_" + std::string(dtype_name(c.dtype)) + "_n" +
         std::to_string(c.n) + "_k" + std::to_string(c.k);
}

class CpuMatmulTest : public testing::TestWithParam<Case> {};

TEST_P(CpuMatmulTest, MatchesDoubleReference) {
  const Case c = GetParam();
  if (!cpu_isa_supported(c.isa))
    GTEST_SKIP() << cpu_isa_name(c.isa) << " kernels not supported by this CPU";
  std::mt19937 rng(static_cast<uint32_t>(c.n * 7919 + c.k * 31 + static_cast<int>(c.dtype)));
  TestWeight tw = make_weight(c.dtype, c.n, c.k, rng);
  ThreadPool pool1(1), pool2(2);
  std::vector<int64_t> ms = {1, 2, 3, 7, 8, 33, 300};
  if (c.n * c.k > 1'000'000) ms = {1, 2, 3, 8};  // keep the double reference quick
  for (int64_t m : ms) {
    for (int strided = 0; strided < 2; ++strided) {
      const int64_t ldx = strided ? c.k + 5 : c.k, ldo = strided ? c.n + 3 : c.n;
      std::vector<float> x = make_x(m, c.k, ldx, rng);
      for (int accumulate = 0; accumulate < 2; ++accumulate) {
        for (ThreadPool* pool : {&pool1, &pool2}) {
          // m = 300: the double reference dominates the run time; two of the eight variants.
          if (m == 300 && (accumulate != strided || (pool == &pool1) != (strided == 0))) continue;
          std::vector<float> before(static_cast<size_t>((m + 1) * ldo), kSentinel);
          if (accumulate)
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < c.n; ++j) before[i * ldo + j] = nonzero(rng);
          std::vector<float> out = before;
          cpu_matmul(*pool, x.data(), m, ldx, tw.w, out.data(), ldo, accumulate != 0, c.isa);
          check_result(x, m, c.k, ldx, tw, before, out, ldo, accumulate != 0,
                       "m=" + std::to_string(m) + " ldx=" + std::to_string(ldx) +
                           " ldo=" + std::to_string(ldo) + " acc=" + std::to_string(accumulate) +
                           " threads=" + std::to_string(pool->n_threads()));
          if (HasFailure()) return;
        }
      }
    }
  }
}

std::vector<Case> all_cases() {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1},    {1, 256},  {4, 256},  {5, 3},     {8, 7},     {16, 16},  {17, 33},
      {31, 17},  {48, 100}, {100, 999}, {256, 256}, {512, 256}, {256, 768}, {768, 256},
      {8192, 256}};
  std::vector<Case> cases;
  for (CpuIsa isa : {CpuIsa::Portable, CpuIsa::Avx2, CpuIsa::Avx512})
    for (DType dtype : {DType::BF16, DType::F32, DType::F16})
      for (auto [n, k] : shapes) {
        if (dtype != DType::BF16 && n * k > 200'000) continue;  // big shapes: bf16 only
        cases.push_back({isa, dtype, n, k});
      }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, CpuMatmulTest, testing::ValuesIn(all_cases()), case_name);

// The AVX-512 tiling (16 lanes: MR 8 x 2 panels; 4 panels side by side for decode) run in plain
// C++, so its loop structure is checked on every CPU; the AVX-512 intrinsics themselves are thin
// wrappers in simd.h, run by the avx512 cases above where the CPU has them. The work is split
// into row and panel blocks the way cpu_matmul's threads split it.
class CpuMatmulWideTilesTest : public testing::TestWithParam<Case> {};

TEST_P(CpuMatmulWideTilesTest, MatchesDoubleReference) {
  const Case c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.n * 131 + c.k));
  TestWeight tw = make_weight(c.dtype, c.n, c.k, rng);
  const cpu::PackedWeight pw = cpu::packed_view(tw.w);
  for (int64_t m : {1, 2, 3, 7, 8, 9, 17, 33, 100}) {
    if (m > 9 && c.n * c.k > 1'000'000) continue;
    const int64_t ldx = c.k + 3, ldo = c.n + 1;
    std::vector<float> x = make_x(m, c.k, ldx, rng);
    for (int accumulate = 0; accumulate < 2; ++accumulate) {
      std::vector<float> before(static_cast<size_t>((m + 1) * ldo), kSentinel);
      if (accumulate)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < c.n; ++j) before[i * ldo + j] = nonzero(rng);
      std::vector<float> out = before;
      const cpu::MatmulArgs a{x.data(), ldx, out.data(), ldo, accumulate != 0};
      if (accumulate) {  // two row blocks x two panel blocks, like a 2-thread split
        const int64_t mh = m / 2, ph = (pw.n_panels + 1) / 2;
        for (auto [m0, m1] : {std::pair{int64_t{0}, mh}, std::pair{mh, m}})
          for (auto [p0, p1] : {std::pair{int64_t{0}, ph}, std::pair{ph, pw.n_panels}})
            cpu::matmul_block_portable16(pw, a, m0, m1, p0, p1);
      } else {
        cpu::matmul_block_portable16(pw, a, 0, m, 0, pw.n_panels);
      }
      check_result(x, m, c.k, ldx, tw, before, out, ldo, accumulate != 0,
                   "wide tiles m=" + std::to_string(m) + " acc=" + std::to_string(accumulate));
      if (HasFailure()) return;
    }
  }
}

std::vector<Case> wide_cases() {
  std::vector<Case> cases;
  for (const Case& c : all_cases())
    if (c.isa == CpuIsa::Portable) cases.push_back(c);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, CpuMatmulWideTilesTest, testing::ValuesIn(wide_cases()), case_name);

// Several weights sharing x in one parallel region, mixed dtypes and n, accumulate per output.
class CpuMatmulMultiTest : public testing::TestWithParam<CpuIsa> {};

TEST_P(CpuMatmulMultiTest, MatchesSeparateProducts) {
  const CpuIsa isa = GetParam();
  if (!cpu_isa_supported(isa)) GTEST_SKIP() << cpu_isa_name(isa) << " not supported by this CPU";
  std::mt19937 rng(7);
  const int64_t k = 257;
  std::vector<TestWeight> tws;
  tws.push_back(make_weight(DType::BF16, 512, k, rng));
  tws.push_back(make_weight(DType::BF16, 4, k, rng));
  tws.push_back(make_weight(DType::F32, 100, k, rng));
  tws.push_back(make_weight(DType::BF16, 768, k, rng));
  ThreadPool pool2(2);
  for (int64_t m : {1, 3, 8, 70}) {
    const int64_t ldx = k + 1;
    std::vector<float> x = make_x(m, k, ldx, rng);
    std::vector<std::vector<float>> before(tws.size()), outs(tws.size());
    std::vector<CpuMatmulOut> specs;
    for (size_t o = 0; o < tws.size(); ++o) {
      const int64_t ldo = tws[o].w.n() + 1;
      before[o].assign(static_cast<size_t>((m + 1) * ldo), kSentinel);
      const bool acc = o % 2 == 1;
      if (acc)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < tws[o].w.n(); ++j) before[o][i * ldo + j] = nonzero(rng);
      outs[o] = before[o];
      specs.push_back({&tws[o].w, outs[o].data(), ldo, acc});
    }
    cpu_matmul_multi(pool2, x.data(), m, ldx, specs, isa);
    for (size_t o = 0; o < tws.size(); ++o)
      check_result(x, m, k, ldx, tws[o], before[o], outs[o], specs[o].ldo, specs[o].accumulate,
                   "multi m=" + std::to_string(m) + " out " + std::to_string(o));
  }
}

INSTANTIATE_TEST_SUITE_P(All, CpuMatmulMultiTest,
                         testing::Values(CpuIsa::Portable, CpuIsa::Avx2, CpuIsa::Avx512),
                         [](const testing::TestParamInfo<CpuIsa>& info) {
                           return std::string(cpu_isa_name(info.param));
                         });

// Batch invariance (cpu_matmul_kernels.h): a row's result is the same bits whatever rows are
// computed beside it, for every tile shape (1, 2, 3 rows; the GEMM tile and its tails; the L2 row
// blocks), k over several k blocks and odd, n with a partial panel, accumulate or not, one thread
// or the work split between two (rows or panels). The reference is each row computed alone.
enum class InvariancePath { Portable, Avx2, Avx512, Portable16 };

class CpuMatmulBatchInvarianceTest : public testing::TestWithParam<InvariancePath> {};

TEST_P(CpuMatmulBatchInvarianceTest, EveryRowIsTheSameBitsAtEveryRowCount) {
  const InvariancePath path = GetParam();
  const CpuIsa isa = path == InvariancePath::Avx2     ? CpuIsa::Avx2
                     : path == InvariancePath::Avx512 ? CpuIsa::Avx512
                                                      : CpuIsa::Portable;
  if (!cpu_isa_supported(isa)) GTEST_SKIP() << cpu_isa_name(isa) << " not supported by this CPU";
  ThreadPool pool1(1), pool2(2);
  std::mt19937 rng(11);
  const int64_t kRows = 200;
  for (DType dtype : {DType::BF16, DType::F32})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{50, 777}, {96, 256}, {33, 1030}, {200, 64}}) {
      TestWeight tw = make_weight(dtype, n, k, rng);
      const cpu::PackedWeight pw = cpu::packed_view(tw.w);
      const int64_t ldx = k + 1, ldo = n + 2;
      const std::vector<float> x = make_x(kRows, k, ldx, rng);
      std::vector<float> init(static_cast<size_t>(kRows * ldo));
      for (float& v : init) v = nonzero(rng);
      // Rows [m0, m1) of x into out (threads: 1, or 2 with the work split as cpu_matmul splits it).
      auto run = [&](std::vector<float>& out, int64_t m0, int64_t m1, bool acc, int threads, int split) {
        const float* xr = x.data() + m0 * ldx;
        float* o = out.data() + m0 * ldo;
        if (path != InvariancePath::Portable16) {
          cpu_matmul(threads == 1 ? pool1 : pool2, xr, m1 - m0, ldx, tw.w, o, ldo, acc, isa);
          return;
        }
        const cpu::MatmulArgs a{xr, ldx, o, ldo, acc};
        const int64_t m = m1 - m0, mh = split == 1 ? m / 2 : m, ph = split == 2 ? pw.n_panels / 2 : pw.n_panels;
        for (auto [r0, r1] : {std::pair{int64_t{0}, mh}, std::pair{mh, m}})
          for (auto [p0, p1] : {std::pair{int64_t{0}, ph}, std::pair{ph, pw.n_panels}})
            cpu::matmul_block_portable16(pw, a, r0, r1, p0, p1);
      };
      for (int acc = 0; acc < 2; ++acc) {
        std::vector<float> alone = init;
        for (int64_t i = 0; i < kRows; ++i) run(alone, i, i + 1, acc != 0, 1, 0);
        for (int64_t m : {2, 3, 4, 5, 7, 8, 9, 12, 13, 17, 24, 25, 63, 64, 65, 97, 200})
          for (int variant = 0; variant < 3; ++variant) {  // 1 thread; 2 threads (row / panel split)
            std::vector<float> batch = init;
            const int64_t m0 = (m * 7) % 5;  // the rows need not start at row 0
            const int64_t m1 = std::min(kRows, m0 + m);
            run(batch, m0, m1, acc != 0, variant == 0 ? 1 : 2, variant);
            for (int64_t i = m0; i < m1; ++i)
              if (std::memcmp(&batch[i * ldo], &alone[i * ldo], n * sizeof(float)) != 0) {
                int64_t j = 0;
                while (batch[i * ldo + j] == alone[i * ldo + j]) ++j;
                FAIL() << dtype_name(dtype) << " n " << n << " k " << k << " acc " << acc << ": rows ["
                       << m0 << ", " << m1 << ") variant " << variant << ": row " << i << " col " << j << " is "
                       << batch[i * ldo + j] << " in the batch, " << alone[i * ldo + j] << " alone";
              }
          }
      }
    }
}

INSTANTIATE_TEST_SUITE_P(All, CpuMatmulBatchInvarianceTest,
                         testing::Values(InvariancePath::Portable, InvariancePath::Avx2, InvariancePath::Avx512,
                                         InvariancePath::Portable16),
                         [](const testing::TestParamInfo<InvariancePath>& info) {
                           switch (info.param) {
                             case InvariancePath::Portable: return std::string("portable");
                             case InvariancePath::Avx2: return std::string("avx2");
                             case InvariancePath::Avx512: return std::string("avx512");
                             case InvariancePath::Portable16: return std::string("portable16");
                           }
                           return std::string("?");
                         });

TEST(CpuMatmulIsa, BestIsSupportedAndNamed) {
  EXPECT_TRUE(cpu_isa_supported(cpu_best_isa()));
  EXPECT_TRUE(cpu_isa_supported(CpuIsa::Portable));
  EXPECT_EQ(cpu_matmul_isa(), cpu_isa_name(cpu_best_isa()));
  std::printf("[          ] kernel family on this CPU: %s\n", cpu_matmul_isa().c_str());
}

}  // namespace
}  // namespace deltaserve
