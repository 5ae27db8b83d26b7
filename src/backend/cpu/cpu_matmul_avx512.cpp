// AVX-512F instantiation of cpu_matmul_kernels.h. Built with -mavx512f -mavx2 -mfma
// (CMakeLists.txt); only called after cpu_isa_supported(CpuIsa::Avx512).
#include "backend/cpu/cpu_matmul_kernels.h"

#if !defined(__AVX512F__)
#error "cpu_matmul_avx512.cpp must be compiled with -mavx512f"
#endif

namespace deltaserve::cpu {

void matmul_block_avx512(const PackedWeight& w, const MatmulArgs& a, int64_t m0, int64_t m1,
                         int64_t p0, int64_t p1) {
  matmul_block<simd::VecAvx512>(w, a, m0, m1, p0, p1);
}

}  // namespace deltaserve::cpu
