// deltaserve serve --model-path DIR [--host H] [--port P] [SGLang flags...]
// The OpenAI-compatible server: flags (serve_options) → memory plan → Engine thread, tokenizer,
// chat template → OpenAiServer (HTTP threads). Runs until SIGINT/SIGTERM.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <optional>
#include <pthread.h>
#include <thread>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/engine_setup.h"
#include "app/launch_history_refresher.h"
#include "app/server_warmup.h"
#include "app/service_notify.h"
#include "app/speculation_choice.h"
#include "options/serve_options.h"
#include "chat/chat_template.h"
#include "deploy/hardware.h"
#include "deploy/launch_db.h"
#include "deploy/plan_input.h"
#include "backend/backend_factory.h"
#include "engine/engine.h"
#include "engine/replica_set.h"
#include "cache/memory_plan.h"
#include "engine/model_setup.h"
#include "model/config.h"
#include "model/generation_config.h"
#include "server/openai_server.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

namespace deltaserve {

namespace {

int fail(const std::string& msg, int code) {
  std::fprintf(stderr, "deltaserve serve: %s\n", msg.c_str());
  return code;
}


// The server's view of the flags.
ServerConfig server_config_from(const ServeOptions& opts) {
  ServerConfig sc;
  sc.host = opts.host.empty() ? "127.0.0.1" : opts.host;
  sc.port = static_cast<int>(opts.port);
  sc.api_key = opts.api_key;
  sc.served_model_name = opts.served_model_name.empty() ? opts.model_path : opts.served_model_name;
  if (opts.max_request_bytes > 0) sc.max_request_bytes = static_cast<std::size_t>(opts.max_request_bytes);
  sc.reasoning_parser = opts.reasoning_parser;
  sc.tool_call_parser = opts.tool_call_parser;
  sc.model_path = opts.model_path;
  sc.enable_cors = opts.enable_cors;  // (--allowed-origins turns it on: resolve_serve_defaults)
  sc.stream_interval = static_cast<int>(opts.stream_interval);
  sc.request_log.level = opts.log_requests ? static_cast<int>(opts.log_requests_level) : RequestLog::kOff;
  sc.allowed_origins.clear();
  for (size_t pos = 0; pos <= opts.allowed_origins.size();) {
    size_t comma = opts.allowed_origins.find(',', pos);
    if (comma == std::string::npos) comma = opts.allowed_origins.size();
    std::string o = opts.allowed_origins.substr(pos, comma - pos);
    while (!o.empty() && o.front() == ' ') o.erase(0, 1);
    while (!o.empty() && o.back() == ' ') o.pop_back();
    if (!o.empty()) sc.allowed_origins.push_back(o);
    pos = comma + 1;
  }
  if (sc.allowed_origins.empty()) sc.allowed_origins.push_back("*");
  return sc;
}

// A host as a URL or "host:port" shows it: an IPv6 address in brackets ("[::1]").
std::string host_for_url(const std::string& host) {
  if (host.find(':') != std::string::npos && (host.empty() || host.front() != '[')) return "[" + host + "]";
  return host;
}

// An empty value given on the command line for one of `flags` ("--api-key ''", "--api-key="),
// or "" if none was. (A full config dump writes served_model_name = "", which stays accepted.)
std::string empty_flag_on_command_line(const Args& args, std::initializer_list<const char*> flags) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 3 || a.compare(0, 2, "--") != 0) continue;
    std::string name = a.substr(2);
    std::optional<std::string> value;
    if (const std::size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else if (i + 1 < args.size()) {
      value = args[i + 1];
    }
    std::replace(name.begin(), name.end(), '_', '-');
    for (const char* f : flags)
      if (name == f && value && value->empty()) return f;
  }
  return "";
}

