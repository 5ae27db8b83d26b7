// The CPU GDN delta rule's pass (cpu_delta_rule.h): every kernel this CPU runs (portable, AVX2,
// AVX-512) against the documented arithmetic written as a plain loop (each product and sum rounded
// on its own, d in order), bit for bit, in every mode the GDN op uses; and the state layout S [Dk, Dv]
// the CPU keeps (kernels.h): a token's update is read from rows of key dims.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_gdn_kernels.h"

namespace deltaserve {
namespace {

using PassFn = void (*)(float*, int, int, const float*, float, const float*, const float*, float, float*,
                        const float*, float*);

// The pass as cpu_delta_rule.h documents it. (This file is built with -ffp-contract=off.)
void reference_pass(float* S, int Dk, int Dv, const float* kp, float g, const float* delta, const float* ka, float ga,
                    float* a, const float* qo, float* o) {
  for (int j = 0; j < Dv; ++j) {
    float sa = 0.f, so = 0.f;
    for (int d = 0; d < Dk; ++d) {
      float x = S[d * Dv + j];
      if (kp) {
        const float gx = x * g, kd = kp[d] * delta[j];
        x = gx + kd;
        S[d * Dv + j] = x;
      }
      if (ka) {
        const float p = ka[d] * (ga * x);
        sa = sa + p;
      }
      if (qo) {
        const float p = qo[d] * x;
        so = so + p;
      }
    }
    if (ka) a[j] = sa;
    if (qo) o[j] = so;
  }
}

std::vector<std::pair<std::string, PassFn>> kernels_of_this_cpu(int Dv) {
  std::vector<std::pair<std::string, PassFn>> k{{"portable", &cpu::delta_pass_portable}};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("x86-64-v3") && Dv % 8 == 0) k.emplace_back("avx2", &cpu::delta_pass_avx2);
  if (__builtin_cpu_supports("x86-64-v4") && Dv % 16 == 0) k.emplace_back("avx512", &cpu::delta_pass_avx512);
#endif
  return k;
}

TEST(CpuDeltaRule, EveryKernelGivesTheDocumentedBits) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  int checked = 0;
  for (auto [Dk, Dv] : {std::pair{16, 16}, {64, 64}, {128, 128}, {32, 80}, {16, 24}, {8, 5}}) {
    for (int mode = 1; mode < 8; ++mode) {
      const bool upd = mode & 4, with_a = mode & 2, with_o = mode & 1;
      std::vector<float> S0(size_t(Dk) * Dv), kp(Dk), delta(Dv), ka(Dk), qo(Dk);
      for (auto* v : {&S0, &kp, &delta, &ka, &qo})
        for (auto& x : *v) x = u(rng);
      const float g = 0.5f + 0.5f * u(rng), ga = 0.5f + 0.5f * u(rng);
      std::vector<float> S_ref = S0, a_ref(Dv, -7.f), o_ref(Dv, -7.f);
      reference_pass(S_ref.data(), Dk, Dv, upd ? kp.data() : nullptr, g, delta.data(), with_a ? ka.data() : nullptr,
                     ga, a_ref.data(), with_o ? qo.data() : nullptr, o_ref.data());
      for (const auto& [name, fn] : kernels_of_this_cpu(Dv)) {
        std::vector<float> S = S0, a(Dv, -7.f), o(Dv, -7.f);
        fn(S.data(), Dk, Dv, upd ? kp.data() : nullptr, g, delta.data(), with_a ? ka.data() : nullptr, ga, a.data(),
           with_o ? qo.data() : nullptr, o.data());
        const std::string what = name + " Dk " + std::to_string(Dk) + " Dv " + std::to_string(Dv) + " mode " +
                                 std::to_string(mode);
        EXPECT_EQ(std::memcmp(S.data(), S_ref.data(), S.size() * sizeof(float)), 0) << what << ": the state";
        EXPECT_EQ(std::memcmp(a.data(), a_ref.data(), a.size() * sizeof(float)), 0) << what << ": a";
        EXPECT_EQ(std::memcmp(o.data(), o_ref.data(), o.size() * sizeof(float)), 0) << what << ": o";
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 42);
}

}  // namespace
}  // namespace deltaserve
