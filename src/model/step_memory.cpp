#include "model/step_memory.h"

#include <algorithm>

#include "backend/cpu/vec.h"
#include "backend/kernels.h"

namespace deltaserve {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One rank's shapes (model/tensor_parallel.h: heads and intermediate rows split evenly, KV heads
// replicated past their count, vocabulary rows ceil(V / P)).
struct RankShapes {
  int64_t H = 0, I = 0, V = 0, V_rank = 0;
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t proj = 0, mix = 0;            // widest fused projection, widest mixer output
  int64_t conv_dim = 0, n_v_heads = 0;  // GDN
  int64_t n_k_heads = 0, k_head_dim = 0, v_head_dim = 0;
};

RankShapes rank_shapes(const ModelConfig& c, int tp) {
  RankShapes r;
  r.H = c.hidden_size;
  r.I = c.intermediate_size / tp;
  r.V = c.vocab_size;
  r.V_rank = ceil_div(c.vocab_size, tp);
  r.n_heads = c.n_heads / tp;
  r.n_kv_heads = std::max<int64_t>(1, c.n_kv_heads / tp);
  r.head_dim = c.head_dim;
  // AttentionLayer: q (+ gate) | k | v rows; GatedDeltaNetLayer: q | k | v | z | b | a rows.
  const int64_t q_per_head = c.head_dim * (c.attn_output_gate ? 2 : 1);
  r.proj = r.n_heads * q_per_head + 2 * r.n_kv_heads * c.head_dim;
  r.mix = r.n_heads * c.head_dim;
  if (c.n_linear_layers() > 0) {
    r.n_k_heads = c.linear_n_key_heads / tp;
    r.n_v_heads = c.linear_n_value_heads / tp;
    r.k_head_dim = c.linear_key_head_dim;
    r.v_head_dim = c.linear_value_head_dim;
    r.conv_dim = 2 * r.n_k_heads * r.k_head_dim + r.n_v_heads * r.v_head_dim;
    r.proj = std::max(r.proj, r.conv_dim + r.n_v_heads * r.v_head_dim + 2 * r.n_v_heads);
    r.mix = std::max(r.mix, r.n_v_heads * r.v_head_dim);
  }
  return r;
}

}  // namespace

StepShape step_shape(int64_t max_prefill_tokens, int64_t max_running_requests, int spec_num_steps,
                     int64_t context_length, int64_t block_size) {
  const int64_t per_decode = 1 + spec_num_steps;
  StepShape s;
  s.tokens = max_prefill_tokens + max_running_requests * per_decode;
  s.logit_rows = max_running_requests * per_decode + max_running_requests;
  s.seqs = max_running_requests;
  s.blocks_per_seq = ceil_div(context_length + per_decode, std::max<int64_t>(1, block_size));
  s.context = context_length;
  s.verify_tokens = spec_num_steps > 0 ? spec_num_steps + 1 : 0;
  s.mtp = spec_num_steps > 0;
  return s;
}

