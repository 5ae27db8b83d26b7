// The fixture models on the CPU with a bf16 / fp8 KV cache against the same engine with the f32
// KV cache: logits of every position through prefill + token-by-token decode within a tolerance
// proportional to the format's unit roundoff, and greedy tokens on tiny-coder that part from the
// f32 run's only at near ties (tolerances and their measurements: kv_runs.h).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "fixture.h"
#include "kv_runs.h"

namespace deltaserve::test {
namespace {

struct ModelCase {
  std::string name;
  std::string dir;
};
std::ostream& operator<<(std::ostream& os, const ModelCase& m) { return os << m.name; }

class KvDtypeTest : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    dir_ = source_dir() / GetParam().dir;
    fixture_ = std::make_unique<Fixture>(dir_);
    for (const auto& c : fixture_->cases()) max_t_ = std::max<int>(max_t_, c.tokens.size());
  }
  std::unique_ptr<ModelSetup> setup(std::optional<DType> kv) {
    SetupOptions o;
    o.model_dir = dir_.string();
    o.n_threads = 2;
    o.kv_dtype = kv;
    const int ctx = std::max(max_t_, 16 + kKvGreedyTokens) + 16;
    auto s = ModelSetup::create(o, ctx, 1, ctx, ctx);
    EXPECT_TRUE(s.is_ok()) << s.status().message();
    return s.is_ok() ? std::move(*s) : nullptr;
  }
  std::filesystem::path dir_;
  std::unique_ptr<Fixture> fixture_;
  int max_t_ = 0;
};

TEST_P(KvDtypeTest, LogitsThroughPrefillAndDecodeTrackTheF32Cache) {
  auto ref = setup(std::nullopt);
  ASSERT_TRUE(ref);
  ASSERT_EQ(ref->cache->kv_dtype(), DType::F32);  // the default: the CPU's activation dtype
  const int64_t V = ref->model->config().vocab_size;
  for (DType dt : kKvTestDtypes) {
    auto s = setup(dt);
    ASSERT_TRUE(s);
    ASSERT_EQ(s->cache->kv_dtype(), dt);
    ASSERT_EQ(s->cache->views().kv[0].k.dtype, dt);
    float worst = 0;
    for (const auto& c : fixture_->cases()) {
      const auto want = prefill_then_decode_logits(*ref, c.tokens, c.prompt_len);
      const auto got = prefill_then_decode_logits(*s, c.tokens, c.prompt_len);
      for (std::size_t t = 0; t < c.tokens.size(); ++t)
        worst = std::max(worst, kv_max_abs_diff(got.data() + t * V, want.data() + t * V, V));
    }
    const float tol = kv_logit_tolerance(GetParam().name, dt);
    std::printf("[ %s ] kv %s: max |logit diff| vs f32 KV %.3g = %.1f u (tolerance %.3g)\n", GetParam().name.c_str(),
                std::string(dtype_name(dt)).c_str(), worst, worst / kv_unit_roundoff(dt), tol);
    EXPECT_LE(worst, tol) << dtype_name(dt);
    EXPECT_GT(worst, 0.f) << dtype_name(dt) << ": identical to the f32 cache, is the dtype in effect?";
  }
}

TEST_P(KvDtypeTest, GreedyTokensPartFromTheF32CacheOnlyAtNearTies) {
  if (GetParam().name != "tiny_coder") GTEST_SKIP() << "random-weight fixture: no meaningful greedy text";
  auto ref = setup(std::nullopt);
  ASSERT_TRUE(ref);
  for (DType dt : kKvTestDtypes) {
    auto s = setup(dt);
    ASSERT_TRUE(s);
    for (const auto& c : fixture_->cases()) {
      const std::string what = std::string(dtype_name(dt)) + " " + c.name;
      const std::span<const int32_t> prompt(c.tokens.data(), c.prompt_len);
      const int same = check_greedy_against_f32(*ref, *s, dt, prompt, kKvGreedyTokens, what);
      std::printf("[ tiny_coder ] kv %s: %d of %d greedy tokens equal to the f32 cache's\n", what.c_str(), same,
                  kKvGreedyTokens);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvDtypeTest,
                         ::testing::Values(ModelCase{"qwen35_tiny", "tests/fixtures/qwen35-tiny"},
                                           ModelCase{"qwen3_tiny", "tests/fixtures/qwen3-tiny"},
                                           ModelCase{"tiny_coder", "models/tiny-coder"}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace deltaserve::test
