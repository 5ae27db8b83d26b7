#include "app/engine_setup.h"

#include <algorithm>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "backend/backend_factory.h"
#include "engine/follower_node.h"
#include "model/generation_config.h"
#include "model/tensor_parallel.h"
#include "util/log.h"
#include "util/thread_pool.h"

namespace deltaserve {

Result<std::vector<std::unique_ptr<Engine>>> make_replicas(const EngineConfig& config, std::unique_ptr<Backend> backend,
                                                           int dp, ReplicaLimitsGiven given) {
  std::vector<std::unique_ptr<Engine>> out;
  if (dp < 1) return error("--dp-size must be at least 1 (got ", dp, ")");
  if (dp > 1 && config.node_link) return error("--dp-size ", dp, " with --nnodes > 1 is not built");
  EngineConfig c = config;
  c.dp_size = dp;
  int run_base = config.max_running_requests, run_extra = 0;  // running requests a replica (CPU: shared out)
  if (dp > 1 && config.device == Device::Cpu) {
    // The CPU: the replicas share this process's cores and memory plan.
    const int threads = config.n_threads > 0 ? config.n_threads : hardware_threads();
    c.n_threads = std::max(1, threads / dp);
    if (threads % dp != 0)
      log_warn("--dp-size ", dp, ": ", threads, " CPU threads do not share out evenly: ", c.n_threads,
               " a replica, ", c.n_threads * dp, " in all");
    const int64_t blocks = config.kv_tokens / config.kv_block_size / dp;
    if (blocks < 1) return error("--dp-size ", dp, ": ", config.kv_tokens, " KV tokens cannot be shared out");
    c.kv_tokens = blocks * config.kv_block_size;
    // A request holds its whole context in its replica's KV: the context length the plan capped at
    // the process's KV is capped again at a replica's (the server reports replica 0's).
    if (c.context_length > c.kv_tokens) {
      if (given.context_length)
        return error("--context-length ", config.context_length, " with --dp-size ", dp, ": each replica holds ",
                     c.kv_tokens, " KV tokens, and a request's whole context must fit its replica: give at most ",
                     c.kv_tokens, " (or more --max-total-tokens / --max-memory)");
      log_warn("--dp-size ", dp, ": each replica holds ", c.kv_tokens, " KV tokens, so the context length is ",
               c.kv_tokens, " (not ", config.context_length, ")");
      c.context_length = c.kv_tokens;
    }
    if (given.max_running_requests && config.max_running_requests < dp)
      return error("--max-running-requests ", config.max_running_requests, " with --dp-size ", dp,
                   ": each replica runs at least one request; give at least ", dp);
    // N running requests over dp replicas: N / dp each and one more for the first N % dp, so that
    // together they run the N given (and the plan's N state slots), not dp * (N / dp).
    run_base = config.max_running_requests / dp;
    run_extra = config.max_running_requests % dp;
    if (run_base == 0) run_base = 1, run_extra = 0;  // (automatic N below dp: a given one was refused)
    c.max_waiting_requests = std::max(1, config.max_waiting_requests / dp);
    c.checkpoint_slots = config.checkpoint_slots / dp;
  }
  // GPUs: each replica has GPUs of its own (replica i: GPUs i * tp .. i * tp + tp - 1), so each
  // gets the whole per-GPU plan.
  for (int i = 0; i < dp; ++i) {
    c.dp_rank = i;
    c.max_running_requests = run_base + (i < run_extra ? 1 : 0);
    // --random-seed N: each replica draws the seeds of unseeded requests from its own stream (one
    // stream in all would give the choices of an n > 1 request, spread over replicas, one seed).
    if (config.random_seed) c.random_seed = *config.random_seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i);
    DS_ASSIGN_OR_RETURN(auto e, Engine::create(c, i == 0 ? std::move(backend) : nullptr));
    out.push_back(std::move(e));
  }
  return out;
}

