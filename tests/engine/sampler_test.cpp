// Sampler: the processed distribution (temperature, top-k, top-p, min-p) equals a plain
// full-vocabulary reference (sort everything, cut, renormalise) on random and adversarial logits;
// greedy and top-logprobs agree with direct computations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "engine/sampler.h"
#include "../ops/sample_reference.h"

namespace deltaserve {
namespace {

// The textbook pipeline over all V tokens: scale, sort (ties by id), top-k, softmax over the
// survivors, top-p prefix, min-p prefix, renormalise.
std::vector<double> reference(const std::vector<float>& logits, const SamplingParams& p) {
  const int64_t V = static_cast<int64_t>(logits.size());
  std::vector<std::pair<double, int32_t>> c;
  for (int64_t i = 0; i < V; ++i) c.emplace_back(double(logits[i] * (1.0f / p.temperature)), int32_t(i));
  std::sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  if (p.top_k > 0 && p.top_k < V) c.resize(p.top_k);
  const double mx = c.front().first;
  double z = 0;
  for (auto& x : c) z += (x.first = std::exp(x.first - mx));
  for (auto& x : c) x.first /= z;
  size_t keep = c.size();
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      cum += c[i].first;
      if (cum >= p.top_p) { keep = i + 1; break; }
    }
  }
  if (p.min_p > 0.0f) {
    size_t i = 1;
    while (i < keep && c[i].first >= p.min_p * c.front().first) ++i;
    keep = i;
  }
  c.resize(keep);
  double s = 0;
  for (auto& x : c) s += x.first;
  std::vector<double> out(V, 0.0);
  for (auto& x : c) out[x.second] = x.first / s;
  return out;
}

std::vector<float> random_logits(std::mt19937_64& rng, int64_t V, float spread) {
  std::normal_distribution<float> n(0.0f, spread);
  std::vector<float> l(V);
  for (auto& x : l) x = n(rng);
  return l;
}

// Same distribution: every probability within 1e-5, and the tokens kept by one side only (a
// top-p boundary decided differently by f32 vs f64 rounding) carry less than 1e-5 of mass.
void expect_same(const std::vector<float>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double max_err = 0, one_sided = 0, total = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_err = std::max(max_err, std::abs(double(got[i]) - want[i]));
    if ((got[i] > 0) != (want[i] > 0)) one_sided += std::max(double(got[i]), want[i]);
    total += got[i];
  }
  EXPECT_LT(max_err, 1e-5) << what;
  EXPECT_LT(one_sided, 1e-5) << what;
  EXPECT_NEAR(total, 1.0, 1e-4) << what;
}

