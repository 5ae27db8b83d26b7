// ServerMetrics: Prometheus text exposition for /metrics. Gauges and engine counters come from
// EngineStats at scrape time; latency histograms and request counters are observed by the server.
// Every series is exported twice: deltaserve_* and SGLang's sglang:* names (with SGLang's
// model_name label), so dashboards built for SGLang keep working. Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine_service.h"

namespace deltaserve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void observe(double v);
  // Appends `# TYPE` and the _bucket/_sum/_count lines; `labels` (e.g. `model_name="m"`) go on
  // every sample.
  void render(const std::string& name, const std::string& help, std::string& out,
              const std::string& labels = "") const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last = +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

// The `route` label for a request path: the path if it is in the route table ("/v1/models/x" →
// "/v1/models"), "unknown" otherwise.
std::string metric_route_label(const std::string& route);
// A Prometheus label value with \\, " and newline escaped.
std::string escape_label_value(const std::string& value);

class ServerMetrics {
 public:
  ServerMetrics();
  void observe_ttft(double seconds) { ttft_.observe(seconds); }
  void observe_itl(double seconds) { itl_.observe(seconds); }
  void observe_e2e(double seconds) { e2e_.observe(seconds); }
  void observe_accept_length(double tokens) { accept_length_.observe(tokens); }
  // `route` is reported as metric_route_label(route).
  void count_request(const std::string& route, int status);
  void count_finish(const std::string& reason);
  void add_abandoned() { std::lock_guard<std::mutex> l(mutex_); ++n_abandoned_; }
  void stream_opened();
  void stream_closed();
  // The model_name label of the sglang:* metrics.
  void set_model_name(std::string name) { model_name_ = std::move(name); }

  // replicas: data parallelism's per-replica statistics (stats is their sum), as
  // deltaserve_replica_*{replica="i"}.
  std::string render(const EngineStats& stats, const std::vector<EngineStats>& replicas = {}) const;
  // Responses in progress (deltaserve_http_streams_open) and requests aborted so far.
  int64_t open_streams() const { std::lock_guard<std::mutex> l(mutex_); return open_streams_; }
  uint64_t aborted_requests() const { std::lock_guard<std::mutex> l(mutex_); return n_aborted_; }

 private:
  Histogram ttft_, itl_, e2e_, accept_length_;
  mutable std::mutex mutex_;
  std::vector<std::pair<std::string, uint64_t>> requests_;  // "route\tstatus" → count
  std::vector<std::pair<std::string, uint64_t>> finishes_;
  uint64_t n_abandoned_ = 0;
  int64_t open_streams_ = 0;
  std::string model_name_ = "default";
  uint64_t n_requests_ = 0, n_aborted_ = 0;
  // For sglang:gen_throughput: generated tokens and time at the previous scrape.
  mutable uint64_t last_generated_ = 0;
  mutable double last_scrape_ = 0, last_throughput_ = 0;

  void render_sglang(const EngineStats& s, std::string& out) const;
};

}  // namespace deltaserve
