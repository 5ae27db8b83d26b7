#include "deploy/bench.h"
#include "util/json_parse.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

namespace deltaserve {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string fmt(double v, int digits = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

const char* kWords[] = {"the", "model", "serves", "tokens", "quickly", "while", "state", "slots", "hold",
                        "each", "request", "and", "kernels", "compute", "attention", "over", "cached",
                        "keys", "values", "python", "function", "returns", "list", "of", "numbers"};

void find_number(const nlohmann::json& j, const std::vector<std::string>& keys, double* out) {
  if (j.is_object()) {
    for (auto& [k, v] : j.items()) {
      if (v.is_number() && std::find(keys.begin(), keys.end(), k) != keys.end() && *out == 0) *out = v.get<double>();
      find_number(v, keys, out);
    }
  } else if (j.is_array()) {
    for (auto& v : j) find_number(v, keys, out);
  }
}

}  // namespace

std::vector<double> bench_arrivals(int64_t n, double rate, uint64_t seed) {
  std::vector<double> t(static_cast<size_t>(std::max<int64_t>(n, 0)), 0.0);
  if (!(rate > 0) || !std::isfinite(rate)) return t;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::exponential_distribution<double> gap(rate);
  double at = 0;
  for (auto& x : t) {
    x = at;
    at += gap(rng);
  }
  return t;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double idx = p / 100.0 * double(v.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(idx)), hi = static_cast<size_t>(std::ceil(idx));
  return v[lo] + (v[hi] - v[lo]) * (idx - double(lo));
}

bool parse_spec_counters(const std::string& text, int64_t* verify_steps, int64_t* accepted_tokens) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("spec_verify_steps_total") || !j.contains("spec_accepted_tokens_total") ||
      !j["spec_verify_steps_total"].is_number_integer() || !j["spec_accepted_tokens_total"].is_number_integer())
    return false;
  *verify_steps = j["spec_verify_steps_total"].get<int64_t>();
  *accepted_tokens = j["spec_accepted_tokens_total"].get<int64_t>();
  return true;
}

void parse_server_info(const std::string& text, int64_t* launch_id, double* accept_length) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return;
  double id = 0;
  find_number(j, {"launch_id"}, &id);
  *launch_id = static_cast<int64_t>(id);
  double acc = 0;
  find_number(j, {"accept_length", "avg_spec_accept_length", "spec_accept_length", "mean_accept_length"}, &acc);
  *accept_length = acc;
}

Result<std::vector<BenchPrompt>> load_bench_dataset(const std::string& path, int64_t default_output_len) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error("cannot read dataset ", path);
  std::ostringstream os;
  os << in.rdbuf();
  const std::string text = os.str();
  std::vector<nlohmann::json> items;
  auto whole = nlohmann::json::parse(text, nullptr, false);
  if (whole.is_array()) {
    for (auto& x : whole) items.push_back(x);
  } else {
    std::stringstream ss(text);
    std::string line;
    int n = 0;
    while (std::getline(ss, line)) {
      ++n;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) return error(path, ":", n, ": not JSON (expected JSON lines or a JSON array)");
      items.push_back(j);
    }
  }
  std::vector<BenchPrompt> out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const nlohmann::json& x = items[i];
    BenchPrompt p;
    p.max_tokens = default_output_len;
    if (!x.is_object()) continue;
    if (x.contains("prompt") && x["prompt"].is_string()) {
      p.text = x["prompt"].get<std::string>();
    } else if (x.contains("conversations") && x["conversations"].is_array()) {  // ShareGPT
      for (auto& turn : x["conversations"]) {
        if (!turn.is_object()) continue;
        // (A number here threw out of the command: type_error.302.)
        if ((turn.contains("from") && !turn["from"].is_string()) || (turn.contains("value") && !turn["value"].is_string()))
          return error(path, ": record ", i + 1, ": a conversation turn's \"from\" and \"value\" must be strings");
        if (turn.value("from", "") == "human" && turn.contains("value")) {
          p.text = turn["value"].get<std::string>();
          break;
        }
      }
    }
    for (const char* k : {"output_len", "max_tokens"})
      if (x.contains(k) && x[k].is_number_integer()) p.max_tokens = x[k].get<int64_t>();
    if (!p.text.empty()) out.push_back(std::move(p));
  }
  if (out.empty()) return error(path, ": no prompts found (objects with \"prompt\" or ShareGPT \"conversations\")");
  return out;
}