// The engine behind the HTTP server before the model has loaded: the server starts listening
// first (a busy port fails at once, /health answers 503 while loading) and this forwards to the
// engine once it exists. The server serves nothing but /metrics until it is set.
class LateEngine final : public EngineService {
 public:
  void set(EngineService* engine) { engine_.store(engine, std::memory_order_release); }
  std::shared_ptr<RequestStream> submit(GenerateRequest request) override {
    if (EngineService* e = get()) return e->submit(std::move(request));
    auto stream = std::make_shared<RequestStream>();
    stream->id = request.id;
    TokenEvent ev;
    ev.finish = FinishReason::Error;
    ev.error_kind = EngineErrorKind::Overloaded;
    ev.error = "the model is loading; retry shortly";
    stream->events.push(std::move(ev));
    stream->events.close();
    return stream;
  }
  void cancel(RequestId id) override {
    if (EngineService* e = get()) e->cancel(id);
  }
  RequestId next_request_id() override { return get() ? get()->next_request_id() : next_id_.fetch_add(1); }
  EngineStats stats() const override { return get() ? get()->stats() : EngineStats{}; }
  std::vector<EngineStats> replica_stats() const override {
    return get() ? get()->replica_stats() : std::vector<EngineStats>{};
  }
  int64_t context_length() const override { return get() ? get()->context_length() : 0; }
  bool flush_cache() override { return get() ? get()->flush_cache() : false; }

 private:
  EngineService* get() const { return engine_.load(std::memory_order_acquire); }
  std::atomic<EngineService*> engine_{nullptr};
  std::atomic<RequestId> next_id_{1};
};

}  // namespace

