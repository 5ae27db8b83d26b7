// One pass of the GDN delta rule over a head's state (cpu_gated_delta_net.cpp), written once over
// simd.h's vector types and compiled per ISA (cpu_gdn_avx512.cpp, cpu_gdn_avx2.cpp; the portable
// one in cpu_gated_delta_net.cpp).
//
// The CPU keeps a head's state as S [Dk, Dv] (row d: key dim d across the value dims). Every product
// the rule needs is then a sum over d of a broadcast scalar times a row, so the value dims sit in
// vector lanes and nothing is reduced across lanes; and one pass both writes the previous token's
// update and reads the next token's products (the state is loaded and stored once per token, not
// twice). Each product and sum is rounded on its own, in the order HF's torch recurrence takes
// (state * g, then + k ⊗ δ; sums over d in order of rounded products): the files are built with
// -ffp-contract=off. Against the qwen35-tiny fixture's logits that halves the largest difference.
#pragma once

#include <cstdint>

#include "backend/cpu/simd.h"

namespace deltaserve::cpu {
namespace {

// Value dims [j0, j0 + NB * V::kLanes) of delta_pass.
template <class V, int NB, bool kUpdate, bool kA, bool kO>
void delta_pass_block(float* S, int Dk, int Dv, int j0, const float* kp, float g, const float* delta,
                      const float* ka, float ga, float* a, const float* qo, float* o) {
  using F = typename V::F;
  constexpr int L = V::kLanes;
  F dl[NB], acc_a[NB], acc_o[NB];
  const F gv = V::bcast(&g), gav = V::bcast(&ga);
  for (int b = 0; b < NB; ++b) {
    dl[b] = kUpdate ? V::load(delta + j0 + b * L) : V::zero();
    acc_a[b] = V::zero();
    acc_o[b] = V::zero();
  }
  for (int d = 0; d < Dk; ++d) {
    float* row = S + int64_t(d) * Dv + j0;
    F kpd, kad, qod;
    if constexpr (kUpdate) kpd = V::bcast(kp + d);
    if constexpr (kA) kad = V::bcast(ka + d);
    if constexpr (kO) qod = V::bcast(qo + d);
    for (int b = 0; b < NB; ++b) {
      F x = V::load(row + b * L);
      if constexpr (kUpdate) {
        x = V::add(V::mul(x, gv), V::mul(kpd, dl[b]));
        V::store(row + b * L, x);
      }
      if constexpr (kA) acc_a[b] = V::add(acc_a[b], V::mul(kad, V::mul(x, gav)));
      if constexpr (kO) acc_o[b] = V::add(acc_o[b], V::mul(qod, x));
    }
  }
  for (int b = 0; b < NB; ++b) {
    if constexpr (kA) V::store(a + j0 + b * L, acc_a[b]);
    if constexpr (kO) V::store(o + j0 + b * L, acc_o[b]);
  }
}

template <class V, bool kUpdate, bool kA, bool kO>
void delta_pass_blocks(float* S, int Dk, int Dv, const float* kp, float g, const float* delta, const float* ka, float ga,
                       float* a, const float* qo, float* o) {
  constexpr int L = V::kLanes;
  int j0 = 0;
  for (; j0 + 4 * L <= Dv; j0 += 4 * L)
    delta_pass_block<V, 4, kUpdate, kA, kO>(S, Dk, Dv, j0, kp, g, delta, ka, ga, a, qo, o);
  for (; j0 + L <= Dv; j0 += L) delta_pass_block<V, 1, kUpdate, kA, kO>(S, Dk, Dv, j0, kp, g, delta, ka, ga, a, qo, o);
}

// S [Dk, Dv] (Dv a multiple of V::kLanes), each part optional (a null pointer leaves it out):
//   the update (kp):  S[d] = g * S[d] + kp[d] * delta           (delta [Dv]: the previous token's)
//   then a (ka):      a[j] = sum over d, in order, of ka[d] * (ga * S[d][j])
//   and o (qo):       o[j] = sum over d, in order, of qo[d] * S[d][j]
// Each value dim's result depends only on its own column, so the lane width never shows in the bits.
template <class V>
void delta_pass(float* S, int Dk, int Dv, const float* kp, float g, const float* delta, const float* ka, float ga, float* a,
                const float* qo, float* o) {
  const int mode = (kp ? 4 : 0) | (ka ? 2 : 0) | (qo ? 1 : 0);
  switch (mode) {
    case 1: return delta_pass_blocks<V, false, false, true>(S, Dk, Dv, kp, g, delta, ka, ga, a, qo, o);
    case 2: return delta_pass_blocks<V, false, true, false>(S, Dk, Dv, kp, g, delta, ka, ga, a, qo, o);
    case 3: return delta_pass_blocks<V, false, true, true>(S, Dk, Dv, kp, g, delta, ka, ga, a, qo, o);
    case 4: return delta_pass_blocks<V, true, false, false>(S, Dk, Dv, kp, g, delta, ka, ga, a, qo, o);
    case 5: return delta_pass_blocks<V, true, false, true>(S, Dk, Dv, kp, g, delta, ka, ga, a, qo, o);
    case 6: return delta_pass_blocks<V, true, true, false>(S, Dk, Dv, kp, g, delta, ka, ga, a, qo, o);
    case 7: return delta_pass_blocks<V, true, true, true>(S, Dk, Dv, kp, g, delta, ka, ga, a, qo, o);
    default: return;  // nothing asked
  }
}

}  // namespace
}  // namespace deltaserve::cpu
