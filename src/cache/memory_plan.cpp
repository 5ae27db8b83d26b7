// Memory plan arithmetic. Shapes follow docs qwen3_5-model.md (HF Qwen3_5ForCausalLM); the
// budget split between GDN state and KV follows SGLang's --mamba-full-memory-ratio
// (state = cache * r / (1 + r), KV = cache / (1 + r)).
#include "cache/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "model/tensor_parallel.h"

namespace deltaserve {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kMaxRunningCuda = 256;  // decode batch beyond which more requests rarely help
constexpr int64_t kMaxRunningCpu = 64;
// Prefix-cache checkpoints may take state memory from KV only while KV holds this many tokens for
// each request asked for (or its context, if shorter).
constexpr int64_t kCheckpointKvPerRequest = 2048;
constexpr int64_t kCudaGraphReserve = 512 * kMiB;    // graph memory pool for decode buckets
constexpr int64_t kTpCollectiveReserve = 384 * kMiB; // GPU tensor parallelism: NCCL's buffers + peer staging
constexpr double kAutoFractionMargin = 0.02;
constexpr double kAutoFractionMin = 0.5, kAutoFractionMax = 0.9;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string commas(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return (v < 0 ? "-" : "") + s;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

int64_t attention_layer_params(const ModelConfig& c) {
  const int64_t h = c.hidden_size, hd = c.head_dim;
  const int64_t q_out = int64_t(c.n_heads) * hd * (c.attn_output_gate ? 2 : 1);
  const int64_t kv_out = int64_t(c.n_kv_heads) * hd;
  return h * q_out + 2 * h * kv_out + int64_t(c.n_heads) * hd * h + 2 * hd;  // q,k,v,o, q/k norm
}

int64_t linear_layer_params(const ModelConfig& c) {
  const int64_t h = c.hidden_size, hv = c.linear_n_value_heads;
  return h * c.linear_conv_dim()                   // in_proj_qkv
         + h * c.linear_value_dim()                // in_proj_z
         + 2 * h * hv                              // in_proj_b, in_proj_a
         + c.linear_conv_dim() * c.linear_conv_kernel  // conv1d
         + 2 * hv                                  // A_log, dt_bias
         + c.linear_value_head_dim                 // gated norm
         + c.linear_value_dim() * h;               // out_proj
}

int64_t mlp_params(const ModelConfig& c) { return 3 * c.hidden_size * c.intermediate_size; }

}  // namespace

std::string human_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (std::llabs(bytes) >= kGiB) return fixed(b / kGiB, 2) + " GiB";
  if (std::llabs(bytes) >= kMiB) return fixed(b / kMiB, 1) + " MiB";
  if (std::llabs(bytes) >= 1024) return fixed(b / 1024, 1) + " KiB";
  return std::to_string(bytes) + " B";
}

Status MemoryPlan::status() const {
  if (errors.empty()) return Status::ok();
  std::string msg = "memory plan: ";
  for (size_t i = 0; i < errors.size(); ++i) msg += (i ? "\n  " : "") + errors[i];
  return Status::error(msg);
}

ParamCount count_params(const ModelConfig& c) {
  ParamCount p;
  p.embedding = c.vocab_size * c.hidden_size;
  p.lm_head = c.tie_word_embeddings ? 0 : c.vocab_size * c.hidden_size;
  const int n_attn = c.n_attention_layers(), n_lin = c.n_linear_layers();
  p.attention_layers = n_attn * attention_layer_params(c);
  p.linear_layers = n_lin * linear_layer_params(c);
  p.mlp = int64_t(c.n_layers) * mlp_params(c);
  p.norms = int64_t(c.n_layers) * 2 * c.hidden_size + c.hidden_size;  // per layer 2, final 1
  // MTP head: pre_fc_norm_embedding, pre_fc_norm_hidden, fc [H, 2H], one full-attention decoder
  // layer (attention + MLP + its 2 norms), mtp.norm; embed_tokens and lm_head are shared.
  const int64_t h = c.hidden_size;
  p.mtp = int64_t(c.mtp_n_layers) *
          (2 * h + 2 * h * h + attention_layer_params(c) + mlp_params(c) + 2 * h + h);
  return p;
}

