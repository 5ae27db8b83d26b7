// Portable instantiation of cpu_matmul_kernels.h (plain C++ vectors of 8 floats): the fallback for
// CPUs without AVX2 and for non-x86 builds, and a second implementation for the op tests.
#include "backend/cpu/cpu_matmul_kernels.h"

namespace deltaserve::cpu {

void matmul_block_portable(const PackedWeight& w, const MatmulArgs& a, int64_t m0, int64_t m1,
                           int64_t p0, int64_t p1) {
  matmul_block<simd::VecScalar>(w, a, m0, m1, p0, p1);
}

void matmul_block_portable16(const PackedWeight& w, const MatmulArgs& a, int64_t m0, int64_t m1,
                             int64_t p0, int64_t p1) {
  matmul_block<simd::VecScalarN<16>>(w, a, m0, m1, p0, p1);
}

}  // namespace deltaserve::cpu
