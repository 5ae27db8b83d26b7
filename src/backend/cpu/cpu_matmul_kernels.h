// The matmul kernels, written once over a simd.h vector type V and included by one file per ISA
// (cpu_matmul_avx512.cpp, cpu_matmul_avx2.cpp, cpu_matmul_portable.cpp), each built with its
// own -m flags. Computes out (+)= x · wᵀ on the packed layout of cpu_matmul_internal.h and
// matches the double-precision reference of tests/ops/cpu_matmul_test.cpp (f32 accumulation).
//
// Structure (BLIS-like, but the weights are already packed at load time and x is read in place):
//   for mc in rows, step kMc                      x block kMc x kc stays in L2
//     for panel group of NP panels (16*NP cols)
//       for kc block of the k pairs               weight sub-panel stays in L1
//         for MR rows in mc: micro<MR, NP>        MR x NP*16 accumulators in registers
// The micro-kernel broadcasts x[i][2q], x[i][2q+1] and FMAs them with the widened lo/hi halves
// of the pair block, so each weight byte is converted once per MR rows. For small m (decode) x
// is one register row or two and NP panels are streamed side by side to keep >= 8 FMA chains busy.
//
// Batch invariance: every output element is summed in one order whatever m, the tile or the
// thread split: per block of kKcPairs k pairs, one FMA chain from zero over k in order (even
// then odd column of each pair), and the blocks added to out one after another. So a row's
// result does not depend on the rows beside it (a decode row alone or in a batch of 64, a prefill
// chunk's rows, the MTP verification's rows: the same bits). cpu_matmul_test checks it.
//
// No standard-library templates in here: every function must stay internal to the including
// file (anonymous namespace), see simd.h.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_matmul_internal.h"
#include "backend/cpu/simd.h"