namespace {

struct Ctx {
  const ModelConfig& c;
  const MemoryPlanInput& in;
  MemoryPlan& p;
  int64_t running_cap;  // requests the step buffers are sized for, when --max-running-requests is auto
  bool cuda() const { return in.device == PlanDevice::Cuda; }
  std::string per() const { return cuda() ? "per GPU" : "per process"; }
  void row(std::string item, std::string value, std::string detail, std::string bound = "",
           std::string raise = "") {
    p.rows.push_back({std::move(item), std::move(value), std::move(detail), std::move(bound),
                      std::move(raise)});
  }
};

// The step the runner is sized for (model/step_memory.h), with the running requests the user
// set or the cap the plan never exceeds.
StepShape plan_step_shape(const Ctx& x) {
  const MemoryPlanInput& in = x.in;
  const int64_t running = in.max_running_requests > 0 ? in.max_running_requests : x.running_cap;
  const int64_t ctx = in.context_length > 0 ? in.context_length : std::max<int64_t>(1, x.c.max_position_embeddings);
  StepShape s = step_shape(std::max<int64_t>(1, in.max_prefill_tokens), running, in.spec_num_steps, ctx,
                           std::max(1, in.kv_block_size));
  s.draft_vocab = in.spec_num_steps > 0 ? in.draft_vocab_size : 0;
  s.tp = std::max(1, in.tp_size);
  s.cuda = x.cuda();
  s.cpu_threads = std::max(1, in.cpu_threads);
  return s;
}

// "a step of T tokens and R logit rows: activations A + runner B + scratch C" (one rank).
std::string step_detail(const Ctx& x) {
  const StepShape s = plan_step_shape(x);
  const StepMemory m = step_memory(x.c, s);
  return "a step of " + commas(s.tokens) + " tokens (--max-prefill-tokens + decodes of " + commas(s.seqs) +
         " requests) and " + commas(s.logit_rows) + " logit rows: activations " + human_bytes(m.activations) +
         " + logits and MTP rows " + human_bytes(m.runner) + " + kernel scratch " + human_bytes(m.scratch);
}

// Every rank's step buffers (on the CPU the ranks are threads of one process: all of them), and on
// CUDA the graphs' pool and NCCL's buffers.
int64_t activation_reserve(const Ctx& x) {
  const StepShape s = plan_step_shape(x);
  int64_t reserve = step_memory(x.c, s).total() * (x.cuda() ? 1 : s.tp);
  if (x.cuda() && x.in.cuda_graphs) reserve += kCudaGraphReserve;
  if (x.cuda() && s.tp > 1) reserve += kTpCollectiveReserve;
  return reserve;
}

}  // namespace

