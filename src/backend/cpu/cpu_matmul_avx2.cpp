// AVX2+FMA instantiation of cpu_matmul_kernels.h. Built with -mavx2 -mfma (CMakeLists.txt); only
// called after cpu_isa_supported(CpuIsa::Avx2).
#include "backend/cpu/cpu_matmul_kernels.h"

#if !defined(__AVX2__) || !defined(__FMA__)
#error "cpu_matmul_avx2.cpp must be compiled with -mavx2 -mfma"
#endif

namespace deltaserve::cpu {

void matmul_block_avx2(const PackedWeight& w, const MatmulArgs& a, int64_t m0, int64_t m1,
                       int64_t p0, int64_t p1) {
  matmul_block<simd::VecAvx2>(w, a, m0, m1, p0, p1);
}

}  // namespace deltaserve::cpu