Result<std::vector<BenchPrompt>> make_bench_prompts(const BenchOptions& opts, int64_t n, int level, int64_t first) {
  std::vector<BenchPrompt> out;
  if (!opts.dataset.empty()) {
    auto ds = load_bench_dataset(opts.dataset, opts.output_len);
    if (!ds) return ds.status();
    for (int64_t i = 0; i < n; ++i) out.push_back((*ds)[static_cast<size_t>(first + i) % ds->size()]);
    return out;
  }
  std::mt19937_64 rng(opts.seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(level));
  const size_t n_words = sizeof kWords / sizeof kWords[0];
  for (int64_t i = 0; i < n; ++i) {
    BenchPrompt p;
    p.max_tokens = opts.output_len;
    for (int64_t w = 0; w < opts.input_len; ++w) {
      if (w) p.text += ' ';
      p.text += kWords[rng() % n_words];
    }
    out.push_back(std::move(p));
  }
  return out;
}

bool tokenize_bench_prompts(const BenchOptions& opts, const std::string& model, std::vector<BenchPrompt>& prompts) {
  if (prompts.empty()) return true;
  nlohmann::json texts = nlohmann::json::array();
  for (const auto& p : prompts) texts.push_back(p.text);
  const nlohmann::json body = {{"model", model}, {"prompt", texts}, {"add_special_tokens", false}};
  auto r = http_request(opts.url, "POST", "/tokenize", dump_lossy(body), nullptr, std::min(60.0, opts.timeout_s));
  if (!r || r->status != 200) return false;
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_array() || j["tokens"].size() != prompts.size())
    return false;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& ids = j["tokens"][i];
    // Every word is a token or more: input_len words give at least input_len ids, cut to that.
    if (!ids.is_array() || static_cast<int64_t>(ids.size()) < opts.input_len) return false;
    prompts[i].ids.clear();
    for (int64_t k = 0; k < opts.input_len; ++k) {
      if (!ids[static_cast<size_t>(k)].is_number_integer()) return false;
      prompts[i].ids.push_back(ids[static_cast<size_t>(k)].get<int64_t>());
    }
  }
  return true;
}

