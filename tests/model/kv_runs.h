// Runs of a fixture model shared by the KV cache dtype tests (kv_dtype_test.cpp on the CPU,
// cuda_model_test.cpp on CUDA): logits of every position through prefill + token-by-token
// decode, and greedy generation.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/model_setup.h"

namespace deltaserve::test {

// The KV cache dtypes checked against the f32 cache, and greedy tokens compared on tiny-coder.
inline constexpr DType kKvTestDtypes[] = {DType::BF16, DType::F8E4M3, DType::F8E5M2};
inline constexpr int kKvGreedyTokens = 32;

// Unit roundoff u of a KV cache format: the relative error of one rounding (2^-8 bf16, 2^-4
// e4m3, 2^-3 e5m2).
inline double kv_unit_roundoff(DType dt) {
  switch (dt) {
    case DType::BF16: return 1.0 / 256;
    case DType::F8E4M3: return 1.0 / 16;
    case DType::F8E5M2: return 1.0 / 8;
    default: return 0.0;
  }
}

// Max |logit - logit with the f32 KV cache| over every position of prefill + token-by-token
// decode: c_model * u. Rounding every cached k and v by a relative u moves the logits by a
// model-specific multiple of u (to first order): its sensitivity, measured on the CPU as max
// |diff| / u, is the same for all three formats (tiny-coder 8.1 / 7.8 / 10.3 for bf16 / e4m3 /
// e5m2, i.e. 0.032 / 0.49 / 1.29 logits; qwen3-tiny 23 / 22 / 21; the random-weight qwen35-tiny
// 15 / 28 / 32). c_model is 1.5x the largest of them. CUDA reads the same stored values (its own
// f32 differences are < 5e-3, cuda_model_test.cpp), so the same bounds apply there.
inline float kv_logit_tolerance(const std::string& model, DType dt) {
  const double c = model == "tiny_coder" ? 16 : model == "qwen3_tiny" ? 35 : 48;
  return static_cast<float>(c * kv_unit_roundoff(dt));
}

// tiny-coder: the most the gap between the f32 run's top two logits may change with another KV
// format: 10 u (measured 4.9 / 4.0 / 8.8 u for bf16 / e4m3 / e5m2: 0.019 / 0.25 / 1.1). Greedy
// tokens can only differ where the f32 run's top-2 margin is within this of a tie.
inline float kv_top2_gap_tolerance(DType dt) { return static_cast<float>(10 * kv_unit_roundoff(dt)); }

// A fresh sequence in s's cache: blocks for n_tokens positions and a zeroed state slot.
struct KvRunSeq {
  ModelSetup& s;
  std::vector<int32_t> blocks;
  int slot = -1;
  KvRunSeq(ModelSetup& setup, int n_tokens) : s(setup) {
    slot = s.cache->acquire_slot();
    if (slot < 0 || !s.cache->blocks().allocate(s.blocks_for(n_tokens), blocks)) throw std::runtime_error("no room");
  }
  ~KvRunSeq() {
    for (auto b : blocks) s.cache->blocks().release(b);
    s.cache->release_slot(slot);
  }
};

// Logits [T, V] of every position of `tokens`: the first prompt_len tokens in one forward, then
// one (teacher-forced) token per forward.
inline std::vector<float> prefill_then_decode_logits(ModelSetup& s, std::span<const int32_t> tokens, int prompt_len) {
  const int64_t V = s.model->config().vocab_size;
  const int T = static_cast<int>(tokens.size());
  KvRunSeq seq(s, T);
  std::vector<float> out;
  out.reserve(static_cast<std::size_t>(T * V));
  RunItem pre{tokens.first(prompt_len), 0, seq.blocks, seq.slot, true, false};
  s.runner->run(std::span<const RunItem>(&pre, 1));
  out.insert(out.end(), s.runner->logits(0), s.runner->logits(0) + int64_t(prompt_len) * V);
  for (int p = prompt_len; p < T; ++p) {
    RunItem step{tokens.subspan(p, 1), p, seq.blocks, seq.slot, false, false};
    s.runner->run(std::span<const RunItem>(&step, 1));
    out.insert(out.end(), s.runner->logits(0), s.runner->logits(0) + V);
  }
  return out;
}

// n greedy tokens after `prompt` (prefill, then one token per forward).
inline std::vector<int32_t> greedy_tokens(ModelSetup& s, std::span<const int32_t> prompt, int n) {
  const int64_t V = s.model->config().vocab_size;
  const int P = static_cast<int>(prompt.size());
  KvRunSeq seq(s, P + n);
  std::vector<int32_t> toks(prompt.begin(), prompt.end());
  RunItem pre{prompt, 0, seq.blocks, seq.slot, false, false};
  s.runner->run(std::span<const RunItem>(&pre, 1));
  for (int i = 0; i < n; ++i) {
    const float* lg = s.runner->logits(0);
    toks.push_back(static_cast<int32_t>(std::max_element(lg, lg + V) - lg));
    if (i + 1 == n) break;
    RunItem step{std::span<const int32_t>(toks).last(1), P + i, seq.blocks, seq.slot, false, false};
    s.runner->run(std::span<const RunItem>(&step, 1));
  }
  return std::vector<int32_t>(toks.begin() + P, toks.end());
}

// max |a - b| over n values (NaN anywhere: infinity).
inline float kv_max_abs_diff(const float* a, const float* b, int64_t n) {
  float m = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
  }
  return m;
}