namespace deltaserve::cpu {
namespace {

// How one k-pair block of a panel widens into f32 vectors; v picks the 16/kLanes vector.
struct FmtBf16 {
  static constexpr int64_t kPairBytes = 64;
  template <class V>
  static typename V::F lo(const uint8_t* blk, int v) {
    return V::bf16_lo(reinterpret_cast<const uint16_t*>(blk) + 2 * V::kLanes * v);
  }
  template <class V>
  static typename V::F hi(const uint8_t* blk, int v) {
    return V::bf16_hi(reinterpret_cast<const uint16_t*>(blk) + 2 * V::kLanes * v);
  }
};

struct FmtF32 {
  static constexpr int64_t kPairBytes = 128;
  template <class V>
  static typename V::F lo(const uint8_t* blk, int v) {
    return V::load(reinterpret_cast<const float*>(blk) + V::kLanes * v);
  }
  template <class V>
  static typename V::F hi(const uint8_t* blk, int v) {
    return V::load(reinterpret_cast<const float*>(blk) + kPanelRows + V::kLanes * v);
  }
};

inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

// Software prefetch distance along each panel stream (16 pair blocks of bf16 ahead).
constexpr int64_t kPrefetchBytes = 1024;

// Register-blocked tile: out[MR, NP*16] (+)= x[MR, 2*nq] · w[NP*16, 2*nq]ᵀ.
//   w: pair block 0 of the first panel; panel j starts at w + j*panel_bytes.
//   last_lo_only: the final pair has no odd column (k odd): never read x past k.
//   n_cols: valid output columns (<= NP*16); add: out += tile instead of out = tile.
template <class V, class Fmt, int MR, int NP>
void micro(const float* x, int64_t ldx, const uint8_t* w, int64_t panel_bytes, int64_t nq,
           bool last_lo_only, float* out, int64_t ldo, int64_t n_cols, bool add) {
  using F = typename V::F;
  constexpr int NV = kPanelRows / V::kLanes;
  // One accumulator per output vector, whatever the tile (batch invariance: no split of a sum
  // over several accumulators). FMA latency 4 on two pipes wants >= 8 of them: Tiles picks NP.
  F acc[MR][NP][NV];
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 64
    for (int j = 0; j < NP; ++j)
#pragma GCC unroll 64
      for (int v = 0; v < NV; ++v) acc[i][j][v] = V::zero();

  const int64_t n_full = last_lo_only ? nq - 1 : nq;
  const float* xq = x;
  const uint8_t* wq = w;
  for (int64_t q = 0; q < n_full; ++q, xq += 2, wq += Fmt::kPairBytes) {
    F wv[NP][NV];
    // One cache line per panel per pair (bf16): ask for it kPrefetchBytes early, so the short
    // per-panel streams of a GEMV do not wait on L3/DRAM latency.
#pragma GCC unroll 64
    for (int j = 0; j < NP; ++j)
#pragma GCC unroll 4
      for (int64_t line = 0; line < Fmt::kPairBytes; line += 64)
        V::prefetch(wq + j * panel_bytes + kPrefetchBytes + line);
#pragma GCC unroll 64
    for (int j = 0; j < NP; ++j)
#pragma GCC unroll 64
      for (int v = 0; v < NV; ++v) wv[j][v] = Fmt::template lo<V>(wq + j * panel_bytes, v);
#pragma GCC unroll 64
    for (int i = 0; i < MR; ++i) {
      F b = V::bcast(xq + i * ldx);
#pragma GCC unroll 64
      for (int j = 0; j < NP; ++j)
#pragma GCC unroll 64
        for (int v = 0; v < NV; ++v) acc[i][j][v] = V::fma(b, wv[j][v], acc[i][j][v]);
    }
#pragma GCC unroll 64
    for (int j = 0; j < NP; ++j)
#pragma GCC unroll 64
      for (int v = 0; v < NV; ++v) wv[j][v] = Fmt::template hi<V>(wq + j * panel_bytes, v);
#pragma GCC unroll 64
    for (int i = 0; i < MR; ++i) {
      F b = V::bcast(xq + i * ldx + 1);
#pragma GCC unroll 64
      for (int j = 0; j < NP; ++j)
#pragma GCC unroll 64
        for (int v = 0; v < NV; ++v) acc[i][j][v] = V::fma(b, wv[j][v], acc[i][j][v]);
    }
  }
  if (last_lo_only) {
#pragma GCC unroll 64
    for (int i = 0; i < MR; ++i) {
      F b = V::bcast(xq + i * ldx);
#pragma GCC unroll 64
      for (int j = 0; j < NP; ++j)
#pragma GCC unroll 64
        for (int v = 0; v < NV; ++v)
          acc[i][j][v] = V::fma(b, Fmt::template lo<V>(wq + j * panel_bytes, v), acc[i][j][v]);
    }
  }

  if (n_cols == NP * kPanelRows) {
#pragma GCC unroll 64
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 64
      for (int j = 0; j < NP; ++j)
#pragma GCC unroll 64
        for (int v = 0; v < NV; ++v) {
          float* o = out + i * ldo + j * kPanelRows + v * V::kLanes;
          V::store(o, add ? V::add(V::load(o), acc[i][j][v]) : acc[i][j][v]);
        }
    return;
  }
  // Edge tile (last panel of a weight whose n is not a multiple of 16): go through a buffer.
  // (Every acc index must be a compile-time constant, or GCC keeps acc in memory throughout.)
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i) {
    float tile[NP * kPanelRows];
#pragma GCC unroll 64
    for (int j = 0; j < NP; ++j)
#pragma GCC unroll 64
      for (int v = 0; v < NV; ++v) V::store(tile + j * kPanelRows + v * V::kLanes, acc[i][j][v]);
    float* o = out + i * ldo;
    for (int64_t c = 0; c < n_cols; ++c) o[c] = add ? o[c] + tile[c] : tile[c];
  }
}

// micro<MR, NP> for a run-time mr in [1, kMaxMr].
template <class V, class Fmt, int NP, int kMaxMr, int MR = 1>
void micro_rows(int64_t mr, const float* x, int64_t ldx, const uint8_t* w, int64_t panel_bytes,
                int64_t nq, bool last_lo_only, float* out, int64_t ldo, int64_t n_cols, bool add) {
  if constexpr (MR <= kMaxMr) {
    if (mr == MR) {
      micro<V, Fmt, MR, NP>(x, ldx, w, panel_bytes, nq, last_lo_only, out, ldo, n_cols, add);
    } else {
      micro_rows<V, Fmt, NP, kMaxMr, MR + 1>(mr, x, ldx, w, panel_bytes, nq, last_lo_only, out, ldo,
                                             n_cols, add);
    }
  }
}

// Tile shapes per vector width. kMr x kNp*16 is the GEMM tile (12 of 16 ymm / 16 of 32 zmm as
// accumulators). One to three rows (decode, MTP drafts) keep x in registers and stream kNp1..3
// panels side by side, so that enough accumulators are independent.
template <class V>
struct Tiles {
  static constexpr int kNv = kPanelRows / V::kLanes;  // vectors per panel row: 1 or 2
  static constexpr int kMr = V::kLanes == 16 ? 8 : 4;
  static constexpr int kNp = V::kLanes == 16 ? 2 : 1;
  static constexpr int kNp1 = 4 / kNv;
  static constexpr int kNp2 = 4 / kNv;
  static constexpr int kNp3 = kNv == 1 ? 4 : 1;  // 12 zmm; with ymm 3 x 1 panel (6), as wider spills
  static constexpr int64_t kMc = 96;        // rows of x per L2 block (multiple of kMr)
  static constexpr int64_t kKcPairs = 128;  // k pairs per block, at every m (batch invariance)
};

// The rows [r0, r1) of one mc block against the NP panels at p: micro tiles of up to MR_MAX rows,
// k in blocks of kKcPairs pairs.
template <class V, class Fmt, int MR_MAX, int NP>
void panel_group(const PackedWeight& w, const MatmulArgs& a, int64_t r0, int64_t r1, int64_t p) {
  const int64_t n_cols = min_i64(w.n - p * kPanelRows, NP * kPanelRows);
  const uint8_t* wp = w.data + p * w.panel_bytes;
  const bool k_odd = (w.k & 1) != 0;
  for (int64_t q0 = 0; q0 < w.kp; q0 += Tiles<V>::kKcPairs) {
    const int64_t nq = min_i64(Tiles<V>::kKcPairs, w.kp - q0);
    const bool last_lo_only = k_odd && q0 + nq == w.kp;
    const bool add = a.accumulate || q0 > 0;
    const uint8_t* wb = wp + q0 * Fmt::kPairBytes;
    for (int64_t r = r0; r < r1; r += MR_MAX) {
      const int64_t mr = min_i64(MR_MAX, r1 - r);
      micro_rows<V, Fmt, NP, MR_MAX>(mr, a.x + r * a.ldx + 2 * q0, a.ldx, wb, w.panel_bytes, nq, last_lo_only,
                                     a.out + r * a.ldo + p * kPanelRows, a.ldo, n_cols, add);
    }
  }
}

// Panels [p, p1) in groups of NP; the last few in groups of NP / 2, NP / 4, ..
template <class V, class Fmt, int MR_MAX, int NP>
void panel_groups(const PackedWeight& w, const MatmulArgs& a, int64_t r0, int64_t r1, int64_t p, int64_t p1) {
  for (; p + NP <= p1; p += NP) panel_group<V, Fmt, MR_MAX, NP>(w, a, r0, r1, p);
  if constexpr (NP > 1)
    if (p < p1) panel_groups<V, Fmt, MR_MAX, NP / 2>(w, a, r0, r1, p, p1);
}

template <class V, class Fmt, int MR_MAX, int NP>
void block_loop(const PackedWeight& w, const MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0,
                int64_t p1) {
  const int64_t mc_step = m1 - m0 <= MR_MAX ? m1 - m0 : Tiles<V>::kMc;
  for (int64_t mc = m0; mc < m1; mc += mc_step)
    panel_groups<V, Fmt, MR_MAX, NP>(w, a, mc, min_i64(m1, mc + mc_step), p0, p1);
}

template <class V, class Fmt>
void matmul_rows(const PackedWeight& w, const MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  using T = Tiles<V>;
  if (m1 - m0 == 1) block_loop<V, Fmt, 1, T::kNp1>(w, a, m0, m1, p0, p1);
  else if (m1 - m0 == 2) block_loop<V, Fmt, 2, T::kNp2>(w, a, m0, m1, p0, p1);
  else if (m1 - m0 == 3) block_loop<V, Fmt, 3, T::kNp3>(w, a, m0, m1, p0, p1);
  else block_loop<V, Fmt, T::kMr, T::kNp>(w, a, m0, m1, p0, p1);
}

template <class V>
void matmul_block(const PackedWeight& w, const MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0,
                  int64_t p1) {
  if (m1 <= m0 || p1 <= p0) return;
  if (w.bf16) matmul_rows<V, FmtBf16>(w, a, m0, m1, p0, p1);
  else matmul_rows<V, FmtF32>(w, a, m0, m1, p0, p1);
}

}  // namespace
}  // namespace deltaserve::cpu
