// Per-ISA kernels of the CPU GDN (cpu_gated_delta_net.cpp), each in its own file with its own -m
// flags; call only where the CPU has the instruction set (cpu_gated_delta_net.cpp checks).
#pragma once

#include <cstdint>

namespace deltaserve::cpu {

// cpu_delta_rule.h's delta_pass in plain C++ (any Dv, any CPU).
void delta_pass_portable(float* S, int Dk, int Dv, const float* kp, float g, const float* delta, const float* ka,
                         float ga, float* a, const float* qo, float* o);
// The same for Dv a multiple of 16, on AVX-512 (x86-64-v4 CPUs); every one gives the same bits (no
// FMAs: the files are built with -ffp-contract=off).
void delta_pass_avx512(float* S, int Dk, int Dv, const float* kp, float g, const float* delta, const float* ka, float ga,
                       float* a, const float* qo, float* o);
// The same for Dv a multiple of 8, on AVX2 + FMA (x86-64-v3 CPUs).
void delta_pass_avx2(float* S, int Dk, int Dv, const float* kp, float g, const float* delta, const float* ka, float ga,
                     float* a, const float* qo, float* o);

}  // namespace deltaserve::cpu
