// Broken checkpoints give one clear error naming the file and tensor, never a crash: missing
// tensor, wrong shape, unknown architecture, truncated file, missing config, corrupt index.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "fixture.h"
#include "model/generation_config.h"
#include "model/model.h"
#include "util/mmap_file.h"

#include <nlohmann/json.hpp>

namespace deltaserve::test {
namespace {

namespace fs = std::filesystem;

class BadCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ds_bad_ckpt_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    src_ = source_dir() / "tests/fixtures/qwen3-tiny";
    fs::copy_file(src_ / "config.json", dir_ / "config.json");
    backend_ = make_cpu_backend(1);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Rewrites qwen3-tiny's weights as f32, letting `edit` drop or reshape tensors.
  void write_weights(const std::function<bool(std::string&, std::vector<int64_t>&, std::vector<float>&)>& edit) {
    auto ck = Checkpoint::open_file(src_ / "model.safetensors");
    ASSERT_TRUE(ck.is_ok());
    std::vector<std::string> names;
    std::vector<std::vector<int64_t>> shapes;
    std::vector<std::vector<float>> data;
    for (const auto& [name, e] : ck->tensors()) {
      std::string n = name;
      std::vector<int64_t> shape = e.shape;
      std::vector<float> d(e.numel());
      for (int64_t i = 0; i < e.numel(); ++i) d[i] = bf16_to_f32(static_cast<const uint16_t*>(e.data)[i]);
      if (!edit(n, shape, d)) continue;
      names.push_back(n);
      shapes.push_back(shape);
      data.push_back(std::move(d));
    }
    std::vector<NamedF32> out;
    for (size_t i = 0; i < names.size(); ++i) out.push_back({names[i], shapes[i], data[i].data()});
    ASSERT_TRUE(write_safetensors_f32(dir_ / "model.safetensors", out).is_ok());
  }
  std::string load_error() {
    auto m = load_model(dir_, *backend_, {});
    EXPECT_FALSE(m.is_ok());
    return m.is_ok() ? "" : m.status().message();
  }

  fs::path dir_, src_;
  std::unique_ptr<Backend> backend_;
};

TEST_F(BadCheckpoint, IntactF32CopyLoads) {
  write_weights([](auto&, auto&, auto&) { return true; });
  auto m = load_model(dir_, *backend_, {});
  ASSERT_TRUE(m.is_ok()) << m.status().message();
}

TEST_F(BadCheckpoint, MissingTensorIsNamed) {
  write_weights([](std::string& n, auto&, auto&) { return n != "model.layers.2.mlp.up_proj.weight"; });
  std::string e = load_error();
  EXPECT_NE(e.find("model.layers.2.mlp.up_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
}

TEST_F(BadCheckpoint, WrongShapeNamesTensorAndFile) {
  write_weights([](std::string& n, std::vector<int64_t>& shape, std::vector<float>& d) {
    if (n == "model.layers.1.self_attn.k_proj.weight") {
      shape = {shape[0] / 2, shape[1]};
      d.resize(shape[0] * shape[1]);
    }
    return true;
  });
  std::string e = load_error();
  EXPECT_NE(e.find("model.layers.1.self_attn.k_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("expected"), std::string::npos) << e;
}

TEST_F(BadCheckpoint, UnexpectedTensorIsReported) {
  write_weights([](std::string& n, auto&, auto&) {
    if (n == "model.norm.weight") n = "model.norm.weight_renamed";
    return true;
  });
  std::string e = load_error();
  EXPECT_NE(e.find("model.norm.weight"), std::string::npos) << e;
}

TEST_F(BadCheckpoint, TruncatedFileIsDetected) {
  fs::copy_file(src_ / "model.safetensors", dir_ / "model.safetensors");
  fs::resize_file(dir_ / "model.safetensors", fs::file_size(dir_ / "model.safetensors") - 1000);
  std::string e = load_error();
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  // Cut inside the header, too.
  fs::resize_file(dir_ / "model.safetensors", 100);
  e = load_error();
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST_F(BadCheckpoint, UnknownArchitectureIsNamed) {
  fs::copy_file(src_ / "model.safetensors", dir_ / "model.safetensors");
  std::ofstream(dir_ / "config.json", std::ios::trunc)
      << R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4})";
  std::string e = load_error();
  EXPECT_NE(e.find("LlamaForCausalLM"), std::string::npos) << e;
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
}

TEST_F(BadCheckpoint, MissingOrBrokenConfig) {
  fs::copy_file(src_ / "model.safetensors", dir_ / "model.safetensors");
  fs::remove(dir_ / "config.json");
  std::string e = load_error();
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  std::ofstream(dir_ / "config.json") << "{\"architectures\": [\"Qwen3ForCausalLM\"], ";
  e = load_error();
  EXPECT_NE(e.find("invalid JSON"), std::string::npos) << e;
  std::ofstream(dir_ / "config.json", std::ios::trunc) << R"({"architectures": ["Qwen3ForCausalLM"]})";
  e = load_error();
  EXPECT_NE(e.find("vocab_size"), std::string::npos) << e;
}

TEST_F(BadCheckpoint, ShardIndexNamingAMissingShard) {
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}})";
  std::string e = load_error();
  EXPECT_NE(e.find("model-00001-of-00002.safetensors"), std::string::npos) << e;
}

TEST_F(BadCheckpoint, NoWeightsAtAll) {
  std::string e = load_error();
  EXPECT_NE(e.find("no model.safetensors"), std::string::npos) << e;
}

}  // namespace
}  // namespace deltaserve::test

