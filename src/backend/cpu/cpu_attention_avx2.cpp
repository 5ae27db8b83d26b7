// AVX2 instantiation of cpu_attention_scores.h. Built with -mavx2 -mfma (CMakeLists.txt); called
// only where the CPU runs vec.cpp's x86-64-v3 (or v4) clones, whose vec::scores_block it matches
// bit for bit.
#include "backend/cpu/cpu_attention_kernels.h"
#include "backend/cpu/cpu_attention_scores.h"

#if !defined(__AVX2__) || !defined(__FMA__)
#error "cpu_attention_avx2.cpp must be compiled with -mavx2 -mfma"
#endif

namespace deltaserve::cpu {

void scores_in_place_avx2(const float* q, int rows, const float* k, int64_t ldk, int n, int hd, float scale,
                          float* s, int64_t lds) {
  scores_in_place<simd::VecAvx2>(q, rows, k, ldk, n, hd, scale, s, lds);
}

}  // namespace deltaserve::cpu