int cmd_serve(const Args& args) {
  std::vector<std::string> warnings;
  Result<ServeOptions> parsed = parse_serve_options(args, &warnings);
  if (!parsed) return fail(parsed.status().message(), 2);
  ServeOptions opts = *parsed;
  if (opts.help) {
    std::fputs(serve_options_help().c_str(), stdout);
    return 0;
  }
  // Refused before anything starts: settings that would quietly do something else than asked.
  if (std::string f = empty_flag_on_command_line(args, {"api-key", "served-model-name"}); !f.empty())
    return fail(str_cat("--", f, " is empty: give a value, or leave the flag out",
                        f == "api-key" ? " (an empty key would serve without authentication)"
                                       : " (the default is the model path)"), 2);
  if (opts.is_explicit("api-key") && opts.api_key.empty())  // (from --config: dumps never write the key)
    return fail("--api-key is empty: give a value, or leave it out (an empty key would serve without authentication)", 2);
  // --log-requests writes at INFO: a quieter --log-level would drop every line it asks for.
  if (opts.log_requests && opts.log_level != "debug" && opts.log_level != "info")
    return fail(str_cat("--log-requests writes its lines at INFO, which --log-level ", opts.log_level,
                        " hides: use --log-level info (or debug) with it, or drop --log-requests"), 2);
  set_log_level(opts.log_level);  // (the table allows only its names)
  for (const auto& w : warnings) log_warn(w);
  // No model given: the bundled tiny model (models/tiny-coder), as `tools/serve.sh` promises.
  if (opts.model_path.empty()) opts.model_path = default_model_dir();
  // Nodes 1..N-1 of a multi-node group run their ranks for node 0, which serves.
  if (opts.nnodes > 1 && opts.node_rank > 0) return follow_node_zero(opts);

  // Parsers are checked before the (slow) model load.
  if (auto k = tool_parser_kind_from_name(opts.tool_call_parser); !k) return fail(k.status().message(), 2);
  // A --state-dir given explicitly must work: created and opened now, before the port opens (the
  // default location only warns below when it cannot record the launch).
  const std::filesystem::path state_dir =
      opts.state_dir.empty() ? default_state_dir() : std::filesystem::path(opts.state_dir);
  if (opts.is_explicit("state-dir")) {
    auto db = LaunchDb::open(state_dir);
    // (A database another process holds locked is usable: the launch record waits for it below.)
    if (!db && db.status().message().find("locked") == std::string::npos)
      return fail(str_cat("--state-dir ", state_dir.string(), " is not usable: ", db.status().message()), 2);
  }

  auto model_config = load_model_config(opts.model_path);
  if (!model_config) return fail(model_config.status().message(), 1);
  auto generation_defaults = load_generation_defaults(opts.model_path, model_config->vocab_size);
  if (!generation_defaults) return fail(generation_defaults.status().message(), 1);
  auto tokenizer = Tokenizer::load(opts.tokenizer_path.empty() ? opts.model_path : opts.tokenizer_path);
  if (!tokenizer)
    return fail(str_cat(opts.tokenizer_path.empty() ? "" : "--tokenizer-path: ", tokenizer.status().message()), 1);
  SamplingDefaults defaults = *generation_defaults;
  defaults.eos_token_ids = end_token_ids(model_config->eos_token_ids, *generation_defaults, tokenizer->eos_token_id());
  // None at all: /v1/completions needs no template, so the server starts and chat requests are
  // refused; one that is there but broken is an error.
  std::optional<std::filesystem::path> template_override;
  if (!opts.chat_template.empty()) template_override = opts.chat_template;
  auto chat_template = ChatTemplate::find(opts.model_path, template_override);
  if (!chat_template)
    return fail(str_cat(opts.chat_template.empty() ? "" : "--chat-template: ", chat_template.status().message()), 1);
  if (!chat_template->has_value())
    log_warn("deltaserve: ", opts.model_path, " has no chat template (chat_template.jinja, tokenizer_config.json's "
             "chat_template or chat_template.json): serving without one; chat requests are refused, "
             "/v1/completions works (or give --chat-template FILE)");
  std::optional<std::string> bos, eos;
  if (!tokenizer->bos_token().empty()) bos = tokenizer->bos_token();
  if (!tokenizer->eos_token().empty()) eos = tokenizer->eos_token();
  // An empty render function: the server answers chat requests "no chat template".
  ChatRenderFn render;
  if (chat_template->has_value())
    render = [&tmpl = **chat_template, bos, eos](const nlohmann::ordered_json& messages,
                                                 const nlohmann::ordered_json& tools,
                                                 const nlohmann::ordered_json& kwargs) -> Result<std::string> {
    ChatTemplate::Input in;
    in.messages = messages;
    in.tools = tools;
    in.add_generation_prompt = true;
    in.kwargs = kwargs;
    in.bos_token = bos;
    in.eos_token = eos;
    return tmpl.render(in);
  };

  // Block the stop signals before any thread starts (every thread inherits the mask), and take
  // them on one thread: during start-up a signal exits at once (the engine may be allocating);
  // once serving, the first asks main to shut down gracefully, a second cuts the wait short.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  static std::atomic<bool> serving{false};
  // The launch recorded during start-up (0: none yet), for the signal thread: a signal before the
  // server is ready records it "failed: signal N during start-up" (the _Exit below skips the
  // recorder's destructor, which would leave it "died").
  static std::mutex startup_launch_mutex;
  static int64_t startup_launch_id = 0;
  static std::filesystem::path startup_state_dir;
  {
    std::lock_guard<std::mutex> lock(startup_launch_mutex);
    startup_state_dir = state_dir;
  }
  static std::mutex stop_mutex;
  static std::condition_variable stop_cv;
  static int stop_signal = 0;
  static bool force_stop = false;
  std::thread([signals] {
    for (;;) {
      int sig = 0;
      if (sigwait(&signals, &sig) != 0) continue;
      if (!serving.load()) {
        std::fprintf(stderr, "deltaserve serve: signal %d during start-up, exiting\n", sig);
        {
          // (Waits for a LaunchRecorder::start in progress, so that its record is found.)
          std::lock_guard<std::mutex> lock(startup_launch_mutex);
          if (startup_launch_id > 0)
            if (auto db = LaunchDb::open(startup_state_dir))
              Status ignored = (*db)->set_stopped(startup_launch_id, utc_now_iso(),
                                                  str_cat("failed: signal ", sig, " during start-up"));
        }
        std::fflush(stderr);
        std::_Exit(128 + sig);
      }
      {
        std::lock_guard<std::mutex> lock(stop_mutex);
        if (stop_signal != 0) force_stop = true;
        stop_signal = sig;
      }
      stop_cv.notify_all();
    }
  }).detach();

  // Listen before anything heavy: a busy port fails now, not after the model has loaded, and
  // /health answers 503 ("loading") meanwhile.
  LateEngine late_engine;
  LaunchHistoryRefresher history_refresher(state_dir);  // (started once this launch is recorded)
  ServerConfig server_config = server_config_from(opts);
  server_config.launch_history = history_refresher.reader();
  server_config.start_loading = true;
  // On the CPU the compute pool has a thread per core: more io threads only hand each token's
  // write from one to another (measured: bench/RESULTS.md, HTTP vs offline).
  const bool cpu = opts.device == "cpu" || !cuda_available();
  server_config.n_http_threads = opts.http_threads > 0 ? static_cast<int>(opts.http_threads) : (cpu ? 1 : 4);
  OpenAiServer server(server_config, late_engine, *tokenizer, render, defaults);
  if (Status s = server.start(); !s) return fail(s.message(), 1);
  log_info("deltaserve: port ", server.port(), " open; loading the model (GET /health answers 503 until ready)");

  // Device (its CUDA context up), measured memory, memory plan -> engine capacities.
  auto setup = setup_engine(opts, *model_config);
  if (!setup) return fail(setup.status().message(), 1);
  setup->config.extra_eos_token_ids = defaults.eos_token_ids;  // the engine stops where the server ends a reply
  const MemoryPlan& plan = setup->plan;
  const PlanDevice device = setup->device;
  std::fprintf(stderr, "%s", render_memory_plan(plan).c_str());
  for (const auto& w : plan.warnings) log_warn(w);

  // Remember this launch (effective config, model identity, hardware) for `history`/`config diff`.
  // Until stop(), the record says "running" while this process lives ("died" once it is gone);
  // a load that fails below is recorded as failed.
  std::unique_lock<std::mutex> startup_launch_lock(startup_launch_mutex);
  LaunchRecorder launch = LaunchRecorder::start(
      opts, &plan, {{"device", device == PlanDevice::Cuda ? "cuda" : "cpu"}}, DELTASERVE_VERSION);
  startup_launch_id = launch.launch_id();
  startup_launch_lock.unlock();
  // The status page's launch history, read off the io threads from now on.
  history_refresher.start();
  if (!launch.warning().empty()) log_warn(launch.warning());
  if (auto w = launch.faster_config_warning()) log_warn(*w);
  if (launch.launch_id() > 0) log_info("launch ", launch.launch_id(), " recorded (deltaserve history)");

  // --nnodes N: node 0 waits for the others and hands them its engine config (the plan above).
  // Declared before the engines: it outlives them, and tells the other nodes to stop last.
  std::unique_ptr<NodeLink> node_link;
  if (opts.nnodes > 1) {
    log_info("deltaserve: node 0 of ", opts.nnodes, ": waiting at ", opts.dist_init_addr, " for the other nodes (",
             opts.dist_timeout, " s)");
    auto link = NodeLink::lead(node_link_options(opts, device), encode_engine_config(setup->config));
    if (!link) {
      launch.stop("failed: " + link.status().message());
      server.stop();
      return fail(link.status().message(), 1);
    }
    node_link = std::move(*link);
    node_link->watch_nodes();
    setup->config.node_link = node_link.get();
  }
  // --dp-size N: N engines (replicas) behind one ReplicaSet; replica 0 answers for the capacity.
  auto replicas = make_replicas(setup->config, std::move(setup->backend), static_cast<int>(opts.dp_size),
                                {opts.is_explicit("context-length"), opts.is_explicit("max-running-requests")});
  if (!replicas) {
    launch.stop("failed: " + replicas.status().message());
    server.stop();
    return fail(replicas.status().message(), 1);
  }
  ReplicaSet engines(std::move(*replicas));
  Engine& primary = engines.replica(0);
  if (primary.tp_size() > 1)
    std::fprintf(stderr, "deltaserve: tensor parallel over %d ranks: %s\n", primary.tp_size(), primary.tp_transport().c_str());
  const SpeculationChoice spec_choice = choose_speculation(primary, opts);
  if (spec_choice.measured) log_info(spec_choice.summary());
  if (opts.speculative_enabled()) {
    launch.record_derived("spec.num_steps", std::to_string(primary.speculative_steps()));
    if (!launch.warning().empty()) log_warn(launch.warning());
  }
  for (int i = 1; i < engines.size(); ++i) engines.replica(i).set_speculative_steps(primary.speculative_steps());
  engines.start();
  std::fprintf(stderr, "%s\n", primary.plan_summary().c_str());
  // CUDA: graphs and GEMM algorithms made before the first request (app/server_warmup.h). The CPU
  // has neither to make.
  if (device == PlanDevice::Cuda && !opts.skip_server_warmup) {
    for (int i = 0; i < engines.size(); ++i) {
      const WarmupResult w = warm_up_engine(engines.replica(i), primary.capacity().max_running_requests);
      std::string sizes;
      for (int b : w.batches) sizes += (sizes.empty() ? "" : ",") + std::to_string(b);
      log_info("deltaserve: warm-up", engines.size() > 1 ? str_cat(" of replica ", i) : std::string(), ": batches of ",
               sizes, " requests in ", w.seconds, " s (--skip-server-warmup skips it)");
      if (w.failed > 0) log_warn("deltaserve: ", w.failed, " warm-up requests failed");
    }
  }
  if (engines.size() > 1) log_info("deltaserve: ", engines.size(), " data-parallel replicas (figures above: each)");
  EngineService* service = engines.size() > 1 ? static_cast<EngineService*>(&engines) : &primary;

  {
    // /get_server_info: the effective arguments (SGLang's names, underscores) and what the
    // engine allocated, which equals `deltaserve plan` for the same flags and memory.
    nlohmann::ordered_json info = nlohmann::ordered_json::object();
    for (const auto& [name, value] : effective_config(opts)) {
      if (is_secret_serve_flag(name)) continue;
      std::string key = name;
      for (char& ch : key) ch = ch == '-' ? '_' : ch;
      // JSON types as SGLang's server_args: booleans, numbers, and null for "auto" or unset (the
      // string "false" reads as true in Python).
      const FlagType type = serve_flag_type(name);
      nlohmann::ordered_json v = value;
      if (type == FlagType::Bool) {
        v = value == "true";
      } else if (type == FlagType::Int || type == FlagType::Float) {
        char* end = nullptr;
        errno = 0;
        const double d = std::strtod(value.c_str(), &end);
        if (value.empty() || value == "auto") v = nullptr;
        else if (end && *end == '\0' && errno == 0 && std::isfinite(d))
          v = type == FlagType::Int && std::fabs(d) < 9e15 ? nlohmann::ordered_json(static_cast<int64_t>(d)) : nlohmann::ordered_json(d);
      }
      info[key] = std::move(v);
    }
    const EngineCapacity cap = primary.capacity();
    info["max_total_num_tokens"] = cap.kv_tokens;
    info["max_running_requests"] = cap.max_running_requests;
    info["max_mamba_cache_size"] = cap.state_slots + cap.checkpoint_slots;
    info["checkpoint_slots"] = cap.checkpoint_slots;
    info["prefix_cache"] = cap.prefix_cache;
    if (spec_choice.measured) {  // what auto chose (0: MTP off), with the tokens each step verifies
      info["speculative_num_steps"] = cap.spec_num_steps;
      info["speculative_num_draft_tokens"] = cap.spec_num_steps > 0 ? cap.spec_num_steps + 1 : 0;
    }
    info["kv_cache_dtype"] = cap.kv_cache_dtype;
    info["context_length"] = cap.context_length;
    info["page_size"] = cap.kv_block_size;
    info["device"] = device == PlanDevice::Cuda ? "cuda" : "cpu";
    info["memory"] = {{"weights_bytes", cap.weight_bytes},
                      {"kv_cache_bytes", cap.kv_cache_bytes},
                      {"state_cache_bytes", cap.state_cache_bytes},
                      {"plan_budget_bytes", plan.budget_bytes},
                      // Step buffers: the plan's reserve, and what the engine allocated (the scratch
                      // part as grown by the warm-up's steps; model/step_memory.h).
                      {"plan_activation_reserve_bytes", plan.activation_reserve_bytes},
                      {"step_buffer_bytes", cap.step_buffer_bytes},
                      {"scratch_bytes", cap.scratch_bytes},
                      {"device_memory_used_before_load_bytes", setup->plan_input.device_memory_used_bytes}};
    info["version"] = DELTASERVE_VERSION;
    // What `deltaserve bench` checks before it attaches results to launch_id in its own database.
    info["launch_started_at"] = launch.started_at();
    info["launch_db"] = launch.db_path();
    info["dp_replicas"] = engines.size();
    info["tp_size"] = primary.tp_size();
    if (!primary.tp_transport().empty()) info["tp_transport"] = primary.tp_transport();
    server.set_server_info(launch.launch_id(), primary.speculative_steps(), std::move(info));
  }
  late_engine.set(service);
  server.set_state(ServeState::Ready);
  // The e2e tests and launchers wait for this line.
  std::fprintf(stderr, "deltaserve: listening on http://%s:%d (model %s, context %lld)\n",
               host_for_url(opts.host.empty() ? "127.0.0.1" : opts.host).c_str(), server.port(),
               opts.model_path.c_str(), static_cast<long long>(primary.capacity().context_length));
  std::fflush(stderr);
  notify_ready("serving on port " + std::to_string(server.port()));

  // Watchdog: the engine must make progress (a step finishes) whenever requests are pending.
  // Stuck for --watchdog-timeout seconds: the launch is recorded failed and the process exits 1
  // (a supervisor restarts it). Under systemd with WatchdogSec, pings go out only while healthy.
  std::atomic<bool> watchdog_stop{false};
  std::mutex watchdog_mutex;  // with watchdog_cv: the stop wakes the watchdog out of its period
  std::condition_variable watchdog_cv;
  std::thread watchdog;
  const auto systemd_interval = watchdog_interval();
  if (opts.watchdog_timeout > 0 || systemd_interval) {
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(opts.watchdog_timeout * 1000));
    const auto period = systemd_interval ? std::min<std::chrono::milliseconds>(
                                               std::chrono::duration_cast<std::chrono::milliseconds>(*systemd_interval) / 2,
                                               std::chrono::milliseconds(1000))
                                         : std::chrono::milliseconds(1000);
    const int64_t launch_id = launch.launch_id();
    EngineService* svc = service;
    const bool several = engines.size() > 1;
    watchdog = std::thread([&watchdog_stop, &watchdog_mutex, &watchdog_cv, svc, timeout, period, state_dir, launch_id,
                            several] {
      // Each replica on its own (--dp-size N): one that is stuck while the others make progress
      // fires too (their summed steps would hide it).
      EngineProgressWatch watch;
      while (!watchdog_stop.load()) {
        const auto now = std::chrono::steady_clock::now();
        if (auto stuck = watch.update(engine_progress_snapshot(*svc), now, timeout)) {
          const std::string why = str_cat("watchdog: ", several ? str_cat("replica ", stuck->replica, " of the engine") : std::string("the engine"),
                                          " made no progress for ",
                                          std::chrono::duration_cast<std::chrono::seconds>(stuck->stalled).count(),
                                          " s with ", stuck->pending, " requests pending");
          log_error("deltaserve: ", why, "; exiting");
          if (launch_id > 0)
            if (auto db = LaunchDb::open(state_dir)) Status ignored = (*db)->set_stopped(launch_id, utc_now_iso(), "failed: " + why);
          std::_Exit(1);
        }
        notify_watchdog();
        std::unique_lock<std::mutex> lock(watchdog_mutex);
        watchdog_cv.wait_for(lock, period, [&] { return watchdog_stop.load(); });
      }
    });
  }

  serving.store(true);
  {
    std::unique_lock<std::mutex> lock(stop_mutex);
    stop_cv.wait(lock, [] { return stop_signal != 0; });
  }
  notify_stopping("shutting down");
  // Graceful shutdown: no new connections or requests; running ones get --shutdown-timeout
  // seconds, then are aborted (streams end with finish_reason "abort" and [DONE]).
  server.stop_accepting();
  server.set_state(ServeState::Draining);
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + std::chrono::milliseconds(static_cast<int64_t>(opts.shutdown_timeout * 1000));
  log_info("deltaserve: signal ", stop_signal, ", shutting down (", server.busy(), " requests running; up to ",
           opts.shutdown_timeout, " s for them to finish)");
  {
    std::unique_lock<std::mutex> lock(stop_mutex);
    while (server.busy() > 0 && !force_stop && std::chrono::steady_clock::now() < deadline)
      stop_cv.wait_for(lock, std::chrono::milliseconds(20));
  }
  if (server.busy() > 0) {
    log_warn("deltaserve: aborting ", server.busy(), " requests still running");
    const auto abort_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (server.busy() > 0 && std::chrono::steady_clock::now() < abort_deadline) {
      server.abort_all();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // The last responses are queued: let them reach the sockets.
  const auto flush_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (server.pending_writes() > 0 && std::chrono::steady_clock::now() < flush_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  {
    std::lock_guard<std::mutex> lock(watchdog_mutex);
    watchdog_stop.store(true);
  }
  watchdog_cv.notify_all();
  if (watchdog.joinable()) watchdog.join();
  history_refresher.stop();
  server.stop();
  engines.stop();
  if (node_link) node_link->stop_nodes();
  launch.stop("stopped");
  if (!launch.warning().empty()) log_warn(launch.warning());
  log_info("deltaserve: stopped");
  return 0;
}

}  // namespace deltaserve
