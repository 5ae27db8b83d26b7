// Tensor-core building blocks shared by the attention kernels (cuda_flash_attention.cu,
// cuda_decode_attention_mma.cu) and the chunked GDN (cuda_gdn_chunked_mma.cu): cp.async copies into
// shared memory, ldmatrix, mma.sync m16n8k16 and bf16 packing, 1xTF32 / 3xTF32 m16n8k8 products; and the
// device's opt-in shared-memory limit. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_launch.h"

namespace deltaserve::cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; src_bytes = 0 writes zeros (src not read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// d += a · b, m16n8k16, row-major A (4 regs), column-major B (2 regs), f32 accumulators.
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// f32 products on tensor cores to ~f32 accuracy (3xTF32): x = hi + lo, hi = x with its low 13
// mantissa bits cleared (exact TF32), lo = x - hi (exact in f32; the mma reads its top 19 bits);
// a·b ~= a_lo·b_hi + a_hi·b_lo + a_hi·b_hi, with the dropped and truncated terms ~2^-20 relative.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = __float_as_uint(x) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi));
}
// d += a · b, m16n8k8 TF32: A 16x8 row-major (a0: (g, t), a1: (g+8, t), a2: (g, t+4), a3: (g+8, t+4)),
// B 8x8 (b0: (t, g), b1: (t+4, g)), D 16x8 (d0, d1: (g, 2t + {0,1}); d2, d3: (g+8, 2t + {0,1})), with
// g = lane / 4, t = lane % 4.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// x rounded to the nearest TF32 (10 mantissa bits), for one-product (1xTF32) mmas.
__device__ __forceinline__ uint32_t round_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
// One warp: acc[nt] (rows 0..15, columns 8 nt .. 8 nt + 7) += A[16 x 8 KSTEPS] · B[8 KSTEPS x 8 NT] on
// tensor cores from shared memory: A(r, k) = A[r * LDA + k * KA], B(k, n) = B[k * KB + n * NB]
// (compile-time strides: every fragment load is one instruction with an immediate offset).
// PARTS 3: 3xTF32, ~f32-accurate (exact mode); 1: one TF32 product of the rounded operands (~2^-11
// relative per operand: the default mode, finer than the bf16 its GEMMs' inputs are rounded to).
// ILP (3 parts): the three terms go to three accumulators (dependent mma chains a third as long, for
// long K; 2 NT x 4 more registers).
template <int PARTS, int NT, int KSTEPS, int LDA, int KA, int KB, int NB, bool ILP = false>
__device__ __forceinline__ void mma_tf32xn(float (&acc)[NT][4], const float* A, const float* B) {
  static_assert(PARTS == 1 || PARTS == 3, "1xTF32 or 3xTF32");
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float* a = A + g * LDA + t * KA;
  const float* b = B + t * KB + g * NB;
  constexpr bool kIlp = ILP && PARTS == 3;
  float c1[kIlp ? NT : 1][4] = {}, c2[kIlp ? NT : 1][4] = {};
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks) {
    const float av[4] = {a[8 * ks * KA], a[8 * LDA + 8 * ks * KA], a[(8 * ks + 4) * KA],
                         a[8 * LDA + (8 * ks + 4) * KA]};
    uint32_t ah[4], al[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (PARTS == 3) split_tf32(av[i], ah[i], al[i]);
      else ah[i] = round_tf32(av[i]);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float b0 = b[8 * ks * KB + 8 * nt * NB], b1 = b[(8 * ks + 4) * KB + 8 * nt * NB];
      if constexpr (PARTS == 3) {
        uint32_t bh0, bl0, bh1, bl1;
        split_tf32(b0, bh0, bl0);
        split_tf32(b1, bh1, bl1);
        mma_tf32(kIlp ? c1[kIlp ? nt : 0] : acc[nt], al, bh0, bh1);
        mma_tf32(kIlp ? c2[kIlp ? nt : 0] : acc[nt], ah, bl0, bl1);
        mma_tf32(acc[nt], ah, bh0, bh1);
      } else {
        mma_tf32(acc[nt], ah, round_tf32(b0), round_tf32(b1));
      }
    }
  }
  if constexpr (kIlp) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][e] += c1[nt][e] + c2[nt][e];
  }
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo: the lower column
  return *reinterpret_cast<uint32_t*>(&v);
}

// The current device's opt-in shared memory per block (bytes), asked once per device.
inline int device_smem_optin() {
  return device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, current_device(), 48 * 1024);
}

}  // namespace deltaserve::cuda
