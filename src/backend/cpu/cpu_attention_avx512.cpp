// AVX-512 instantiation of cpu_attention_scores.h. Built with -mavx512f (CMakeLists.txt); called
// only where the CPU runs vec.cpp's x86-64-v4 clones, whose vec::scores_block it matches bit for bit.
#include "backend/cpu/cpu_attention_kernels.h"
#include "backend/cpu/cpu_attention_scores.h"

#if !defined(__AVX512F__)
#error "cpu_attention_avx512.cpp must be compiled with -mavx512f"
#endif

namespace deltaserve::cpu {

void scores_in_place_avx512(const float* q, int rows, const float* k, int64_t ldk, int n, int hd, float scale,
                            float* s, int64_t lds) {
  scores_in_place<simd::VecAvx512>(q, rows, k, ldk, n, hd, scale, s, lds);
}

}  // namespace deltaserve::cpu