TEST(Sampler, DistributionMatchesFullSortReference) {
  std::mt19937_64 rng(7);
  const int64_t V = 5000;
  Sampler sampler(V);
  std::vector<float> probs;
  int cases = 0;
  for (float spread : {0.5f, 3.0f, 12.0f}) {
    for (float t : {0.3f, 0.7f, 1.0f, 1.5f}) {
      for (int k : {-1, 1, 2, 20, 400, 4999, 5000, 9000}) {
        for (float top_p : {1.0f, 0.95f, 0.5f, 0.999999f}) {
          for (float min_p : {0.0f, 0.05f, 1e-6f}) {
            SamplingParams p;
            p.temperature = t;
            p.top_k = k;
            p.top_p = top_p;
            p.min_p = min_p;
            auto logits = random_logits(rng, V, spread);
            sampler.distribution(logits.data(), p, {}, {}, probs);
            if (k == 1) {  // greedy: one-hot on the argmax
              std::vector<double> one(V, 0.0);
              one[std::max_element(logits.begin(), logits.end()) - logits.begin()] = 1.0;
              expect_same(probs, one, "greedy");
            } else {
              expect_same(probs, reference(logits, p),
                          "spread " + std::to_string(spread) + " t " + std::to_string(t) + " k " + std::to_string(k) +
                              " top_p " + std::to_string(top_p) + " min_p " + std::to_string(min_p));
            }
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 3 * 4 * 8 * 4 * 3);
}

TEST(Sampler, WindowWidensForFlatAndTiedLogits) {
  const int64_t V = 3000;
  Sampler sampler(V);
  std::vector<float> probs;
  // Flat logits with one outlier far above: the nucleus needs almost every token.
  std::vector<float> logits(V, 0.0f);
  logits[17] = 30.0f;
  for (float top_p : {0.9f, 1.0f}) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_p = top_p;
    sampler.distribution(logits.data(), p, {}, {}, probs);
    expect_same(probs, reference(logits, p), "outlier top_p " + std::to_string(top_p));
  }
  // A long tail just below the window: top_p 0.99 of a two-level distribution.
  for (int64_t i = 0; i < V; ++i) logits[i] = i < 10 ? 0.0f : -17.0f;
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.99f;
  sampler.distribution(logits.data(), p, {}, {}, probs);
  expect_same(probs, reference(logits, p), "two levels");
  // top-k larger than the window at the first try.
  p.top_p = 1.0f;
  p.top_k = 100;
  sampler.distribution(logits.data(), p, {}, {}, probs);
  expect_same(probs, reference(logits, p), "top-k beyond the window");
  // -inf logits (masked tokens) never come back.
  for (int64_t i = 0; i < V; ++i) logits[i] = i % 3 == 0 ? -INFINITY : float(i % 7);
  p = SamplingParams{};
  p.temperature = 0.8f;
  sampler.distribution(logits.data(), p, {}, {}, probs);
  for (int64_t i = 0; i < V; i += 3) EXPECT_EQ(probs[i], 0.0f);
  expect_same(probs, reference(logits, p), "masked");
}

TEST(Sampler, GreedyAndTopLogprobs) {
  std::mt19937_64 rng(3);
  const int64_t V = 4096;
  Sampler sampler(V);
  auto logits = random_logits(rng, V, 4.0f);
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_logprobs = 5;
  TokenLogprob lp;
  const int32_t tok = sampler.sample(logits.data(), p, {}, {}, rng, &lp);
  EXPECT_EQ(tok, std::max_element(logits.begin(), logits.end()) - logits.begin());
  double z = 0;
  const float mx = *std::max_element(logits.begin(), logits.end());
  for (float l : logits) z += std::exp(double(l - mx));
  const double lse = mx + std::log(z);
  EXPECT_NEAR(lp.logprob, logits[tok] - lse, 1e-4);
  std::vector<int32_t> order(V);
  for (int32_t i = 0; i < V; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  ASSERT_EQ(lp.top.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(lp.top[i].first, order[i]);
    EXPECT_NEAR(lp.top[i].second, logits[order[i]] - lse, 1e-4);
  }
  // A repetition penalty changes the greedy choice when it should.
  SamplingParams pen = p;
  pen.top_logprobs = -1;
  pen.repetition_penalty = 1e6f;
  const int32_t prompt[] = {tok};
  const int32_t again = sampler.sample(logits.data(), pen, prompt, {}, rng, nullptr);
  std::vector<float> penalised = logits;
  penalised[tok] = penalised[tok] > 0 ? penalised[tok] / 1e6f : penalised[tok] * 1e6f;
  EXPECT_EQ(again, std::max_element(penalised.begin(), penalised.end()) - penalised.begin());
  EXPECT_NE(again, tok);
}


// Penalty entries: HF/vLLM repetition over prompt + output, OpenAI frequency/presence over output.
TEST(Sampler, PenaltyEntriesFollowTheHfAndOpenAiRules) {
  Sampler sampler(100);
  SamplingParams p;
  p.repetition_penalty = 1.2f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  const int32_t prompt[] = {1, 2, 1};
  const int32_t gen[] = {3, 2, 3};
  std::vector<PenaltyEntry> e;
  sampler.penalty_entries(p, prompt, gen, 7, e);
  ASSERT_EQ(e.size(), 3u);
  const float subs[] = {0.0f, 0.5f * 1 + 0.25f, 0.5f * 2 + 0.25f};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(e[i].row, 7);
    EXPECT_EQ(e[i].token, i + 1);
    EXPECT_EQ(e[i].rep, 1.2f);
    EXPECT_FLOAT_EQ(e[i].sub, subs[i]) << i;
  }
  // Without a repetition penalty the prompt does not count.
  p.repetition_penalty = 1.0f;
  e.clear();
  sampler.penalty_entries(p, prompt, gen, 0, e);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].token, 2);
  EXPECT_EQ(e[1].token, 3);
  // No penalties, no entries.
  e.clear();
  sampler.penalty_entries(SamplingParams{}, prompt, gen, 0, e);
  EXPECT_TRUE(e.empty());
}

// The host sampler, given the uniform, draws the token the CPU's Kernels::sample_rows draws for the
// same row, settings and penalties, on every row (both run RowSampler, so even a draw at a CDF
// boundary agrees); both draw the textbook pipeline's token (sample_reference.h, the CUDA kernel's
// reference too) except within 2e-6 of a boundary of its CDF (rounding).
TEST(Sampler, SampleWithUniformMatchesTheSampleRowsKernel) {
  const int64_t V = 3000, R = 4;
  ThreadPool pool(1);
  CpuKernels kernels(pool);
  Sampler sampler(V);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  struct Case {
    float t, top_p, min_p, rep, freq, pres;
    int top_k;
  };
  const Case cases[] = {{0.8f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, -1}, {0.6f, 0.95f, 0.0f, 1.0f, 0.0f, 0.0f, 20},
                        {1.0f, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f, -1}, {0.7f, 1.0f, 0.05f, 1.0f, 0.0f, 0.0f, -1},
                        {1.2f, 0.8f, 0.02f, 1.1f, 0.3f, 0.5f, 50}, {0.0f, 1.0f, 0.0f, 1.3f, 0.0f, 0.0f, -1},
                        {0.9f, 1.0f, 0.0f, 1.0f, 0.0f, 1.5f, 1000}, {1.0f, 0.5f, 0.0f, 1.05f, 0.2f, 0.0f, 5}};
  int compared = 0, skipped = 0;
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<float> x(R * V);
    std::vector<SampleRow> rows(R);
    std::vector<SamplingParams> params(R);
    std::vector<std::vector<int32_t>> prompts(R), gens(R);
    std::vector<double> us(R);
    std::vector<PenaltyEntry> pen;
    for (int r = 0; r < R; ++r) {
      const Case& c = cases[(trial * R + r) % std::size(cases)];
      auto l = random_logits(rng, V, trial % 3 == 0 ? 0.5f : trial % 3 == 1 ? 2.0f : 6.0f);
      std::copy(l.begin(), l.end(), x.begin() + r * V);
      SamplingParams& p = params[r];
      p.temperature = c.t;
      p.top_k = c.top_k;
      p.top_p = c.top_p;
      p.min_p = c.min_p;
      p.repetition_penalty = c.rep;
      p.frequency_penalty = c.freq;
      p.presence_penalty = c.pres;
      std::uniform_int_distribution<int32_t> tok(0, int32_t(V - 1));
      for (int i = 0; i < 40; ++i) prompts[r].push_back(tok(rng));
      for (int i = 0; i < 25; ++i) gens[r].push_back(i % 3 == 0 ? prompts[r][i] : tok(rng));
      us[r] = unif(rng);
      if (!p.greedy()) {
        rows[r].inv_temperature = 1.0f / p.temperature;
        rows[r].top_k = p.top_k;
        rows[r].top_p = p.top_p;
        rows[r].min_p = p.min_p;
        rows[r].u = static_cast<float>(us[r]);
      }
      sampler.penalty_entries(p, prompts[r], gens[r], r, pen);
    }
    std::vector<float> penalised = x;
    std::vector<int32_t> out(R, -7);
    kernels.sample_rows(Tensor(penalised.data(), DType::F32, {R, V}), Tensor(rows.data(), DType::I32, {R * 6}),
                        Tensor(pen.data(), DType::I32, {int64_t(pen.size()) * 4}), Tensor(out.data(), DType::I32, {R}));
    for (int r = 0; r < R; ++r) {
      const int32_t host = sampler.sample_u(x.data() + r * V, params[r], prompts[r], gens[r], us[r], nullptr);
      EXPECT_EQ(host, out[r]) << "trial " << trial << " row " << r;
      bool fragile = false;
      const auto dist = deltaserve::test::reference_distribution(penalised.data() + r * V, V, rows[r], &fragile);
      const auto want = deltaserve::test::reference_draw(dist, rows[r].inv_temperature == 0.f ? 0.0 : double(rows[r].u));
      if (fragile || (rows[r].inv_temperature != 0.f && want.margin < 2e-6)) {
        ++skipped;
        continue;
      }
      ++compared;
      EXPECT_EQ(out[r], want.token) << "trial " << trial << " row " << r;
      EXPECT_EQ(host, want.token) << "trial " << trial << " row " << r;
    }
  }
  EXPECT_GT(compared, 150) << skipped << " skipped";
}

