// ModelConfig: the numbers of an HF config.json that the engine needs, for both layouts
// (nested `text_config` of Qwen3_5ForConditionalGeneration, flat Qwen3_5ForCausalLM / Qwen3ForCausalLM).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "util/status.h"

namespace deltaserve {

enum class LayerType : uint8_t { FullAttention, LinearAttention };

enum class ModelFamily : uint8_t { Qwen3, Qwen3_5 };

struct ModelConfig {
  std::string architecture;       // architectures[0], e.g. "Qwen3_5ForConditionalGeneration"
  ModelFamily family = ModelFamily::Qwen3_5;
  bool nested_layout = false;     // weights under model.language_model.* (ConditionalGeneration)

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int n_layers = 0;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;

  // Full (gated) attention.
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  bool attn_output_gate = false;  // Qwen3.5: q_proj carries a sigmoid gate per head
  double rope_theta = 10000.0;
  float partial_rotary_factor = 1.0f;
  int rotary_dim = 0;             // head_dim * partial_rotary_factor

  // Gated DeltaNet (linear attention).
  int linear_n_key_heads = 0;     // Hk
  int linear_n_value_heads = 0;   // Hv
  int linear_key_head_dim = 0;    // Dk
  int linear_value_head_dim = 0;  // Dv
  int linear_conv_kernel = 0;     // K
  std::string mamba_ssm_dtype = "float32";  // the recurrent state's dtype the checkpoint was trained with

  std::vector<LayerType> layer_types;  // [n_layers]

  int mtp_n_layers = 0;           // 0: no MTP head

  std::vector<int32_t> eos_token_ids;  // from config.json (generation_config may add more)
  int32_t bos_token_id = -1;

  // Derived sizes.
  int64_t linear_key_dim() const { return int64_t(linear_n_key_heads) * linear_key_head_dim; }
  int64_t linear_value_dim() const { return int64_t(linear_n_value_heads) * linear_value_head_dim; }
  int64_t linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }
  int n_attention_layers() const;
  int n_linear_layers() const;
};

// A token id or a list of them (eos_token_id): integers (or integral floats) in [0, INT32_MAX];
// any other element is an error naming `key` and `source`.
Result<std::vector<int32_t>> parse_token_id_list(const nlohmann::json& v, const char* key, const std::string& source);

// A JSON value for an error message: a scalar as JSON (a long string cut), an array or object
// by its type name only (dumping a deeply nested one overflows the stack).
std::string json_value_for_message(const nlohmann::json& v);

// Parse config.json text; `source` names the file in errors.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);
// Read <dir>/config.json (or a config file path directly).
Result<ModelConfig> load_model_config(const std::filesystem::path& dir_or_file);

}  // namespace deltaserve