Status single_replica_only(const ServeOptions& opts, const char* command) {
  if (auto f = explicit_serve_only_flags(opts); !f.empty()) {
    std::string names;
    for (const auto& n : f) names += (names.empty() ? "" : ", ") + n;
    return error(names, ": only `deltaserve serve` (the HTTP server) reads ", f.size() == 1 ? "it" : "them",
                 "; `deltaserve ", command, "` refuses rather than ignores ", f.size() == 1 ? "it" : "them");
  }
  if (opts.nnodes > 1)
    return error("--nnodes ", opts.nnodes, ": `deltaserve ", command, "` runs on one node; multi-node groups are for "
                 "`deltaserve serve`");
  if (opts.dp_size > 1)
    return error("--dp-size ", opts.dp_size, ": `deltaserve ", command, "` drives one engine; data parallelism is "
                 "for `deltaserve serve`");
  return Status::ok();
}

Result<EngineSetup> setup_engine(const ServeOptions& opts, const ModelConfig& model_config) {
  EngineSetup s;
  const bool cuda_built = cuda_available();
  HostInfo host = detect_host(cuda_built);
  s.device = resolve_plan_device(opts, host, cuda_built);
  if (opts.device == "cuda" && !cuda_built)
    return error("--device cuda: this build has no CUDA backend, or no CUDA device is visible");
  DS_RETURN_IF_ERROR(check_device_flags(opts, s.device));
  DS_RETURN_IF_ERROR(check_tp_split(model_config, static_cast<int>(opts.tp_size), opts.model_path));
  if (s.device == PlanDevice::Cuda) {
    // Made here to measure the memory the CUDA context takes; the engine's rank 0 uses it. (On the
    // CPU the engine makes its backends, sharing the threads out between tensor-parallel ranks.)
    DS_ASSIGN_OR_RETURN(s.backend, make_backend("cuda", static_cast<int>(opts.threads)));
    // As SGLang: the fraction is of the whole GPU; what is already in use (this CUDA context,
    // other processes) comes out of it.
    const MemoryInfo m = s.backend->memory_info();
    s.plan_input = memory_plan_input(opts, s.device, static_cast<int64_t>(m.total_bytes), host);
    s.plan_input.device_memory_used_bytes = static_cast<int64_t>(m.total_bytes - m.free_bytes);
  } else {
    s.plan_input = memory_plan_input(opts, s.device, 0, host);
  }
  DS_ASSIGN_OR_RETURN(std::vector<int32_t> token_map, plan_token_map(opts, model_config, s.plan_input));
  s.plan = plan_memory(model_config, s.plan_input);
  if (!s.plan.ok()) return s.plan.status();

  EngineConfig& ec = s.config;
  ec.model_dir = opts.model_path;
  ec.dummy_weights = opts.load_format == "dummy";
  ec.weight_dtype = opts.dtype == "bfloat16" ? WeightDType::BF16 : opts.dtype == "float32" ? WeightDType::F32 : WeightDType::Auto;
  ec.device = s.device == PlanDevice::Cuda ? Device::Cuda : Device::Cpu;
  ec.n_threads = static_cast<int>(opts.threads);
  ec.tp_size = static_cast<int>(opts.tp_size);
  ec.custom_all_reduce = !opts.disable_custom_all_reduce;
  ec.device_sampling = opts.sampling_backend == "device" || (opts.sampling_backend != "host" && ec.device == Device::Cuda);
  ec.max_running_requests = static_cast<int>(s.plan.max_running_requests);
  ec.max_waiting_requests = std::max(1024, 4 * ec.max_running_requests);
  ec.context_length = s.plan.context_length;
  ec.kv_tokens = s.plan.kv_tokens;
  ec.kv_block_size = static_cast<int>(s.plan_input.kv_block_size);
  ec.kv_cache_dtype = s.plan_input.kv_cache_dtype;
  ec.state_dtype = s.plan.state_dtype;
  ec.chunked_prefill_size = static_cast<int>(s.plan_input.chunked_prefill_size);
  ec.max_prefill_tokens = static_cast<int>(s.plan_input.max_prefill_tokens);
  ec.mixed_prefill_tokens = static_cast<int>(std::min<int64_t>(opts.mixed_prefill_tokens, ec.max_prefill_tokens));
  ec.spec_num_steps = s.plan_input.spec_num_steps;
  ec.spec_token_map = std::move(token_map);
  ec.cuda_graph_max_bs = opts.disable_cuda_graph ? 0 : opts.cuda_graph_max_bs > 0 ? static_cast<int>(opts.cuda_graph_max_bs) : -1;
  ec.overlap_schedule = ec.device == Device::Cuda && !opts.disable_overlap_schedule;
  if (opts.is_explicit("random-seed")) ec.random_seed = static_cast<uint64_t>(opts.random_seed);
  ec.prefix_cache = s.plan_input.prefix_cache;
  ec.checkpoint_slots = static_cast<int>(s.plan.checkpoint_slots);
  // extra_buffer (auto): each running request keeps a checkpoint at its last block boundary, so
  // a finished request's prompt + output is cached; no_buffer: prompt and chunk ends only.
  ec.decode_checkpoints = opts.mamba_scheduler_strategy != "no_buffer";
  ec.schedule_lpm = opts.schedule_policy == "lpm";
  DS_ASSIGN_OR_RETURN(GenerationDefaults gen, load_generation_defaults(opts.model_path, model_config.vocab_size));  // a missing file: none
  ec.extra_eos_token_ids = gen.eos_token_ids;
  return s;
}