namespace deltaserve::test {
namespace {

// Found by fuzz_model_config: a float too large for an integer field (6.7e85) was converted to
// int64 (undefined behaviour). Integer fields take integers, or integral floats, within range.
TEST(BadConfig, NumbersOutsideAnIntegerFieldsRangeAreRefusedNamingTheKey) {
  auto text = read_text_file(source_dir() / "tests/fixtures/qwen3-tiny/config.json");
  ASSERT_TRUE(text.is_ok());
  auto with = [&](const std::string& value) {
    nlohmann::json j = nlohmann::json::parse(*text);
    j["hidden_size"] = nlohmann::json::parse(value);
    return parse_model_config(j.dump(), "config.json");
  };
  for (const char* bad : {"6.6e85", "-1e300", "64.5", "9223372036854775808", "\"64\"", "true"}) {
    auto c = with(bad);
    ASSERT_FALSE(c.is_ok()) << bad;
    EXPECT_NE(c.status().message().find("hidden_size"), std::string::npos) << c.status().message();
  }
  auto ok = with("64.0");  // an integral float is an integer
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ(ok->hidden_size, 64);
  auto big = nlohmann::json::parse(*text);
  big["num_attention_heads"] = 4294967296LL;  // an int field: beyond int32
  auto c = parse_model_config(big.dump(), "config.json");
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("num_attention_heads"), std::string::npos) << c.status().message();
}

// Found by review (stop 52), each a crash or a write outside a buffer before:
// partial_rotary_factor 2.0 made RoPE write past each head (heap corruption); an eos_token_id
// outside the vocabulary was written to by the constraint's logit masks.
TEST(BadConfig, RopeFactorAndEosIdsOutsideTheirRangeAreRefused) {
  auto text = read_text_file(source_dir() / "tests/fixtures/qwen3-tiny/config.json");
  ASSERT_TRUE(text.is_ok());
  for (const char* factor : {"2.0", "0", "-0.5", "1e30"}) {
    nlohmann::json j = nlohmann::json::parse(*text);
    j["partial_rotary_factor"] = nlohmann::json::parse(factor);
    auto c = parse_model_config(j.dump(), "config.json");
    ASSERT_FALSE(c.is_ok()) << factor;
    EXPECT_NE(c.status().message().find("partial_rotary_factor"), std::string::npos) << c.status().message();
  }
  for (const char* eos : {"-1", "[1, 99999999]", "4294967296"}) {
    nlohmann::json j = nlohmann::json::parse(*text);
    j["eos_token_id"] = nlohmann::json::parse(eos);
    auto c = parse_model_config(j.dump(), "config.json");
    ASSERT_FALSE(c.is_ok()) << eos;
    EXPECT_NE(c.status().message().find("eos_token_id"), std::string::npos) << c.status().message();
  }
}

// generation_config.json: a do_sample that is not a boolean (it threw out of main) or a negative
// EOS id is an error naming the file.
TEST(BadConfig, GenerationConfigFieldsAreChecked) {
  const fs::path dir = fs::temp_directory_path() / ("ds_bad_gen_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  // Stop 54: defaults a request could not set (they bypassed the request's checks), ids of the
  // wrong type (dropped silently: the model no longer stopped), ids past int32 (wrapped to a valid
  // id) or past the vocabulary.
  const std::pair<const char*, const char*> bad[] = {
      {R"({"do_sample": "false"})", "do_sample"},       {R"({"eos_token_id": [2, -1]})", "eos_token_id"},
      {R"({"temperature": -1})", "temperature"},        {R"({"temperature": 1e39})", "temperature"},
      {R"({"temperature": "0.6"})", "temperature"},     {R"({"top_p": 5})", "top_p"},
      {R"({"top_p": 0})", "top_p"},                     {R"({"min_p": 1.5})", "min_p"},
      {R"({"repetition_penalty": 0.0})", "repetition_penalty"},
      {R"({"top_k": 1099511627776})", "top_k"},         {R"({"top_k": "20"})", "top_k"},
      {R"({"top_k": 2.5})", "top_k"},                   {R"({"eos_token_id": "8185"})", "eos_token_id"},
      {R"({"eos_token_id": ["8185"]})", "eos_token_id"}, {R"({"eos_token_id": {"a": 1}})", "eos_token_id"},
      {R"({"eos_token_id": 2147483648})", "eos_token_id"}, {R"({"eos_token_id": 4294975481})", "eos_token_id"},
      {R"({"eos_token_id": 9000})", "eos_token_id"}};
  for (const auto& [body, key] : bad) {
    std::ofstream(dir / "generation_config.json") << body;
    auto g = load_generation_defaults(dir, 8192);
    ASSERT_FALSE(g.is_ok()) << body;
    EXPECT_NE(g.status().message().find("generation_config.json"), std::string::npos) << g.status().message();
    EXPECT_NE(g.status().message().find(key), std::string::npos) << g.status().message();
  }
  std::ofstream(dir / "generation_config.json") << R"({"do_sample": false, "temperature": 0.7})";
  auto g = load_generation_defaults(dir, 8192);
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  EXPECT_EQ(g->temperature, 0.0f);  // do_sample false: greedy
  std::ofstream(dir / "generation_config.json")
      << R"({"temperature": 0.6, "top_k": 20.0, "top_p": 0.95, "eos_token_id": [8185, 8184.0], "min_p": null})";
  g = load_generation_defaults(dir, 8192);
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  EXPECT_FLOAT_EQ(*g->temperature, 0.6f);
  EXPECT_EQ(g->top_k, 20);
  EXPECT_EQ(g->eos_token_ids, (std::vector<int32_t>{8185, 8184}));
  EXPECT_FALSE(g->min_p.has_value());
  fs::remove_all(dir);
}

// tiny-coder's config.json (or `file`) with `patch` applied to its text_config (a null removes a key).
Result<ModelConfig> tiny_coder_config_with(const std::string& patch, const char* file = "models/tiny-coder/config.json") {
  auto text = read_text_file(source_dir() / file);
  if (!text) return text.status();
  nlohmann::json j = nlohmann::json::parse(*text);
  nlohmann::json& t = j.contains("text_config") ? j["text_config"] : j;
  const nlohmann::json fields = nlohmann::json::parse(patch);
  for (auto& [k, v] : fields.items()) {
    if (v.is_null()) t.erase(k);
    else t[k] = v;
  }
  return parse_model_config(j.dump(), "config.json");
}

// Stop 54: sizes that aborted the load (std::length_error, a CpuWeight check) or produced NaN
// logits, a RoPE scaling that was silently not applied, sliding-window layers run as full
// attention, and a layer count that took 43 s and 2 GB before any check: each is refused with its
// key named.
TEST(BadConfig, SizesRopeScalingAndLayerKindsAreChecked) {
  auto text = read_text_file(source_dir() / "models/tiny-coder/config.json");
  ASSERT_TRUE(text.is_ok());
  ASSERT_TRUE(parse_model_config(*text, "config.json").is_ok());
  const std::pair<const char*, const char*> bad[] = {
      {R"({"linear_num_value_heads": -2})", "linear_num_value_heads"},
      {R"({"linear_num_value_heads": 0})", "linear_num_value_heads"},
      {R"({"intermediate_size": 0})", "intermediate_size"},
      {R"({"intermediate_size": -768})", "intermediate_size"},
      {R"({"linear_conv_kernel_dim": 0})", "linear_conv_kernel_dim"},
      {R"({"linear_value_head_dim": -64})", "linear_value_head_dim"},
      {R"({"linear_key_head_dim": 0})", "linear_key_head_dim"},
      {R"({"mtp_num_hidden_layers": -1})", "mtp_num_hidden_layers"},
      {R"({"rms_norm_eps": -1})", "rms_norm_eps"},
      {R"({"rope_parameters": {"rope_type": "default", "rope_theta": 0}})", "rope_theta"},
      {R"({"rope_parameters": {"rope_theta": -1e7}})", "rope_theta"},
      {R"({"max_position_embeddings": -5})", "max_position_embeddings"},
      {R"({"head_dim": 2})", "rotary"},
      {R"({"num_hidden_layers": 2000000000, "layer_types": null})", "num_hidden_layers"},
      {R"({"hidden_size": 4611686018427387904})", "hidden_size"},
      {R"({"vocab_size": 1000000000})", "vocab_size"},
      {R"({"linear_conv_kernel_dim": 100000})", "linear_"},
      {R"({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}})", "yarn"},
      {R"({"rope_scaling": {"type": "linear", "factor": 8}})", "linear"},
      {R"({"rope_scaling": {"factor": 8}})", "rope_scaling.factor"},
      {R"({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e7}})", "yarn"},
      {R"({"bos_token_id": "1"})", "bos_token_id"},
      {R"({"eos_token_id": ["8185"]})", "eos_token_id"}};
  for (const auto& [patch, key] : bad) {
    auto c = tiny_coder_config_with(patch);
    ASSERT_FALSE(c.is_ok()) << patch;
    EXPECT_NE(c.status().message().find(key), std::string::npos) << patch << ": " << c.status().message();
  }
  // Plain RoPE spelt out, as Qwen3.6's config does, is fine; so are sliding layers nowhere.
  nlohmann::json j = nlohmann::json::parse(*text);
  nlohmann::json& t = j.contains("text_config") ? j["text_config"] : j;
  t["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e7}, {"mrope_section", {11, 11, 10}}};
  auto c = parse_model_config(j.dump(), "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->rope_theta, 1e7f);
  auto q3 = read_text_file(source_dir() / "tests/fixtures/qwen3-tiny/config.json");
  ASSERT_TRUE(q3.is_ok());
  nlohmann::json k = nlohmann::json::parse(*q3);
  const int n = k["num_hidden_layers"].get<int>();
  k["layer_types"] = nlohmann::json::array();
  for (int i = 0; i < n; ++i) k["layer_types"].push_back(i == 0 ? "sliding_attention" : "full_attention");
  auto s = parse_model_config(k.dump(), "config.json");
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("sliding_attention"), std::string::npos) << s.status().message();
}

// A safetensors shape whose byte count overflows 64 bits (here [2^62] of f32: 2^64 bytes, which
// wrapped to the entry's 0) is refused; it once loaded and the read ran past the mapped file.
TEST(BadConfig, SafetensorsShapeThatOverflowsIsRefused) {
  const fs::path file = fs::temp_directory_path() / ("ds_overflow_" + std::to_string(::getpid()) + ".safetensors");
  const std::string header = R"({"x":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  std::ofstream(file, std::ios::binary) << bytes << header;
  auto ck = Checkpoint::open_file(file);
  ASSERT_FALSE(ck.is_ok());
  EXPECT_NE(ck.status().message().find("overflows"), std::string::npos) << ck.status().message();
  fs::remove(file);
}



// `depth` arrays nested around 1, as JSON text.
std::string nested_arrays(int depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); }

// Stop 56: an error message dumped the offending value whole; a rope_type or top_k of 200k nested
// arrays overflowed the stack in dump(), and a long one buried the message. Non-scalars are named
// by type; the message stays short.
TEST(BadConfig, NestedValuesInErrorsAreNamedByTheirType) {
  auto c = tiny_coder_config_with(R"({"rope_parameters": {"rope_type": )" + nested_arrays(2000) + "}}");
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("rope_parameters.rope_type array is not supported"), std::string::npos)
      << c.status().message().substr(0, 300);
  EXPECT_LT(c.status().message().size(), 300u) << c.status().message().substr(0, 300);

  const fs::path dir = fs::temp_directory_path() / ("ds_bad_gen_nested_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "generation_config.json") << R"({"top_k": )" + nested_arrays(2000) + "}";
  auto g = load_generation_defaults(dir, 8192);
  ASSERT_FALSE(g.is_ok());
  EXPECT_NE(g.status().message().find("'top_k' must be an integer"), std::string::npos) << g.status().message().substr(0, 300);
  EXPECT_NE(g.status().message().find("got array"), std::string::npos) << g.status().message().substr(0, 300);
  EXPECT_LT(g.status().message().size(), 300u);
  // A long string is cut, a short one shown whole.
  std::ofstream(dir / "generation_config.json", std::ios::trunc) << R"({"top_k": ")" + std::string(5000, 'x') + "\"}";
  g = load_generation_defaults(dir, 8192);
  ASSERT_FALSE(g.is_ok());
  EXPECT_LT(g.status().message().size(), 300u);
  c = tiny_coder_config_with(R"({"rope_parameters": {"rope_type": "yarn"}})");
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("\"yarn\""), std::string::npos) << c.status().message();
  fs::remove_all(dir);
}

