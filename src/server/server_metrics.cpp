#include "server/server_metrics.h"

#include <charconv>

#include <chrono>
#include <cstdio>

namespace deltaserve {

namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// A bucket's bound as Prometheus's Python client writes it (shortest round trip, ".0" on whole
// numbers): le is matched as a string, so le="0.1" must not be "0.10000000000000001".
std::string bound_label(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

void add_count(std::vector<std::pair<std::string, uint64_t>>& counts, const std::string& key) {
  for (auto& [k, v] : counts) {
    if (k == key) {
      ++v;
      return;
    }
  }
  counts.emplace_back(key, 1);
}

void gauge(std::string& out, const char* name, const char* help, double v) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " +
         num(v) + "\n";
}
void counter(std::string& out, const char* name, const char* help, double v) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" + name +
         " " + num(v) + "\n";
}

}  // namespace

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(const std::string& name, const std::string& help, std::string& out,
                       const std::string& labels) const {
  std::lock_guard<std::mutex> lock(mutex_);
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  const std::string lead = labels.empty() ? "" : labels + ",";
  const std::string plain = labels.empty() ? "" : "{" + labels + "}";
  uint64_t cumulative = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{" + lead + "le=\"" + bound_label(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  cumulative += counts_.back();
  out += name + "_bucket{" + lead + "le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
  out += name + "_sum" + plain + " " + num(sum_) + "\n";
  out += name + "_count" + plain + " " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
            0.3, 0.4, 0.5, 0.75, 1.0, 2.5}),
      e2e_({0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0}),
      accept_length_({1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0}) {}

std::string metric_route_label(const std::string& route) {
  // The route table: a label is one of these, so a client cannot mint label values (one time
  // series per path it invents) by requesting paths that do not exist.
  static const char* const kRoutes[] = {
      "/v1/chat/completions", "/v1/completions", "/v1/models",     "/v1/responses",  "/health",
      "/metrics",             "/v1/server_info", "/get_server_info", "/generate",    "/abort_request",
      "/flush_cache",         "/tokenize",       "/v1/tokenize",   "/detokenize",    "/v1/detokenize",
      "/health_generate",     "/get_model_info", "/get_load",      "/",              "/status.json",
      "OPTIONS"};
  for (const char* r : kRoutes)
    if (route == r) return route;
  if (route == "/v1/health") return "/health";
  if (route == "/server_info") return "/v1/server_info";
  if (route.rfind("/v1/models/", 0) == 0) return "/v1/models";
  if (route.rfind("/v1/responses/", 0) == 0) return "/v1/responses";
  return "unknown";
}

std::string escape_label_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void ServerMetrics::count_request(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  add_count(requests_, "route=\"" + metric_route_label(route) + "\",code=\"" + std::to_string(status) + "\"");
}

void ServerMetrics::count_finish(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  // SGLang's num_requests_total: generations finished (a choice each, as the aborted count), not
  // HTTP requests (a /metrics scrape counted itself).
  ++n_requests_;
  if (reason == "abort") ++n_aborted_;
  add_count(finishes_, "reason=\"" + escape_label_value(reason) + "\"");
}

void ServerMetrics::stream_opened() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++open_streams_;
}
void ServerMetrics::stream_closed() {
  std::lock_guard<std::mutex> lock(mutex_);
  --open_streams_;
}

