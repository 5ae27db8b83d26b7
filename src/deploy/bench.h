// `deltaserve bench`: an HTTP load generator in the spirit of sglang.bench_serving. Streams
// /v1/completions at each concurrency level and reports output tokens/s, request throughput,
// TTFT / ITL / end-to-end percentiles and the server's accept length, as a table, JSON and an SVG
// plot; the results are attached to the launch the server reports at /v1/server_info.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deploy/http_client.h"
#include "deploy/launch_db.h"
#include "util/status.h"

namespace deltaserve {

struct BenchPrompt {
  std::string text;
  int64_t max_tokens = 0;    // output length
  std::vector<int64_t> ids;  // synthetic prompts: exactly --input-len token ids (sent instead of text)
};

struct BenchOptions {
  HttpUrl url;
  std::string model;                   // "" = first id of /v1/models
  std::vector<int> concurrency = {1, 4, 16};
  int64_t num_prompts = 0;             // per level; 0 = max(8, 4 x concurrency)
  int64_t input_len = 256, output_len = 128;
  std::string dataset;                 // JSONL/JSON of {"prompt", "output_len"} or ShareGPT
  bool ignore_eos = true;
  double temperature = 0;
  uint64_t seed = 1;
  double timeout_s = 600;
  double request_rate = 0;             // requests/s, Poisson arrivals (seeded); 0 = all at once
  bool flush_cache = true;             // POST /flush_cache before each level: no level (or rerun) is
                                       // served from the prompts an earlier one left in the prefix cache
  int warmup_requests = 1;             // untimed requests before the first level (SGLang's bench_serving: 1)
};

struct RequestResult {
  bool ok = false;
  std::string error;
  int64_t prompt_tokens = 0, output_tokens = 0;
  int64_t cached_tokens = 0;   // usage.prompt_tokens_details.cached_tokens (prefix cache)
  std::string text;            // the completion (multi-turn replays it)
  double ttft_ms = 0, e2e_ms = 0;
  int64_t streamed_tokens = 0; // tokens the chunks carried (their token ids, else one per text chunk)
  std::vector<double> itl_ms;  // per token after the first chunk: a chunk's gap / its tokens
};

struct LevelResult {
  int concurrency = 0;
  int64_t n_requests = 0, n_failed = 0;
  double duration_s = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  int64_t cached_tokens = 0;  // of input_tokens, served from the prefix cache (usage.prompt_tokens_details)
  double output_tokens_per_s = 0, request_throughput = 0;
  double ttft_p50 = 0, ttft_p90 = 0, ttft_p99 = 0;
  double itl_p50 = 0, itl_p90 = 0, itl_p99 = 0;
  double e2e_p50 = 0, e2e_p90 = 0, e2e_p99 = 0;
  double accept_length = 0;  // this level's, from /v1/server_info's counters (else its average); 0 = not reported
  std::string first_error;
};

struct BenchReport {
  std::string url, model, started_at;
  int64_t launch_id = 0;  // from /v1/server_info
  std::string launch_started_at, launch_db;  // the same: which launch, in which database
  std::vector<LevelResult> levels;
};

// Whether `record` (launch_id in this machine's database at `db_path`) is the launch the server
// reported: ids repeat across databases (another user's, another host's), so the start time must
// agree too. An error says which database the server records in.
Status check_bench_launch(const BenchReport& report, const LaunchRecord& record, const std::string& db_path);

// Prompts for one level: from the dataset (cycled, from record `first`) or synthetic text of
// input_len random words from a generator seeded by (seed, level), so that levels differ.
Result<std::vector<BenchPrompt>> make_bench_prompts(const BenchOptions& opts, int64_t n, int level = 0, int64_t first = 0);
// Synthetic prompts as exactly input_len token ids, by the server's /tokenize (SGLang's random
// dataset counts tokens, not words). False (the prompts stay text) where the server has no /tokenize.
bool tokenize_bench_prompts(const BenchOptions& opts, const std::string& model, std::vector<BenchPrompt>& prompts);
Result<std::vector<BenchPrompt>> load_bench_dataset(const std::string& path, int64_t default_output_len);

// POST /flush_cache (SGLang's route; deltaserve serves it): an error says why the server's prefix
// cache was not emptied (a server without the route, or one with requests running).
Status flush_prefix_cache(const HttpUrl& url, double timeout_s);

// The model to ask for: `model` when given, else the first id the server lists at /v1/models.
Result<std::string> resolve_bench_model(const HttpUrl& url, const std::string& model, double timeout_s);

// One streaming request against /v1/completions.
RequestResult run_completion(const BenchOptions& opts, const std::string& model, const BenchPrompt& prompt);
// The whole benchmark; progress lines go to stderr when verbose.
Result<BenchReport> run_bench(const BenchOptions& opts, bool verbose = true);

// When each of n requests arrives, in seconds from the start: Poisson at `rate` requests/s
// (exponential gaps from `seed`; the first at 0), or all at 0 when rate is 0 (as fast as the
// concurrency allows).
std::vector<double> bench_arrivals(int64_t n, double rate, uint64_t seed);

// p in [0, 100], linear interpolation; 0 for an empty list.
double percentile(std::vector<double> values, double p);

std::string bench_table(const BenchReport& report);
std::string bench_json(const BenchReport& report);
std::string bench_svg(const BenchReport& report);
// One Measurement per level without failed requests, for LaunchDb::add_measurement.
std::vector<Measurement> bench_measurements(const BenchReport& report);

// Looks for the launch id and an accept length in /v1/server_info JSON text.
void parse_server_info(const std::string& json_text, int64_t* launch_id, double* accept_length);
// The speculative counters /v1/server_info carries (spec_verify_steps_total,
// spec_accepted_tokens_total); false when it has none (another server).
bool parse_spec_counters(const std::string& json_text, int64_t* verify_steps, int64_t* accepted_tokens);

}  // namespace deltaserve
