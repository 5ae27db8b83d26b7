// deltaserve bench-offline [--batch 1,8] [--threads 1,2] [--prompt-len 1024] [--gen-len 128] [--json]
//     [serve flags: --model-path DIR --load-format dummy --speculative-num-steps K ...]
// Offline throughput through the Engine (no HTTP): prefill tokens/s for one prompt, and decode
// tokens/s with B concurrent sequences, plus the weight-streaming bandwidth at batch 1. With
// --workload it also runs the workload `deltaserve bench` sends over HTTP, in process: max(8, 4 x B)
// requests, at most B in flight (closed loop), output tokens over wall time including prefills --
// the denominator of the HTTP/offline ratio (bench/serve/run.sh) -- and the requests' TTFT
// percentiles (from submit to the first token).
#include <atomic>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <mutex>
#include <thread>

#include "app/batch_rates.h"
#include "app/cli_args.h"
#include "app/engine_setup.h"
#include "app/speculation_choice.h"
#include "app/commands.h"
#include "deploy/bench.h"
#include "engine/engine.h"
#include "engine/model_setup.h"
#include "options/serve_options.h"
#include "util/log.h"
#include "util/timer.h"
#include "util/json_parse.h"

namespace deltaserve {

namespace {

struct RunResult : BatchRates {
  double accept_length = 0;
  std::string error;  // the first failed request's error ("" = every request finished)
};

// A request of `prompt_len` random tokens generating exactly `gen_len` (ignore_eos), sampled with
// `sampling` and its own seed.
GenerateRequest random_request(Engine& e, std::mt19937_64& rng, const SamplingParams& sampling, int prompt_len,
                               int gen_len, uint64_t seed) {
  const int64_t V = std::min<int64_t>(e.model_config().vocab_size, 4096);
  GenerateRequest r;
  r.id = e.next_request_id();
  for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(static_cast<int32_t>(rng() % V));
  r.sampling = sampling;
  r.sampling.seed = seed;
  r.sampling.max_tokens = gen_len;
  r.sampling.ignore_eos = true;
  return r;
}

// B requests submitted at once, each drained by its own reader thread (event times are when the
// engine emitted them, TokenEvent::emitted_at, not when a reader got round to a stream); figures:
// app/batch_rates.h.
RunResult run_batch(Engine& e, const SamplingParams& sampling, int batch, int prompt_len, int gen_len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::shared_ptr<RequestStream>> streams;
  const double t0 = now_seconds();
  for (int b = 0; b < batch; ++b)
    streams.push_back(e.submit(random_request(e, rng, sampling, prompt_len, gen_len, seed * 1000 + uint64_t(b))));
  std::vector<std::vector<EmittedTokens>> emitted(batch);  // [batch][events]
  std::vector<double> accept(batch, 0);
  std::vector<std::string> errors(batch);
  std::vector<std::thread> readers;
  for (int b = 0; b < batch; ++b) {
    readers.emplace_back([&, b] {
      DrainedStream d = drain_stream(*streams[b], static_cast<std::size_t>(gen_len) + 1);
      emitted[b] = std::move(d.emitted);
      accept[b] = d.accept_length;
      errors[b] = std::move(d.error);
    });
  }
  for (auto& r : readers) r.join();
  RunResult res;
  for (const std::string& err : errors)
    if (!err.empty()) {
      res.error = err;  // the figures of a failed run mean nothing
      return res;
    }
  static_cast<BatchRates&>(res) = batch_rates(t0, prompt_len, emitted);
  for (double a : accept) res.accept_length += a / batch;
  return res;
}

// The closed-loop workload of `deltaserve bench` without HTTP: `concurrency` client threads, each
// submitting the next of n_requests and draining its events before taking another. Output tokens
// over wall time (first submit to last finish), and each request's time to its first token.
struct WorkloadResult {
  double output_tok_s = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  std::string error;  // the first failed request's error
};
WorkloadResult run_workload(Engine& e, const SamplingParams& sampling, int concurrency, int64_t n_requests,
                            int prompt_len, int gen_len, uint64_t seed) {
  std::atomic<int64_t> next{0}, tokens{0};
  std::mutex error_mu;
  std::string first_error;
  std::vector<std::vector<double>> ttft(static_cast<size_t>(concurrency));  // seconds, per client
  const double t0 = now_seconds();
  std::vector<std::thread> clients;
  for (int c = 0; c < concurrency; ++c)
    clients.emplace_back([&, c] {
      std::mt19937_64 rng(seed + static_cast<uint64_t>(c));
      for (int64_t i; (i = next.fetch_add(1)) < n_requests;) {
        const double submitted = now_seconds();
        bool first = true;
        auto stream = e.submit(random_request(e, rng, sampling, prompt_len, gen_len, seed * 1000 + uint64_t(i)));
        while (auto ev = stream->events.pop()) {
          if (first && !ev->tokens.empty()) {
            ttft[static_cast<size_t>(c)].push_back(now_seconds() - submitted);
            first = false;
          }
          tokens += static_cast<int64_t>(ev->tokens.size());
          if (ev->finish == FinishReason::Error) {
            std::lock_guard<std::mutex> lock(error_mu);
            if (first_error.empty()) first_error = ev->error.empty() ? "request failed" : ev->error;
          }
          if (ev->finish != FinishReason::None) break;
        }
      }
    });
  for (auto& t : clients) t.join();
  const double wall = now_seconds() - t0;
  WorkloadResult r;
  r.error = first_error;
  r.output_tok_s = wall > 0 ? double(tokens.load()) / wall : 0;
  std::vector<double> all;
  for (const auto& v : ttft) all.insert(all.end(), v.begin(), v.end());
  r.ttft_p50_ms = 1e3 * percentile(all, 50);
  r.ttft_p99_ms = 1e3 * percentile(all, 99);
  return r;
}

// What set the plan's running-request count, as its table names it ("--max-running-requests",
// "--max-mamba-cache-size 2 (the model's state slots)", "KV tokens", ...).
std::string running_cap_bound(const MemoryPlan& plan) {
  std::string bound, slots_bound;
  for (const PlanRow& r : plan.rows) {
    if (r.item == "max running requests") bound = r.bound_by;
    if (r.item == "state slots") slots_bound = r.bound_by;
  }
  if (bound == "state slots" && !slots_bound.empty()) bound = slots_bound + " (the model's state slots)";
  return bound.empty() ? "the memory plan" : bound;
}

// Stats once the engine has published its last step (requests finish inside a step; the counters
// are published right after it).
EngineStats settled_stats(Engine& e) {
  for (;;) {
    EngineStats st = e.stats();
    if (st.requests_running == 0 && st.requests_waiting == 0) return st;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace

int cmd_bench_offline(const Args& args) {
  CliArgs cli({"batch", "threads", "prompt-len", "gen-len", "prefill-len", "temperature", "top-k", "top-p"},
              {"json", "workload", "help"});
  std::vector<std::string> serve_args;
  if (Status s = cli.parse(args, &serve_args); !s) {
    std::fprintf(stderr, "deltaserve bench-offline: %s\n", s.message().c_str());
    return 2;
  }
  if (cli.flag("help")) {
    std::printf("usage: deltaserve bench-offline [--batch 1,8] [--threads 1,2] [--prompt-len 1024[,8192,...]] [--gen-len 128]\n"
                "         [--prefill-len 1024] [--workload] [--temperature 0 --top-k -1 --top-p 1] (greedy by default)\n"
                "         [--json] [serve flags: --model-path DIR --load-format dummy --device cuda\n"
                "          --speculative-algorithm NEXTN --speculative-num-steps K --kv-cache-dtype ...]\n"
                "The engine is configured as serve configures it (same flags, defaults and memory plan), except\n"
                "that --max-running-requests defaults to the largest batch and --context-length to what the\n"
                "workload needs.\n"
                "--workload also runs max(8, 4 x B) requests with at most B in flight (what `deltaserve bench`\n"
                "sends over HTTP) and reports output tokens over wall time, prefills included, and the\n"
                "requests' time to first token (p50 / p99).\n");
    return 0;
  }
  std::vector<std::string> warnings;
  auto parsed = parse_serve_options(serve_args, &warnings);
  if (!parsed) {
    std::fprintf(stderr, "deltaserve bench-offline: %s\n", parsed.status().message().c_str());
    return 2;
  }
  for (const auto& w : warnings) std::fprintf(stderr, "deltaserve bench-offline: warning: %s\n", w.c_str());
  ServeOptions opts = std::move(*parsed);
  set_log_level(opts.log_level);
  if (opts.model_path.empty()) opts.model_path = default_model_dir();
  auto model_config = load_model_config(opts.model_path);
  if (!model_config) {
    std::fprintf(stderr, "deltaserve bench-offline: %s\n", model_config.status().message().c_str());
    return 1;
  }
  auto batches = parse_int_list("batch", cli.get_or("batch", "1,8"));
  auto threads = parse_int_list("threads", cli.get_or("threads", "1,2"));
  auto prompt_lens = parse_int_list("prompt-len", cli.get_or("prompt-len", "1024"));
  auto gen_len = parse_int("gen-len", cli.get_or("gen-len", "128"));
  auto prefill_len = parse_int("prefill-len", cli.get_or("prefill-len", "1024"));
  auto top_k = parse_top_k(cli.get_or("top-k", "-1"));
  auto temperature = parse_double("temperature", cli.get_or("temperature", "0"));
  auto top_p = parse_double("top-p", cli.get_or("top-p", "1"));
  for (const Status& st : {batches.status(), threads.status(), prompt_lens.status(), gen_len.status(),
                           prefill_len.status(), top_k.status(), temperature.status(), top_p.status()}) {
    if (!st.is_ok()) {
      std::fprintf(stderr, "deltaserve bench-offline: %s\n", st.message().c_str());
      return 2;
    }
  }
  // Ranges (a batch is that many requests and reader threads; lengths are tokens).
  constexpr int kMaxBatch = 4096, kMaxLen = 1 << 24;
  std::string range_error;
  for (int b : *batches)
    if (b < 1 || b > kMaxBatch) range_error = str_cat("--batch values must be 1..", kMaxBatch, " (got ", b, ")");
  for (int t : *threads)
    if (t < 0 || t > kMaxThreads) range_error = str_cat("--threads values must be 0..", kMaxThreads, " (0: all usable CPUs) (got ", t, ")");
  for (int p : *prompt_lens)
    if (p < 1 || p > kMaxLen) range_error = str_cat("--prompt-len values must be 1..", kMaxLen, " (got ", p, ")");
  if (*gen_len < 1 || *gen_len > kMaxLen) range_error = str_cat("--gen-len must be 1..", kMaxLen, " (got ", *gen_len, ")");
  if (*prefill_len < 1 || *prefill_len > kMaxLen)
    range_error = str_cat("--prefill-len must be 1..", kMaxLen, " (got ", *prefill_len, ")");
  if (!(*temperature >= 0 && *temperature <= 100)) range_error = str_cat("--temperature must be 0..100 (got ", *temperature, ")");
  if (!(*top_p > 0 && *top_p <= 1)) range_error = str_cat("--top-p must be in (0, 1] (got ", *top_p, ")");
  // Serve's flags that this command does not read (it sends random token ids, no text).
  if (!opts.tokenizer_path.empty()) range_error = "--tokenizer-path: bench-offline sends token ids and reads no tokenizer";
  if (!range_error.empty()) {
    std::fprintf(stderr, "deltaserve bench-offline: %s\n", range_error.c_str());
    return 2;
  }
  if (Status s = single_replica_only(opts, "bench-offline"); !s) {
    std::fprintf(stderr, "deltaserve bench-offline: %s\n", s.message().c_str());
    return 2;
  }
  SamplingParams sampling;  // greedy unless --temperature
  sampling.temperature = static_cast<float>(*temperature);
  sampling.top_p = static_cast<float>(*top_p);
  sampling.top_k = *top_k;
  nlohmann::json results = nlohmann::json::array();
  const bool workload = cli.flag("workload");
  // Every figure names its context: prefill over --prefill-len tokens, decode at --prompt-len
  // (+ up to --gen-len) tokens; "decode-only" excludes steps shared with other prefills.
  const int64_t max_prompt = *std::max_element(prompt_lens->begin(), prompt_lens->end());
  std::printf("prefill context %lld tokens; decode context: the context column (+ up to %lld generated)\n",
              static_cast<long long>(*prefill_len), static_cast<long long>(*gen_len));
  std::printf("%-8s %-6s %8s %14s %14s %17s %14s %12s%s\n", "threads", "batch", "context", "prefill tok/s", "decode tok/s",
              "decode-only tok/s", "weights GB/s", "accept len",
              workload ? "  workload tok/s  TTFT p50 / p99 ms" : "");
  for (int t : *threads) {
    // The workload's size, unless the flags say otherwise.
    ServeOptions o = opts;
    o.threads = t;
    if (!o.is_explicit("max-running-requests")) o.max_running_requests = *std::max_element(batches->begin(), batches->end());
    if (!o.is_explicit("context-length"))
      o.context_length = std::max<int64_t>(max_prompt + *gen_len, *prefill_len) + 16;
    // A batch submitted at once is measured as a batch: the prompts of its last sequences are not
    // held back for the decodes of its first ones (serve's default learns a budget for that).
    if (!o.is_explicit("mixed-prefill-tokens")) o.mixed_prefill_tokens = std::numeric_limits<int32_t>::max();
    Status valid = validate_serve_options(o);  // the sizes set here are checked as the flags' are
    auto setup = valid ? setup_engine(o, *model_config) : Result<EngineSetup>(valid);
    if (!setup) {
      std::fprintf(stderr, "deltaserve bench-offline: %s\n", setup.status().message().c_str());
      return 1;
    }
    // A batch above what the engine runs at once would be measured as a queue (its last requests
    // waiting for the first ones) and reported as that batch: refused, naming the bound.
    const int max_running = setup->config.max_running_requests;
    for (int b : *batches)
      if (b > max_running) {
        std::string bound = running_cap_bound(setup->plan);
        if (bound == "--max-running-requests") bound += str_cat(" ", o.max_running_requests);
        std::fprintf(stderr,
                     "deltaserve bench-offline: --batch %d: the engine runs at most %d request(s) at once here (bound by "
                     "%s): a larger batch would be measured as a queue; lower --batch or raise that bound\n",
                     b, max_running, bound.c_str());
        return 2;
      }
    if (setup->device == PlanDevice::Cuda)
      std::fprintf(stderr, "device memory: %.2f GiB, in use before loading %.2f GiB (CUDA context); KV %s, %lld tokens\n",
                   double(setup->plan_input.device_memory_bytes) / double(1 << 30),
                   double(setup->plan_input.device_memory_used_bytes) / double(1 << 30),
                   std::string(dtype_name(setup->config.kv_cache_dtype)).c_str(),
                   static_cast<long long>(setup->config.kv_tokens));
    auto engine = Engine::create(setup->config, std::move(setup->backend));
    if (!engine) {
      std::fprintf(stderr, "deltaserve bench-offline: %s\n", engine.status().message().c_str());
      return 1;
    }
    if ((*engine)->tp_size() > 1)
      std::fprintf(stderr, "tensor parallel over %d ranks: %s\n", (*engine)->tp_size(), (*engine)->tp_transport().c_str());
    Engine& e = **engine;
    const SpeculationChoice spec_choice = choose_speculation(e, o);
    if (spec_choice.measured) std::fprintf(stderr, "%s\n", spec_choice.summary().c_str());
    e.start();
    // Warm-up at each batch size: buffers reach their steady size, and the CUDA graphs and GEMM
    // algorithms (backend/cuda/cuda_gemm.h) of its steps exist before anything is timed.
    std::set<int> warm(batches->begin(), batches->end());
    warm.insert(1);
    for (int b : warm) {
      const double w0 = now_seconds();
      run_batch(e, sampling, b, 16, 8, 1);
      std::fprintf(stderr, "warm-up at batch %d: %.3f s\n", b, now_seconds() - w0);
    }
    // Prefill: one long prompt, one generated token.
    RunResult pre = run_batch(e, sampling, 1, static_cast<int>(*prefill_len), 1, 2);
    // A failed request (e.g. a prompt past the context) is reported, not measured.
    auto failed = [&](const std::string& err, const char* what) {
      std::fprintf(stderr, "deltaserve bench-offline: %s failed: %s\n", what, err.c_str());
      e.stop();
      return 1;
    };
    if (!pre.error.empty()) return failed(pre.error, "the prefill run");
    for (int prompt_len : *prompt_lens)
    for (int b : *batches) {
      const EngineStats s0 = settled_stats(e);
      RunResult r = run_batch(e, sampling, b, prompt_len, static_cast<int>(*gen_len), 3 + b);
      if (!r.error.empty()) return failed(r.error, str_cat("a request at batch ", b).c_str());
      // At batch 1 every decode step streams all weights once (MTP verification streams them
      // once per step too, so divide by the accept length when speculating).
      const double steps_per_s = r.decode_tok_s / b / (r.accept_length > 0 ? r.accept_length : 1.0);
      const double gbps = b == 1 ? steps_per_s * double(e.decode_weight_bytes()) / 1e9 : 0.0;
      const EngineStats s1 = settled_stats(e);
      // Engine-thread time per step over this run (prefills included), by phase.
      const double n_steps = double(std::max<uint64_t>(1, s1.steps_total - s0.steps_total));
      const double fwd_ms = 1e3 * (s1.forward_seconds - s0.forward_seconds) / n_steps;
      const double smp_ms = 1e3 * (s1.sample_seconds - s0.sample_seconds) / n_steps;
      const double drf_ms = 1e3 * (s1.draft_seconds - s0.draft_seconds) / n_steps;
      const double step_ms = 1e3 * (s1.step_seconds - s0.step_seconds) / n_steps;
      const WorkloadResult wl = workload ? run_workload(e, sampling, b, std::max<int64_t>(8, 4 * int64_t(b)),
                                                        prompt_len, static_cast<int>(*gen_len), 100 + b)
                                         : WorkloadResult{};
      if (!wl.error.empty()) return failed(wl.error, str_cat("a workload request at batch ", b).c_str());
      std::printf("%-8d %-6d %8lld %14.0f %14.1f %17.1f %14.2f %12.2f", t, b, static_cast<long long>(prompt_len),
                  pre.prefill_tok_s, r.decode_tok_s, r.decode_only_tok_s, gbps, r.accept_length);
      if (workload) std::printf(" %16.1f %8.1f / %.1f", wl.output_tok_s, wl.ttft_p50_ms, wl.ttft_p99_ms);
      std::printf("\n");
      if (b > 1 && r.decode_only_tok_s == 0)
        std::fprintf(stderr, "  batch %d: no step decoded all %d sequences (their prompts' prefill staggered them by more "
                     "than --gen-len): decode-only tok/s is 0\n", b, b);
      std::fprintf(stderr, "  batch %d: %.0f steps, per step %.3f ms = forward %.3f + sampling %.3f + drafts %.3f + other %.3f\n",
                   b, n_steps, step_ms, fwd_ms, smp_ms, drf_ms, step_ms - fwd_ms - smp_ms - drf_ms);
      // Decode steps only (no prefill chunk in the batch): the step time of decoding itself.
      const double d_steps = double(s1.decode_steps_total - s0.decode_steps_total);
      const auto per = [&](double a1, double a0) { return d_steps > 0 ? 1e3 * (a1 - a0) / d_steps : 0.0; };
      const double d_step = per(s1.decode_step_seconds, s0.decode_step_seconds);
      const double d_fwd = per(s1.decode_forward_seconds, s0.decode_forward_seconds);
      const double d_smp = per(s1.decode_sample_seconds, s0.decode_sample_seconds);
      const double d_drf = per(s1.decode_draft_seconds, s0.decode_draft_seconds);
      std::fprintf(stderr, "  batch %d: %.0f decode steps, per decode step %.3f ms = forward %.3f + sampling %.3f + drafts %.3f + other %.3f\n",
                   b, d_steps, d_step, d_fwd, d_smp, d_drf, d_step - d_fwd - d_smp - d_drf);
      const uint64_t on_dev = s1.device_sampled_total - s0.device_sampled_total;
      if (on_dev > 0)
        std::fprintf(stderr, "  batch %d: %llu tokens drawn on the device\n", b, static_cast<unsigned long long>(on_dev));
      const uint64_t overlapped = s1.overlapped_steps_total - s0.overlapped_steps_total;
      if (overlapped > 0)
        std::fprintf(stderr, "  batch %d: %llu steps launched while the step before computed (overlap), %llu tokens dropped\n",
                     b, static_cast<unsigned long long>(overlapped),
                     static_cast<unsigned long long>(s1.overlap_dropped_tokens_total - s0.overlap_dropped_tokens_total));
      std::fflush(stdout);
      nlohmann::json row = {{"threads", t}, {"batch", b}, {"prefill_tokens_per_second", pre.prefill_tok_s},
                            {"decode_tokens_per_second", r.decode_tok_s},
                            {"decode_only_tokens_per_second", r.decode_only_tok_s}, {"context_tokens", prompt_len},
                            {"prefill_context_tokens", *prefill_len}, {"weight_gb_per_second", gbps},
                            {"accept_length", r.accept_length}, {"weight_bytes", e.weight_bytes()},
                            {"decode_weight_bytes", e.decode_weight_bytes()}, {"backend", e.backend_description()},
                            {"tp_size", e.tp_size()}, {"tp_transport", e.tp_transport()}};
      if (workload) {
        row["workload_output_tokens_per_second"] = wl.output_tok_s;
        row["workload_ttft_ms"] = {{"p50", wl.ttft_p50_ms}, {"p99", wl.ttft_p99_ms}};
      }
      row["step_ms"] = {{"total", step_ms}, {"forward", fwd_ms}, {"sampling", smp_ms}, {"drafts", drf_ms}};
      row["decode_step_ms"] = {{"steps", d_steps}, {"total", d_step}, {"forward", d_fwd}, {"sampling", d_smp},
                               {"drafts", d_drf}};
      row["overlapped_steps"] = overlapped;
      results.push_back(std::move(row));
    }
    e.stop();
  }
  if (cli.flag("json")) std::printf("%s\n", dump_lossy(results, 2).c_str());
  return 0;
}

}  // namespace deltaserve
