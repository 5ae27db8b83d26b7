// --dtype (ModelLoadOptions::weight_dtype) on the CPU: the matmul weights' dtype, whatever the
// checkpoint's. Checked on qwen35-tiny (bf16 checkpoint) and an f32 copy of it written here:
// bfloat16 rounds the copy back to the checkpoint's own bits, float32 widens the checkpoint and
// keeps the float32 engine's tolerance to the Hugging Face reference.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/model_setup.h"
#include "model/weight_loader.h"
#include "fixture.h"
#include "fixture_seq.h"

namespace deltaserve::test {
namespace {

namespace fs = std::filesystem;

constexpr float kLogitTol = 2e-3f;  // qwen3_5-model.md: a correct float32 engine meets this

struct Loaded {
  std::size_t weight_bytes = 0;
  std::vector<std::vector<float>> logits;  // per fixture case: [T, V]
};

class WeightDTypeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = source_dir() / "tests/fixtures/qwen35-tiny";
    fixture_ = std::make_unique<Fixture>(src_);
    f32_dir_ = fs::temp_directory_path() / ("ds_weight_dtype_" + std::to_string(::getpid()));
    fs::remove_all(f32_dir_);
    fs::create_directories(f32_dir_);
    fs::copy_file(src_ / "config.json", f32_dir_ / "config.json");
    // Every tensor of the checkpoint widened to f32 (exactly: bf16 values are f32 values).
    auto ck = Checkpoint::open_file(src_ / "model.safetensors");
    ASSERT_TRUE(ck.is_ok()) << ck.status().message();
    std::vector<std::string> names;
    std::vector<std::vector<int64_t>> shapes;
    std::vector<std::vector<float>> data;
    for (const auto& [name, e] : ck->tensors()) {
      ASSERT_EQ(e.dtype, DType::BF16) << name;
      std::vector<float> d(static_cast<std::size_t>(e.numel()));
      for (int64_t i = 0; i < e.numel(); ++i) d[i] = bf16_to_f32(static_cast<const uint16_t*>(e.data)[i]);
      names.push_back(name);
      shapes.push_back(e.shape);
      data.push_back(std::move(d));
    }
    std::vector<NamedF32> out;
    for (std::size_t i = 0; i < names.size(); ++i) out.push_back({names[i], shapes[i], data[i].data()});
    ASSERT_TRUE(write_safetensors_f32(f32_dir_ / "model.safetensors", out).is_ok());
  }
  void TearDown() override { fs::remove_all(f32_dir_); }

  // Every fixture case's logits, prefilled at once, from `dir` loaded with `dtype`.
  Loaded run(const fs::path& dir, WeightDType dtype) {
    Loaded r;
    SetupOptions o;
    o.model_dir = dir.string();
    o.n_threads = 2;
    o.weight_dtype = dtype;
    int max_t = 0;
    for (const auto& c : fixture_->cases()) max_t = std::max<int>(max_t, static_cast<int>(c.tokens.size()));
    auto s = ModelSetup::create(o, max_t, 2, max_t + 16, max_t);
    EXPECT_TRUE(s.is_ok()) << s.status().message();
    if (!s.is_ok()) return r;
    ModelSetup& m = **s;
    r.weight_bytes = m.model->weight_bytes();
    const int64_t V = m.model->config().vocab_size;
    for (const auto& c : fixture_->cases()) {
      FixtureSeq seq = FixtureSeq::acquire(m, max_t + 16);
      run_prompt(m, c.tokens, seq, /*logits=*/true);
      const float* lg = m.runner->logits(0);
      r.logits.emplace_back(lg, lg + int64_t(c.tokens.size()) * V);
      seq.release(m);
    }
    return r;
  }

  fs::path src_, f32_dir_;
  std::unique_ptr<Fixture> fixture_;
};

