// `deltaserve bench`: HTTP load generator against a running server's /v1/completions.
//   deltaserve bench --url http://127.0.0.1:30000 [--concurrency 1,4,16]
//                    [--input-len N --output-len M | --dataset FILE] [--num-prompts N]
#include <cmath>
#include <cstdio>
#include <fstream>

#include "app/cli_args.h"
#include "app/commands.h"
#include "options/serve_options.h"
#include "deploy/bench.h"
#include "deploy/bench_multiturn.h"
#include "deploy/launch_db.h"

namespace deltaserve {
namespace {

constexpr const char* kUsage =
    "usage: deltaserve bench [--url http://127.0.0.1:30000] [--concurrency 1,4,16]\n"
    "                        [--input-len 256 --output-len 128 | --dataset FILE] [--num-prompts N]\n"
    "                        [--model NAME] [--output bench.json] [--svg bench.svg] [--state-dir DIR]\n"
    "                        [--no-record] [--temperature 0] [--seed 1] [--timeout 600] [--request-rate R|inf]\n"
    "                        [--warmup-requests 1] [--no-flush-cache]\n"
    "Streams /v1/completions at each concurrency (num-prompts per level; default max(8, 4 x level)),\n"
    "requests arriving at once or, with --request-rate, as a Poisson process of R per second (at most\n"
    "`concurrency` in flight); prints output tok/s, requests/s, TTFT, ITL (per output token: a chunk's\n"
    "gap over the token ids it carries) and E2E percentiles and the server's accept length, writes\n"
    "JSON and an SVG plot, and attaches the results to the launch the server reports at\n"
    "/v1/server_info (in the local launch database).\n"
    "Synthetic prompts are --input-len tokens of random words (by the server's /tokenize; words where it\n"
    "has none), different at each level. Before each level the server's prefix cache is flushed\n"
    "(POST /flush_cache; --no-flush-cache keeps it), so that no level or rerun is served from an earlier\n"
    "one's prompts; the table shows what was cached. --warmup-requests untimed requests go first.\n"
    "Dataset: JSON lines or a JSON array of {\"prompt\": ..., \"output_len\": N} or ShareGPT conversations.\n"
    "\n"
    "deltaserve bench --multi-turn [--conversations 4] [--turns 12] [--system-len 6000] [--turn-len 150]\n"
    "                  [--output-len 64] [--dataset conversations.jsonl] [--output multiturn.json] [--url ...]\n"
    "Replays conversations turn by turn, each turn's prompt = the previous prompt + the model's reply + the\n"
    "next user/tool message (a coding agent's pattern), all conversations at once; reports TTFT per turn,\n"
    "the prompt tokens served from the server's prefix cache (hit ratio) and output tok/s. Without a\n"
    "dataset: a generated agent workload (system prompt with tool schemas of --system-len words, then\n"
    "--turn-len words per turn). Dataset: JSON lines of {\"system\": \"...\", \"turns\": [\"...\", ...]}.\n";

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  return static_cast<bool>(out);
}

}  // namespace