// A uniform placed on a boundary of the cumulative distribution (and one float either side of it):
// the host sampler and the CPU's Kernels::sample_rows still draw the same token. Two samplers that
// sum their CDFs differently part exactly there, and a draw of a long seeded run that lands at such a
// step then diverges for the rest of the run (engine_test's DeviceSamplingDrawsWhatTheHostSamplerDraws).
TEST(Sampler, DrawsOnACdfBoundaryAgreeWithTheSampleRowsKernel) {
  const int64_t V = 4000;
  ThreadPool pool(1);
  CpuKernels kernels(pool);
  Sampler sampler(V);
  std::mt19937_64 rng(3);
  int compared = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const auto x = random_logits(rng, V, trial % 2 ? 0.5f : 3.0f);
    SamplingParams p;
    p.temperature = trial % 3 == 0 ? 1.0f : 0.8f;
    p.top_p = trial % 4 == 1 ? 0.9f : 1.0f;
    // The boundaries of the reference CDF in token-id order, at spread-out places.
    const auto dist = reference(x, p);
    double cum = 0;
    std::vector<double> bounds;
    int n_kept = 0;
    for (double q : dist) n_kept += q > 0;
    int seen = 0;
    for (int64_t i = 0; i < V; ++i) {
      if (dist[i] <= 0) continue;
      cum += dist[i];
      if (++seen % std::max(1, n_kept / 40) == 0 && seen < n_kept) bounds.push_back(cum);
    }
    for (double b : bounds) {
      const float fb = static_cast<float>(b);
      for (float u : {std::nextafter(fb, 0.f), fb, std::nextafter(fb, 1.f)}) {
        SampleRow row;
        row.inv_temperature = 1.0f / p.temperature;
        row.top_p = p.top_p;
        row.u = u;
        std::vector<float> in = x;
        int32_t out = -1;
        kernels.sample_rows(Tensor(in.data(), DType::F32, {1, V}), Tensor(&row, DType::I32, {6}),
                            Tensor(nullptr, DType::I32, {0}), Tensor(&out, DType::I32, {1}));
        EXPECT_EQ(sampler.sample_u(x.data(), p, {}, {}, double(u), nullptr), out)
            << "trial " << trial << " u " << u;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 600) << compared;
  std::printf("%d draws compared\n", compared);
}

// A uniform just below 1 (a double that rounds to 1.0f) never draws a masked token: with only
// tokens 5, 7 and 9 allowed (the rest -inf, as a grammar or allowed_token_ids leaves them), the
// kept set under top-k 20 (or with top-k off) also holds tokens of probability 0, and the draw
// returned the last of them (19, or 999) when no running total passed u.
// Found by review (stop 55). Temperature alone (no top-k, top-p or min-p) drew by sorting the
// whole vocabulary twice (~100 ms a row at 248k tokens); it is now one pass in token-id order: the
// reference's inverse CDF wherever u is not within rounding of a boundary, the same token as
// Kernels::sample_rows, and the same distribution. Greedy skips NaNs as argmax_rows does.
TEST(Sampler, TemperatureAloneDrawsTheReferenceInverseCdf) {
  const int64_t V = 248320;
  ThreadPool pool(1);
  CpuKernels kernels(pool);
  Sampler sampler(V);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  int compared = 0;
  for (int trial = 0; trial < 12; ++trial) {
    auto logits = random_logits(rng, V, 3.0f);
    SamplingParams p;
    p.temperature = trial % 2 ? 0.7f : 1.0f;
    p.top_k = trial % 3 == 0 ? -1 : static_cast<int>(V);
    const double u = unif(rng);
    const SampleRow row = sample_row(p, u);
    const auto want = reference(logits, p);
    // The reference's token at row.u, and how close u lies to a boundary of its CDF.
    double cum = 0, gap = 1;
    int32_t ref = -1;
    for (int64_t i = 0; i < V; ++i) {
      cum += want[static_cast<size_t>(i)];
      gap = std::min(gap, std::abs(cum - double(row.u)));
      if (ref < 0 && double(row.u) < cum) ref = static_cast<int32_t>(i);
    }
    const int32_t got = sampler.sample_u(logits.data(), p, {}, {}, u, nullptr);
    if (gap > 1e-6) {
      EXPECT_EQ(got, ref) << "trial " << trial;
      ++compared;
    }
    std::vector<float> in = logits;
    SampleRow r = row;
    int32_t out = -1;
    kernels.sample_rows(Tensor(in.data(), DType::F32, {1, V}), Tensor(&r, DType::I32, {6}),
                        Tensor(nullptr, DType::I32, {0}), Tensor(&out, DType::I32, {1}));
    EXPECT_EQ(out, got) << "trial " << trial;
    std::vector<float> probs;
    sampler.distribution(logits.data(), p, {}, {}, probs);
    expect_same(probs, want, "trial " + std::to_string(trial));
  }
  EXPECT_GE(compared, 10);
  // Greedy with a NaN first: the largest number, as argmax_rows picks.
  std::vector<float> x = {NAN, 1.0f, 5.0f, 2.0f};
  SamplingParams g;
  g.temperature = 0.0f;
  Sampler small(4);
  EXPECT_EQ(small.sample_u(x.data(), g, {}, {}, 0.0, nullptr), 2);
  std::vector<float> probs;
  small.distribution(x.data(), g, {}, {}, probs);
  EXPECT_EQ(probs[2], 1.0f);
}

TEST(Sampler, AUniformNearOneNeverDrawsAMaskedToken) {
  const int64_t V = 1000;
  std::vector<float> x(V, -INFINITY);
  x[5] = 1.0f;
  x[7] = 2.0f;
  x[9] = 0.5f;
  ThreadPool pool(1);
  CpuKernels kernels(pool);
  Sampler sampler(V);
  for (int top_k : {20, -1}) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = top_k;
    for (double u : {1.0 - 1e-8, 1.0 - 1e-12, std::nextafter(1.0, 0.0)}) {
      EXPECT_EQ(sampler.sample_u(x.data(), p, {}, {}, u, nullptr), 9) << "top_k " << top_k << " u " << u;
      SampleRow row = sample_row(p, u);
      EXPECT_LT(row.u, 1.0f);
      std::vector<float> in = x;
      int32_t out = -1;
      kernels.sample_rows(Tensor(in.data(), DType::F32, {1, V}), Tensor(&row, DType::I32, {6}),
                          Tensor(nullptr, DType::I32, {0}), Tensor(&out, DType::I32, {1}));
      EXPECT_EQ(out, 9) << "top_k " << top_k << " u " << u;
    }
  }
}

}  // namespace
}  // namespace deltaserve
