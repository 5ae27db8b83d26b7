// fp8 <-> f32 conversions (core/dtype.h) against independent references: every one of the 256
// codes of each format decoded from its bit fields with std::ldexp; every finite code round-trips;
// every midpoint between neighbouring codes rounds to the even code (and one f32 ulp either side
// to the nearer one); overflow saturates; and random f32 values encode to the nearest finite
// fp8 value found by a search over the decoded table.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace deltaserve {
namespace {

struct Format {
  const char* name;
  int mant, bias;
  bool fn;           // E4M3FN: no infinity, only S.1111.111 is NaN
  float max_finite;  // 448 / 57344
  float (*decode)(uint8_t);
  uint8_t (*encode)(float);
};

const Format kFormats[] = {
    {"e4m3", 3, 7, true, 448.f, f8e4m3_to_f32, f32_to_f8e4m3},
    {"e5m2", 2, 15, false, 57344.f, f8e5m2_to_f32, f32_to_f8e5m2},
};

// The value of code c from its fields, computed in double with ldexp (independent of dtype.h).
double reference_value(const Format& f, int c) {
  const int exp_bits = 7 - f.mant;
  const int e = (c >> f.mant) & ((1 << exp_bits) - 1), m = c & ((1 << f.mant) - 1);
  const double sign = (c & 0x80) ? -1.0 : 1.0;
  const int e_all = (1 << exp_bits) - 1;
  if (f.fn && e == e_all && m == (1 << f.mant) - 1) return std::numeric_limits<double>::quiet_NaN();
  if (!f.fn && e == e_all) return m == 0 ? sign * INFINITY : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(double(m), 1 - f.bias - f.mant);
  return sign * std::ldexp(1.0 + double(m) / (1 << f.mant), e - f.bias);
}

bool is_nan_code(const Format& f, uint8_t c) { return std::isnan(reference_value(f, c)); }

TEST(Fp8, EveryCodeDecodesToItsFieldValue) {
  for (const Format& f : kFormats) {
    int n_nan = 0, n_inf = 0;
    for (int c = 0; c < 256; ++c) {
      const double want = reference_value(f, c);
      const float got = f.decode(static_cast<uint8_t>(c));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << f.name << " code " << c;
        ++n_nan;
        continue;
      }
      if (std::isinf(want)) ++n_inf;
      EXPECT_EQ(double(got), want) << f.name << " code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << f.name << " code " << c;
    }
    EXPECT_EQ(n_nan, f.fn ? 2 : 6) << f.name;
    EXPECT_EQ(n_inf, f.fn ? 0 : 2) << f.name;
  }
  // Landmarks of the two formats.
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.f);
  EXPECT_EQ(f8e4m3_to_f32(0x08), std::ldexp(1.f, -6));  // smallest normal
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.f, -9));  // smallest subnormal
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.f);
  EXPECT_EQ(f8e4m3_to_f32(0xb8), -1.f);
  EXPECT_EQ(f8e5m2_to_f32(0x7b), 57344.f);
  EXPECT_EQ(f8e5m2_to_f32(0x04), std::ldexp(1.f, -14));
  EXPECT_EQ(f8e5m2_to_f32(0x01), std::ldexp(1.f, -16));
  EXPECT_EQ(f8e5m2_to_f32(0x3c), 1.f);
  EXPECT_EQ(f8e5m2_to_f32(0x7c), INFINITY);
  EXPECT_EQ(f8e5m2_to_f32(0xfc), -INFINITY);
  // E5M2 is the upper byte of an IEEE half.
  for (int c = 0; c < 256; ++c) {
    const float h = f16_to_f32(static_cast<uint16_t>(c << 8));
    if (std::isnan(h)) EXPECT_TRUE(std::isnan(f8e5m2_to_f32(static_cast<uint8_t>(c))));
    else EXPECT_EQ(f8e5m2_to_f32(static_cast<uint8_t>(c)), h) << c;
  }
}

TEST(Fp8, EveryFiniteCodeRoundTrips) {
  for (const Format& f : kFormats) {
    int n = 0;
    for (int c = 0; c < 256; ++c) {
      const float v = f.decode(static_cast<uint8_t>(c));
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(f.encode(v), c) << f.name << " code " << c << " value " << v;
      ++n;
    }
    EXPECT_EQ(n, f.fn ? 254 : 248) << f.name;
  }
}

