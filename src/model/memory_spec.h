// MemorySpec: what a model keeps between steps, per token (attention KV) and per request (GDN
// state), on one GPU of a tensor-parallel group; and the one set of byte formulas that both the
// memory plan (`deltaserve plan`, serve's sizing) and CacheMemory's allocation use.
#pragma once

#include <cstdint>

#include "model/config.h"

namespace deltaserve {

struct MemorySpec {
  int n_kv_layers = 0;        // main attention layers + MTP attention layers
  int n_kv_heads = 0;         // per GPU
  int head_dim = 0;
  int n_state_layers = 0;     // GDN layers
  int64_t conv_dim = 0;       // GDN conv state [conv_dim, conv_kernel - 1], per GPU
  int conv_kernel = 0;
  int n_v_heads = 0;          // GDN recurrent state [n_v_heads, v_head_dim, k_head_dim], per GPU
  int k_head_dim = 0;
  int v_head_dim = 0;
};

// From the config alone. with_mtp adds the MTP head's attention layer (its KV shares the
// sequence's block table). tp_size splits heads over GPUs; KV heads are replicated when
// tp_size > num_key_value_heads (each GPU keeps one).
MemorySpec memory_spec_of(const ModelConfig& config, bool with_mtp, int tp_size = 1);

// K + V bytes of one token over every KV layer, at elem_bytes per element (4 f32, 2 bf16, 1 fp8).
inline int64_t kv_bytes_per_token(const MemorySpec& s, int64_t elem_bytes) {
  return int64_t(s.n_kv_layers) * 2 * s.n_kv_heads * s.head_dim * elem_bytes;
}
// GDN state of one request over every GDN layer: the conv window (f32) and the recurrent state at
// rec_elem_bytes per element (4 f32, 2 with --mamba-ssm-dtype bfloat16).
inline int64_t state_bytes_per_slot(const MemorySpec& s, int64_t rec_elem_bytes = 4) {
  const int64_t conv = s.conv_dim * (s.conv_kernel - 1);
  const int64_t rec = int64_t(s.n_v_heads) * s.v_head_dim * s.k_head_dim;
  return int64_t(s.n_state_layers) * (conv * 4 + rec * rec_elem_bytes);
}
// Speculative decoding: a verification run's raw GDN inputs (pre-conv q|k|v, b, a; f32) for
// pending_depth tokens (1 + drafts), kept until acceptance replays them into the state.
inline int64_t pending_bytes_per_slot(const MemorySpec& s, int pending_depth) {
  return int64_t(s.n_state_layers) * pending_depth * (s.conv_dim + 2LL * s.n_v_heads) * 4;
}
// Everything one request holds outside the KV cache.
inline int64_t state_bytes_per_request(const MemorySpec& s, int pending_depth, int64_t rec_elem_bytes = 4) {
  return state_bytes_per_slot(s, rec_elem_bytes) + pending_bytes_per_slot(s, pending_depth);
}

}  // namespace deltaserve