RequestResult run_completion(const BenchOptions& opts, const std::string& model, const BenchPrompt& prompt) {
  RequestResult r;
  nlohmann::json body = {{"model", model},
                         {"prompt", prompt.ids.empty() ? nlohmann::json(prompt.text) : nlohmann::json(prompt.ids)},
                         {"max_tokens", prompt.max_tokens},
                         {"temperature", opts.temperature},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}},
                         // Each chunk's token ids: a step whose text is held back (an incomplete
                         // UTF-8 sequence) still arrives, so gaps are per token, not per text.
                         {"return_token_ids", true}};
  if (opts.ignore_eos) body["ignore_eos"] = true;
  const auto t0 = Clock::now();
  double last = -1;
  int64_t chunks = 0;
  std::string server_error;
  SseParser sse([&](const std::string& data) {
    if (data == "[DONE]") return;
    auto j = nlohmann::json::parse(data, nullptr, false);
    if (j.is_discarded()) return;
    if (j.contains("error")) {
      const auto& e = j["error"];
      server_error = e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>()
                                                                                        : dump_lossy(e);
      if (server_error.empty()) server_error = "(empty error)";
      return;
    }
    // Counts are read where they are integers (a server may send null): never a throw on this thread.
    auto count = [](const nlohmann::json& o, const char* key, int64_t fallback) {
      return o.contains(key) && o[key].is_number_integer() ? o[key].get<int64_t>() : fallback;
    };
    if (j.contains("usage") && j["usage"].is_object()) {
      const auto& u = j["usage"];
      r.prompt_tokens = count(u, "prompt_tokens", r.prompt_tokens);
      r.output_tokens = count(u, "completion_tokens", r.output_tokens);
      if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object())
        r.cached_tokens = count(u["prompt_tokens_details"], "cached_tokens", r.cached_tokens);
    }
    // Tokens in this chunk: its token ids when the server sends them, else one per chunk with text.
    int64_t n = 0;
    bool has_ids = false;
    if (j.contains("choices") && j["choices"].is_array())
      for (auto& c : j["choices"]) {
        if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty()) {
          r.text += c["text"].get<std::string>();
          if (!has_ids) n = std::max<int64_t>(n, 1);
        }
        if (c.contains("token_ids") && c["token_ids"].is_array()) {
          if (!has_ids) n = 0;
          has_ids = true;
          n += static_cast<int64_t>(c["token_ids"].size());
        }
      }
    if (n == 0) return;
    const double now = ms_since(t0);
    if (last < 0) {
      r.ttft_ms = now;
    } else {
      // A chunk of n tokens after a gap counts n gaps of gap / n (a speculative step's tokens).
      for (int64_t k = 0; k < n; ++k) r.itl_ms.push_back((now - last) / static_cast<double>(n));
    }
    last = now;
    ++chunks;
    r.streamed_tokens += n;
  });
  std::string error_body;
  int status = 0;
  auto resp = http_request(
      opts.url, "POST", "/v1/completions", dump_lossy(body),
      [&](std::string_view piece) {
        if (status == 0) status = 200;  // callback only runs after headers; status checked below
        sse.feed(piece);
        if (error_body.size() < 2000) error_body.append(piece);
        return true;
      },
      opts.timeout_s);
  r.e2e_ms = ms_since(t0);
  if (!resp) {
    r.error = resp.status().message();
    return r;
  }
  sse.finish();
  if (resp->status != 200) {
    r.error = "HTTP " + std::to_string(resp->status) + ": " + error_body.substr(0, 300);
    return r;
  }
  if (!server_error.empty()) {
    r.error = "server error: " + server_error;
    return r;
  }
  if (r.output_tokens == 0) r.output_tokens = r.streamed_tokens;  // no usage: count streamed tokens
  if (chunks == 0) {
    r.error = "no tokens streamed";
    return r;
  }
  r.ok = true;
  return r;
}

Status flush_prefix_cache(const HttpUrl& url, double timeout_s) {
  auto r = http_request(url, "POST", "/flush_cache", "", nullptr, std::min(30.0, timeout_s));
  if (!r) return r.status();
  if (r->status != 200) return error("POST /flush_cache: HTTP ", r->status);
  return Status::ok();
}

Result<std::string> resolve_bench_model(const HttpUrl& url, const std::string& model, double timeout_s) {
  if (!model.empty()) return model;
  auto models = http_request(url, "GET", "/v1/models", "", nullptr, std::min(30.0, timeout_s));
  if (!models) return models.status();
  auto j = nlohmann::json::parse(models->body, nullptr, false);
  if (models->status != 200 || !j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty())
    return error(url.to_string(), "/v1/models did not list a model (HTTP ", models->status, "); pass --model NAME");
  return j["data"][0].value("id", "");
}

