// Checkpoint KV cache scales: the per-layer k_scale / v_scale tensors under every name SGLang and
// vLLM accept are loaded (not reported as unexpected), reach Model::kv_scales() in KV layer order
// (the MTP layer last) and the cache views of an fp8 cache (1 for bf16 / f32 caches); two names for
// one scale, a non-positive or non-finite value, and a non-scalar shape are errors naming the
// tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "engine/model_setup.h"
#include "fixture.h"

namespace deltaserve::test {
namespace {

namespace fs = std::filesystem;

class KvScaleCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ds_kv_scale_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    src_ = source_dir() / "tests/fixtures/qwen35-tiny";  // attention layers 3 and 7, and an MTP layer
    fs::copy_file(src_ / "config.json", dir_ / "config.json");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // qwen35-tiny's weights as f32 plus the given extra tensors (name -> (shape, values)).
  void write_weights(const std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>& extra) {
    auto ck = Checkpoint::open_file(src_ / "model.safetensors");
    ASSERT_TRUE(ck.is_ok());
    std::vector<std::vector<float>> data;
    std::vector<NamedF32> out;
    data.reserve(ck->tensors().size() + extra.size());
    for (const auto& [name, e] : ck->tensors()) {
      std::vector<float> d(e.numel());
      for (int64_t i = 0; i < e.numel(); ++i) d[i] = bf16_to_f32(static_cast<const uint16_t*>(e.data)[i]);
      data.push_back(std::move(d));
      out.push_back({name, e.shape, data.back().data()});
    }
    for (const auto& [name, sv] : extra) out.push_back({name, sv.first, sv.second.data()});
    ASSERT_TRUE(write_safetensors_f32(dir_ / "model.safetensors", out).is_ok());
  }
  Result<std::unique_ptr<ModelSetup>> setup(std::optional<DType> kv) {
    SetupOptions o;
    o.model_dir = dir_.string();
    o.n_threads = 1;
    o.kv_dtype = kv;
    return ModelSetup::create(o, 16, 1, 32, 16);
  }
  std::string load_error() {
    auto s = setup(std::nullopt);
    EXPECT_FALSE(s.is_ok());
    return s.is_ok() ? "" : s.status().message();
  }

  fs::path dir_, src_;
};

const std::string L3 = "model.language_model.layers.3.self_attn.";
const std::string L7 = "model.language_model.layers.7.self_attn.";
const std::string MTP = "mtp.layers.0.self_attn.";

TEST_F(KvScaleCheckpoint, ScalesUnderEveryAcceptedNameReachModelAndFp8Cache) {
  write_weights({
      {L3 + "k_scale", {{}, {0.5f}}},           // compressed-tensors / Quark: a 0-dim scalar
      {L3 + "v_scale", {{1}, {0.25f}}},         //   ... or shape [1]
      {L7 + "k_proj.k_scale", {{}, {2.f}}},     // ModelOpt
      {L7 + "v_proj.v_scale", {{}, {3.f}}},
      {MTP + "kv_scale", {{}, {0.125f}}},       // deprecated: one scale for k and v
  });
  auto s = setup(DType::F8E4M3);
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  const auto scales = (*s)->model->kv_scales();
  ASSERT_EQ(scales.size(), 3u);
  EXPECT_EQ(scales[0].k, 0.5f);
  EXPECT_EQ(scales[0].v, 0.25f);
  EXPECT_EQ(scales[1].k, 2.f);
  EXPECT_EQ(scales[1].v, 3.f);
  EXPECT_EQ(scales[2].k, 0.125f);
  EXPECT_EQ(scales[2].v, 0.125f);
  const auto& kv = (*s)->cache->views().kv;
  ASSERT_EQ(kv.size(), 3u);
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ(kv[l].k.dtype, DType::F8E4M3);
    EXPECT_EQ(kv[l].k_scale, scales[l].k) << l;
    EXPECT_EQ(kv[l].v_scale, scales[l].v) << l;
  }
  // A bf16 cache stores the values themselves: scales stay 1.
  auto b = setup(DType::BF16);
  ASSERT_TRUE(b.is_ok()) << b.status().message();
  for (const auto& v : (*b)->cache->views().kv) {
    EXPECT_EQ(v.k.dtype, DType::BF16);
    EXPECT_EQ(v.k_scale, 1.f);
    EXPECT_EQ(v.v_scale, 1.f);
  }
  // KV bytes per token follow the cache dtype: 3 KV layers x (k, v) x heads x head_dim x element.
  const ModelConfig& c = (*b)->model->config();
  EXPECT_EQ((*b)->cache->kv_bytes_per_token(), int64_t(3) * 2 * c.n_kv_heads * c.head_dim * 2);
  EXPECT_EQ((*s)->cache->kv_bytes_per_token(), int64_t(3) * 2 * c.n_kv_heads * c.head_dim * 1);
}

TEST_F(KvScaleCheckpoint, AttnModuleNamesAndNoScales) {
  write_weights({{L7 + "attn.k_scale", {{}, {4.f}}}, {L7 + "attn.v_scale", {{}, {5.f}}}});
  auto s = setup(DType::F8E5M2);
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  const auto scales = (*s)->model->kv_scales();
  ASSERT_EQ(scales.size(), 3u);
  EXPECT_EQ(scales[0].k, 1.f);  // layer 3: none in the checkpoint
  EXPECT_EQ(scales[0].v, 1.f);
  EXPECT_EQ(scales[1].k, 4.f);
  EXPECT_EQ(scales[1].v, 5.f);
  EXPECT_EQ((*s)->cache->views().kv[1].k_scale, 4.f);
  EXPECT_EQ((*s)->cache->views().kv[0].k_scale, 1.f);
}

TEST_F(KvScaleCheckpoint, TwoNamesForOneScaleAreAnError) {
  write_weights({{L3 + "k_scale", {{}, {0.5f}}}, {L3 + "attn.k_scale", {{}, {0.5f}}}});
  const std::string e = load_error();
  EXPECT_NE(e.find(L3 + "k_scale"), std::string::npos) << e;
  EXPECT_NE(e.find(L3 + "attn.k_scale"), std::string::npos) << e;
}

TEST_F(KvScaleCheckpoint, BadScaleValuesAndShapesAreNamed) {
  for (float bad : {0.f, -1.f, NAN, INFINITY}) {
    write_weights({{L7 + "v_scale", {{}, {bad}}}});
    const std::string e = load_error();
    EXPECT_NE(e.find(L7 + "v_scale"), std::string::npos) << e;
    EXPECT_NE(e.find("positive finite"), std::string::npos) << e;
  }
  write_weights({{L3 + "k_scale", {{2}, {1.f, 2.f}}}});
  const std::string e = load_error();
  EXPECT_NE(e.find(L3 + "k_scale"), std::string::npos) << e;
  EXPECT_NE(e.find("shape"), std::string::npos) << e;
}

}  // namespace
}  // namespace deltaserve::test
