// Private to the cpu_matmul*.cpp files: the packed weight layout and the per-ISA block entry points.
//
// Packed layout (same for every ISA, so one CpuWeight serves all kernels):
//   rows are grouped in panels of kPanelRows = 16; k is walked in pairs q = 0 .. kp-1, kp = ceil(k/2).
//   Panel p is contiguous (panel_bytes); inside it, the block of pair q is
//     bf16: 16 uint32 lanes, lane r = w[16p + r][2q] | w[16p + r][2q + 1] << 16      (64 bytes)
//     f32 : 16 floats w[16p + r][2q], then 16 floats w[16p + r][2q + 1]            (128 bytes)
//   Rows n.. of the last panel and column k (when k is odd) are zero padding.
//   One bf16 block is exactly one AVX-512 register or two AVX2 registers; the lo/hi halves of a
//   lane are widened exactly with a shift / an and (simd.h), so no shuffles in the inner loop.
//
//   panel p:  q=0                 q=1                 ...   q=kp-1
//            [r0:k0k1 r1:k0k1 .. r15:k0k1][r0:k2k3 .. r15:k2k3] ...
#pragma once

#include <cstdint>

namespace deltaserve {
class CpuWeight;
}

namespace deltaserve::cpu {

constexpr int kPanelRows = 16;

struct PackedWeight {
  const uint8_t* data;  // panel 0, pair 0
  int64_t n, k;
  int64_t n_panels;     // ceil(n / 16)
  int64_t kp;           // ceil(k / 2)
  int64_t panel_bytes;  // kp * 64 (bf16) or kp * 128 (f32)
  bool bf16;
};

struct MatmulArgs {
  const float* x;  // [m, k] row stride ldx
  int64_t ldx;
  float* out;      // [m, n] row stride ldo
  int64_t ldo;
  bool accumulate;
};

// The packed view of a weight (defined in cpu_matmul.cpp).
PackedWeight packed_view(const CpuWeight& w);

// out[m0:m1, 16*p0 : min(n, 16*p1)] (+)= x[m0:m1, :] · w[16*p0 : ..., :]ᵀ
// Each is compiled in its own file with its own -m flags; call only if the CPU supports it.
void matmul_block_avx512(const PackedWeight& w, const MatmulArgs& a, int64_t m0, int64_t m1,
                         int64_t p0, int64_t p1);
void matmul_block_avx2(const PackedWeight& w, const MatmulArgs& a, int64_t m0, int64_t m1,
                       int64_t p0, int64_t p1);
void matmul_block_portable(const PackedWeight& w, const MatmulArgs& a, int64_t m0, int64_t m1,
                           int64_t p0, int64_t p1);
// The AVX-512 tile shapes (16 lanes: MR 8 x 2 panels, 4 panels for decode) in plain C++, so the
// tests check that tiling on CPUs without AVX-512. Not used for inference.
void matmul_block_portable16(const PackedWeight& w, const MatmulArgs& a, int64_t m0, int64_t m1,
                             int64_t p0, int64_t p1);

}  // namespace deltaserve::cpu