Result<BenchReport> run_bench(const BenchOptions& opts, bool verbose) {
  BenchReport report;
  report.url = opts.url.to_string();
  report.started_at = utc_now_iso();
  DS_ASSIGN_OR_RETURN(report.model, resolve_bench_model(opts.url, opts.model, opts.timeout_s));
  auto info_before = http_request(opts.url, "GET", "/v1/server_info", "", nullptr, std::min(30.0, opts.timeout_s));
  if (info_before && info_before->status == 200) {
    double ignored = 0;
    parse_server_info(info_before->body, &report.launch_id, &ignored);
    auto j = nlohmann::json::parse(info_before->body, nullptr, false);
    if (j.is_object()) {
      if (j.contains("launch_started_at") && j["launch_started_at"].is_string())
        report.launch_started_at = j["launch_started_at"].get<std::string>();
      if (j.contains("launch_db") && j["launch_db"].is_string()) report.launch_db = j["launch_db"].get<std::string>();
    }
  }
  // Synthetic prompts of exactly --input-len tokens where the server tokenizes (words otherwise).
  bool warned_words = false, warned_flush = false;
  auto make_level_prompts = [&](int64_t n, int level, int64_t first) -> Result<std::vector<BenchPrompt>> {
    auto prompts = make_bench_prompts(opts, n, level, first);
    if (!prompts) return prompts.status();
    if (opts.dataset.empty() && !tokenize_bench_prompts(opts, report.model, *prompts) && !warned_words && verbose) {
      warned_words = true;
      std::fprintf(stderr, "the server has no /tokenize: prompts are %lld words each, not tokens\n",
                   static_cast<long long>(opts.input_len));
    }
    return prompts;
  };
  // Untimed requests first (a server's first requests may pay one-off costs).
  if (opts.warmup_requests > 0) {
    auto warm = make_level_prompts(opts.warmup_requests, -1, 0);
    if (!warm) return warm.status();
    for (auto& p : *warm) {
      p.max_tokens = std::min<int64_t>(p.max_tokens, 16);
      RequestResult r = run_completion(opts, report.model, p);
      if (!r.ok && verbose) std::fprintf(stderr, "warm-up request failed: %s\n", r.error.c_str());
    }
  }
  int64_t first_record = 0;
  for (size_t level = 0; level < opts.concurrency.size(); ++level) {
    const int c = opts.concurrency[level];
    const int64_t n = opts.num_prompts > 0 ? opts.num_prompts : std::max<int64_t>(8, 4 * int64_t(c));
    auto prompts = make_level_prompts(n, static_cast<int>(level), first_record);
    if (!prompts) return prompts.status();
    first_record += n;
    if (opts.flush_cache) {
      Status f = flush_prefix_cache(opts.url, opts.timeout_s);
      if (!f && !warned_flush && verbose) {
        warned_flush = true;
        std::fprintf(stderr, "the server did not flush its prefix cache (%s): a level may be served from the prompts "
                             "an earlier one left there (see its cached tokens)\n",
                     f.message().c_str());
      }
    }
    int64_t steps_before = -1, accepted_before = -1;
    {
      auto info = http_request(opts.url, "GET", "/v1/server_info", "", nullptr, std::min(30.0, opts.timeout_s));
      if (!info || info->status != 200 || !parse_spec_counters(info->body, &steps_before, &accepted_before))
        steps_before = accepted_before = -1;
    }
    std::vector<RequestResult> results(static_cast<size_t>(n));
    const std::vector<double> arrival_s = bench_arrivals(n, opts.request_rate, opts.seed);
    std::atomic<int64_t> next{0};
    const auto t0 = Clock::now();
    std::vector<std::thread> workers;
    for (int w = 0; w < c; ++w)
      workers.emplace_back([&] {
        for (int64_t i; (i = next.fetch_add(1)) < n;) {
          // A request is sent at its arrival time, or when a worker frees up after it (at most
          // `c` in flight).
          std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(arrival_s[static_cast<size_t>(i)])));
          results[static_cast<size_t>(i)] = run_completion(opts, report.model, (*prompts)[static_cast<size_t>(i)]);
        }
      });
    for (auto& t : workers) t.join();
    LevelResult L;
    L.concurrency = c;
    L.duration_s = ms_since(t0) / 1000.0;
    std::vector<double> ttft, itl, e2e;
    for (const auto& r : results) {
      if (!r.ok) {
        ++L.n_failed;
        if (L.first_error.empty()) L.first_error = r.error;
        continue;
      }
      ++L.n_requests;
      L.input_tokens += r.prompt_tokens;
      L.cached_tokens += r.cached_tokens;
      L.output_tokens += r.output_tokens;
      ttft.push_back(r.ttft_ms);
      e2e.push_back(r.e2e_ms);
      itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    }
    if (L.duration_s > 0) {
      L.output_tokens_per_s = double(L.output_tokens) / L.duration_s;
      L.request_throughput = double(L.n_requests) / L.duration_s;
    }
    L.ttft_p50 = percentile(ttft, 50), L.ttft_p90 = percentile(ttft, 90), L.ttft_p99 = percentile(ttft, 99);
    L.itl_p50 = percentile(itl, 50), L.itl_p90 = percentile(itl, 90), L.itl_p99 = percentile(itl, 99);
    L.e2e_p50 = percentile(e2e, 50), L.e2e_p90 = percentile(e2e, 90), L.e2e_p99 = percentile(e2e, 99);
    auto info = http_request(opts.url, "GET", "/v1/server_info", "", nullptr, std::min(30.0, opts.timeout_s));
    if (info && info->status == 200) {
      int64_t id = 0;
      parse_server_info(info->body, &id, &L.accept_length);  // the server's average since it started
      if (id > 0) report.launch_id = id;
      // This level's own, from the counters' change (the average includes warm-up and earlier levels).
      int64_t steps = 0, accepted = 0;
      if (steps_before >= 0 && parse_spec_counters(info->body, &steps, &accepted)) {
        L.accept_length = steps > steps_before ? 1.0 + double(accepted - accepted_before) / double(steps - steps_before) : 0;
      }
    }
    if (verbose)
      std::fprintf(stderr, "concurrency %d: %lld ok, %lld failed, %.1f output tok/s%s%s\n", c,
                   static_cast<long long>(L.n_requests), static_cast<long long>(L.n_failed), L.output_tokens_per_s,
                   L.first_error.empty() ? "" : "; first error: ", L.first_error.c_str());
    report.levels.push_back(std::move(L));
  }
  return report;
}

