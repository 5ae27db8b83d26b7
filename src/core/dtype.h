// Element types of tensors and checkpoints.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace deltaserve {

// F8E4M3 / F8E5M2: the two OCP 8-bit floats (KV cache storage). E4M3 is the "fn" variant
// (float8_e4m3fn: no infinities, one NaN pattern per sign, largest finite 448); E5M2 is IEEE-like
// (infinities and NaNs, largest finite 57344).
enum class DType : uint8_t { F32, F16, BF16, I32, I64, U8, F8E4M3, F8E5M2 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
    case DType::F8E4M3: return 1;
    case DType::F8E5M2: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
    case DType::F8E4M3: return "fp8_e4m3";
    case DType::F8E5M2: return "fp8_e5m2";
  }
  return "?";
}

// bf16 <-> f32. bf16 is the upper half of an IEEE f32; rounding is to nearest even.
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// IEEE half -> f32 (portable; no F16C needed).
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- fp8 <-> f32 ----------------------------------------------------------------------------
// Decoding is exact (every fp8 value is an f32). Encoding rounds to nearest, ties to even, and
// saturates: a finite value beyond the largest finite fp8 (and +-inf) becomes +-max, as CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...) does, so host and device caches agree bit for bit.
// NaN becomes 0x7f (a NaN in both formats). |x| at or below half the smallest subnormal becomes a
// zero of x's sign.
namespace fp8_detail {

// kMant mantissa bits, exponent bias kBias. E4M3FN has no infinity: only S.1111.111 is NaN, so
// its largest finite code is 0x7e (448); E5M2's all-ones exponent holds inf / NaN, largest finite
// code 0x7b (57344).
struct E4M3 {
  static constexpr int kMant = 3, kBias = 7;
  static constexpr uint32_t kMaxCode = 0x7e;
  static constexpr bool is_nan(uint32_t mag) { return mag == 0x7f; }
  static constexpr bool is_inf(uint32_t) { return false; }
};
struct E5M2 {
  static constexpr int kMant = 2, kBias = 15;
  static constexpr uint32_t kMaxCode = 0x7b;
  static constexpr bool is_nan(uint32_t mag) { return mag > 0x7c; }
  static constexpr bool is_inf(uint32_t mag) { return mag == 0x7c; }
};

// 2^e as an f32 (e within the normal f32 exponent range).
constexpr float pow2(int e) { return std::bit_cast<float>(static_cast<uint32_t>(e + 127) << 23); }

template <typename F>
constexpr float decode(uint8_t c) {
  const uint32_t mag = c & 0x7fu, e = mag >> F::kMant, m = mag & ((1u << F::kMant) - 1);
  float v = 0.f;
  if (F::is_nan(mag)) v = std::bit_cast<float>(0x7fc00000u);
  else if (F::is_inf(mag)) v = std::bit_cast<float>(0x7f800000u);
  else if (e == 0) v = float(m) * pow2(1 - F::kBias - F::kMant);  // subnormal: m * 2^(emin - M)
  else v = float((1u << F::kMant) | m) * pow2(int(e) - F::kBias - F::kMant);
  return (c & 0x80u) ? -v : v;
}

template <typename F>
constexpr std::array<float, 256> decode_table() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) t[c] = decode<F>(static_cast<uint8_t>(c));
  return t;
}

// v >> s rounded to nearest, ties to even (1 <= s <= 31).
constexpr uint32_t shift_rne(uint32_t v, int s) {
  const uint32_t q = v >> s, rem = v & ((1u << s) - 1), half = 1u << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

template <typename F>
constexpr uint8_t encode(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;  // NaN
  const uint32_t sign = (u >> 24) & 0x80u;
  const int e = static_cast<int>(a >> 23) - 127;  // unbiased f32 exponent (normal a)
  const int emin = 1 - F::kBias;                   // exponent of the smallest normal fp8
  uint32_t code = 0;
  if (a < 0x00800000u) {
    code = 0;  // f32 zero or subnormal: far below the smallest fp8 subnormal
  } else if (a >= 0x7f800000u || e > 30) {
    code = F::kMaxCode;  // inf or far beyond the range: saturate
  } else {
    const uint32_t sig = (a & 0x7fffffu) | 0x800000u;  // 24-bit significand 1.m
    if (e >= emin) {
      // Round to kMant bits; a carry into 2^(kMant+1) moves the exponent up by one.
      const uint32_t q = shift_rne(sig, 23 - F::kMant);  // in [2^M, 2^(M+1)]
      code = (static_cast<uint32_t>(e + F::kBias - 1) << F::kMant) + q;
    } else {
      // Subnormal fp8: |x| / 2^(emin - M), rounded to an integer (2^M is the smallest normal).
      const int s = 23 - F::kMant + (emin - e);
      code = s > 25 ? 0u : shift_rne(sig, s);
    }
    if (code > F::kMaxCode) code = F::kMaxCode;
  }
  return static_cast<uint8_t>(sign | code);
}

}  // namespace fp8_detail

inline constexpr std::array<float, 256> kF8E4M3ToF32 = fp8_detail::decode_table<fp8_detail::E4M3>();
inline constexpr std::array<float, 256> kF8E5M2ToF32 = fp8_detail::decode_table<fp8_detail::E5M2>();

inline float f8e4m3_to_f32(uint8_t c) { return kF8E4M3ToF32[c]; }
inline float f8e5m2_to_f32(uint8_t c) { return kF8E5M2ToF32[c]; }
inline uint8_t f32_to_f8e4m3(float x) { return fp8_detail::encode<fp8_detail::E4M3>(x); }
inline uint8_t f32_to_f8e5m2(float x) { return fp8_detail::encode<fp8_detail::E5M2>(x); }

}  // namespace deltaserve
