// The fixture models on the CUDA backend against the Hugging Face reference: logits of every
// position (prefill: cuBLAS with bf16-rounded activations), greedy tokens through prefill +
// token-by-token decode (the f32 GEMV path), and MTP logits (snapshots and rollback are covered by
// tests/ops/cuda_ops_test.cpp), and the bf16 / fp8 KV caches against the f32 one (the same
// checks and tolerances as kv_dtype_test.cpp on the CPU, see kv_runs.h). Skipped without a GPU.
// The `_tp*` cases run the same under tensor parallelism (CudaPeerCommunicator; with fewer GPUs
// than ranks, every rank shares GPU 0 through DELTASERVE_TP_DEVICES).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <memory>

#include "backend/cuda/cuda_backend.h"
#include "engine/model_setup.h"
#include "fixture.h"
#include "fixture_seq.h"
#include "kv_runs.h"

namespace deltaserve::test {
namespace {

// qwen3_5-model.md: an f32 engine is within 2e-3. Decode (GEMV on f32 activations) and prefill
// with DELTASERVE_CUDA_GEMM=exact (three bf16 parts of each activation) are f32-accurate up to
// summation order. The default GEMM rounds prefill activations to bf16 once (as vLLM/SGLang do): the
// random-weight qwen35-tiny amplifies that to O(1) logit errors, so that mode is only checked on
// tiny-coder, and only to a few 1e-2.
constexpr float kPrefillTol = 5e-3f;
constexpr float kDecodeTol = 5e-3f;
constexpr float kBf16PrefillTol = 1e-1f;

struct ModelCase {
  std::string name;
  std::string dir;
  int tp = 1;
};
std::ostream& operator<<(std::ostream& os, const ModelCase& m) { return os << m.name; }

float max_abs_diff(const float* a, const float* b, int64_t n) {
  float m = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    float d = std::fabs(a[i] - b[i]);
    if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
  }
  return m;
}
float ref_margin(const float* row, int64_t V) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < V; ++i) {
    if (row[i] > a) { b = a; a = row[i]; }
    else if (row[i] > b) b = row[i];
  }
  return a - b;
}

class CudaModelTest : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    // Exact GEMM (DELTASERVE_CUDA_GEMM=exact) splits activations into three bf16 parts:
    // f32-accurate, so the fixtures' 2e-3 applies. The *Bf16Gemm test runs the default mode
    // (activations rounded to bf16 once for GEMMs above 8 rows).
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    bf16_gemm_ = test.find("Bf16Gemm") != std::string::npos;
    if (bf16_gemm_) unsetenv("DELTASERVE_CUDA_GEMM");
    else setenv("DELTASERVE_CUDA_GEMM", "exact", 1);
    dir_ = source_dir() / GetParam().dir;
    fixture_ = std::make_unique<Fixture>(dir_);
    for (const auto& c : fixture_->cases()) max_t_ = std::max<int>(max_t_, c.tokens.size());
    setup_ = make_setup(std::nullopt);
    ASSERT_TRUE(setup_);
  }
  // The model on CUDA with the given KV cache dtype (unset: the activation dtype, f32).
  std::unique_ptr<ModelSetup> make_setup(std::optional<DType> kv, const std::vector<int32_t>& draft_vocab = {}) {
    SetupOptions o;
    o.draft_vocab = draft_vocab;
    o.pending_depth = 1;  // MTP hidden states (MtpLogitsMatchReference)
    o.model_dir = dir_.string();
    o.device = "cuda";
    o.kv_dtype = kv;
    o.tp_size = GetParam().tp;
    if (o.tp_size > cuda_device_count()) {
      std::string devs = "0";
      for (int r = 1; r < o.tp_size; ++r) devs += ",0";
      setenv("DELTASERVE_TP_DEVICES", devs.c_str(), 1);
    } else {
      unsetenv("DELTASERVE_TP_DEVICES");
    }
    auto s = ModelSetup::create(o, max_t_, 2, max_t_ + 16, max_t_);
    EXPECT_TRUE(s.is_ok()) << s.status().message();
    return s.is_ok() ? std::move(*s) : nullptr;
  }
  // Sequences and runs by hand (fixture_seq.h): blocks for max_t_ + 16 tokens.
  using Seq = FixtureSeq;
  Seq new_seq() { return FixtureSeq::acquire(*setup_, max_t_ + 16); }
  void free_seq(Seq& s) { s.release(*setup_); }
  void prefill(const FixtureCase& c, const Seq& s) { run_prompt(*setup_, c.tokens, s, /*logits=*/false); }
  void mtp_teacher_forced(const FixtureCase& c, const Seq& s, ModelRunner::Fetch fetch = ModelRunner::Fetch::Logits) {
    test::mtp_teacher_forced(*setup_, c, s, fetch);
  }
  // Logits of every position of each case, one prefill forward per case; returns the max error.
  float prefill_max_diff(float tol) {
    const int64_t V = setup_->model->config().vocab_size;
    float worst = 0;
    for (const auto& c : fixture_->cases()) {
      Seq s = new_seq();
      RunItem it{c.tokens, 0, s.blocks, s.slot, true, false};
      setup_->runner->run(std::span<const RunItem>(&it, 1));
      const float* ref = fixture_->f32(c.name + ".logits");
      EXPECT_NE(ref, nullptr);
      if (!ref) return INFINITY;
      for (size_t t = 0; t < c.tokens.size(); ++t) {
        float d = max_abs_diff(setup_->runner->logits(static_cast<int>(t)), ref + t * V, V);
        worst = std::max(worst, d);
        EXPECT_LE(d, tol) << c.name << " position " << t;
      }
      free_seq(s);
    }
    return worst;
  }
  std::filesystem::path dir_;
  std::unique_ptr<Fixture> fixture_;
  std::unique_ptr<ModelSetup> setup_;
  int max_t_ = 0;
  bool bf16_gemm_ = false;
};