// Greedy decoding with a KV format against the f32 cache (tiny-coder): n greedy tokens of each
// run, and both caches teacher-forced along the f32 run's tokens. Checks (gtest) that
//  - at every position the f32 top-2 gap changes by at most kv_top2_gap_tolerance, and the argmax
//    agrees wherever the f32 margin exceeds it;
//  - the free-running tokens are equal up to the first position whose f32 margin does not (a
//    near tie, where the two runs may legitimately part).
// Returns how many free-running tokens are equal.
inline int check_greedy_against_f32(ModelSetup& f32, ModelSetup& other, DType dt, std::span<const int32_t> prompt,
                                    int n, const std::string& what) {
  const int64_t V = f32.model->config().vocab_size;
  const int P = static_cast<int>(prompt.size());
  const auto want = greedy_tokens(f32, prompt, n);
  const auto got = greedy_tokens(other, prompt, n);
  std::vector<int32_t> seq(prompt.begin(), prompt.end());
  seq.insert(seq.end(), want.begin(), want.end());
  const auto lf = prefill_then_decode_logits(f32, seq, P);
  const auto lo = prefill_then_decode_logits(other, seq, P);
  const float gap_tol = kv_top2_gap_tolerance(dt);
  int first_near_tie = n;
  for (int i = 0; i < n; ++i) {  // row P - 1 + i predicts generated token i
    const float* a = lf.data() + int64_t(P - 1 + i) * V;
    const float* b = lo.data() + int64_t(P - 1 + i) * V;
    const int64_t top = std::max_element(a, a + V) - a;
    int64_t second = top == 0 ? 1 : 0;
    for (int64_t v = 0; v < V; ++v)
      if (v != top && a[v] > a[second]) second = v;
    const float margin = a[top] - a[second];
    EXPECT_EQ(top, want[i]) << what << ": teacher-forced f32 logits disagree with the f32 greedy run at " << i;
    EXPECT_LE(std::fabs((b[top] - b[second]) - margin), gap_tol) << what << " token " << i;
    if (margin > gap_tol) {
      EXPECT_EQ(std::max_element(b, b + V) - b, top) << what << " token " << i << ": f32 margin " << margin;
    } else if (first_near_tie == n) {
      first_near_tie = i;
    }
  }
  int same = 0;
  while (same < n && got[same] == want[same]) ++same;
  EXPECT_GE(same, first_near_tie) << what << ": greedy tokens part at " << same << ", before the first near tie ("
                                  << first_near_tie << ")";
  return same;
}

}  // namespace deltaserve::test