Status check_bench_launch(const BenchReport& report, const LaunchRecord& record, const std::string& db_path) {
  // Two servers started in the same second with their own databases both have a launch #1 at that
  // time: the database the server named must be this one.
  if (!report.launch_db.empty()) {
    std::error_code e1, e2;
    const auto theirs = std::filesystem::weakly_canonical(report.launch_db, e1);
    const auto ours = std::filesystem::weakly_canonical(db_path, e2);
    if (!e1 && !e2 && theirs != ours)
      return error("the server's launch #", report.launch_id, " is recorded in ", report.launch_db, ", not in ", db_path,
                   " (pass the server's --state-dir)");
  }
  // A server from before these fields: the id alone, as before.
  if (report.launch_started_at.empty() || record.started_at == report.launch_started_at) return Status::ok();
  return error("launch #", report.launch_id, " in ", db_path, " started at ", record.started_at,
               ", but the server's launch #", report.launch_id, " started at ", report.launch_started_at,
               report.launch_db.empty() ? std::string() : " and is recorded in " + report.launch_db,
               ": another database (pass the server's --state-dir, or run bench where the server runs)");
}

std::string bench_table(const BenchReport& rep) {
  std::string out = "bench " + rep.url + " model " + rep.model +
                    (rep.launch_id > 0 ? " launch #" + std::to_string(rep.launch_id) : " (launch id not reported)") + "\n";
  char line[512];
  std::snprintf(line, sizeof line, "%5s %6s %5s %8s %7s %10s %8s %9s %9s %9s %9s %9s %9s %7s\n", "conc", "ok", "fail",
                "in/req", "cached", "out tok/s", "req/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "E2E p50",
                "E2E p99", "accept");
  out += line;
  for (const auto& L : rep.levels) {
    const double in_per_req = L.n_requests > 0 ? double(L.input_tokens) / double(L.n_requests) : 0;
    const double cached_pct = L.input_tokens > 0 ? 100.0 * double(L.cached_tokens) / double(L.input_tokens) : 0;
    std::snprintf(line, sizeof line, "%5d %6lld %5lld %8.0f %6.1f%% %10.1f %8.2f %9.1f %9.1f %9.2f %9.2f %9.0f %9.0f %7s\n",
                  L.concurrency, static_cast<long long>(L.n_requests), static_cast<long long>(L.n_failed), in_per_req,
                  cached_pct, L.output_tokens_per_s, L.request_throughput, L.ttft_p50, L.ttft_p99, L.itl_p50, L.itl_p99,
                  L.e2e_p50, L.e2e_p99, L.accept_length > 0 ? fmt(L.accept_length, 2).c_str() : "-");
    out += line;
  }
  out += "(latencies in ms; ITL = time per output token after the first: a chunk's gap over the tokens it carries;\n"
         " in/req = prompt tokens a request, cached = of them served from the prefix cache)\n";
  return out;
}