int cmd_bench(const Args& args) {
  CliArgs cli({"url", "concurrency", "input-len", "output-len", "dataset", "num-prompts", "model", "output", "svg",
               "state-dir", "temperature", "seed", "timeout", "request-rate", "conversations", "turns", "system-len", "turn-len",
               "warmup-requests"},
              {"no-record", "help", "multi-turn", "no-flush-cache"});
  if (Status s = cli.parse(args); !s) {
    std::fprintf(stderr, "deltaserve bench: %s\n", s.message().c_str());
    return 2;
  }
  if (cli.flag("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  BenchOptions opts;
  auto url = parse_local_http_url(cli.get_or("url", "http://127.0.0.1:30000"));
  if (!url) {
    std::fprintf(stderr, "deltaserve bench: %s\n", url.status().message().c_str());
    return 2;
  }
  opts.url = *url;
  opts.model = cli.get_or("model", "");
  opts.dataset = cli.get_or("dataset", "");
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "deltaserve bench: %s\n", s.message().c_str());
    return 2;
  };
  if (auto c = cli.get("concurrency")) {
    auto v = parse_int_list("concurrency", *c);
    if (!v) return fail(v.status());
    for (int x : *v)
      if (x < 1 || x > 4096) return fail(error("--concurrency values must be 1..4096"));
    opts.concurrency = *v;
  }
  struct IntOpt { const char* name; int64_t* dst; int64_t min; };
  for (IntOpt o : {IntOpt{"input-len", &opts.input_len, 1}, IntOpt{"output-len", &opts.output_len, 1},
                   IntOpt{"num-prompts", &opts.num_prompts, 1}}) {
    if (auto v = cli.get(o.name)) {
      auto n = parse_int(o.name, *v);
      if (!n) return fail(n.status());
      if (*n < o.min) return fail(error("--", o.name, " must be at least ", o.min));
      *o.dst = *n;
    }
  }
  opts.flush_cache = !cli.flag("no-flush-cache");
  if (auto v = cli.get("warmup-requests")) {
    auto n = parse_int("warmup-requests", *v);
    if (!n) return fail(n.status());
    if (*n < 0 || *n > 1000) return fail(error("--warmup-requests must be 0..1000"));
    opts.warmup_requests = static_cast<int>(*n);
  }
  if (auto v = cli.get("temperature")) {
    auto t = parse_double("temperature", *v);
    if (!t) return fail(t.status());
    opts.temperature = *t;
  }
  if (auto v = cli.get("seed")) {
    auto s = parse_int("seed", *v);
    if (!s) return fail(s.status());
    opts.seed = static_cast<uint64_t>(*s);
  }
  if (auto v = cli.get("timeout")) {
    auto t = parse_double("timeout", *v);
    if (!t) return fail(t.status());
    // 0 would mean no socket timeout at all (a hang), a negative one fails every connect.
    if (!(*t >= 0.001) || *t > 86400)
      return fail(error("--timeout must be at least 0.001 and at most 86400 seconds (got ", *v, ")"));
    opts.timeout_s = *t;
  }
  if (auto v = cli.get("request-rate")) {
    if (*v != "inf") {
      auto r = parse_double("request-rate", *v);
      if (!r) return fail(r.status());
      if (!(*r > 0) || !std::isfinite(*r)) return fail(error("--request-rate must be a positive number of requests/s or inf"));
      opts.request_rate = *r;
    }
  }
  if (cli.flag("multi-turn")) {
    MultiTurnOptions mt;
    mt.dataset = opts.dataset;
    if (!cli.has("output-len")) opts.output_len = 64;
    struct MtOpt { const char* name; int64_t min, max; };
    int64_t vals[4] = {mt.conversations, mt.turns, mt.system_words, mt.turn_words};
    const MtOpt mopts[4] = {{"conversations", 1, 1024}, {"turns", 1, 1000}, {"system-len", 0, 10000000}, {"turn-len", 1, 1000000}};
    for (int i = 0; i < 4; ++i)
      if (auto v = cli.get(mopts[i].name)) {
        auto n = parse_int(mopts[i].name, *v);
        if (!n) return fail(n.status());
        if (*n < mopts[i].min || *n > mopts[i].max)
          return fail(error("--", mopts[i].name, " must be ", mopts[i].min, "..", mopts[i].max));
        vals[i] = *n;
      }
    mt.conversations = static_cast<int>(vals[0]);
    mt.turns = static_cast<int>(vals[1]);
    mt.system_words = vals[2];
    mt.turn_words = vals[3];
    // (Multi-turn runs are not recorded against a launch.)
    for (const char* not_here : {"concurrency", "num-prompts", "input-len", "svg", "request-rate", "state-dir", "no-record",
                                 "warmup-requests", "no-flush-cache"})
      if (cli.has(not_here)) return fail(error("--", not_here, " does not apply to --multi-turn"));
    if (!mt.dataset.empty()) {
      for (const char* from_dataset : {"conversations", "turns", "system-len", "turn-len"})
        if (cli.has(from_dataset)) return fail(error("--", from_dataset, " does not apply with --dataset (the dataset gives the conversations)"));
      if (auto ds = make_conversations(opts, mt); !ds) return fail(ds.status());
    }
    auto report = run_multi_turn(opts, mt);
    if (!report) {
      std::fprintf(stderr, "deltaserve bench: %s\n", report.status().message().c_str());
      return 1;
    }
    std::fputs(multi_turn_table(*report).c_str(), stdout);
    if (auto out = cli.get("output")) {
      if (!write_file(*out, multi_turn_json(*report) + "\n")) {
        std::fprintf(stderr, "deltaserve bench: cannot write %s\n", out->c_str());
        return 1;
      }
      std::printf("wrote %s\n", out->c_str());
    }
    return report->first_error.empty() ? 0 : 1;
  }
  for (const char* only_mt : {"conversations", "turns", "system-len", "turn-len"})
    if (cli.has(only_mt)) return fail(error("--", only_mt, " needs --multi-turn"));
  if (!opts.dataset.empty() && cli.has("input-len"))
    return fail(error("--input-len does not apply with --dataset (the dataset gives the prompts)"));
  if (!opts.dataset.empty()) {  // fail early on a bad dataset
    auto ds = load_bench_dataset(opts.dataset, opts.output_len);
    if (!ds) return fail(ds.status());
  }
  auto report = run_bench(opts);
  if (!report) {
    std::fprintf(stderr, "deltaserve bench: %s\n", report.status().message().c_str());
    return 1;
  }
  std::fputs(bench_table(*report).c_str(), stdout);
  const std::string stamp = report->started_at;
  std::string base = "bench-" + stamp.substr(0, 10) + "-" + stamp.substr(11, 2) + stamp.substr(14, 2) + stamp.substr(17, 2);
  const std::string json_path = cli.get_or("output", base + ".json");
  const std::string svg_path = cli.get_or("svg", json_path.size() > 5 && json_path.substr(json_path.size() - 5) == ".json"
                                                     ? json_path.substr(0, json_path.size() - 5) + ".svg"
                                                     : json_path + ".svg");
  // The exit status: 1 when a file could not be written or a level had no successful request
  // (its figures measure nothing); results are still printed and recorded.
  int rc = 0;
  if (!write_file(json_path, bench_json(*report) + "\n")) {
    std::fprintf(stderr, "deltaserve bench: cannot write %s\n", json_path.c_str());
    rc = 1;
  } else {
    std::printf("wrote %s\n", json_path.c_str());
  }
  if (!write_file(svg_path, bench_svg(*report))) {
    std::fprintf(stderr, "deltaserve bench: cannot write %s\n", svg_path.c_str());
    rc = 1;
  } else {
    std::printf("wrote %s\n", svg_path.c_str());
  }
  for (const LevelResult& l : report->levels)
    if (l.n_requests == 0 && l.n_failed > 0) {  // (n_requests counts the successful ones)
      std::fprintf(stderr, "deltaserve bench: every request at concurrency %d failed; first error: %s\n", l.concurrency,
                   l.first_error.c_str());
      rc = 1;
    }

  if (cli.flag("no-record")) return rc;
  if (report->launch_id <= 0) {
    std::printf("not attached to a launch: the server did not report a launch_id at /v1/server_info\n");
    return rc;
  }
  const std::filesystem::path dir = cli.has("state-dir") ? std::filesystem::path(*cli.get("state-dir")) : default_state_dir();
  // An existing database only: a mistyped --state-dir is not created.
  if (!std::filesystem::exists(LaunchDb::file_in(dir))) {
    std::fprintf(stderr, "deltaserve bench: results not attached: no launch database at %s\n",
                 LaunchDb::file_in(dir).c_str());
    return rc;
  }
  auto db = LaunchDb::open(dir);
  if (!db) {
    std::fprintf(stderr, "deltaserve bench: results not attached: %s\n", db.status().message().c_str());
    return rc;
  }
  auto record = (*db)->get(report->launch_id);
  if (!record) {
    std::fprintf(stderr, "deltaserve bench: results not attached: %s (is the server using another --state-dir?)\n",
                 record.status().message().c_str());
    return rc;
  }
  if (Status s = check_bench_launch(*report, *record, (*db)->path().string()); !s) {
    std::fprintf(stderr, "deltaserve bench: results not attached: %s\n", s.message().c_str());
    return rc;
  }
  for (const auto& m : bench_measurements(*report)) {
    if (Status s = (*db)->add_measurement(m); !s) {
      std::fprintf(stderr, "deltaserve bench: results not attached: %s (is the server using another --state-dir?)\n",
                   s.message().c_str());
      return rc;
    }
  }
  std::printf("attached to launch #%lld in %s\n", static_cast<long long>(report->launch_id), (*db)->path().c_str());
  for (const LevelResult& l : report->levels)
    if (l.n_failed > 0)
      std::printf("not recorded: concurrency %d (%lld of its requests failed)\n", l.concurrency,
                  static_cast<long long>(l.n_failed));
  return rc;
}

}  // namespace deltaserve
