#include "model/config.h"

#include "model/memory_spec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "util/mmap_file.h"

namespace deltaserve {

using nlohmann::json;

int ModelConfig::n_attention_layers() const {
  int n = 0;
  for (auto t : layer_types) n += t == LayerType::FullAttention;
  return n;
}
int ModelConfig::n_linear_layers() const {
  return static_cast<int>(layer_types.size()) - n_attention_layers();
}

MemorySpec memory_spec_of(const ModelConfig& c, bool with_mtp, int tp_size) {
  const int tp = tp_size < 1 ? 1 : tp_size;
  auto split = [tp](int64_t n) { return (n + tp - 1) / tp; };
  MemorySpec s;
  s.n_kv_layers = c.n_attention_layers() + (with_mtp ? c.mtp_n_layers : 0);
  s.n_kv_heads = static_cast<int>(split(c.n_kv_heads) < 1 ? 1 : split(c.n_kv_heads));
  s.head_dim = c.head_dim;
  s.n_state_layers = c.n_linear_layers();
  if (s.n_state_layers > 0) {
    s.conv_dim = split(c.linear_conv_dim());
    s.conv_kernel = c.linear_conv_kernel;
    s.n_v_heads = static_cast<int>(split(c.linear_n_value_heads));
    s.k_head_dim = c.linear_key_head_dim;
    s.v_head_dim = c.linear_value_head_dim;
  }
  return s;
}

namespace {

// v as a T. Integer fields take integers, or floats with an integral value (4.0), within T's
// range: converting 6.7e85 to an integer is undefined behaviour (found by fuzz_model_config).
template <typename T>
Status convert(const json& v, T& out, const char* key, const std::string& source) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());  // exact (a power of two)
    constexpr double hi_excl = static_cast<double>(std::numeric_limits<T>::max()) + 1.0;
    double d = 0;
    if (v.is_number_unsigned()) d = static_cast<double>(v.get<uint64_t>());
    else if (v.is_number_integer()) d = static_cast<double>(v.get<int64_t>());
    else if (v.is_number_float()) d = v.get<double>();
    else return error(source, ": key '", key, "' must be an integer, got ", v.type_name());
    if (!(d >= lo && d < hi_excl) || d != std::floor(d))
      return error(source, ": key '", key, "' must be an integer in [", static_cast<int64_t>(lo), ", ",
                   std::numeric_limits<T>::max(), "], got ", v.dump());
    out = v.is_number_float() ? static_cast<T>(d) : v.get<T>();
    return Status::ok();
  } else {
    try {
      out = v.get<T>();
    } catch (const std::exception& e) {
      return error(source, ": key '", key, "' has the wrong type (", e.what(), ")");
    }
    return Status::ok();
  }
}

template <typename T>
Status get_required(const json& obj, const char* key, T& out, const std::string& source) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return error(source, ": missing required key '", key, "'");
  return convert(*it, out, key, source);
}

template <typename T>
Status get_optional(const json& obj, const char* key, T& out, const std::string& source) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::ok();
  return convert(*it, out, key, source);
}

}  // namespace