TEST_P(CudaModelTest, PrefillLogitsOfEveryPositionMatchReference) {
  const float worst = prefill_max_diff(kPrefillTol);
  std::printf("[ %s ] prefill logits (exact GEMM): max |diff| %.3g\n", GetParam().name.c_str(), worst);
}

TEST_P(CudaModelTest, PrefillLogitsWithinFewHundredthsBf16Gemm) {
  if (GetParam().name != "tiny_coder") GTEST_SKIP() << "random-weight fixture: bf16 activations are O(1) off";
  const float worst = prefill_max_diff(kBf16PrefillTol);
  std::printf("[ %s ] prefill logits (bf16 GEMM): max |diff| %.3g\n", GetParam().name.c_str(), worst);
}

TEST_P(CudaModelTest, GreedyTokensThroughTokenByTokenDecode) {
  const int64_t V = setup_->model->config().vocab_size;
  float worst = 0;
  int compared = 0;
  for (const auto& c : fixture_->cases()) {
    const float* ref = fixture_->f32(c.name + ".logits");
    Seq s = new_seq();
    const int T = static_cast<int>(c.tokens.size());
    std::span<const int32_t> toks(c.tokens);
    // Every token alone (GEMV path, exact f32 activations): logits and greedy choice per position.
    for (int p = 0; p < T; ++p) {
      RunItem step{toks.subspan(p, 1), p, s.blocks, s.slot, false, false};
      setup_->runner->run(std::span<const RunItem>(&step, 1));
      const float* lg = setup_->runner->logits(0);
      const float d = max_abs_diff(lg, ref + int64_t(p) * V, V);
      worst = std::max(worst, d);
      EXPECT_LE(d, kDecodeTol) << c.name << " position " << p;
      if (p + 1 < T && p + 1 >= c.prompt_len && ref_margin(ref + int64_t(p) * V, V) > 1e-2f) {
        const int32_t best = static_cast<int32_t>(std::max_element(lg, lg + V) - lg);
        EXPECT_EQ(best, c.tokens[p + 1]) << c.name << " position " << p + 1;
        ++compared;
      }
    }
    free_seq(s);
  }
  std::printf("[ %s ] decode logits: max |diff| %.3g, %d greedy tokens compared\n", GetParam().name.c_str(),
              worst, compared);
  EXPECT_GT(compared, 0);
}

TEST_P(CudaModelTest, MtpLogitsMatchReference) {
  if (!setup_->model->has_mtp()) GTEST_SKIP() << "model has no MTP head";
  const int64_t V = setup_->model->config().vocab_size;
  for (const auto& c : fixture_->cases()) {
    const float* ref = fixture_->f32(c.name + ".mtp_logits");
    ASSERT_NE(ref, nullptr);
    const int T = static_cast<int>(c.tokens.size());
    Seq s = new_seq();
    prefill(c, s);
    mtp_teacher_forced(c, s);
    for (int p = 0; p < T - 1; ++p) {
      float d = max_abs_diff(setup_->runner->logits(p), ref + int64_t(p) * V, V);
      ASSERT_LE(d, kPrefillTol) << c.name << " MTP row " << p;
    }
    free_seq(s);
  }
}