namespace {

// One plan whose step buffers are sized for running_cap requests (when --max-running-requests is
// auto), which it then never exceeds.
MemoryPlan plan_for(const ModelConfig& c, const MemoryPlanInput& in, int64_t running_cap) {
  MemoryPlan p;
  Ctx x{c, in, p, running_cap};
  // On the CPU the tensor-parallel ranks are threads of one process sharing its memory: the
  // process holds every shard, so the plan is the one of a single rank over the whole model.
  const int tp = x.cuda() ? std::max(1, in.tp_size) : 1;
  const bool spec = in.spec_num_steps > 0;
  const bool hybrid = c.n_linear_layers() > 0;
  const std::string PER = x.per();
  if (spec && c.mtp_n_layers == 0)
    p.errors.push_back("speculative decoding needs the model's MTP head, and this config has "
                       "none (mtp_num_hidden_layers = 0): remove --speculative-algorithm");
  if (in.device_memory_bytes <= 0) {
    p.errors.push_back(x.cuda() ? "GPU memory size unknown: pass --gpu-memory SIZE (e.g. 48GiB)"
                                : "RAM size unknown: pass --max-memory SIZE");
    return p;
  }

  // Weights (their row comes in step 2).
  const ParamCount pc = count_params(c);
  // A token map copies its tokens' lm_head rows for the drafts (split over TP like the vocabulary).
  const int64_t draft_params = spec ? in.draft_vocab_size * c.hidden_size : 0;
  p.n_params = pc.total() + draft_params;
  const int64_t replicated = pc.norms;  // norms are copied to every GPU; the rest is split
  p.weights_bytes_per_gpu = ((p.n_params - replicated + tp - 1) / tp + replicated) * in.weight_bytes_per_param;

  // 1. Budget and activation reserve.
  p.activation_reserve_bytes = activation_reserve(x);
  // A step's buffers larger than the device can only fail when the engine allocates them. (When the
  // weights alone do not fit either, step 3 says so instead: they are what to fix first.)
  if (p.activation_reserve_bytes > in.device_memory_bytes && p.weights_bytes_per_gpu < in.device_memory_bytes) {
    p.errors.push_back("a step's buffers (" + human_bytes(p.activation_reserve_bytes) + ": " + step_detail(x) +
                       ") exceed the " + (x.cuda() ? "GPU's " : "RAM's ") + human_bytes(in.device_memory_bytes) +
                       ": lower --max-prefill-tokens (" + commas(in.max_prefill_tokens) +
                       "; auto: --chunked-prefill-size) or --max-running-requests");
    return p;
  }
  if (x.cuda()) {
    double frac = in.mem_fraction_static;
    std::string how = "--mem-fraction-static " + fixed(frac, 2);
    if (frac <= 0) {
      frac = 1.0 - static_cast<double>(p.activation_reserve_bytes) / in.device_memory_bytes -
             kAutoFractionMargin;
      frac = std::clamp(std::floor(frac * 100) / 100, kAutoFractionMin, kAutoFractionMax);
      how = "auto: leaves the activation reserve + 2%, within [0.50, 0.90]";
    }
    p.mem_fraction_static = frac;
    p.budget_bytes = static_cast<int64_t>(in.device_memory_bytes * frac) - in.device_memory_used_bytes;
    x.row("GPU memory", human_bytes(in.device_memory_bytes), "per GPU, x" + std::to_string(tp) + " (--tp-size)");
    x.row("in use before loading", human_bytes(in.device_memory_used_bytes),
          "CUDA context, cuBLAS and other processes (measured by serve; plan --gpu-memory assumes " +
              human_bytes(MemoryPlanInput::kCudaContextBytes) + ")");
    x.row("static budget", human_bytes(p.budget_bytes),
          human_bytes(in.device_memory_bytes) + " x " + fixed(frac, 2) + " (" + how + ") - in use",
          "--mem-fraction-static", "raise --mem-fraction-static (the rest must hold activations)");
    const int64_t outside = in.device_memory_bytes - static_cast<int64_t>(in.device_memory_bytes * frac);
    x.row("activation reserve", human_bytes(p.activation_reserve_bytes),
          step_detail(x) + std::string(in.cuda_graphs ? " + CUDA graphs" : "") +
              std::string(tp > 1 ? " + collectives" : "") + "; outside the budget (" + human_bytes(outside) + " left)",
          "", "lower --max-prefill-tokens / --chunked-prefill-size or --max-running-requests");
    if (outside < p.activation_reserve_bytes)
      p.warnings.push_back("--mem-fraction-static " + fixed(frac, 2) + " leaves " + human_bytes(outside) +
                           " per GPU outside the budget, but activations need about " +
                           human_bytes(p.activation_reserve_bytes) +
                           ": expect out-of-memory under load; set --mem-fraction-static " +
                           fixed(std::floor((1.0 - double(p.activation_reserve_bytes) /
                                                       in.device_memory_bytes) * 100) / 100, 2) +
                           " or lower --max-prefill-tokens");
  } else {
    const bool auto_budget = in.max_memory_bytes <= 0;
    p.budget_bytes = auto_budget ? static_cast<int64_t>(in.device_memory_bytes * MemoryPlanInput::kCpuAutoShare)
                                 : in.max_memory_bytes;
    x.row("RAM", human_bytes(in.device_memory_bytes), "available to this process");
    x.row("budget", human_bytes(p.budget_bytes),
          auto_budget ? "auto: 70% of RAM (--max-memory)" : "--max-memory",
          "--max-memory", "raise --max-memory");
    x.row("activation reserve", human_bytes(p.activation_reserve_bytes),
          step_detail(x) + (tp > 1 ? ", x" + std::to_string(tp) + " ranks" : std::string()) + "; inside the budget", "",
          "lower --max-prefill-tokens / --chunked-prefill-size or --max-running-requests");
    if (in.max_memory_bytes > in.device_memory_bytes)
      p.warnings.push_back("--max-memory " + human_bytes(in.max_memory_bytes) + " exceeds the RAM (" +
                           human_bytes(in.device_memory_bytes) + "): the machine will swap");
  }

  // 2. Weights.
  x.row("weights", human_bytes(p.weights_bytes_per_gpu),
        fixed(double(p.n_params) / 1e9, 2) + "B params (MTP head " + fixed(double(pc.mtp) / 1e9, 2) + "B" +
            (draft_params > 0 ? ", --speculative-token-map's lm_head rows " +
                                    human_bytes(draft_params * in.weight_bytes_per_param) + " for " +
                                    std::to_string(in.draft_vocab_size) + " tokens"
                              : std::string()) +
            ") x " + std::to_string(in.weight_bytes_per_param) + " B" +
            (tp > 1 ? " / TP " + std::to_string(tp) : "") + ", " + PER,
        "", x.cuda() ? "raise --tp-size to split them" : "");

  // 3. What is left for caches. (CPU --dp-size: each replica loads the weights and its own step
  // buffers in the one process; KV and state are shared out between them.)
  const int64_t replicas = x.cuda() ? 1 : std::max(1, in.dp_size);
  if (replicas > 1)
    x.row("data-parallel replicas", std::to_string(replicas),
          "each with its own weights and step buffers in this process (--dp-size)", "--dp-size", "");
  p.cache_bytes = p.budget_bytes - replicas * (p.weights_bytes_per_gpu + (x.cuda() ? 0 : p.activation_reserve_bytes));
  if (p.cache_bytes <= 0) {
    std::string fix;
    if (x.cuda()) {
      // The next tensor-parallel size the model's shapes split into whose weights leave room
      // (suggesting 16 for 24 attention heads sent users to a size serve refuses).
      int need_tp = 0;
      for (int t = tp + 1; t <= 64 && need_tp == 0; ++t) {
        const int64_t w = ((p.n_params - replicated + t - 1) / t + replicated) * in.weight_bytes_per_param;
        if (w < p.budget_bytes * 0.8 && check_tp_split(c, t, "the model's config").is_ok()) need_tp = t;
      }
      fix = need_tp > 0 ? "use --tp-size " + std::to_string(need_tp) + " or GPUs with more memory"
                        : std::string("use GPUs with more memory");
      if (in.mem_fraction_static > 0) fix += ", or raise --mem-fraction-static " + fixed(in.mem_fraction_static, 2);
    } else {
      fix = "raise --max-memory above " + human_bytes(replicas * (p.weights_bytes_per_gpu + p.activation_reserve_bytes)) +
            (replicas > 1 ? " (" + std::to_string(replicas) + " replicas, --dp-size)" : "");
    }
    p.errors.push_back("the weights (" + human_bytes(p.weights_bytes_per_gpu) + " " + PER +
                       ") do not fit in the budget (" + human_bytes(p.budget_bytes) + "): " + fix);
    p.cache_bytes = 0;
    return p;
  }
  x.row("cache (KV + state)", human_bytes(p.cache_bytes),
        x.cuda() ? "budget - weights" : "budget - weights - activation reserve", "",
        x.cuda() ? "raise --mem-fraction-static or --tp-size" : "raise --max-memory");

  // 4. Per-token and per-request sizes (model/memory_spec.h: the formulas CacheMemory allocates by).
  const MemorySpec mspec = memory_spec_of(c, spec, tp);
  p.kv_bytes_per_token_per_gpu = kv_bytes_per_token(mspec, in.kv_bytes_per_elem);
  // CPU ranks hold their shards in one process: past num_key_value_heads ranks, each keeps a
  // replicated head (CacheMemory allocates per rank), so the process holds ranks x one rank's KV.
  if (!x.cuda() && in.tp_size > 1)
    p.kv_bytes_per_token_per_gpu =
        std::max(p.kv_bytes_per_token_per_gpu,
                 in.tp_size * kv_bytes_per_token(memory_spec_of(c, spec, in.tp_size), in.kv_bytes_per_elem));
  x.row("KV bytes per token", human_bytes(p.kv_bytes_per_token_per_gpu),
        std::to_string(c.n_attention_layers()) + " attention layers" +
            (spec ? " + " + std::to_string(c.mtp_n_layers) + " MTP layer" : "") + " x " +
            std::to_string(mspec.n_kv_heads) + " KV heads x " + std::to_string(c.head_dim) + " x 2 (K,V) x " +
            std::to_string(in.kv_bytes_per_elem) + " B, " + PER +
            (spec ? "" : " (no MTP layer: speculative decoding off)"));
  p.state_dtype = in.state_dtype.value_or(c.mamba_ssm_dtype == "bfloat16" ? DType::BF16 : DType::F32);
  if (hybrid) {
    const int64_t rec_bytes = static_cast<int64_t>(dtype_size(p.state_dtype));
    p.state_bytes_per_slot_base = state_bytes_per_slot(mspec, rec_bytes);
    p.pending_depth = spec ? in.spec_num_steps + 1 : 0;
    p.state_bytes_per_request_per_gpu = state_bytes_per_request(mspec, p.pending_depth, rec_bytes);
    x.row("state bytes per request", human_bytes(p.state_bytes_per_request_per_gpu),
          std::to_string(c.n_linear_layers()) + " GDN layers x (conv f32 + recurrent " +
              std::string(p.state_dtype == DType::BF16 ? "bf16" : "f32") +
              (in.state_dtype ? ", --mamba-ssm-dtype" : ", the config's mamba_ssm_dtype") + ") = " +
              human_bytes(p.state_bytes_per_slot_base) +
              (spec ? " + " + human_bytes(pending_bytes_per_slot(mspec, p.pending_depth)) + " of inputs of " +
                          std::to_string(p.pending_depth) + " verified tokens (speculative rollback)"
                    : "") +
              ", " + PER);
  }

  // 5. Split the cache between state slots and KV (SGLang: ratio = state bytes / KV bytes).
  const double r = in.mamba_full_memory_ratio > 0 ? in.mamba_full_memory_ratio : 0.9;
  int64_t state_budget = hybrid ? static_cast<int64_t>(double(p.cache_bytes) * r / (1 + r)) : 0;
  std::string split_note = hybrid ? "cache x " + fixed(r, 2) + " / (1 + " + fixed(r, 2) +
                                        ") (--mamba-full-memory-ratio " + fixed(r, 2) + ")"
                                  : "no GDN layers: all of the cache is KV";
  const int64_t per_req = std::max<int64_t>(1, p.state_bytes_per_request_per_gpu);
  const int64_t block = std::max(1, in.kv_block_size);
  auto kv_tokens_for = [&](int64_t kv_budget) {
    int64_t t = kv_budget / std::max<int64_t>(1, p.kv_bytes_per_token_per_gpu);
    return t / block * block;
  };
  // (running_cap: the parameter)
  const std::string cap_name = running_cap == (x.cuda() ? kMaxRunningCuda : kMaxRunningCpu)
                                   ? "running-request cap " + std::to_string(running_cap)
                                   : "requests whose step buffers fit beside their state (" + std::to_string(running_cap) + ")";

  // With the prefix cache, --max-mamba-cache-size counts request slots and checkpoints together
  // (SGLang's mamba cache); without it, request slots alone.
  const bool cache_on = hybrid && in.prefix_cache;
  std::string slots_bound_name;  // what bound the request slots (step 7 names it)
  const int64_t max_live_slots = cache_on ? 0 : in.max_state_slots;
  // Prefix-cache checkpoints (a GDN state each, no speculative rows) wanted beside `slots` request
  // slots: one per request slot (SGLang's extra_buffer), or what --max-mamba-cache-size leaves.
  const int64_t per_ckpt = std::max<int64_t>(1, p.state_bytes_per_slot_base);
  auto checkpoints_for = [&](int64_t slots) -> int64_t {
    if (!cache_on) return 0;
    return in.max_state_slots > 0 ? std::max<int64_t>(0, in.max_state_slots - slots) : slots;
  };
  if (hybrid) {
    const int64_t fit_slots = state_budget / per_req;
    int64_t want = 0;  // slots the user asked for, if any
    std::string want_flag;
    if (in.max_running_requests > 0) want = in.max_running_requests, want_flag = "--max-running-requests";
    if (max_live_slots > 0 && max_live_slots > want) want = max_live_slots, want_flag = "--max-mamba-cache-size";
    // The request slots asked for and their checkpoints, where KV is left for both; else the slots
    // alone (the checkpoints then get what the budget holds, below, with a warning).
    const int64_t min_kv_tokens = std::max<int64_t>(in.context_length > 0 ? in.context_length : 0, want * block);
    auto kv_fits = [&](int64_t state) {
      const int64_t kv_left = p.cache_bytes - state;
      return kv_left > 0 && kv_tokens_for(kv_left) >= std::max<int64_t>(min_kv_tokens, block);
    };
    // Checkpoints raise the split only while the KV left still holds the requests asked for at a
    // working length (kCheckpointKvPerRequest tokens each, or the context if shorter): the running
    // requests come first (64 requests with 64 checkpoints on one 80 GB GPU left KV for 27k
    // tokens, 424 a request, and a batch of 64 never ran at once).
    const int64_t ckpt_kv_tokens = std::max(
        min_kv_tokens, want * std::min<int64_t>(in.context_length > 0 ? in.context_length : kCheckpointKvPerRequest,
                                                kCheckpointKvPerRequest));
    auto kv_fits_with_checkpoints = [&](int64_t state) {
      const int64_t kv_left = p.cache_bytes - state;
      return kv_left > 0 && kv_tokens_for(kv_left) >= std::max<int64_t>(ckpt_kv_tokens, block);
    };
    // What asked for the state, for the messages: the flag and its count. With the prefix cache,
    // --max-mamba-cache-size alone asks for request slots and checkpoints together (want 0: the
    // slots are the plan's).
    std::string want_label = want_flag + " " + std::to_string(want);
    if (want == 0 && cache_on && in.max_state_slots > 0)
      want_flag = "--max-mamba-cache-size",
      want_label = want_flag + " " + std::to_string(in.max_state_slots) + " (request slots and checkpoints)";
    int64_t need_state = want * per_req + checkpoints_for(want) * per_ckpt;
    if (!kv_fits_with_checkpoints(need_state) || in.mamba_full_memory_ratio_explicit) need_state = want * per_req;
    if (need_state > state_budget) {
      const int64_t kv_left = p.cache_bytes - need_state;
      const bool kv_ok = kv_fits(need_state);
      const double r_need = kv_left > 0 ? double(need_state) / double(kv_left) : 0;
      if (kv_ok && !in.mamba_full_memory_ratio_explicit) {
        state_budget = need_state;
        split_note = "raised to fit " + want_label +
                     " (as --mamba-full-memory-ratio " + fixed(r_need, 2) + "; the default " + fixed(r, 2) +
                     " fits " + std::to_string(fit_slots) + ")";
        p.warnings.push_back(want_label +
                             (want > 0 && need_state > want * per_req ? " with their prefix-cache checkpoints" : "") +
                             " needs more state memory than the default split (" +
                             std::to_string(fit_slots) + " fit at --mamba-full-memory-ratio " + fixed(r, 2) +
                             "): the plan uses --mamba-full-memory-ratio " + fixed(r_need, 2) + ", leaving KV for " +
                             commas(kv_tokens_for(kv_left)) + " tokens");
      } else {
        std::string msg = want_label + " does not fit: each request needs " +
                          human_bytes(per_req) + " of GDN state " + PER + ", and --mamba-full-memory-ratio " +
                          fixed(r, 2) + " gives state " + human_bytes(state_budget) + ", room for " +
                          std::to_string(fit_slots) + ". Set " + want_flag + " " + std::to_string(std::max<int64_t>(fit_slots, 0));
        if (kv_ok) msg += ", or --mamba-full-memory-ratio " + fixed(std::ceil(r_need * 100) / 100, 2) +
                          " (leaves KV for " + commas(kv_tokens_for(kv_left)) + " tokens)";

        msg += x.cuda() ? ", or raise --mem-fraction-static / --tp-size" : ", or raise --max-memory";
        p.errors.push_back(msg);
      }
    }
    int64_t slots = state_budget / per_req;
    std::string slots_bound = "state budget (--mamba-full-memory-ratio)";
    // Running requests auto with the prefix cache on: each request slot comes with its checkpoint,
    // so that the cache can keep a GDN state for every running conversation (filling the budget
    // with request slots left none: a hybrid model's prompts were then always recomputed).
    if (cache_on && in.max_running_requests <= 0) {
      slots = state_budget / (per_req + per_ckpt);
      slots_bound = "state budget, with a prefix-cache checkpoint per request";
    }
    // --max-mamba-cache-size N with the prefix cache: request slots and checkpoints in all; left
    // to the plan, half of N for each.
    if (cache_on && in.max_state_slots > 0) {
      const int64_t share = in.max_running_requests > 0 ? std::min(in.max_state_slots, in.max_running_requests)
                                                        : std::max<int64_t>(1, in.max_state_slots / 2);
      if (share < slots)
        slots = share, slots_bound = "--max-mamba-cache-size " + std::to_string(in.max_state_slots) +
                                     (in.max_running_requests > 0 ? "" : " / 2 (a checkpoint per request slot)");
    }
    if (max_live_slots > 0 && max_live_slots <= slots) slots = max_live_slots, slots_bound = "--max-mamba-cache-size";
    const int64_t cap_running = in.max_running_requests > 0 ? in.max_running_requests : running_cap;
    if (slots > cap_running) {
      slots = cap_running;
      slots_bound = in.max_running_requests > 0 ? "--max-running-requests" : cap_name;
    }
    p.state_slots = std::max<int64_t>(slots, 0);
    slots_bound_name = slots_bound;
    std::string ckpt_note = "prefix cache off (--disable-radix-cache): none";
    if (cache_on) {
      const int64_t want_ckpt = checkpoints_for(p.state_slots);
      const int64_t room = std::max<int64_t>(0, state_budget - p.state_slots * per_req) / per_ckpt;
      p.checkpoint_slots = std::min(want_ckpt, room);
      ckpt_note = (in.max_state_slots > 0 ? "--max-mamba-cache-size " + std::to_string(in.max_state_slots) +
                                                " - request slots"
                                          : std::string("one per request slot")) +
                  ", " + human_bytes(per_ckpt) + " each" +
                  (p.checkpoint_slots < want_ckpt ? "; the state budget holds " + std::to_string(room) : "");
      // Fewer checkpoints than request slots: conversations beyond them lose their cached state
      // and their next prompt is recomputed; none at all, and no prompt is ever reused.
      const std::string mamba_flag = "--max-mamba-cache-size " + std::to_string(in.max_state_slots);
      if (p.checkpoint_slots < want_ckpt)
        p.warnings.push_back((in.max_state_slots > 0 ? mamba_flag + " asks for " + std::to_string(want_ckpt) +
                                                           " prefix-cache checkpoints"
                                                     : "the prefix cache asks for " + std::to_string(want_ckpt) +
                                                           " checkpoints (one per request slot)") +
                             "; the state budget holds " +
                             std::to_string(room) + ": conversations beyond them have their prompts recomputed" +
                             " (raise --mamba-full-memory-ratio" +
                             (in.max_running_requests > 0 ? " or lower --max-running-requests)" : ")"));
      else if (p.checkpoint_slots == 0 && in.max_state_slots > 0)
        p.warnings.push_back(mamba_flag + " leaves no prefix-cache checkpoint beside " + std::to_string(p.state_slots) +
                             " request slots: prompts are always recomputed (raise --max-mamba-cache-size)");
    }
    const int64_t used = p.state_slots * per_req + p.checkpoint_slots * per_ckpt;
    const int64_t unused = state_budget - used;
    p.state_budget_bytes = used;
    p.kv_budget_bytes = p.cache_bytes - p.state_budget_bytes;
    x.row("state budget", human_bytes(state_budget), split_note);
    x.row("state slots", commas(p.state_slots),
          "state budget / state bytes per request" +
              (unused >= per_req ? "; unused " + human_bytes(unused) + " given to KV" : std::string()),
          slots_bound, "raise --mamba-full-memory-ratio");
    x.row("prefix-cache checkpoints", commas(p.checkpoint_slots), ckpt_note, "",
          cache_on ? "--max-mamba-cache-size (request slots + checkpoints)" : "");
  } else {
    p.kv_budget_bytes = p.cache_bytes;
  }

  // 6. KV tokens.
  {
    const int64_t fit = kv_tokens_for(p.kv_budget_bytes);
    p.kv_tokens = fit;
    std::string bound = hybrid ? "KV budget (cache - state slots)" : "KV budget";
    // No more KV than every running request at full length could use (a small model would
    // otherwise take the whole budget): cap at running x context.
    const int64_t model_ctx = in.context_length > 0 ? in.context_length : c.max_position_embeddings;
    const int64_t running_est = hybrid ? p.state_slots : (in.max_running_requests > 0 ? in.max_running_requests : running_cap);
    // (Whole blocks per request: a context shorter than a block still takes one, and rounding the
    // total instead left room for one request of a 1,000-token context in blocks of 4,096.)
    const int64_t per_request_kv = ceil_div(model_ctx, block) * block;
    if (in.max_total_tokens <= 0 && model_ctx > 0 && running_est > 0 && running_est * per_request_kv < fit) {
      p.kv_tokens = running_est * per_request_kv;
      bound = "running requests x context length";
    }
    if (in.max_total_tokens > 0) {
      if (in.max_total_tokens > fit)
        p.errors.push_back("--max-total-tokens " + commas(in.max_total_tokens) + " does not fit: the KV budget " +
                           human_bytes(p.kv_budget_bytes) + " holds " + commas(fit) + " tokens at " +
                           human_bytes(p.kv_bytes_per_token_per_gpu) + " each; set --max-total-tokens " +
                           commas(fit) + " or leave it out");
      else if (in.max_total_tokens < block)  // (else "no request fits" below, not naming the cause)
        p.errors.push_back("--max-total-tokens " + commas(in.max_total_tokens) + " is less than one KV block of " +
                           std::to_string(block) + " tokens (--page-size): set at least " + std::to_string(block));
      else
        p.kv_tokens = in.max_total_tokens / block * block, bound = "--max-total-tokens";
    }
    x.row("KV tokens", commas(p.kv_tokens),
          human_bytes(p.kv_budget_bytes) + " / " + human_bytes(p.kv_bytes_per_token_per_gpu) +
              ", in blocks of " + std::to_string(block),
          bound, hybrid ? "lower --mamba-full-memory-ratio or --max-running-requests; raise memory"
                        : "raise --mem-fraction-static / --max-memory or --tp-size");
  }

  // 7. Max running requests.
  {
    const int64_t by_kv = p.kv_tokens / block;  // every running request holds at least one block
    int64_t running = hybrid ? p.state_slots : std::min(running_cap, by_kv);
    std::string bound = hybrid ? "state slots" : (running == running_cap ? cap_name : "KV tokens");
    if (in.max_running_requests > 0 && in.max_running_requests <= running) {
      running = in.max_running_requests;
      bound = "--max-running-requests";
    } else if (in.max_running_requests > 0 && !hybrid) {
      p.errors.push_back("--max-running-requests " + std::to_string(in.max_running_requests) +
                         " does not fit: the KV cache holds " + commas(p.kv_tokens) + " tokens, room for " +
                         std::to_string(running) + " requests; set --max-running-requests " + std::to_string(running));
    }
    if (running > by_kv) running = by_kv, bound = "KV tokens (one block each)";
    // A hybrid model's request slots may hold fewer than asked (--max-mamba-cache-size, the KV's
    // blocks): SGLang runs with the fewer too, so it is a warning naming the bound, never silent.
    if (in.max_running_requests > running && p.errors.empty())
      p.warnings.push_back("--max-running-requests " + std::to_string(in.max_running_requests) + " is lowered to " +
                           std::to_string(std::max<int64_t>(running, 0)) + ", bound by " +
                           (hybrid && bound == "state slots" ? slots_bound_name : bound));
    p.max_running_requests = std::max<int64_t>(running, 0);
    x.row("max running requests", commas(p.max_running_requests),
          hybrid ? "one state slot each" : "one KV block each at least", bound,
          hybrid ? "raise --mamba-full-memory-ratio (or set --max-running-requests: the plan re-splits)"
                 : "raise memory");
    if (p.max_running_requests == 0 && p.errors.empty())
      p.errors.push_back("no request fits: the cache " + human_bytes(p.cache_bytes) + " " + PER +
                         " holds no state slot and KV; add memory or GPUs");
  }

  // 8. Context length.
  {
    const int64_t model_max = c.max_position_embeddings > 0 ? c.max_position_embeddings : p.kv_tokens;
    int64_t ctx = std::min(model_max, p.kv_tokens);
    std::string bound = ctx == model_max ? "model (max_position_embeddings)" : "KV tokens";
    std::string raise = ctx == model_max ? "" : "more KV: lower --mamba-full-memory-ratio, raise memory or --tp-size";
    if (in.context_length > 0) {
      if (in.context_length > p.kv_tokens) {
        std::string msg = "--context-length " + commas(in.context_length) + " does not fit: one request of that length needs " +
                          human_bytes(in.context_length * p.kv_bytes_per_token_per_gpu) + " of KV " + PER +
                          ", and the plan holds " + commas(p.kv_tokens) + " tokens. Set --context-length " +
                          commas(p.kv_tokens);
        if (hybrid && p.state_budget_bytes > 0) {
          const int64_t need_kv = in.context_length * p.kv_bytes_per_token_per_gpu;
          const int64_t state_left = p.cache_bytes - need_kv;
          if (state_left >= per_req)
            msg += ", or --mamba-full-memory-ratio " + fixed(std::floor(double(state_left) / need_kv * 100) / 100, 2) +
                   " (" + commas(state_left / per_req) + " state slots)";
        }
        msg += x.cuda() ? ", or raise --mem-fraction-static / --tp-size" : ", or raise --max-memory";
        p.errors.push_back(msg);
      } else {
        ctx = in.context_length;
        bound = "--context-length";
        raise = "";
      }
      if (in.context_length > model_max)
        p.warnings.push_back("--context-length " + commas(in.context_length) + " exceeds the model's " +
                             commas(model_max) + " (max_position_embeddings): quality beyond it is untested");
    }
    p.context_length = ctx;
    x.row("context length", commas(p.context_length),
          "tokens per request; " + (p.context_length > 0 ? commas(p.kv_tokens / std::max<int64_t>(1, p.context_length)) : "0") +
              " requests of full length fit in KV at once",
          bound, raise);
  }
  return p;
}

}  // namespace

