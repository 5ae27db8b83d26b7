// AVX512 instantiation of cpu_delta_rule.h. Built with -mavx512f (CMakeLists.txt);
// called only where the CPU has it (cpu_gated_delta_net.cpp checks).
#include "backend/cpu/cpu_delta_rule.h"
#include "backend/cpu/cpu_gdn_kernels.h"

#if !defined(__AVX512F__)
#error "cpu_gdn_avx512.cpp must be compiled with -mavx512f"
#endif

namespace deltaserve::cpu {

void delta_pass_avx512(float* S, int Dk, int Dv, const float* kp, float g, const float* delta, const float* ka, float ga,
                     float* a, const float* qo, float* o) {
  delta_pass<simd::VecAvx512>(S, Dk, Dv, kp, g, delta, ka, ga, a, qo, o);
}

}  // namespace deltaserve::cpu