TEST(Fp8, SpecialsSaturateAndKeepNan) {
  for (const Format& f : kFormats) {
    const uint8_t max_code = f.encode(f.max_finite);
    EXPECT_EQ(f.decode(max_code), f.max_finite) << f.name;
    for (float x : {INFINITY, std::nextafter(f.max_finite, INFINITY), 2 * f.max_finite, 1e30f,
                    std::numeric_limits<float>::max()}) {
      EXPECT_EQ(f.encode(x), max_code) << f.name << " " << x;
      EXPECT_EQ(f.encode(-x), max_code | 0x80) << f.name << " " << -x;
    }
    for (float nan : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                      std::bit_cast<float>(0x7f800001u)})
      EXPECT_TRUE(is_nan_code(f, f.encode(nan))) << f.name;
    EXPECT_EQ(f.encode(0.f), 0x00) << f.name;
    EXPECT_EQ(f.encode(-0.f), 0x80) << f.name;
    // Below half the smallest subnormal, and f32 subnormals: a zero of the input's sign.
    const float tiny = f.decode(0x01);
    for (float x : {tiny / 2, tiny / 4, std::numeric_limits<float>::denorm_min(), 1e-30f}) {
      EXPECT_EQ(f.encode(x), 0x00) << f.name << " " << x;
      EXPECT_EQ(f.encode(-x), 0x80) << f.name << " " << -x;
    }
  }
  // The largest finite values and the thresholds just above them.
  EXPECT_EQ(f32_to_f8e4m3(464.f), 0x7e);  // tie between 448 and the (missing) 480: saturated
  EXPECT_EQ(f32_to_f8e4m3(432.f), 0x7e);  // tie between 416 (0x7d) and 448 (0x7e): even is 0x7e
  EXPECT_EQ(f32_to_f8e5m2(61440.f), 0x7b);
  EXPECT_EQ(f32_to_f8e5m2(53248.f), 0x7a);  // tie between 49152 (0x7a) and 57344 (0x7b): 0x7a
}

// Midpoints of every pair of neighbouring finite values of the same sign round to the code with
// an even mantissa; one f32 ulp either side rounds to the nearer neighbour.
TEST(Fp8, MidpointsRoundToEven) {
  for (const Format& f : kFormats) {
    int ties = 0;
    for (int c = 0; c < 0x7f; ++c) {
      const float lo = f.decode(static_cast<uint8_t>(c)), hi = f.decode(static_cast<uint8_t>(c + 1));
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const float mid = (lo + hi) / 2;  // exact: at most mant + 2 significant bits
      ASSERT_EQ(double(mid), (double(lo) + double(hi)) / 2);
      const int even = (c & 1) == 0 ? c : c + 1;
      for (int sign : {0, 0x80}) {
        const float s = sign ? -1.f : 1.f;
        EXPECT_EQ(f.encode(s * mid), even | sign) << f.name << " between codes " << c << " and " << c + 1;
        EXPECT_EQ(f.encode(s * std::nextafter(mid, 0.f)), c | sign) << f.name << " below mid " << mid;
        EXPECT_EQ(f.encode(s * std::nextafter(mid, INFINITY)), (c + 1) | sign) << f.name << " above mid " << mid;
      }
      ++ties;
    }
    EXPECT_EQ(ties, f.fn ? 126 : 123) << f.name;
  }
}

// Nearest finite fp8 value by search over the decoded table; ties to the even code; beyond the
// largest finite value: saturate.
uint8_t nearest_code(const Format& f, float x) {
  const double a = std::fabs(double(x));
  int best = 0;
  double best_d = INFINITY;
  for (int c = 0; c < 0x80; ++c) {
    const double v = reference_value(f, c);
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(v - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  if (a > f.max_finite) best = f.encode(f.max_finite);
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

TEST(Fp8, RandomValuesEncodeToTheNearestCode) {
  std::mt19937 rng(7);
  for (const Format& f : kFormats) {
    // Log-uniform magnitudes from far below the subnormals to beyond the maximum, random sign.
    const float lo_exp = float(-f.bias - f.mant - 4), hi_exp = std::log2(f.max_finite) + 2;
    std::uniform_real_distribution<float> e(lo_exp, hi_exp);
    for (int i = 0; i < 200000; ++i) {
      float x = std::exp2(e(rng));
      if (rng() & 1) x = -x;
      ASSERT_EQ(f.encode(x), nearest_code(f, x)) << f.name << " x=" << x;
    }
  }
}

}  // namespace
}  // namespace deltaserve