// --speculative-token-map on the GPU (Kernels::gather_columns after the map's lm_head rows):
// the map's tokens keep the reference's MTP logits, the rest are -inf, and the device argmax
// picks the best token of the map (twice: nothing left over from the first run changes it).
TEST_P(CudaModelTest, MtpLogitsOverATokenMapAreTheReferencesAtItsTokens) {
  if (!setup_->model->has_mtp()) GTEST_SKIP() << "model has no MTP head";
  const int64_t V = setup_->model->config().vocab_size;
  std::vector<int32_t> map;
  for (int32_t id = 0; id < V; ++id)
    if (id % 3 != 1) map.push_back(id);
  setup_.reset();
  setup_ = make_setup(std::nullopt, map);
  ASSERT_TRUE(setup_);
  for (const auto& c : fixture_->cases()) {
    const float* ref = fixture_->f32(c.name + ".mtp_logits");
    ASSERT_NE(ref, nullptr);
    const int T = static_cast<int>(c.tokens.size());
    Seq s = new_seq();
    prefill(c, s);
    mtp_teacher_forced(c, s);
    std::vector<int32_t> best(T - 1);
    for (int p = 0; p < T - 1; ++p) {
      const float* lg = setup_->runner->logits(p);
      const float* rr = ref + int64_t(p) * V;
      float worst = 0;
      for (int64_t i = 0; i < V; ++i) {
        if (i % 3 != 1) worst = std::max(worst, std::fabs(lg[i] - rr[i]));
        else ASSERT_TRUE(std::isinf(lg[i]) && lg[i] < 0) << c.name << " MTP row " << p << " token " << i;
      }
      ASSERT_LE(worst, kPrefillTol) << c.name << " MTP row " << p;
      best[p] = static_cast<int32_t>(std::max_element(lg, lg + V) - lg);
    }
    for (int round = 0; round < 2; ++round) {
      mtp_teacher_forced(c, s, ModelRunner::Fetch::Argmax);
      for (int p = 0; p < T - 1; ++p) EXPECT_EQ(setup_->runner->token(p), best[p]) << c.name << " MTP row " << p;
    }
    free_seq(s);
  }
}

// Prefill (cuBLAS, flash attention for prompts of 64+ tokens) + token-by-token decode (GEMV,
// split-KV attention, CUDA graphs) with each KV cache dtype, against the f32 cache on CUDA.
TEST_P(CudaModelTest, KvCacheDtypesTrackTheF32Cache) {
  const int64_t V = setup_->model->config().vocab_size;
  for (DType dt : kKvTestDtypes) {
    auto s = make_setup(dt);
    ASSERT_TRUE(s);
    ASSERT_EQ(s->cache->kv_dtype(), dt);
    float worst = 0;
    for (const auto& c : fixture_->cases()) {
      const auto want = prefill_then_decode_logits(*setup_, c.tokens, c.prompt_len);
      const auto got = prefill_then_decode_logits(*s, c.tokens, c.prompt_len);
      for (std::size_t t = 0; t < c.tokens.size(); ++t)
        worst = std::max(worst, kv_max_abs_diff(got.data() + t * V, want.data() + t * V, V));
    }
    std::printf("[ %s ] kv %s: max |logit diff| vs f32 KV %.3g = %.1f u (tolerance %.3g)\n", GetParam().name.c_str(),
                std::string(dtype_name(dt)).c_str(), worst, worst / kv_unit_roundoff(dt),
                kv_logit_tolerance(GetParam().name, dt));
    EXPECT_LE(worst, kv_logit_tolerance(GetParam().name, dt)) << dtype_name(dt);
    EXPECT_GT(worst, 0.f) << dtype_name(dt) << ": identical to the f32 cache, is the dtype in effect?";
  }
}

TEST_P(CudaModelTest, KvCacheDtypesPartFromTheF32CacheOnlyAtNearTies) {
  if (GetParam().name != "tiny_coder") GTEST_SKIP() << "random-weight fixture: no meaningful greedy text";
  for (DType dt : kKvTestDtypes) {
    auto s = make_setup(dt);
    ASSERT_TRUE(s);
    for (const auto& c : fixture_->cases()) {
      const std::string what = std::string(dtype_name(dt)) + " " + c.name;
      const std::span<const int32_t> prompt(c.tokens.data(), c.prompt_len);
      const int same = check_greedy_against_f32(*setup_, *s, dt, prompt, kKvGreedyTokens, what);
      std::printf("[ tiny_coder ] kv %s: %d of %d greedy tokens equal to the f32 cache's\n", what.c_str(), same,
                  kKvGreedyTokens);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaModelTest,
                         ::testing::Values(ModelCase{"tiny_coder", "models/tiny-coder"},
                                           ModelCase{"qwen35_tiny", "tests/fixtures/qwen35-tiny"},
                                           ModelCase{"qwen3_tiny", "tests/fixtures/qwen3-tiny"},
                                           ModelCase{"tiny_coder_tp2", "models/tiny-coder", 2},
                                           ModelCase{"qwen35_tiny_tp2", "tests/fixtures/qwen35-tiny", 2},
                                           ModelCase{"qwen3_tiny_tp4", "tests/fixtures/qwen3-tiny", 4}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace deltaserve::test
