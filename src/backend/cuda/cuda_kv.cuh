// KV cache elements on the device, per KvType (cuda_launch.h): the storage type, encoding one f32
// and decoding 16 bytes at a time. Included by the attention .cu files only.
//
// Encoding matches core/dtype.h bit for bit (round to nearest even; fp8 saturating at the largest
// finite value, __NV_SATFINITE), so the CPU reference and the GPU write the same cache bytes for
// the same f32 input. fp8 uses cuda_fp8.h's conversions: hardware cvt on sm_89+, the header's
// exact emulation on sm_86.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/cuda_launch.h"

namespace deltaserve::cuda {

template <KvType KV>
struct KvTraits;
template <>
struct KvTraits<KvType::F32> {
  using Storage = float;
};
template <>
struct KvTraits<KvType::BF16> {
  using Storage = uint16_t;
};
template <>
struct KvTraits<KvType::E4M3> {
  using Storage = uint8_t;
  static constexpr __nv_fp8_interpretation_t kInterp = __NV_E4M3;
};
template <>
struct KvTraits<KvType::E5M2> {
  using Storage = uint8_t;
  static constexpr __nv_fp8_interpretation_t kInterp = __NV_E5M2;
};

template <KvType KV>
using KvStorage = typename KvTraits<KV>::Storage;

// Elements per 16-byte chunk (4 f32, 8 bf16, 16 fp8).
template <KvType KV>
constexpr int kv_per_chunk() {
  return static_cast<int>(16 / sizeof(KvStorage<KV>));
}

template <KvType KV>
__device__ __forceinline__ KvStorage<KV> kv_encode(float x) {
  if constexpr (KV == KvType::F32) {
    return x;
  } else if constexpr (KV == KvType::BF16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  } else {
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, KvTraits<KV>::kInterp);
  }
}

template <KvType KV>
__device__ __forceinline__ float kv_decode(KvStorage<KV> s) {
  if constexpr (KV == KvType::F32) {
    return s;
  } else if constexpr (KV == KvType::BF16) {
    return __uint_as_float(static_cast<uint32_t>(s) << 16);
  } else {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(s, KvTraits<KV>::kInterp)));
  }
}

// NW 32-bit words of stored elements (lowest address first) -> NW * 4 / sizeof(storage) floats
// (unscaled).
template <KvType KV, int NW>
__device__ __forceinline__ void kv_decode_words(const uint32_t* w, float* out) {
#pragma unroll
  for (int i = 0; i < NW; ++i) {
    if constexpr (KV == KvType::F32) {
      out[i] = __uint_as_float(w[i]);
    } else if constexpr (KV == KvType::BF16) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const auto pair = static_cast<__nv_fp8x2_storage_t>(w[i] >> (16 * h));  // .x = the lower byte
        const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, KvTraits<KV>::kInterp)));
        out[4 * i + 2 * h] = f.x;
        out[4 * i + 2 * h + 1] = f.y;
      }
    }
  }
}

// One 16-byte chunk of stored elements -> kv_per_chunk<KV>() floats (unscaled), lowest address first.
template <KvType KV>
__device__ __forceinline__ void kv_decode_chunk(const uint4& raw, float* out) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  kv_decode_words<KV, 4>(w, out);
}

}  // namespace deltaserve::cuda