std::string ServerMetrics::render(const EngineStats& s, const std::vector<EngineStats>& replicas) const {
  std::string out;
  out.reserve(8192);
  if (!replicas.empty()) {
    auto per_replica = [&](const char* name, const char* type, const char* help, auto value) {
      out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
      for (std::size_t i = 0; i < replicas.size(); ++i)
        out += std::string(name) + "{replica=\"" + std::to_string(i) + "\"} " + num(value(replicas[i])) + "\n";
    };
    per_replica("deltaserve_replica_requests_running", "gauge", "Sequences being decoded or prefilled, per replica.",
                [](const EngineStats& r) { return double(r.requests_running); });
    per_replica("deltaserve_replica_requests_waiting", "gauge", "Sequences queued, per replica.",
                [](const EngineStats& r) { return double(r.requests_waiting); });
    per_replica("deltaserve_replica_kv_usage_ratio", "gauge", "Fraction of the replica's KV cache in use.",
                [](const EngineStats& r) {
                  return r.kv_tokens_total > 0 ? double(r.kv_tokens_used) / double(r.kv_tokens_total) : 0.0;
                });
    per_replica("deltaserve_replica_generation_tokens_total", "counter", "Tokens generated, per replica.",
                [](const EngineStats& r) { return double(r.generated_tokens_total); });
  }
  gauge(out, "deltaserve_requests_running", "Sequences being decoded or prefilled.",
        s.requests_running);
  gauge(out, "deltaserve_requests_waiting", "Sequences queued for admission.", s.requests_waiting);
  gauge(out, "deltaserve_mixed_prefill_tokens",
        "Prefill tokens a step that also decodes may carry (--mixed-prefill-tokens; auto: learnt from step times, before a backlog of pending prompts raises it for a step).",
        s.mixed_prefill_tokens);
  gauge(out, "deltaserve_kv_tokens_used", "KV cache token slots held by live requests.",
        static_cast<double>(s.kv_tokens_used));
  gauge(out, "deltaserve_kv_tokens_total", "KV cache capacity in tokens.",
        static_cast<double>(s.kv_tokens_total));
  gauge(out, "deltaserve_kv_usage_ratio", "Fraction of the KV cache in use.",
        s.kv_tokens_total > 0 ? static_cast<double>(s.kv_tokens_used) / s.kv_tokens_total : 0.0);
  gauge(out, "deltaserve_state_slots_used", "Recurrent (GDN) state slots in use.",
        s.state_slots_used);
  gauge(out, "deltaserve_state_slots_total", "Recurrent (GDN) state slots.", s.state_slots_total);
  counter(out, "deltaserve_prompt_tokens_total", "Prompt tokens processed.",
          static_cast<double>(s.prompt_tokens_total));
  counter(out, "deltaserve_prompt_tokens_cached_total", "Prompt tokens served from the prefix cache (not computed).",
          static_cast<double>(s.prompt_tokens_cached_total));
  counter(out, "deltaserve_prompt_tokens_computed_total", "Prompt tokens computed (not served from the prefix cache).",
          static_cast<double>(s.prompt_tokens_total > s.prompt_tokens_cached_total
                                  ? s.prompt_tokens_total - s.prompt_tokens_cached_total
                                  : 0));
  gauge(out, "deltaserve_prefix_cache_blocks", "KV blocks the prefix cache holds.", static_cast<double>(s.cached_blocks));
  gauge(out, "deltaserve_prefix_cache_checkpoints", "GDN state checkpoints the prefix cache holds.",
        s.cached_checkpoints);
  gauge(out, "deltaserve_prefix_cache_checkpoint_slots", "GDN state checkpoint slots.", s.checkpoint_slots_total);
  counter(out, "deltaserve_generation_tokens_total", "Tokens generated.",
          static_cast<double>(s.generated_tokens_total));
  counter(out, "deltaserve_spec_draft_tokens_total", "Speculative draft tokens proposed.",
          static_cast<double>(s.spec_draft_tokens_total));
  counter(out, "deltaserve_spec_accepted_tokens_total", "Speculative draft tokens accepted.",
          static_cast<double>(s.spec_accepted_tokens_total));
  counter(out, "deltaserve_spec_verify_steps_total", "Speculative verification steps.",
          static_cast<double>(s.spec_verify_steps_total));
  counter(out, "deltaserve_engine_steps_total", "Engine steps (one forward each).", static_cast<double>(s.steps_total));
  counter(out, "deltaserve_preemptions_total",
          "Running requests retracted for lack of KV blocks (their computed tokens are recomputed).",
          static_cast<double>(s.preemptions_total));
  counter(out, "deltaserve_engine_step_seconds_total", "Engine thread time in steps.", s.step_seconds);
  counter(out, "deltaserve_engine_forward_seconds_total", "Of which the forward (incl. logits to the host).",
          s.forward_seconds);
  counter(out, "deltaserve_engine_sample_seconds_total", "Of which sampling and verification.", s.sample_seconds);
  counter(out, "deltaserve_engine_draft_seconds_total", "Of which speculative rollback and drafting.", s.draft_seconds);
  counter(out, "deltaserve_engine_overlapped_steps_total",
          "Steps launched while the step before them still computed (overlap scheduling).",
          static_cast<double>(s.overlapped_steps_total));
  counter(out, "deltaserve_engine_overlap_dropped_tokens_total",
          "Tokens computed by overlapped steps for requests that had finished a step earlier (discarded).",
          static_cast<double>(s.overlap_dropped_tokens_total));
  ttft_.render("deltaserve_time_to_first_token_seconds",
               "Time from request arrival to its first generated token.", out);
  itl_.render("deltaserve_inter_token_latency_seconds", "Time between generated tokens.", out);
  e2e_.render("deltaserve_e2e_request_latency_seconds", "Time from request arrival to its end.",
              out);
  accept_length_.render("deltaserve_spec_accept_length",
                        "Mean tokens accepted per verification step, per request.", out);
  std::lock_guard<std::mutex> lock(mutex_);
  out += "# HELP deltaserve_http_requests_total HTTP requests by route and status.\n";
  out += "# TYPE deltaserve_http_requests_total counter\n";
  for (const auto& [k, v] : requests_) {
    out += "deltaserve_http_requests_total{" + k + "} " + std::to_string(v) + "\n";
  }
  out += "# HELP deltaserve_request_finish_total Finished choices by finish reason.\n";
  out += "# TYPE deltaserve_request_finish_total counter\n";
  for (const auto& [k, v] : finishes_) {
    out += "deltaserve_request_finish_total{" + k + "} " + std::to_string(v) + "\n";
  }
  counter(out, "deltaserve_requests_abandoned_total",
          "Requests whose client disconnected before the end.", static_cast<double>(n_abandoned_));
  gauge(out, "deltaserve_http_streams_open", "Responses in progress.",
        static_cast<double>(open_streams_));
  render_sglang(s, out);
  return out;
}