// Stop 56: hidden_act was never read: a gelu model ran with SiLU, silently wrong.
TEST(BadConfig, HiddenActOtherThanSiluIsRefused) {
  for (const char* act : {R"("gelu")", R"("relu")", R"("gelu_pytorch_tanh")", "7"}) {
    auto c = tiny_coder_config_with(std::string(R"({"hidden_act": )") + act + "}");
    ASSERT_FALSE(c.is_ok()) << act;
    EXPECT_NE(c.status().message().find("hidden_act"), std::string::npos) << c.status().message();
  }
  for (const char* act : {R"("silu")", R"("swish")", "null"}) {
    auto c = tiny_coder_config_with(std::string(R"({"hidden_act": )") + act + "}");
    EXPECT_TRUE(c.is_ok()) << act << ": " << c.status().message();
  }
  // The bundled models and fixtures (all "silu") still load.
  for (const char* file : {"models/tiny-coder/config.json", "tests/fixtures/qwen3-tiny/config.json",
                           "tests/fixtures/qwen35-tiny/config.json", "tests/fixtures/qwen3.6-27b-config.json"}) {
    auto c = load_model_config(source_dir() / file);
    EXPECT_TRUE(c.is_ok()) << file << ": " << c.status().message();
  }
}

// Stop 56: Qwen3's use_sliding_window + sliding_window (transformers derives sliding_attention
// layers from them when layer_types is absent) ran every layer as full attention.
TEST(BadConfig, UseSlidingWindowWithoutLayerTypesIsRefused) {
  const char* q3 = "tests/fixtures/qwen3-tiny/config.json";
  auto c = tiny_coder_config_with(
      R"({"layer_types": null, "use_sliding_window": true, "sliding_window": 2, "max_window_layers": 0})", q3);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("use_sliding_window"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("sliding_attention"), std::string::npos) << c.status().message();
  // max_window_layers' default (28) is past qwen3-tiny's 4 layers only if given: from layer 2 on.
  c = tiny_coder_config_with(R"({"layer_types": null, "use_sliding_window": true, "sliding_window": 2, "max_window_layers": 2})", q3);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("layers 2..3"), std::string::npos) << c.status().message();
  // No sliding layer: off, no window, or every layer below max_window_layers.
  for (const char* ok : {R"({"layer_types": null, "use_sliding_window": false, "sliding_window": 2, "max_window_layers": 0})",
                         R"({"layer_types": null, "use_sliding_window": true, "sliding_window": null, "max_window_layers": 0})",
                         R"({"layer_types": null, "use_sliding_window": true, "sliding_window": 2})"}) {
    auto r = tiny_coder_config_with(ok, q3);
    EXPECT_TRUE(r.is_ok()) << ok << ": " << r.status().message();
  }
}