NodeLinkOptions node_link_options(const ServeOptions& opts, PlanDevice device) {
  NodeLinkOptions o;
  if (auto a = parse_host_port(opts.dist_init_addr)) o.addr = *a;  // validated with the options
  o.nnodes = static_cast<int>(opts.nnodes);
  o.node_rank = static_cast<int>(opts.node_rank);
  o.tp_size = static_cast<int>(opts.tp_size);
  o.device = device == PlanDevice::Cuda ? "cuda" : "cpu";
  o.timeout_s = static_cast<double>(opts.dist_timeout);
  // Node 0 decides every setting but each node's own: where it listens and logs, its threads and
  // timeouts, and paths that may differ between machines (the model is compared by identity
  // below, the resolved device and the group's shape apart). Secrets never go over the wire.
  static const char* const kPerNode[] = {"node-rank", "host", "port", "threads", "log-level", "state-dir",
                                         "dist-timeout", "dist-init-addr", "config", "model-path", "tokenizer-path",
                                         "chat-template", "watchdog-timeout", "help", "device", "nnodes", "tp-size"};
  for (const auto& [name, value] : effective_config(opts)) {
    if (is_secret_serve_flag(name)) continue;
    if (std::find(std::begin(kPerNode), std::end(kPerNode), name) != std::end(kPerNode)) continue;
    if (o.node_rank > 0 && !opts.is_explicit(name)) continue;
    o.settings.emplace_back(name, value);
  }
  // The model: config.json's bytes (FNV-1a) and the load format.
  std::ifstream in(std::filesystem::path(opts.model_path) / "config.json", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : ss.str()) h = (h ^ ch) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  o.model_identity = std::string("config.json ") + hex + ", --load-format " + opts.load_format;
  return o;
}

int follow_node_zero(const ServeOptions& opts) {
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "deltaserve serve: %s\n", msg.c_str());
    return 1;
  };
  // This node's own model first: a path that is not one is its error, not a mismatch with node 0.
  if (auto mc = load_model_config(opts.model_path); !mc) return fail(mc.status().message());
  const bool cuda_built = cuda_available();
  const PlanDevice device = resolve_plan_device(opts, detect_host(cuda_built), cuda_built);
  const NodeLinkOptions lo = node_link_options(opts, device);
  log_info("deltaserve: node ", lo.node_rank, " of ", lo.nnodes, ": joining node 0 at ", lo.addr.str());
  auto link = NodeLink::join(lo);
  if (!link) return fail(link.status().message());
  EngineConfig c;
  c.model_dir = opts.model_path;
  c.device = device == PlanDevice::Cuda ? Device::Cuda : Device::Cpu;
  c.n_threads = static_cast<int>(opts.threads);
  if (Status s = apply_engine_config((*link)->welcome(), c); !s) return fail(s.message());
  auto node = FollowerNode::create(c, **link);
  if (!node) return fail(node.status().message());
  log_info("deltaserve: node ", lo.node_rank, " runs tensor-parallel ranks ", (*link)->first_rank(), "..",
           (*link)->first_rank() + (*link)->local_ranks() - 1, " of ", lo.tp_size, " (", (*node)->ranks().transport(),
           "); node 0 serves HTTP");
  std::fflush(stderr);
  (*link)->watch_node_zero(30);
  if (Status s = (*node)->run(); !s) return fail(s.message());
  log_info("deltaserve: node 0 stopped; node ", lo.node_rank, " exits");
  return 0;
}

}  // namespace deltaserve