std::string json_value_for_message(const nlohmann::json& v) {
  // Arrays and objects are named by type: dumping one is recursive (200k nested arrays overflowed
  // the stack) and a long one would bury the message. Scalars are shown, long strings cut.
  if (v.is_structured()) return v.type_name();
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr std::size_t kMax = 80;
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

Result<std::vector<int32_t>> parse_token_id_list(const json& v, const char* key, const std::string& source) {
  std::vector<int32_t> out;
  if (v.is_null()) return out;
  if (!v.is_array()) {
    int32_t id = 0;
    DS_RETURN_IF_ERROR(convert(v, id, key, source));
    out.push_back(id);
  } else {
    for (const auto& x : v) {
      int32_t id = 0;
      DS_RETURN_IF_ERROR(convert(x, id, key, source));
      out.push_back(id);
    }
  }
  for (int32_t id : out)
    if (id < 0) return error(source, ": ", key, " ", id, " is negative");
  return out;
}

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const std::exception& e) {
    return error(source, ": invalid JSON: ", e.what());
  }
  if (!root.is_object()) return error(source, ": expected a JSON object");

  ModelConfig c;
  auto arch = root.find("architectures");
  if (arch == root.end() || !arch->is_array() || arch->empty() || !(*arch)[0].is_string())
    return error(source, ": missing 'architectures'");
  c.architecture = (*arch)[0].get<std::string>();

  const json* text = &root;
  if (auto tc = root.find("text_config"); tc != root.end() && tc->is_object()) {
    text = &*tc;
    c.nested_layout = true;
  }
  const json& t = *text;
  std::string model_type;
  DS_RETURN_IF_ERROR(get_optional(t, "model_type", model_type, source));
  c.family = (model_type.rfind("qwen3_5", 0) == 0 || model_type.rfind("qwen3_6", 0) == 0 ||
              t.contains("linear_num_value_heads"))
                 ? ModelFamily::Qwen3_5
                 : ModelFamily::Qwen3;

  DS_RETURN_IF_ERROR(get_required(t, "vocab_size", c.vocab_size, source));
  DS_RETURN_IF_ERROR(get_required(t, "hidden_size", c.hidden_size, source));
  DS_RETURN_IF_ERROR(get_required(t, "intermediate_size", c.intermediate_size, source));
  DS_RETURN_IF_ERROR(get_required(t, "num_hidden_layers", c.n_layers, source));
  DS_RETURN_IF_ERROR(get_required(t, "num_attention_heads", c.n_heads, source));
  c.n_kv_heads = c.n_heads;
  DS_RETURN_IF_ERROR(get_optional(t, "num_key_value_heads", c.n_kv_heads, source));
  DS_RETURN_IF_ERROR(get_optional(t, "rms_norm_eps", c.rms_norm_eps, source));
  DS_RETURN_IF_ERROR(get_optional(t, "max_position_embeddings", c.max_position_embeddings, source));
  c.head_dim = c.n_heads > 0 ? static_cast<int>(c.hidden_size / c.n_heads) : 0;
  DS_RETURN_IF_ERROR(get_optional(t, "head_dim", c.head_dim, source));

  // tie_word_embeddings may sit at either level; the text level wins.
  DS_RETURN_IF_ERROR(get_optional(root, "tie_word_embeddings", c.tie_word_embeddings, source));
  DS_RETURN_IF_ERROR(get_optional(t, "tie_word_embeddings", c.tie_word_embeddings, source));

  // RoPE: rope_parameters (new transformers) or top-level rope_theta / partial_rotary_factor.
  DS_RETURN_IF_ERROR(get_optional(t, "rope_theta", c.rope_theta, source));
  DS_RETURN_IF_ERROR(get_optional(t, "partial_rotary_factor", c.partial_rotary_factor, source));
  if (auto rp = t.find("rope_parameters"); rp != t.end() && rp->is_object()) {
    DS_RETURN_IF_ERROR(get_optional(*rp, "rope_theta", c.rope_theta, source));
    DS_RETURN_IF_ERROR(get_optional(*rp, "partial_rotary_factor", c.partial_rotary_factor, source));
  }
  // Only plain RoPE is implemented: a scaled one (yarn, linear, dynamic, ...) is refused by name
  // rather than run unscaled. (Qwen3.6's mrope sections are plain RoPE for text positions.)
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto rs = t.find(key);
    if (rs == t.end() || rs->is_null()) continue;
    if (!rs->is_object()) return error(source, ": '", key, "' must be an object");
    for (const char* type_key : {"rope_type", "type"}) {
      auto rt = rs->find(type_key);
      if (rt == rs->end() || rt->is_null()) continue;
      if (!rt->is_string() || rt->get<std::string>() != "default")
        return error(source, ": ", key, ".", type_key, " ", json_value_for_message(*rt),
                     " is not supported (only plain RoPE, \"default\", is implemented)");
    }
    if (std::string(key) == "rope_scaling" && rs->contains("factor"))
      return error(source, ": rope_scaling.factor is not supported (only plain RoPE is implemented)");
  }
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    return error(source, ": rope_theta ", c.rope_theta, " must be a positive number");
  if (!(c.rms_norm_eps >= 0) || !std::isfinite(c.rms_norm_eps))
    return error(source, ": rms_norm_eps ", c.rms_norm_eps, " must be a non-negative number");
  if (c.max_position_embeddings < 0)
    return error(source, ": max_position_embeddings ", c.max_position_embeddings, " is negative");
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
    return error(source, ": partial_rotary_factor ", c.partial_rotary_factor, " must be in (0, 1]");
  c.rotary_dim = static_cast<int>(c.head_dim * c.partial_rotary_factor);
  if (c.rotary_dim % 2) return error(source, ": rotary dimension ", c.rotary_dim, " is odd");
  if (c.head_dim > 0 && c.rotary_dim <= 0)
    return error(source, ": rotary dimension ", c.rotary_dim, " (head_dim x partial_rotary_factor) must be positive");
  if (c.intermediate_size <= 0) return error(source, ": intermediate_size ", c.intermediate_size, " must be positive");
  // Bounds far past any real model: the plan's products (parameters, bytes) fit in 64 bits
  // (hidden_size 2^62 gave a negative parameter count), and a typo does not allocate per-layer
  // tables for a minute before any other check (num_hidden_layers 2e9).
  for (const auto& [key, value, bound] : {std::tuple<const char*, int64_t, int64_t>{"num_hidden_layers", c.n_layers, 100000},
                                          {"vocab_size", c.vocab_size, int64_t(1) << 24},
                                          {"hidden_size", c.hidden_size, int64_t(1) << 18},
                                          {"intermediate_size", c.intermediate_size, int64_t(1) << 21},
                                          {"num_attention_heads", c.n_heads, int64_t(1) << 14},
                                          {"num_key_value_heads", c.n_kv_heads, int64_t(1) << 14},
                                          {"head_dim", c.head_dim, int64_t(1) << 14},
                                          // 1e15 positions: the RoPE tables and context plans are sized by it.
                                          {"max_position_embeddings", c.max_position_embeddings, int64_t(1) << 27}})
    if (value > bound) return error(source, ": ", key, " ", value, " is above ", bound);

  // Only SiLU (SwiGLU) MLPs are implemented; another activation would run as SiLU, silently
  // wrong. ("swish" is HF's other name for the same function.)
  if (auto act = t.find("hidden_act"); act != t.end() && !act->is_null()) {
    if (!act->is_string())
      return error(source, ": hidden_act must be a string, got ", act->type_name());
    const std::string name = act->get<std::string>();
    if (name != "silu" && name != "swish")
      return error(source, ": hidden_act '", name, "' is not supported (only silu is implemented)");
  }

  if (c.family == ModelFamily::Qwen3_5) {
    c.attn_output_gate = true;
    DS_RETURN_IF_ERROR(get_optional(t, "attn_output_gate", c.attn_output_gate, source));
    DS_RETURN_IF_ERROR(get_required(t, "linear_num_key_heads", c.linear_n_key_heads, source));
    DS_RETURN_IF_ERROR(get_required(t, "linear_num_value_heads", c.linear_n_value_heads, source));
    DS_RETURN_IF_ERROR(get_required(t, "linear_key_head_dim", c.linear_key_head_dim, source));
    DS_RETURN_IF_ERROR(get_required(t, "linear_value_head_dim", c.linear_value_head_dim, source));
    DS_RETURN_IF_ERROR(get_required(t, "linear_conv_kernel_dim", c.linear_conv_kernel, source));
    DS_RETURN_IF_ERROR(get_optional(t, "mtp_num_hidden_layers", c.mtp_n_layers, source));
    DS_RETURN_IF_ERROR(get_optional(t, "mamba_ssm_dtype", c.mamba_ssm_dtype, source));
    if (c.linear_n_key_heads <= 0 || c.linear_n_value_heads <= 0 ||
        c.linear_n_value_heads % c.linear_n_key_heads != 0)
      return error(source, ": linear_num_value_heads must be a positive multiple of linear_num_key_heads");
    if (c.linear_key_head_dim <= 0 || c.linear_value_head_dim <= 0)
      return error(source, ": linear_key_head_dim and linear_value_head_dim must be positive");
    if (c.linear_conv_kernel <= 0) return error(source, ": linear_conv_kernel_dim must be positive");
    if (c.linear_n_key_heads > (1 << 14) || c.linear_n_value_heads > (1 << 14) || c.linear_key_head_dim > (1 << 14) ||
        c.linear_value_head_dim > (1 << 14) || c.linear_conv_kernel > 64 || c.mtp_n_layers > 64)
      return error(source, ": a linear_* size or mtp_num_hidden_layers is far above any model's");
    if (c.mtp_n_layers < 0) return error(source, ": mtp_num_hidden_layers ", c.mtp_n_layers, " is negative");
  }

  // Layer types: explicit list, else every full_attention_interval-th layer is full attention.
  auto lt = t.find("layer_types");
  // A layer_types that is not a list (a string, say) must not fall back to the default layout.
  if (lt != t.end() && !lt->is_null() && !lt->is_array())
    return error(source, ": layer_types must be an array of strings, got ", lt->type_name());
  if (lt != t.end() && lt->is_array()) {
    for (const auto& v : *lt) {
      if (!v.is_string())
        return error(source, ": layer_types must be an array of strings, has an element of type ",
                     v.type_name());
      const std::string s = v.get<std::string>();
      if (s == "full_attention") c.layer_types.push_back(LayerType::FullAttention);
      else if (s == "sliding_attention")
        return error(source, ": layer type 'sliding_attention' (sliding-window attention) is not supported");
      else if (s == "linear_attention") c.layer_types.push_back(LayerType::LinearAttention);
      else return error(source, ": unknown layer type '", s, "' in layer_types");
    }
    if (static_cast<int>(c.layer_types.size()) != c.n_layers)
      return error(source, ": layer_types has ", c.layer_types.size(), " entries for ", c.n_layers,
                   " layers");
  } else if (c.family == ModelFamily::Qwen3_5) {
    int interval = 4;
    DS_RETURN_IF_ERROR(get_optional(t, "full_attention_interval", interval, source));
    if (interval <= 0) return error(source, ": full_attention_interval must be positive");
    for (int i = 0; i < c.n_layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? LayerType::FullAttention
                                                      : LayerType::LinearAttention);
  } else {
    // Without layer_types, transformers' Qwen3Config derives them: with use_sliding_window and a
    // sliding_window, layers from max_window_layers (default 28) on are sliding-window attention,
    // which is not implemented; running them as full attention would be silently wrong.
    bool use_sliding = false;
    int64_t max_window_layers = 28;
    DS_RETURN_IF_ERROR(get_optional(t, "use_sliding_window", use_sliding, source));
    DS_RETURN_IF_ERROR(get_optional(t, "max_window_layers", max_window_layers, source));
    auto sw = t.find("sliding_window");
    if (use_sliding && sw != t.end() && !sw->is_null() && max_window_layers < c.n_layers)
      return error(source, ": use_sliding_window with sliding_window ", json_value_for_message(*sw),
                   " makes layers ", std::max<int64_t>(max_window_layers, 0), "..", c.n_layers - 1,
                   " sliding-window attention (layer type 'sliding_attention'), which is not supported");
    c.layer_types.assign(c.n_layers, LayerType::FullAttention);
  }
  if (c.family == ModelFamily::Qwen3) {
    for (auto lt : c.layer_types)
      if (lt != LayerType::FullAttention) return error(source, ": Qwen3 has only attention layers");
  }

  for (const json* obj : std::initializer_list<const json*>{&root, text}) {
    if (auto e = obj->find("eos_token_id"); e != obj->end()) {
      DS_ASSIGN_OR_RETURN(auto ids, parse_token_id_list(*e, "eos_token_id", source));
      if (!ids.empty()) c.eos_token_ids = ids;
    }
    if (auto b = obj->find("bos_token_id"); b != obj->end() && !b->is_null()) {
      int32_t id = 0;
      DS_RETURN_IF_ERROR(convert(*b, id, "bos_token_id", source));
      c.bos_token_id = id;
    }
  }

  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.n_layers <= 0 || c.n_heads <= 0 ||
      c.n_kv_heads <= 0 || c.head_dim <= 0 || c.n_heads % c.n_kv_heads != 0)
    return error(source, ": inconsistent sizes (vocab, hidden, layers or heads)");
  for (int32_t id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size)
      return error(source, ": eos_token_id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")");
  return c;
}

Result<ModelConfig> load_model_config(const std::filesystem::path& dir_or_file) {
  std::filesystem::path file = dir_or_file;
  std::error_code ec;
  if (std::filesystem::is_directory(dir_or_file, ec)) file = dir_or_file / "config.json";
  if (!std::filesystem::exists(file, ec)) return error(file.string(), ": missing config file");
  DS_ASSIGN_OR_RETURN(std::string text, read_text_file(file));
  return parse_model_config(text, file.string());
}

}  // namespace deltaserve
