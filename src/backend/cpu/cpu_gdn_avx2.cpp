// AVX2 instantiation of cpu_delta_rule.h. Built with -mavx2 -mfma (CMakeLists.txt);
// called only where the CPU has it (cpu_gated_delta_net.cpp checks).
#include "backend/cpu/cpu_delta_rule.h"
#include "backend/cpu/cpu_gdn_kernels.h"

#if !defined(__AVX2__) || !defined(__FMA__)
#error "cpu_gdn_avx2.cpp must be compiled with -mavx2 -mfma"
#endif

namespace deltaserve::cpu {

void delta_pass_avx2(float* S, int Dk, int Dv, const float* kp, float g, const float* delta, const float* ka, float ga,
                     float* a, const float* qo, float* o) {
  delta_pass<simd::VecAvx2>(S, Dk, Dv, kp, g, delta, ka, ga, a, qo, o);
}

}  // namespace deltaserve::cpu