// SGLang's names (python/sglang/srt/metrics/collector.py), labelled model_name as SGLang does.
// Called with mutex_ held.
void ServerMetrics::render_sglang(const EngineStats& s, std::string& out) const {
  const std::string label = "model_name=\"" + escape_label_value(model_name_) + "\"";
  auto sample = [&](const char* type, const char* name, const char* help, double v) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + "{" + label +
           "} " + num(v) + "\n";
  };
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (last_scrape_ > 0 && now > last_scrape_) {
    last_throughput_ = static_cast<double>(s.generated_tokens_total - last_generated_) / (now - last_scrape_);
  }
  last_scrape_ = now;
  last_generated_ = s.generated_tokens_total;
  sample("gauge", "sglang:num_running_reqs", "The number of running requests.", s.requests_running);
  sample("gauge", "sglang:num_queue_reqs", "The number of requests in the waiting queue.", s.requests_waiting);
  sample("gauge", "sglang:num_used_tokens", "The number of used tokens.", static_cast<double>(s.kv_tokens_used));
  sample("gauge", "sglang:token_usage", "The token usage.",
         s.kv_tokens_total > 0 ? static_cast<double>(s.kv_tokens_used) / static_cast<double>(s.kv_tokens_total) : 0.0);
  sample("gauge", "sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache.",
         static_cast<double>(s.kv_tokens_total));
  sample("gauge", "sglang:gen_throughput", "The generation throughput (token/s) since the previous scrape.",
         last_throughput_);
  sample("gauge", "sglang:cache_hit_rate", "The prefix cache hit rate (cached prompt tokens / prompt tokens).",
         s.prompt_tokens_total > 0
             ? static_cast<double>(s.prompt_tokens_cached_total) / static_cast<double>(s.prompt_tokens_total)
             : 0.0);
  sample("gauge", "sglang:spec_accept_length", "The average acceptance length of speculative decoding.",
         s.spec_verify_steps_total > 0
             ? 1.0 + static_cast<double>(s.spec_accepted_tokens_total) / static_cast<double>(s.spec_verify_steps_total)
             : 0.0);
  sample("counter", "sglang:prompt_tokens_total", "Number of prefill tokens processed.",
         static_cast<double>(s.prompt_tokens_total));
  sample("counter", "sglang:generation_tokens_total", "Number of generation tokens processed.",
         static_cast<double>(s.generated_tokens_total));
  sample("counter", "sglang:cached_tokens_total", "Number of cached prompt tokens.",
         static_cast<double>(s.prompt_tokens_cached_total));
  sample("counter", "sglang:num_requests_total", "Number of requests processed.", static_cast<double>(n_requests_));
  sample("counter", "sglang:num_aborted_requests_total", "Number of requests aborted.", static_cast<double>(n_aborted_));
  ttft_.render("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", out, label);
  itl_.render("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", out, label);
  e2e_.render("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", out, label);
}

}  // namespace deltaserve