std::string bench_json(const BenchReport& rep) {
  nlohmann::ordered_json j;
  j["url"] = rep.url;
  j["model"] = rep.model;
  j["started_at"] = rep.started_at;
  j["launch_id"] = rep.launch_id;
  auto levels = nlohmann::ordered_json::array();
  for (const auto& L : rep.levels)
    levels.push_back({{"concurrency", L.concurrency},
                      {"completed", L.n_requests},
                      {"failed", L.n_failed},
                      {"duration_s", L.duration_s},
                      {"input_tokens", L.input_tokens},
                      {"cached_tokens", L.cached_tokens},
                      {"output_tokens", L.output_tokens},
                      {"output_tokens_per_s", L.output_tokens_per_s},
                      {"request_throughput", L.request_throughput},
                      {"ttft_ms", {{"p50", L.ttft_p50}, {"p90", L.ttft_p90}, {"p99", L.ttft_p99}}},
                      {"itl_ms", {{"p50", L.itl_p50}, {"p90", L.itl_p90}, {"p99", L.itl_p99}}},
                      {"e2e_ms", {{"p50", L.e2e_p50}, {"p90", L.e2e_p90}, {"p99", L.e2e_p99}}},
                      {"accept_length", L.accept_length},
                      {"first_error", L.first_error}});
  j["levels"] = levels;
  return dump_lossy(j, 2);
}

namespace {

// One line chart: x = concurrency levels (evenly spaced), y from 0 to the max of the series.
struct Series {
  std::string name, color;
  std::vector<double> y;
};

std::string chart(double ox, double oy, double w, double h, const std::string& title, const std::string& y_label,
                  const std::vector<int>& xs, const std::vector<Series>& series) {
  std::ostringstream s;
  double ymax = 0;
  for (const auto& se : series)
    for (double v : se.y) ymax = std::max(ymax, v);
  if (ymax <= 0) ymax = 1;
  // A round top: 1, 2 or 5 x 10^k above ymax.
  double mag = std::pow(10.0, std::floor(std::log10(ymax)));
  double top = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= ymax) { top = m * mag; break; }
  const double left = ox + 60, right = ox + w - 10, bottom = oy + h - 40, upper = oy + 30;
  auto X = [&](size_t i) { return xs.size() == 1 ? (left + right) / 2 : left + (right - left) * double(i) / double(xs.size() - 1); };
  auto Y = [&](double v) { return bottom - (bottom - upper) * v / top; };
  s << "<text x=\"" << ox + w / 2 << "\" y=\"" << oy + 18 << "\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">"
    << title << "</text>\n";
  s << "<line x1=\"" << left << "\" y1=\"" << bottom << "\" x2=\"" << right << "\" y2=\"" << bottom << "\" stroke=\"#333\"/>\n";
  s << "<line x1=\"" << left << "\" y1=\"" << upper << "\" x2=\"" << left << "\" y2=\"" << bottom << "\" stroke=\"#333\"/>\n";
  for (int t = 0; t <= 4; ++t) {
    double v = top * t / 4;
    s << "<line x1=\"" << left << "\" y1=\"" << Y(v) << "\" x2=\"" << right << "\" y2=\"" << Y(v)
      << "\" stroke=\"#ddd\"/>\n<text x=\"" << left - 6 << "\" y=\"" << Y(v) + 4
      << "\" text-anchor=\"end\" font-size=\"11\">" << fmt(v, v < 10 ? 1 : 0) << "</text>\n";
  }
  for (size_t i = 0; i < xs.size(); ++i)
    s << "<text x=\"" << X(i) << "\" y=\"" << bottom + 16 << "\" text-anchor=\"middle\" font-size=\"11\">" << xs[i]
      << "</text>\n";
  s << "<text x=\"" << (left + right) / 2 << "\" y=\"" << bottom + 32
    << "\" text-anchor=\"middle\" font-size=\"12\">concurrency</text>\n";
  s << "<text x=\"" << ox + 14 << "\" y=\"" << (upper + bottom) / 2 << "\" text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 "
    << ox + 14 << " " << (upper + bottom) / 2 << ")\">" << y_label << "</text>\n";
  double ly = upper + 4;
  for (const auto& se : series) {
    s << "<polyline fill=\"none\" stroke=\"" << se.color << "\" stroke-width=\"2\" points=\"";
    for (size_t i = 0; i < se.y.size(); ++i) s << X(i) << "," << Y(se.y[i]) << " ";
    s << "\"/>\n";
    for (size_t i = 0; i < se.y.size(); ++i)
      s << "<circle cx=\"" << X(i) << "\" cy=\"" << Y(se.y[i]) << "\" r=\"3\" fill=\"" << se.color << "\"><title>"
        << se.name << " at " << xs[i] << ": " << fmt(se.y[i], 2) << "</title></circle>\n";
    s << "<rect x=\"" << left + 10 << "\" y=\"" << ly - 8 << "\" width=\"10\" height=\"10\" fill=\"" << se.color
      << "\"/><text x=\"" << left + 24 << "\" y=\"" << ly + 1 << "\" font-size=\"11\">" << se.name << "</text>\n";
    ly += 14;
  }
  return s.str();
}