// Stop 56: max_position_embeddings had no upper bound (1e15 went on to size the plan).
TEST(BadConfig, MaxPositionEmbeddingsHasABound) {
  for (const char* v : {"1e15", "134217729"}) {
    auto c = tiny_coder_config_with(std::string(R"({"max_position_embeddings": )") + v + "}");
    ASSERT_FALSE(c.is_ok()) << v;
    EXPECT_NE(c.status().message().find("max_position_embeddings"), std::string::npos) << c.status().message();
  }
  auto c = tiny_coder_config_with(R"({"max_position_embeddings": 134217728})");
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->max_position_embeddings, 134217728);
}

// Stop 56: a layer_types that was not a list was ignored and the default layout used.
TEST(BadConfig, LayerTypesMustBeAnArrayOfStrings) {
  for (const char* v : {R"("full_attention")", "{}", "4", R"(["linear_attention", 3])"}) {
    auto c = tiny_coder_config_with(std::string(R"({"layer_types": )") + v + "}");
    ASSERT_FALSE(c.is_ok()) << v;
    EXPECT_NE(c.status().message().find("layer_types must be an array of strings"), std::string::npos)
        << v << ": " << c.status().message();
  }
  auto c = tiny_coder_config_with(R"({"layer_types": null})");  // absent: every 4th layer is attention
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->n_attention_layers(), 2);
}