MemoryPlan plan_memory(const ModelConfig& c, const MemoryPlanInput& in) {
  const int64_t cap = in.device == PlanDevice::Cuda ? kMaxRunningCuda : kMaxRunningCpu;
  if (in.max_running_requests > 0) return plan_for(c, in, in.max_running_requests);
  // Auto: the most requests r (up to the cap) whose step buffers (the runner's logits and decode
  // rows grow with r) leave room for r requests' state and KV. What fits shrinks as r grows, so
  // the largest r that still fits is found by bisection.
  // A cap plan that fails may fit fewer requests (with MTP, 256 requests' step buffers lowered the
  // automatic fraction until the weights no longer fit on 2 x 32 GB): bisect all the same, and
  // report the cap plan's error only when not even one request fits.
  MemoryPlan best = plan_for(c, in, cap);
  if (best.ok() && best.max_running_requests >= cap) return best;
  int64_t lo = 0, hi = cap;  // plan_for(lo) fits lo requests (0 trivially); plan_for(hi) does not fit hi
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    MemoryPlan p = plan_for(c, in, mid);
    if (p.ok() && p.max_running_requests >= mid) lo = mid;
    else hi = mid;
  }
  return lo > 0 ? plan_for(c, in, lo) : best;
}

std::string render_memory_plan(const MemoryPlan& plan) {
  size_t w_item = 4, w_value = 5, w_bound = 8;
  for (const auto& r : plan.rows) {
    w_item = std::max(w_item, r.item.size());
    w_value = std::max(w_value, r.value.size());
    w_bound = std::max(w_bound, r.bound_by.size());
  }
  auto pad = [](const std::string& s, size_t w) { return s + std::string(w > s.size() ? w - s.size() : 0, ' '); };
  std::ostringstream os;
  os << "memory plan\n";
  os << "  " << pad("item", w_item) << "  " << pad("value", w_value) << "  " << pad("bound by", w_bound) << "  how / to raise\n";
  for (const auto& r : plan.rows) {
    os << "  " << pad(r.item, w_item) << "  " << pad(r.value, w_value) << "  " << pad(r.bound_by, w_bound) << "  "
       << r.detail;
    if (!r.to_raise.empty()) os << " [to raise: " << r.to_raise << "]";
    os << "\n";
  }
  for (const auto& w : plan.warnings) os << "warning: " << w << "\n";
  for (const auto& e : plan.errors) os << "error: " << e << "\n";
  return os.str();
}

}  // namespace deltaserve