StepMemory step_memory(const ModelConfig& c, const StepShape& s) {
  const int tp = std::max(1, s.tp);
  const RankShapes r = rank_shapes(c, tp);
  const int64_t T = s.tokens, R = s.logit_rows, S = s.seqs, R1 = std::max<int64_t>(R, 1);
  const int64_t f = 4;  // activations are f32 on both backends
  StepMemory m;

  // Activations::reserve: x, h, rows, rows_norm [T, H]; proj; mix; gu [T, 2I]; act [T, I]; the MTP
  // head's input [T, 2H]; with TP the local and gathered logits; the token map's draft logits.
  m.activations = T * (4 * r.H + r.proj + r.mix + 3 * r.I + (s.mtp ? 2 * r.H : 0)) * f;
  if (tp > 1) m.activations += R * r.V_rank * f * (1 + tp);
  if (s.draft_vocab > 0) m.activations += R * ceil_div(s.draft_vocab, tp) * f;

  // ModelRunner: logits [R, V] per rank; MTP hidden rows [T, H] x 3 and the draft chain [S, H] x 2;
  // the kept draft ids; batch metadata (positions, sequence starts, block tables, ...) and ids.
  const int64_t n_meta = T + (S + 1) + S + S * s.blocks_per_seq + 4 * S;
  const int64_t sample_bytes = R1 * int64_t(sizeof(SampleRow)) + kMaxPenaltyEntries * int64_t(sizeof(PenaltyEntry));
  m.runner = R * r.V * f;
  if (s.mtp) m.runner += 3 * T * r.H * f + 2 * S * r.H * f + std::max(s.verify_tokens, 1) * S * 4;
  if (s.cuda) {
    m.runner += R1 * 4 + sample_bytes + n_meta * 4 + T * 4 + (4 * S + 1) * 4;
  } else {
    // The CPU's host staging is the same memory (allocate_host = allocate): two flights' metadata
    // and ids, the token rows, two sampling regions, the commit table.
    m.runner += 2 * R1 * 4 + 2 * (n_meta + 2 * T) * 4 + 2 * sample_bytes + (4 * S + 1) * 4;
  }

  // Scratch. Collectives stage the residual [T, H] or a rank's logits [R, V/P].
  const int64_t collective = std::max(T * r.H * f, R * r.V_rank * f);
  const int64_t n_q = r.n_heads * r.head_dim, n_kv = r.n_kv_heads * r.head_dim;
  if (s.cuda) {
    // CudaKernels::scratch slots, each allocated at 1.25x its largest request:
    //  0 a matmul's bf16 input [T, K] (K: the MTP head's fc 2H, the hidden size, a mixer's output;
    //    the MLP's down projection at <= 64 rows), 1 the GDN conv output [T, conv], 2 attention's
    //    f32 q [T, nh, hd], 3 GDN beta/decay [T, Hv, 2], 7/8 the flash path's q and k|v in fp16,
    //    9 the chunked delta rule's rows [T, Hv, 36]; 5/6 the split-KV partials, 10 argmax
    //    and 11 the GDN decode counters are bounded by the split and batch limits (16 MiB).
    const int64_t widest_k = std::max({s.mtp ? 2 * r.H : r.H, r.H, r.mix});
    int64_t sc = std::max(T * widest_k, std::min<int64_t>(T, 64) * r.I) * 2;
    sc += T * n_q * 4 + T * n_q * 2 + T * n_kv * 4;
    if (c.n_linear_layers() > 0) sc += T * r.conv_dim * 4 + T * r.n_v_heads * 2 * 4 + T * r.n_v_heads * 36 * 4;
    m.scratch = sc + sc / 4 + (int64_t(16) << 20);
    m.scratch += int64_t(32) << 20;  // cuBLAS workspace (32 MiB on Hopper, 4 MiB before)
    if (tp > 1) m.scratch += 2 * std::min(collective, kPeerAllReduceMaxBytes);
  } else {
    // CpuKernels: attention's q [T, nh, hd] or the GDN conv output [T, conv] (slot 0); per thread
    // an attention tile's buffers, the GDN conv's tile (backend/cpu/vec.h) or a head's state
    // (slot 1).
    const int64_t threads = std::max(1, s.cpu_threads);
    const int64_t group = std::max<int64_t>(1, r.n_heads / r.n_kv_heads);
    m.scratch = std::max(T * n_q + threads * r.head_dim, T * r.conv_dim) * f;
    m.scratch += threads * std::max({vec::attention_tile_floats(group, r.head_dim),
                                     vec::conv_tile_floats(c.linear_conv_kernel),
                                     vec::delta_rule_floats(r.k_head_dim, r.v_head_dim)}) * f;
    // The attention's parts run apart (slot 2), and each slot starts on a cache line (+64 bytes).
    if (c.n_attention_layers() > 0) m.scratch += vec::attention_parts_floats(threads, s.context, r.head_dim) * f;
    m.scratch += 3 * 64;
    if (tp > 1) m.scratch += collective;  // this rank's slot of the CPU communicator
  }
  return m;
}

}  // namespace deltaserve