// A safetensors file from a raw header and `data_bytes` zero bytes of data.
fs::path write_raw_safetensors(const std::string& name, std::string header, std::size_t data_bytes) {
  const fs::path file = fs::temp_directory_path() / ("ds_" + name + "_" + std::to_string(::getpid()) + ".safetensors");
  while ((header.size() + 8) % 8) header += ' ';
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  std::ofstream(file, std::ios::binary) << bytes << header << std::string(data_bytes, '\0');
  return file;
}

// Stop 56: overlapping data_offsets (two tensors reading the same bytes) and a tensor listed twice
// (the parser kept the last) loaded: a different model ran silently. The entries must tile the
// data exactly, as the safetensors library checks, and each name appear once.
TEST(BadConfig, SafetensorsOffsetsMustTileTheDataAndNamesBeUnique) {
  const auto entry = [](const char* name, int begin, int end) {
    return str_cat("\"", name, "\":{\"dtype\":\"F32\",\"shape\":[", (end - begin) / 4, "],\"data_offsets\":[", begin, ",", end, "]}");
  };
  struct Case { const char* what; std::string header; std::size_t data; const char* needle; };
  const Case bad[] = {
      {"overlap", "{" + entry("a", 0, 16) + "," + entry("b", 8, 24) + "}", 24, "'b'"},
      {"same_bytes", "{" + entry("a", 0, 16) + "," + entry("b", 0, 16) + "}", 32, "'b'"},
      {"gap", "{" + entry("a", 0, 16) + "," + entry("b", 24, 40) + "}", 40, "'b'"},
      {"not_at_0", "{" + entry("a", 8, 24) + "}", 24, "'a'"},
      {"tail", "{" + entry("a", 0, 16) + "}", 24, "'a'"},
      {"duplicate", "{" + entry("a", 0, 16) + "," + entry("a", 16, 32) + "}", 32, "'a' appears twice"},
  };
  for (const auto& c : bad) {
    const fs::path file = write_raw_safetensors(c.what, c.header, c.data);
    auto ck = Checkpoint::open_file(file);
    ASSERT_FALSE(ck.is_ok()) << c.what;
    EXPECT_NE(ck.status().message().find("corrupt safetensors header"), std::string::npos) << c.what << ": " << ck.status().message();
    EXPECT_NE(ck.status().message().find(c.needle), std::string::npos) << c.what << ": " << ck.status().message();
    fs::remove(file);
  }
  // Tiled in any key order, with metadata and an empty tensor: fine.
  const fs::path file = write_raw_safetensors(
      "tiled", "{\"__metadata__\":{\"format\":\"pt\"}," + entry("b", 16, 32) + "," + entry("e", 16, 16) + "," + entry("a", 0, 16) + "}", 32);
  auto ck = Checkpoint::open_file(file);
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  EXPECT_EQ(ck->tensors().size(), 3u);
  fs::remove(file);
}

}  // namespace
}  // namespace deltaserve::test
