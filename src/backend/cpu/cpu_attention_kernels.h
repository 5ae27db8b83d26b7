// Per-ISA kernels of the CPU attention (cpu_attention.cpp), each in its own file with its own -m
// flags; call only where the CPU has the instruction set (cpu_attention.cpp checks).
#pragma once

#include <cstdint>

namespace deltaserve::cpu {

// vec::scores_strided for hd a multiple of 16, on AVX-512 (x86-64-v4 CPUs), the same bits:
// s[r * lds + j] = scale * sum_d q[r * hd + d] * k[j * ldk + d] for r < rows, j < n.
void scores_in_place_avx512(const float* q, int rows, const float* k, int64_t ldk, int n, int hd, float scale,
                            float* s, int64_t lds);
// The same for hd a multiple of 8, on AVX2 + FMA (x86-64-v3 CPUs).
void scores_in_place_avx2(const float* q, int rows, const float* k, int64_t ldk, int n, int hd, float scale,
                          float* s, int64_t lds);

}  // namespace deltaserve::cpu