// The bytes the CPU backend holds for one fused matmul (gate | up, [384, 96]) loaded from `dir`.
std::size_t gate_up_bytes(const fs::path& dir, WeightDType dtype) {
  auto ck = Checkpoint::open_file(dir / "model.safetensors");
  EXPECT_TRUE(ck.is_ok()) << ck.status().message();
  if (!ck.is_ok()) return 0;
  auto backend = make_cpu_backend(1);
  WeightLoader w(&*ck, *backend, dir.string(), dtype);
  const std::string p = "model.language_model.layers.0.mlp.";
  auto lw = w.linear({p + "gate_proj.weight", p + "up_proj.weight"}, {192, 192}, 96);
  EXPECT_TRUE(lw.is_ok()) << lw.status().message();
  return lw.is_ok() ? (*lw)->nbytes() : 0;
}

TEST_F(WeightDTypeTest, TheBackendHoldsTheMatmulsInTheDTypeAsked) {
  const std::size_t bf16 = gate_up_bytes(src_, WeightDType::Auto);
  EXPECT_GE(bf16, std::size_t{384 * 96 * 2});
  EXPECT_EQ(gate_up_bytes(src_, WeightDType::BF16), bf16);
  EXPECT_EQ(gate_up_bytes(src_, WeightDType::F32), 2 * bf16);
  EXPECT_EQ(gate_up_bytes(f32_dir_, WeightDType::Auto), 2 * bf16);
  EXPECT_EQ(gate_up_bytes(f32_dir_, WeightDType::BF16), bf16);
  EXPECT_EQ(gate_up_bytes(f32_dir_, WeightDType::F32), 2 * bf16);
}

TEST_F(WeightDTypeTest, Bfloat16RoundsAnF32CheckpointToTheBf16CheckpointsBits) {
  const Loaded bf16 = run(src_, WeightDType::Auto);
  const Loaded f32_auto = run(f32_dir_, WeightDType::Auto);
  const Loaded f32_as_bf16 = run(f32_dir_, WeightDType::BF16);
  ASSERT_EQ(bf16.logits.size(), fixture_->cases().size());
  ASSERT_EQ(f32_as_bf16.logits.size(), bf16.logits.size());
  // Auto keeps the copy's f32 matmuls; bfloat16 loads them as the checkpoint's own bf16 (the
  // embedding table stays the copy's f32: --dtype is the matmul weights'). The CPU's bf16 and f32
  // matmuls give the same bits for the same values, so the logits check the values rounded and
  // TheBackendHoldsTheMatmulsInTheDTypeAsked the dtype they are held in.
  EXPECT_GT(f32_auto.weight_bytes, bf16.weight_bytes);
  EXPECT_LT(f32_as_bf16.weight_bytes, f32_auto.weight_bytes);
  for (std::size_t i = 0; i < bf16.logits.size(); ++i) {
    ASSERT_EQ(f32_as_bf16.logits[i].size(), bf16.logits[i].size());
    EXPECT_EQ(std::memcmp(f32_as_bf16.logits[i].data(), bf16.logits[i].data(), bf16.logits[i].size() * sizeof(float)), 0)
        << fixture_->cases()[i].name;
  }
}

TEST_F(WeightDTypeTest, Float32WidensTheBf16CheckpointWithinTheFloat32Tolerance) {
  const Loaded bf16 = run(src_, WeightDType::Auto);
  const Loaded f32 = run(src_, WeightDType::F32);
  EXPECT_GT(f32.weight_bytes, bf16.weight_bytes);
  ASSERT_EQ(f32.logits.size(), fixture_->cases().size());
  for (std::size_t i = 0; i < f32.logits.size(); ++i) {
    const FixtureCase& c = fixture_->cases()[i];
    const float* ref = fixture_->f32(c.name + ".logits");
    ASSERT_NE(ref, nullptr) << c.name;
    float worst = 0;
    for (std::size_t j = 0; j < f32.logits[i].size(); ++j) worst = std::max(worst, std::abs(f32.logits[i][j] - ref[j]));
    EXPECT_LE(worst, kLogitTol) << c.name;
  }
}

}  // namespace
}  // namespace deltaserve::test
