// The only place with CPU intrinsics: one small vector type per instruction set, all with the same
// static interface, so each kernel is written once (a template over the vector type) and compiled
// once per ISA in its own translation unit (cpu_matmul_avx2.cpp is built with -mavx2 -mfma, ...).
// Which types exist depends on the flags of the including file:
//   VecAvx512  16 x f32 (zmm)   needs __AVX512F__
//   VecAvx2     8 x f32 (ymm)   needs __AVX2__ and __FMA__
//   VecScalar   8 x f32 array   always (plain C++; the compiler may auto-vectorise it)
//   VecScalarN<16>              always; the AVX-512 tile shapes in plain C++ (tests)
// Everything here sits in an anonymous namespace on purpose: a header compiled with different
// -m flags in different files must not produce one shared (COMDAT) symbol that the linker could
// pick from the AVX-512 file and then call on a CPU without AVX-512.
//
// bf16 pairs: the packed weights keep two bf16 values per 32-bit lane (lo = even k, hi = odd k).
// An exact f32 of the lo half is `lane << 16`, of the hi half `lane & 0xffff0000`; no shuffles.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace deltaserve::simd {
namespace {

#if defined(__AVX512F__)
struct VecAvx512 {
  using F = __m512;
  static constexpr int kLanes = 16;
  static F zero() { return _mm512_setzero_ps(); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F bcast(const float* p) { return _mm512_set1_ps(*p); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }  // a*b + c
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  // In place: r[i] (row i of a kLanes x kLanes block) becomes column i. Unpack, shuffle within
  // 128-bit lanes, then across them.
  static void transpose(F r[16]) {
    F t[16], u[16];
    for (int i = 0; i < 16; i += 2) {  // per 128-bit lane L: rows i, i+1 interleaved, columns 4L..4L+3
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  // u[i + c], lane L: column 4L + c of rows i .. i+3
      u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
      u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
      u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {  // column 4L + c: lane L of u[c], u[4 + c], u[8 + c], u[12 + c]
      const F x0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), x1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
      const F y0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
      const F y1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
      r[c] = _mm512_shuffle_f32x4(x0, y0, 0x88);
      r[4 + c] = _mm512_shuffle_f32x4(x0, y0, 0xDD);
      r[8 + c] = _mm512_shuffle_f32x4(x1, y1, 0x88);
      r[12 + c] = _mm512_shuffle_f32x4(x1, y1, 0xDD);
    }
  }
  static void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
  // p: kLanes uint32 lanes, each holding two bf16 (lo, hi).
  static F bf16_lo(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(p), 16));
  }
  static F bf16_hi(const uint16_t* p) {
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
struct VecAvx2 {
  using F = __m256;
  static constexpr int kLanes = 8;
  static F zero() { return _mm256_setzero_ps(); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  // In place: r[i] (row i of a kLanes x kLanes block) becomes column i. Unpack, shuffle within
  // 128-bit halves, then swap the halves.
  static void transpose(F r[8]) {
    F t[8], u[8];
    for (int i = 0; i < 8; i += 2) {  // per half H: rows i, i+1 interleaved, columns 4H..4H+3
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {  // u[i + c], half H: column 4H + c of rows i .. i+3
      u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
      u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
      u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {  // column c: the low halves of u[c], u[4 + c]; column 4 + c: the high ones
      r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
      r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
  }
  static void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
  static F bf16_lo(const uint16_t* p) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  static F bf16_hi(const uint16_t* p) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};
#endif

// N floats in plain C++. N = 8 is the portable kernel; N = 16 runs the AVX-512 tiling
// (cpu_matmul_kernels.h picks tiles by lane count) on any CPU, for tests.
template <int N>
struct VecScalarN {
  struct F {
    float v[N];
  };
  static constexpr int kLanes = N;
  static F zero() { return F{}; }
  static F load(const float* p) {
    F r;
    for (int i = 0; i < N; ++i) r.v[i] = p[i];
    return r;
  }
  static void store(float* p, F a) {
    for (int i = 0; i < N; ++i) p[i] = a.v[i];
  }
  static F bcast(const float* p) {
    F r;
    for (int i = 0; i < N; ++i) r.v[i] = *p;
    return r;
  }
  static F fma(F a, F b, F c) {
    for (int i = 0; i < N; ++i) c.v[i] += a.v[i] * b.v[i];
    return c;
  }
  static F add(F a, F b) {
    for (int i = 0; i < N; ++i) a.v[i] += b.v[i];
    return a;
  }
  static F mul(F a, F b) {
    for (int i = 0; i < N; ++i) a.v[i] *= b.v[i];
    return a;
  }
  static void prefetch(const void* p) { __builtin_prefetch(p); }
  static F bf16_lo(const uint16_t* p) {
    F r;
    for (int i = 0; i < N; ++i) {
      uint32_t u = static_cast<uint32_t>(p[2 * i]) << 16;
      std::memcpy(&r.v[i], &u, 4);
    }
    return r;
  }
  static F bf16_hi(const uint16_t* p) {
    F r;
    for (int i = 0; i < N; ++i) {
      uint32_t u = static_cast<uint32_t>(p[2 * i + 1]) << 16;
      std::memcpy(&r.v[i], &u, 4);
    }
    return r;
  }
};
using VecScalar = VecScalarN<8>;

}  // namespace
}  // namespace deltaserve::simd