std::string xml_escape(const std::string& in) {
  std::string out;
  for (char c : in) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

}  // namespace

std::string bench_svg(const BenchReport& rep) {
  std::vector<int> xs;
  Series tput{"output tok/s", "#1f77b4", {}}, ttft{"TTFT p50", "#d62728", {}}, itl{"ITL p50", "#2ca02c", {}},
      e2e{"E2E p50 / 10", "#9467bd", {}};
  for (const auto& L : rep.levels) {
    xs.push_back(L.concurrency);
    tput.y.push_back(L.output_tokens_per_s);
    ttft.y.push_back(L.ttft_p50);
    itl.y.push_back(L.itl_p50);
    e2e.y.push_back(L.e2e_p50 / 10);
  }
  const double W = 900, H = 360;
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H + 30 << "\" viewBox=\"0 0 " << W
    << " " << H + 30 << "\" font-family=\"sans-serif\">\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"10\" y=\"" << H + 20 << "\" font-size=\"11\" fill=\"#555\">"
    << xml_escape("deltaserve bench " + rep.url + " model " + rep.model + " " + rep.started_at +
                  (rep.launch_id > 0 ? " launch #" + std::to_string(rep.launch_id) : ""))
    << "</text>\n";
  s << chart(0, 0, W / 2, H, "Throughput", "output tokens/s", xs, {tput});
  s << chart(W / 2, 0, W / 2, H, "Latency", "ms", xs, {ttft, itl, e2e});
  s << "</svg>\n";
  return s.str();
}

std::vector<Measurement> bench_measurements(const BenchReport& rep) {
  std::vector<Measurement> out;
  for (const auto& L : rep.levels) {
    if (L.n_failed > 0) continue;  // a level with failed requests measures less than the server does
    Measurement m;
    m.launch_id = rep.launch_id;
    m.source = "bench";
    m.concurrency = L.concurrency;
    m.n_requests = L.n_requests;
    m.output_tokens_per_s = L.output_tokens_per_s;
    m.request_throughput = L.request_throughput;
    m.ttft_p50_ms = L.ttft_p50;
    m.ttft_p99_ms = L.ttft_p99;
    m.itl_p50_ms = L.itl_p50;
    m.itl_p99_ms = L.itl_p99;
    m.e2e_p50_ms = L.e2e_p50;
    m.e2e_p99_ms = L.e2e_p99;
    m.accept_length = L.accept_length;
    nlohmann::json d = {{"url", rep.url}, {"model", rep.model}, {"failed", L.n_failed},
                        {"input_tokens", L.input_tokens}, {"cached_tokens", L.cached_tokens},
                        {"output_tokens", L.output_tokens}, {"duration_s", L.duration_s}};
    m.details_json = dump_lossy(d);
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace deltaserve
