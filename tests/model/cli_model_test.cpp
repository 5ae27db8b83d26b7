// The command-line forms other tools rely on, run as a user would: `deltaserve logits` against the
// fixtures' reference logits and MTP logits, `deltaserve generate --json` against the reference
// greedy continuation, `deltaserve bench-offline --workload --json`, and clear errors with
// non-zero exits for bad input.
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "fixture.h"
#include "model/generation_config.h"

namespace deltaserve::test {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string out;
};

RunResult run(const std::string& args) {
  RunResult r;
  std::string cmd = std::string(DELTASERVE_BIN) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

TEST(CliLogits, MatchesReferenceLogitsAndMtpLogits) {
  for (const char* tp : {"1", "2"})
  for (const char* dir : {"tests/fixtures/qwen35-tiny", "models/tiny-coder"}) {
    Fixture fx(source_dir() / dir);
    const auto& c = fx.cases()[1];
    const auto out = std::filesystem::temp_directory_path() / ("ds_cli_logits_" + std::to_string(::getpid()) + ".safetensors");
    RunResult r = run(std::string("logits --model ") + (source_dir() / dir).string() + " --tokens " + join(c.tokens) +
                      " --out " + out.string() + " --mtp --threads 2 --tp-size " + tp);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    auto ck = Checkpoint::open_file(out);
    ASSERT_TRUE(ck.is_ok()) << ck.status().message();
    for (const char* name : {"logits", "mtp_logits"}) {
      const TensorEntry* got = ck->find(name);
      const TensorEntry* ref = fx.tensor(c.name + "." + name);
      ASSERT_NE(got, nullptr) << name;
      ASSERT_NE(ref, nullptr) << name;
      ASSERT_EQ(got->shape, ref->shape) << name;
      float maxd = 0;
      for (int64_t i = 0; i < got->numel(); ++i)
        maxd = std::max(maxd, std::fabs(static_cast<const float*>(got->data)[i] - static_cast<const float*>(ref->data)[i]));
      EXPECT_LE(maxd, 2e-3f) << dir << " " << name << " --tp-size " << tp;
    }
    std::filesystem::remove(out);
  }
}

TEST(CliGenerate, JsonGreedyContinuationMatchesReference) {
  Fixture fx(source_dir() / "models/tiny-coder");
  const auto& c = fx.cases()[0];
  std::vector<int32_t> prompt(c.tokens.begin(), c.tokens.begin() + c.prompt_len);
  const int n = static_cast<int>(c.tokens.size()) - c.prompt_len;
  for (const char* spec : {"", " --speculative-algorithm NEXTN --speculative-num-steps 3", " --tp-size 2",
                           " --tp-size 2 --speculative-algorithm NEXTN --speculative-num-steps 3"}) {
    RunResult r = run("generate --prompt-ids " + join(prompt) + " --max-tokens " + std::to_string(n) +
                      " --temperature 0 --ignore-eos --json" + spec);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
    std::vector<int32_t> expect(c.tokens.begin() + c.prompt_len, c.tokens.end());
    EXPECT_EQ(j["token_ids"].get<std::vector<int32_t>>(), expect) << spec;
    EXPECT_EQ(j["prompt_tokens"].get<int>(), c.prompt_len);
    for (const char* k : {"text", "prefill_seconds", "decode_seconds", "decode_tokens_per_second"})
      EXPECT_TRUE(j.contains(k)) << k;
    if (std::string(spec).find("NEXTN") != std::string::npos) {
      EXPECT_GT(j["accept_length"].get<double>(), 1.5);
    }
  }
  // --prompt goes through the tokenizer.
  RunResult r = run("generate --prompt 'def fibonacci(n):\n' --max-tokens 4 --temperature 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
}

// The end ids' order: generation_config.json's first (its first is what a finished grammar ends
// with: Qwen3.6's <|im_end|>), then config.json's, then the tokenizer's; no repeats.
TEST(EndTokenIds, GenerationConfigFirstThenConfigThenTokenizer) {
  GenerationDefaults gen;
  gen.eos_token_ids = {248046, 248044};
  EXPECT_EQ(end_token_ids({248044}, gen, 248046), (std::vector<int32_t>{248046, 248044}));
  EXPECT_EQ(end_token_ids({2}, {}, 7), (std::vector<int32_t>{2, 7}));
  EXPECT_EQ(end_token_ids({}, {}, std::nullopt), std::vector<int32_t>{});
}

// The tokenizer's EOS ends a reply even when neither config.json nor generation_config.json names it
// (a fine-tune that only sets tokenizer_config.json's eos_token): the engine stops on the ids the
// server hides. A copy of tiny-coder whose eos_token is the third token of the reference greedy
// continuation stops there; the model's own EOS ids still stop it as before.
TEST(CliGenerate, StopsOnTheTokenizersEos) {
  const auto src = source_dir() / "models/tiny-coder";
  const auto dir = std::filesystem::temp_directory_path() / ("ds_cli_eos_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const auto& e : std::filesystem::directory_iterator(src)) {
    if (e.path().filename() == "tokenizer_config.json") continue;
    std::filesystem::create_symlink(e.path(), dir / e.path().filename());
  }
  Fixture fx(src);
  const auto& c = fx.cases()[0];
  std::vector<int32_t> prompt(c.tokens.begin(), c.tokens.begin() + c.prompt_len);
  std::vector<int32_t> expect(c.tokens.begin() + c.prompt_len, c.tokens.end());
  ASSERT_GE(expect.size(), 4u);
  const int32_t end = expect[2];
  ASSERT_EQ(std::find(expect.begin(), expect.begin() + 2, end), expect.begin() + 2);  // first seen third
  std::ifstream tj(src / "tokenizer.json");
  const auto vocab = nlohmann::json::parse(tj)["model"]["vocab"];
  std::string end_text;
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    if (it.value().get<int32_t>() == end) end_text = it.key();
  ASSERT_FALSE(end_text.empty());
  std::ifstream tc(src / "tokenizer_config.json");
  auto config = nlohmann::json::parse(tc);
  config["eos_token"] = end_text;
  std::ofstream(dir / "tokenizer_config.json") << config.dump(2);
  RunResult r = run("generate --model-path " + dir.string() + " --prompt-ids " + join(prompt) + " --max-tokens " +
                    std::to_string(expect.size()) + " --temperature 0 --json");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["token_ids"].get<std::vector<int32_t>>(), std::vector<int32_t>(expect.begin(), expect.begin() + 3));
  EXPECT_EQ(j["finish_reason"], "stop");
}

// `deltaserve token-map` counts a corpus's tokens with the model's tokenizer and keeps the most
// frequent (each count checked against `deltaserve tokenize` of the same text); `generate` with the
// map as --speculative-token-map gives the reference continuation, drafts accepted.
TEST(CliTokenMap, BuildsTheCorpusMostFrequentTokensAndGenerateDraftsFromThem) {
  const auto dir = std::filesystem::temp_directory_path() / ("ds_cli_token_map_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "corpus" / "sub");
  const std::string a = "def add(a, b):\n    return a + b\n\n", b = "for i in range(10):\n    print(i)\n";
  std::string text_a, text_b;
  for (int i = 0; i < 5; ++i) text_a += a;
  for (int i = 0; i < 3; ++i) text_b += b;
  text_a += "# end a";  // no trailing newline: the shell's $(cat) below keeps the text as it is
  text_b += "# end b";
  std::ofstream(dir / "corpus" / "a.py") << text_a;
  std::ofstream(dir / "corpus" / "sub" / "b.py") << text_b;
  const std::string model = (source_dir() / "models/tiny-coder").string();
  RunResult r = run("token-map --model " + model + " --corpus " + (dir / "corpus").string() + " --size 6 --out " +
                    (dir / "map.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("wrote 6 tokens"), std::string::npos) << r.out;
  std::ifstream in(dir / "map.json");
  const auto map = nlohmann::json::parse(in).get<std::vector<int32_t>>();
  ASSERT_EQ(map.size(), 6u);
  // The counts from the tokenizer, file by file, as the command reads them.
  std::map<int32_t, int> count;
  for (const std::string* t : {&text_a, &text_b}) {
    RunResult tk = run("tokenize --model " + model + " --no-special --text \"$(cat " + (dir / "corpus").string() +
                       (t == &text_a ? "/a.py" : "/sub/b.py") + ")\"");
    ASSERT_EQ(tk.exit_code, 0) << tk.out;
    for (int32_t id : nlohmann::json::parse(tk.out)["ids"].get<std::vector<int32_t>>()) ++count[id];
  }
  for (std::size_t i = 1; i < map.size(); ++i) EXPECT_GE(count[map[i - 1]], count[map[i]]) << i;
  int outside_max = 0;
  for (auto [id, n] : count)
    if (std::find(map.begin(), map.end(), id) == map.end()) outside_max = std::max(outside_max, n);
  EXPECT_GE(count[map.back()], outside_max);

  Fixture fx(source_dir() / "models/tiny-coder");
  const auto& c = fx.cases()[0];
  std::vector<int32_t> prompt(c.tokens.begin(), c.tokens.begin() + c.prompt_len);
  const int n = static_cast<int>(c.tokens.size()) - c.prompt_len;
  RunResult g = run("generate --prompt-ids " + join(prompt) + " --max-tokens " + std::to_string(n) +
                    " --temperature 0 --ignore-eos --json --speculative-algorithm NEXTN --speculative-num-steps 3" +
                    " --speculative-token-map " + (dir / "map.json").string());
  ASSERT_EQ(g.exit_code, 0) << g.out;
  auto j = nlohmann::json::parse(g.out.substr(g.out.find('{')));
  EXPECT_EQ(j["token_ids"].get<std::vector<int32_t>>(), std::vector<int32_t>(c.tokens.begin() + c.prompt_len, c.tokens.end()));
  EXPECT_GE(j["accept_length"].get<double>(), 1.0);

  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"token-map --model " + model + " --corpus " + (dir / "corpus").string() + " --size 0 --out /tmp/x.json",
            "--size must be a positive integer"},
           {"token-map --model " + model + " --corpus /nonexistent/dir --size 8 --out /tmp/x.json",
            "--corpus /nonexistent/dir: no file to read there"},
           {"token-map --model " + model + " --size 8 --out /tmp/x.json", "are required"}}) {
    RunResult e = run(args);
    EXPECT_NE(e.exit_code, 0) << args;
    EXPECT_NE(e.out.find(needle), std::string::npos) << args << " -> " << e.out;
  }
  std::filesystem::remove_all(dir);
}

// bench-offline --workload: the closed-loop workload's output rate and its requests' time to first
// token. A request's first token cannot come sooner than one prefill of its prompt, which the same
// run measures (half of it, for timing noise on a loaded machine).
TEST(CliBenchOffline, WorkloadReportsTimeToFirstToken) {
  const int prompt_len = 64;
  RunResult r = run("bench-offline --batch 2 --threads 2 --prompt-len " + std::to_string(prompt_len) +
                    " --gen-len 4 --prefill-len " + std::to_string(prompt_len) + " --workload --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_NE(r.out.find("TTFT p50 / p99 ms"), std::string::npos) << r.out;
  auto rows = nlohmann::json::parse(r.out.substr(r.out.find("\n[\n") + 1));
  ASSERT_EQ(rows.size(), 1u) << r.out;
  const auto& row = rows[0];
  EXPECT_GT(row["workload_output_tokens_per_second"].get<double>(), 0.0);
  const double p50 = row["workload_ttft_ms"]["p50"].get<double>(), p99 = row["workload_ttft_ms"]["p99"].get<double>();
  const double prefill_ms = 1e3 * prompt_len / row["prefill_tokens_per_second"].get<double>();
  EXPECT_GE(p50, 0.5 * prefill_ms) << "TTFT below one prompt's prefill time";
  EXPECT_GE(p99, p50);
}

TEST(CliErrors, BadInputGivesOneLineErrorAndNonZeroExit) {
  struct Case { std::string args, needle; };
  const std::vector<Case> cases = {
      {"logits --model /nonexistent/dir --tokens 1,2 --out /tmp/x.safetensors", "/nonexistent/dir"},
      {"logits --model " + (source_dir() / "tests/fixtures/qwen3-tiny").string() + " --tokens 1,abc --out /tmp/x.st", "not an integer"},
      {"logits --model " + (source_dir() / "tests/fixtures/qwen3-tiny").string() + " --tokens 1,99999 --out /tmp/x.st", "out of range"},
      {"logits --model " + (source_dir() / "tests/fixtures/qwen3-tiny").string() + " --tokens 1,2 --out /tmp/x.st --mtp", "no MTP head"},
      {"generate --prompt-ids 1,2 --max-tokens 0", "max-tokens"},
      {"generate --prompt-ids 1,2 --speculative-algorithm NEXTN --speculative-eagle-topk 4", "topk"},
      {"generate --prompt-ids 1,2 --bogus-flag 3", "bogus-flag"},
      {"generate --prompt-ids 1,2 --speculative-token-map /tmp/map.json", "--speculative-token-map is set but speculative decoding is off"},
      {"generate --prompt-ids 1,2 --speculative-algorithm NEXTN --speculative-num-steps 2 --speculative-token-map /nonexistent/map.json",
       "--speculative-token-map /nonexistent/map.json: cannot read the file"},
      {"nonsense-command", "unknown command"},
      {"logits --model " + (source_dir() / "tests/fixtures/qwen35-tiny").string() + " --tokens 1,2 --out /tmp/x.st --tp-size 4",
       "does not divide num_attention_heads (6)"},
      {"generate --model-path " + (source_dir() / "tests/fixtures/qwen35-tiny").string() + " --prompt-ids 1,2 --tp-size 3",
       "num_key_value_heads"},
      {"generate --prompt-ids 1,2 --device cpu --tp-size 2 --disable-custom-all-reduce",
       "--disable-custom-all-reduce applies to GPUs (--device cuda)"},
      // The command-line audit: ranges, flags that do not apply, boolean words, exit statuses.
      {"bench-offline --batch 0 --threads 1 --prompt-len 8 --gen-len 4 --prefill-len 8", "--batch values must be 1..4096"},
      {"bench-offline --batch -1 --threads 1", "--batch values must be 1..4096"},
      {"bench-offline --batch 1 --threads 1 --prompt-len 8 --gen-len -3", "--gen-len must be 1.."},
      {"bench-offline --batch 1 --threads 1 --prompt-len 0", "--prompt-len values must be 1.."},
      {"bench-offline --batch 1 --threads 1 --prefill-len -5", "--prefill-len must be 1.."},
      {"bench-offline --batch 1 --threads 99999", "--threads values must be 0..1024"},
      {"bench-offline --temperature abc", "--temperature: 'abc' is not a finite number"},
      {"bench-offline --top-k -99", "--top-k must be -1 (off) or 1.."},
      {"bench-offline --port 1 --api-key x", "--port, --api-key: only `deltaserve serve`"},
      {"bench-offline --tokenizer-path /nonexistent", "--tokenizer-path: bench-offline sends token ids"},
      {"bench-offline --batch 1 --threads 1 --prompt-len 64 --gen-len 4 --prefill-len 8 --context-length 32",
       "failed:"},
      {"generate --prompt-ids 1,2 --threads 99999999999", "--threads must be 0..1024"},
      {"generate --prompt-ids 1,2 --threads 4294967297", "--threads must be 0..1024"},
      {"generate --prompt-ids 1,2,3 --max-prefill-tokens 99999999999", "--max-prefill-tokens must be at most 2147483647"},
      {"generate --prompt-ids 1,2,3 --chunked-prefill-size 99999999999", "--chunked-prefill-size must be at most"},
      {"generate --prompt-ids 1,2 --top-k 0 --temperature 1", "--top-k must be -1 (off) or 1.."},
      {"generate --prompt-ids 1,2 --top-k -7 --temperature 1", "--top-k must be -1 (off) or 1.."},
      {"generate --prompt-ids 1,2 --host 1.2.3.4 --api-key k --chat-template /x", "--chat-template, --host, --api-key: only"},
      {"generate --prompt-ids 1,2 --reasoning-parser qwen3", "--reasoning-parser: only `deltaserve serve`"},
      {"generate --prompt-ids 1,2 --device cpu --cuda-graph-max-bs 4 --disable-cuda-graph",
       "--cuda-graph-max-bs applies to GPUs"},
      {"generate --prompt-ids 1,2 --device cpu --sampling-backend device --temperature 1", "--sampling-backend device applies"},
      {"generate --prompt hello --tokenizer-path /nonexistent", "--tokenizer-path: "},
      {"generate --prompt-ids 1,2 --disable-radix-cache false", "(use --disable-radix-cache=false)"},
      {"logits --tokens 1,2 --out /tmp/x.st --threads 99999999999", "--threads must be 0..1024"},
      {"logits --tokens 1,2 --out /tmp/x.st --threads -4", "--threads must be 0..1024"},
      {"history --limit abc", "--limit must be 1..1000000"},
      {"history --limit 0", "--limit must be 1..1000000"},
      {"config show 1 --json", "--json is for `config diff`"},
      {"config diff 1 2 --toml", "--toml is for `config show`"},
      {"config diff 1 2 --bogus", "unknown option --bogus"},
      {"config show 99999999999999999999999 --state-dir /tmp/ds-cli-test-none", "is not a launch id"},
      {"plan --tp-size 3 --gpu-memory 48GiB", "--tp-size 3 does not divide"},
      {"plan --gpu-memory 48GiB --device cpu", "--gpu-memory sizes GPUs"},
      {"plan --gpu-memory 80GiB --max-memory 1GiB", "--max-memory is the CPU's memory budget"},
      {"plan --device cpu --mem-fraction-static 0.5", "--mem-fraction-static applies to GPUs"},
      {"plan /nonexistent --model-path /m", "--model-path and a positional model path"},
      {"systemd-unit --model-path /m --tool-call-parser bogus2", "bogus2"},
      {"systemd-unit --model-path /m --reasoning-parser bogus", "qwen3,qwen3-thinking,deepseek-r1"},
      {"systemd-unit --model-path /m --disable-radix-cache false", "(use --disable-radix-cache=false)"},
      // A line break would start another unit line (ExecStartPre=...): refused, naming the flag.
      {"systemd-unit --model-path /m --description \"$(printf 'x\\nExecStartPre=/bin/true')\"",
       "--description: a value with a line break cannot go into a unit file"},
      {"systemd-unit --model-path /m \"--env=A=$(printf 'x\\ny')\"", "--env: a value with a line break"},
      {"bench --timeout 0", "--timeout must be at least 0.001"},
      {"bench --timeout -5", "--timeout must be at least 0.001"},
      {"bench --timeout 0.0000001", "--timeout must be at least 0.001"},  // (below 1 us it meant no timeout: a hang)
      // Stop 54: flags that did nothing in these combinations.
      {"bench --dataset /nonexistent.jsonl --input-len 5000", "--input-len does not apply with --dataset"},
      {"bench --multi-turn --state-dir /tmp/x", "--state-dir does not apply to --multi-turn"},
      {"bench --multi-turn --dataset /nonexistent.jsonl --turns 2", "--turns does not apply with --dataset"},
  };
  for (const auto& c : cases) {
    RunResult r = run(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.exit_code, -1) << c.args << " crashed";
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << " -> " << r.out;
  }
}

// The unit file takes only what the command line would: a line break in a --config file's value
// (it went in unchecked and started an ExecStartPre= line) is refused; a % in the Description is
// written %%; under --user NAME the launch records go to NAME's home, not the writer's, and an
// unknown user needs --state-dir.
TEST(CliSystemdUnit, ConfigValuesPercentsAndTheServiceUsersStateFolder) {
  const auto dir = std::filesystem::temp_directory_path() / ("ds-cli-unit-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto toml = dir / "nl.toml";
  std::ofstream(toml) << "model_path = \"/m\"\nserved_model_name = \"foo\\nExecStartPre=/bin/touch /tmp/x\"\n";
  RunResult nl = run("systemd-unit --config " + toml.string());
  EXPECT_EQ(nl.exit_code, 2) << nl.out;
  EXPECT_NE(nl.out.find("a value with a line break cannot go into a unit file"), std::string::npos) << nl.out;
  EXPECT_EQ(nl.out.find("ExecStartPre"), std::string::npos) << nl.out;
  RunResult pct = run("systemd-unit --model-path /models/a%h");
  ASSERT_EQ(pct.exit_code, 0) << pct.out;
  EXPECT_NE(pct.out.find("Description=deltaserve (/models/a%%h)"), std::string::npos) << pct.out;
  RunResult root = run("systemd-unit --model-path /m --user root");
  ASSERT_EQ(root.exit_code, 0) << root.out;
  EXPECT_NE(root.out.find("--state-dir /root/.local/state/deltaserve"), std::string::npos) << root.out;
  RunResult nobody = run("systemd-unit --model-path /m --user no-such-user-ds");
  EXPECT_EQ(nobody.exit_code, 2) << nobody.out;
  EXPECT_NE(nobody.out.find("pass --state-dir"), std::string::npos) << nobody.out;
  RunResult given = run("systemd-unit --model-path /m --user no-such-user-ds --state-dir /srv/ds");
  EXPECT_EQ(given.exit_code, 0) << given.out;
  std::filesystem::remove_all(dir);
}

// bench-offline refuses serve's flags and data parallelism before it prints its table: a refused
// run leaves no header that reads like the start of results.
TEST(CliErrors, BenchOfflineRefusesBeforeItsTable) {
  for (const char* args : {"bench-offline --batch 1 --prompt-len 8 --gen-len 2 --state-dir /tmp/ds-cli-test-none",
                           "bench-offline --batch 1 --prompt-len 8 --gen-len 2 --dp-size 2"}) {
    RunResult r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << " -> " << r.out;
    EXPECT_NE(r.out.find("deltaserve bench-offline: --"), std::string::npos) << args << " -> " << r.out;
    EXPECT_EQ(r.out.find("prefill context"), std::string::npos) << args << " -> " << r.out;
    EXPECT_EQ(r.out.find("threads  batch"), std::string::npos) << args << " -> " << r.out;
  }
}

// `history` with a state folder that holds no launch database (a typo, another user's HOME) says
// so and creates nothing there.
TEST(CliHistory, MissingStateDirIsReportedNotCreated) {
  const auto dir = std::filesystem::temp_directory_path() / ("ds-cli-history-typo-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  RunResult r = run("history --state-dir " + dir.string());
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("no launches recorded in " + (dir / "launches.sqlite").string()), std::string::npos) << r.out;
  RunResult j = run("history --json --state-dir " + dir.string());
  EXPECT_EQ(j.exit_code, 0) << j.out;
  EXPECT_EQ(j.out, "[]\n");
  EXPECT_FALSE(std::filesystem::exists(dir));
  std::filesystem::remove_all(dir);
}

// SGLang's CPU command lines pass --disable-cuda-graph and --disable-overlap-schedule: what they
// ask for holds on the CPU, so they run (and give the same tokens).
TEST(CliGenerate, DisableFlagsThatHoldOnTheCpuAreAccepted) {
  RunResult plain = run("generate --prompt-ids 8183,755 --max-tokens 4 --temperature 0 --device cpu --json");
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  RunResult with = run("generate --prompt-ids 8183,755 --max-tokens 4 --temperature 0 --device cpu --json "
                       "--disable-cuda-graph --disable-overlap-schedule");
  ASSERT_EQ(with.exit_code, 0) << with.out;
  auto ids = [](const std::string& out) { return nlohmann::json::parse(out.substr(out.find('{')))["token_ids"]; };
  EXPECT_EQ(ids(with.out), ids(plain.out));
}

// -h is --help for every command (exit 0, the usage on stdout).
TEST(CliErrors, DashHIsHelpForEveryCommand) {
  for (const char* cmd : {"generate", "bench-offline", "logits", "history", "config", "bench", "serve", "plan",
                          "systemd-unit"}) {
    RunResult r = run(std::string(cmd) + " -h");
    EXPECT_EQ(r.exit_code, 0) << cmd << " -> " << r.out;
    EXPECT_NE(r.out.find("usage"), std::string::npos) << cmd << " -> " << r.out;
  }
}


// Stop 56: a copy of tiny-coder (files linked) without the files named in `skip`.
std::filesystem::path tiny_coder_copy(const std::string& name, const std::vector<std::string>& skip) {
  const auto src = source_dir() / "models/tiny-coder";
  const auto dir = std::filesystem::temp_directory_path() / ("ds_cli_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const auto& e : std::filesystem::directory_iterator(src))
    if (std::find(skip.begin(), skip.end(), e.path().filename().string()) == skip.end())
      std::filesystem::create_symlink(e.path(), dir / e.path().filename());
  return dir;
}

// Stop 56: a tokenizer.json that failed to load was dropped silently: --prompt then said it "needs a
// tokenizer", --prompt-ids ran without the tokenizer's EOS. Its error is the command's.
TEST(CliGenerate, BrokenTokenizerIsReportedWithItsReason) {
  const auto dir = tiny_coder_copy("broken_tok", {"tokenizer.json"});
  std::ifstream in(source_dir() / "models/tiny-coder/tokenizer.json");
  auto tok = nlohmann::json::parse(in);
  tok["normalizer"] = {{"type", "NFKC"}};
  std::ofstream(dir / "tokenizer.json") << tok.dump();
  for (const char* prompt : {"--prompt hi", "--prompt-ids 1,2"}) {
    RunResult r = run("generate --model-path " + dir.string() + " " + prompt + " --max-tokens 1 --threads 1");
    EXPECT_EQ(r.exit_code, 1) << prompt << ": " << r.out;
    EXPECT_NE(r.out.find("normalizer type 'NFKC' is not supported"), std::string::npos) << prompt << ": " << r.out;
    EXPECT_EQ(r.out.find("needs a tokenizer"), std::string::npos) << r.out;
  }
  // No tokenizer.json at all: --prompt says what it needs.
  std::filesystem::remove(dir / "tokenizer.json");
  RunResult r = run("generate --model-path " + dir.string() + " --prompt hi --max-tokens 1 --threads 1");
  EXPECT_NE(r.out.find("--prompt needs a tokenizer"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

// Stop 56: serve refused to start for a model without a chat template, though /v1/completions needs
// none: it warns and starts (the chat routes refuse per request). Each run is stopped (SIGKILL) once
// its port is open, before the model loads, or when it exits. A chat_template.json (what
// transformers' processors read) is used when it is the only template; a broken one is an error.
TEST(CliServe, StartsWithoutAChatTemplate) {
  const auto dir = tiny_coder_copy("no_template", {"chat_template.jinja"});
  const auto log = dir / "serve.log";
  const auto serve = [&] {
    const std::string cmd = std::string(DELTASERVE_BIN) + " serve --model-path " + dir.string() +
                            " --host 127.0.0.1 --port 0 --threads 1 --max-memory 1GiB > " + log.string() +
                            " 2>&1 & pid=$!; for i in $(seq 250); do grep -q \"open; loading\" " + log.string() +
                            " && break; kill -0 $pid 2>/dev/null || break; sleep 0.02; done; kill -9 $pid 2>/dev/null;"
                            " wait $pid 2>/dev/null; cat " + log.string();
    RunResult r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    pclose(p);
    return r;
  };
  RunResult r = serve();
  EXPECT_NE(r.out.find("has no chat template"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("open; loading the model"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("the model has no chat template"), std::string::npos) << r.out;
  std::ofstream(dir / "chat_template.json") << R"({"chat_template": "{% for m in messages %}"})";
  r = serve();
  EXPECT_NE(r.out.find("chat_template.json"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("open; loading the model"), std::string::npos) << r.out;
  std::ofstream(dir / "chat_template.json", std::ios::trunc)
      << R"({"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})";
  r = serve();
  EXPECT_EQ(r.out.find("chat template"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("open; loading the model"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace deltaserve::test
