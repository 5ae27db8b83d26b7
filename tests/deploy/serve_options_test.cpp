// The serve flag table: argv and TOML parsing, defaults, validation messages, rendering.
#include "options/serve_options.h"
#include "deploy/plan_input.h"
#include "util/log.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

namespace deltaserve {
namespace {

using Args = std::vector<std::string>;

std::map<std::string, std::string> as_map(const ServeOptions& o) {
  std::map<std::string, std::string> m;
  for (auto& [k, v] : effective_config(o)) m[k] = v;
  return m;
}

TEST(ServeOptions, DefaultsComeFromTheTable) {
  ServeOptions o;
  EXPECT_EQ(o.port, 30000);
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_EQ(o.tp_size, 1);
  EXPECT_EQ(o.max_request_bytes, 32 << 20);
  EXPECT_EQ(o.mem_fraction_static, 0.0);  // auto
  EXPECT_DOUBLE_EQ(o.mamba_full_memory_ratio, 0.9);
  EXPECT_EQ(o.load_format, "auto");
  EXPECT_EQ(o.device, "auto");
  EXPECT_FALSE(o.speculative_enabled());
  EXPECT_TRUE(o.explicit_keys.empty());
  auto m = as_map(o);
  EXPECT_EQ(m["mem-fraction-static"], "auto");
  EXPECT_EQ(m["max-request-bytes"], "32MiB");
  EXPECT_EQ(m["context-length"], "auto");
  EXPECT_FALSE(m["state-dir"].empty());  // resolved default path
  // Every table row is rendered (except --help).
  EXPECT_EQ(effective_config(o).size(), serve_flag_specs().size() - 1);
}

// Stop 54: without HOME the launch database went to a folder of the working directory, so serve
// and history run from two places named two databases; a relative XDG_STATE_HOME is ignored (the
// XDG spec). The folder is always absolute.
TEST(ServeOptions, DefaultStateDirIsAbsolute) {
  const char* home = std::getenv("HOME");
  const char* xdg = std::getenv("XDG_STATE_HOME");
  const std::string saved_home = home ? home : "", saved_xdg = xdg ? xdg : "";
  ::setenv("XDG_STATE_HOME", "relative/state", 1);
  ::setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(default_state_dir(), std::filesystem::path("/home/someone/.local/state/deltaserve"));
  ::setenv("XDG_STATE_HOME", "/var/xdg", 1);
  EXPECT_EQ(default_state_dir(), std::filesystem::path("/var/xdg/deltaserve"));
  ::unsetenv("XDG_STATE_HOME");
  ::unsetenv("HOME");
  EXPECT_TRUE(default_state_dir().is_absolute()) << default_state_dir();
  if (home) ::setenv("HOME", saved_home.c_str(), 1);
  if (xdg) ::setenv("XDG_STATE_HOME", saved_xdg.c_str(), 1);
}

TEST(ServeOptions, ParsesSpaceEqualsAndBooleans) {
  auto r = parse_serve_options({"--model-path", "/m", "--port=8080", "--tp", "2",
                                "--mem-fraction-static", "0.88", "--trust-remote-code",
                                "--disable-radix-cache=false", "--max-memory", "64GiB"});
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->model_path, "/m");
  EXPECT_EQ(r->port, 8080);
  EXPECT_EQ(r->tp_size, 2);
  EXPECT_DOUBLE_EQ(r->mem_fraction_static, 0.88);
  EXPECT_TRUE(r->trust_remote_code);
  EXPECT_FALSE(r->disable_radix_cache);
  EXPECT_EQ(r->max_memory, int64_t(64) << 30);
  EXPECT_TRUE(r->is_explicit("tp-size"));
  EXPECT_TRUE(r->is_explicit("disable-radix-cache"));
  EXPECT_FALSE(r->is_explicit("host"));
}

TEST(ServeOptions, AliasesAndPositionalModel) {
  auto r = parse_serve_options({"Qwen/Qwen3.6-27B", "--tensor-parallel-size", "2",
                                "--speculative-algorithm", "mtp"});
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->model_path, "Qwen/Qwen3.6-27B");
  EXPECT_EQ(r->tp_size, 2);
  EXPECT_EQ(r->speculative_algorithm, "NEXTN");
  EXPECT_EQ(r->speculative_num_steps, 3);
  EXPECT_EQ(r->speculative_eagle_topk, 1);
  EXPECT_EQ(r->speculative_num_draft_tokens, 4);
  auto m = parse_serve_options({"--model", "/x", "--speculative-algorithm", "EAGLE",
                                "--speculative-num-steps", "1"});
  ASSERT_TRUE(m) << m.status().message();
  EXPECT_EQ(m->model_path, "/x");
  EXPECT_EQ(m->speculative_num_draft_tokens, 2);
}

TEST(ServeOptions, UnknownFlagIsNamed) {
  auto r = parse_serve_options({"--model-path", "/m", "--enable-turbo", "1"});
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("--enable-turbo"), std::string::npos);
  auto r2 = parse_serve_options({"--port"});
  ASSERT_FALSE(r2);
  EXPECT_NE(r2.status().message().find("needs a value"), std::string::npos);
  auto r3 = parse_serve_options({"--port", "eighty"});
  ASSERT_FALSE(r3);
  EXPECT_NE(r3.status().message().find("--port"), std::string::npos);
  auto r4 = parse_serve_options({"--device", "tpu"});
  ASSERT_FALSE(r4);
  EXPECT_NE(r4.status().message().find("auto,cpu,cuda"), std::string::npos);
  auto r5 = parse_serve_options({"a", "b"});
  EXPECT_FALSE(r5);
}

TEST(ServeOptions, SpeculativeValidationSaysWhatToSet) {
  auto r = parse_serve_options({"--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                                "--speculative-num-draft-tokens", "3"});
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("set --speculative-num-draft-tokens 4"), std::string::npos)
      << r.status().message();

  auto topk = parse_serve_options({"--speculative-algorithm", "NEXTN", "--speculative-eagle-topk", "4"});
  ASSERT_FALSE(topk);
  EXPECT_NE(topk.status().message().find("not supported yet"), std::string::npos);

  auto steps = parse_serve_options({"--speculative-algorithm", "NEXTN", "--speculative-num-steps", "9"});
  ASSERT_FALSE(steps);
  EXPECT_NE(steps.status().message().find("1..8"), std::string::npos);

  // SGLang-style relaunch with only num-steps: the algorithm is inferred (MTP is our only drafter).
  auto only = parse_serve_options({"--speculative-num-steps", "1"});
  ASSERT_TRUE(only) << only.status().message();
  EXPECT_EQ(only->speculative_algorithm, "NEXTN");
  EXPECT_EQ(only->speculative_num_draft_tokens, 2);

  // Only the verified tokens: SGLang's steps + 1, so 3 of them is 2 steps (once refused, "set 4").
  auto draft = parse_serve_options({"--speculative-algorithm", "EAGLE", "--speculative-num-draft-tokens", "3"});
  ASSERT_TRUE(draft) << draft.status().message();
  EXPECT_EQ(draft->speculative_num_steps, 2);
  EXPECT_EQ(draft->speculative_num_draft_tokens, 3);
}

TEST(ServeOptions, OtherValidation) {
  EXPECT_FALSE(parse_serve_options({"--mem-fraction-static", "1.5"}));
  EXPECT_FALSE(parse_serve_options({"--port", "-1"}));
  EXPECT_FALSE(parse_serve_options({"--port", "65536"}));
  auto any_port = parse_serve_options({"--port", "0"});  // any free port (the e2e tests use it)
  ASSERT_TRUE(any_port) << any_port.status().message();
  EXPECT_EQ(any_port->port, 0);
  EXPECT_FALSE(parse_serve_options({"--tp-size", "0"}));
  EXPECT_FALSE(parse_serve_options({"--max-memory", "12 parsecs"}));
  EXPECT_TRUE(parse_serve_options({"--context-length", "auto"}));
  auto bad_threads = parse_serve_options({"--http-threads", "-2"});
  ASSERT_FALSE(bad_threads);
  EXPECT_NE(bad_threads.status().message().find("--http-threads"), std::string::npos);
  auto two = parse_serve_options({"--http-threads", "2"});
  ASSERT_TRUE(two);
  EXPECT_EQ(two->http_threads, 2);
  auto aut = parse_serve_options({"--http-threads", "auto"});
  ASSERT_TRUE(aut);
  EXPECT_EQ(aut->http_threads, 0);
  // SGLang's --stream-interval: 1 by default, 1..1024.
  EXPECT_EQ(parse_serve_options({})->stream_interval, 1);
  EXPECT_EQ(parse_serve_options({"--stream-interval", "8"})->stream_interval, 8);
  auto zero = parse_serve_options({"--stream-interval", "0"});
  ASSERT_FALSE(zero);
  EXPECT_NE(zero.status().message().find("--stream-interval"), std::string::npos);
}

// SGLang's multi-node flags: --nnodes N needs --dist-init-addr, a --node-rank in 0..N-1 and a
// --tp-size that splits evenly over the nodes; each refusal names the flag. One node takes no
// address (given, it must still parse) and warns of nothing.
TEST(ServeOptions, MultiNodeFlagsAreCheckedByName) {
  std::vector<std::string> warnings;
  auto one = parse_serve_options({"--nnodes", "1", "--node-rank", "0"}, &warnings);
  ASSERT_TRUE(one) << one.status().message();
  EXPECT_EQ(one->nnodes, 1);
  EXPECT_TRUE(warnings.empty());
  auto two = parse_serve_options({"--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000",
                                  "--tp-size", "4", "--dist-timeout", "60"}, &warnings);
  ASSERT_TRUE(two) << two.status().message();
  EXPECT_EQ(two->node_rank, 1);
  EXPECT_EQ(two->dist_timeout, 60);
  EXPECT_TRUE(warnings.empty());
  struct Case {
    std::vector<std::string> args;
    const char* names;
  };
  for (const Case& c : {Case{{"--nnodes", "2"}, "--dist-init-addr"},
                        Case{{"--nnodes", "2", "--dist-init-addr", "node0"}, "--dist-init-addr 'node0'"},
                        Case{{"--nnodes", "2", "--dist-init-addr", "n:1", "--node-rank", "2"}, "--node-rank 2"},
                        Case{{"--node-rank", "1"}, "--node-rank 1"},
                        Case{{"--nnodes", "0"}, "--nnodes"},
                        Case{{"--nnodes", "2", "--dist-init-addr", "n:1", "--tp-size", "3"}, "--tp-size 3"},
                        Case{{"--nnodes", "2", "--dist-init-addr", "n:1", "--tp-size", "2", "--dp-size", "2"}, "--dp-size 2"},
                        Case{{"--dist-timeout", "0"}, "--dist-timeout"},
                        Case{{"--dist-init-addr", "127.0.0.1:x"}, "--dist-init-addr"}}) {
    auto r = parse_serve_options(c.args);
    ASSERT_FALSE(r) << c.names;
    EXPECT_NE(r.status().message().find(c.names), std::string::npos) << r.status().message();
  }
}

TEST(ServeOptions, MixedPrefillTokensIsAutoOrPositive) {
  auto a = parse_serve_options({});
  ASSERT_TRUE(a) << a.status().message();
  EXPECT_EQ(a->mixed_prefill_tokens, 0);  // auto
  auto n = parse_serve_options({"--mixed-prefill-tokens", "256"});
  ASSERT_TRUE(n) << n.status().message();
  EXPECT_EQ(n->mixed_prefill_tokens, 256);
  auto bad = parse_serve_options({"--mixed-prefill-tokens", "-5"});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("--mixed-prefill-tokens"), std::string::npos) << bad.status().message();
}

// Every flag either works or is refused: no value is accepted and then ignored. What is not built
// is refused by name (--dtype float16, --quantization, a request-log level without the log).
TEST(ServeOptions, ValuesThatAreNotBuiltAreRefusedByName) {
  std::vector<std::string> warnings;
  auto r = parse_serve_options({"--enable-metrics", "--log-requests", "--log-requests-level", "3", "--dtype",
                                "bfloat16", "--dp-size", "2", "--tp-size", "2", "--trust-remote-code"},
                               &warnings);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_TRUE(r->log_requests);
  EXPECT_EQ(r->log_requests_level, 3);
  EXPECT_EQ(r->dtype, "bfloat16");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "accepted for SGLang compatibility, no effect here: --trust-remote-code");
  auto refused = [](std::vector<std::string> args) {
    auto o = parse_serve_options(args);
    return o ? std::string("accepted") : o.status().message();
  };
  EXPECT_EQ(refused({"--dtype", "float16"}).rfind("--dtype float16 is not built", 0), 0u);
  EXPECT_EQ(refused({"--quantization", "fp8"}).rfind("--quantization fp8 is not built", 0), 0u);
  EXPECT_EQ(refused({"--log-requests-level", "1"}).rfind("--log-requests-level sets what --log-requests logs", 0), 0u);
  EXPECT_EQ(refused({"--log-requests", "--log-requests-level", "4"}), "--log-requests-level must be 0..3 (got 4)");
  EXPECT_EQ(refused({"--dtype", "float32"}), "accepted");  // the CPU widens; CUDA refuses it (below)
  EXPECT_EQ(serve_options_help().find("[not yet]"), std::string::npos);
  warnings.clear();
  ASSERT_TRUE(parse_serve_options({"--port", "1234"}, &warnings));
  EXPECT_TRUE(warnings.empty());
}

// IGNORED flags that were given get a start-up line naming each; the help says they do nothing
// and does not mark them as changing speed.
TEST(ServeOptions, IgnoredFlagsAreNamedAtStartUpAndInTheHelp) {
  std::vector<std::string> warnings;
  ASSERT_TRUE(parse_serve_options({"--attention-backend", "bogus", "--enable-torch-compile"}, &warnings));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "accepted for SGLang compatibility, no effect here: --attention-backend, --enable-torch-compile");
  const std::string help = serve_options_help();
  const std::size_t at = help.find("  --attention-backend");
  ASSERT_NE(at, std::string::npos);
  const std::string line = help.substr(at, help.find('\n', at) - at);
  EXPECT_EQ(line.find("(*)"), std::string::npos) << line;
  EXPECT_NE(line.find("[no effect]"), std::string::npos) << line;
  EXPECT_NE(help.find("(also -h)"), std::string::npos);
  EXPECT_EQ(help.find("--h)"), std::string::npos);
}

// SGLang's --chunked-prefill-size -1 (no chunking) is not built: the start-up log says what it is.
TEST(ServeOptions, ChunkedPrefillMinusOneSaysWhatItBecomes) {
  std::vector<std::string> warnings;
  ASSERT_TRUE(parse_serve_options({"--chunked-prefill-size", "-1"}, &warnings));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("--chunked-prefill-size -1"), std::string::npos);
  EXPECT_NE(warnings[0].find("512 on CPU"), std::string::npos);
}

// A boolean flag given a separate word is refused (argparse's store_true does the same), and a
// positional model path with --model-path is refused whichever comes first.
TEST(ServeOptions, BoolFlagWithSeparateValueAndTwoModelPathsAreRefused) {
  auto b = parse_serve_options({"--model-path", "/m", "--disable-radix-cache", "false"});
  ASSERT_FALSE(b);
  EXPECT_EQ(b.status().message(), "--disable-radix-cache takes no separate value (use --disable-radix-cache=false)");
  auto t = parse_serve_options({"--model-path", "/m", "--enable-cors", "TRUE"});
  ASSERT_FALSE(t);
  EXPECT_NE(t.status().message().find("--enable-cors=true"), std::string::npos);
  // A bool flag then the positional model path is still fine.
  auto ok = parse_serve_options({"--disable-radix-cache", "/m"});
  ASSERT_TRUE(ok) << ok.status().message();
  EXPECT_EQ(ok->model_path, "/m");
  for (const Args& args : {Args{"/a", "--model-path", "/m"}, Args{"--model-path", "/m", "/a"}, Args{"--model=/m", "/a"}}) {
    auto r = parse_serve_options(args);
    ASSERT_FALSE(r) << args[0];
    EXPECT_NE(r.status().message().find("--model-path"), std::string::npos) << r.status().message();
  }
}

// Values the engine holds as int are refused above INT32_MAX (never narrowed), and --threads has
// an upper bound; all at parse time, so plan, generate and serve (before its port) agree.
TEST(ServeOptions, LargeValuesAreRefusedNotNarrowed) {
  for (const char* flag : {"--max-prefill-tokens", "--chunked-prefill-size", "--context-length", "--max-running-requests",
                           "--mixed-prefill-tokens", "--cuda-graph-max-bs", "--tp-size", "--dp-size"}) {
    for (const char* v : {"99999999999", "4294967297"}) {
      auto r = parse_serve_options({flag, v});
      ASSERT_FALSE(r) << flag << " " << v;
      EXPECT_NE(r.status().message().find(std::string(flag) + " must be at most 2147483647"), std::string::npos)
          << r.status().message();
    }
  }
  EXPECT_TRUE(parse_serve_options({"--max-prefill-tokens", "2147483647"}));
  EXPECT_TRUE(parse_serve_options({"--threads", "1024"}));
  for (const char* v : {"1025", "99999999999", "4294967297", "-4"}) {
    auto r = parse_serve_options({"--threads", v});
    ASSERT_FALSE(r) << v;
    EXPECT_NE(r.status().message().find("--threads must be 0..1024"), std::string::npos) << r.status().message();
  }
}

// "auto" is the default itself, not a choice: `--speculative-num-steps auto` keeps the start-up
// probe (it used to count as given, and fixed 3 steps). An explicit 0 is refused where 0 stands
// for auto (it read as auto, though the messages say "positive"). --random-seed is SGLang's:
// every integer, 0 included, is a fixed seed; auto (the default) is random.
TEST(ServeOptions, AutoIsTheDefaultAndZeroIsNotAuto) {
  auto a = parse_serve_options({"--speculative-algorithm", "NEXTN", "--speculative-num-steps", "auto"});
  ASSERT_TRUE(a) << a.status().message();
  EXPECT_FALSE(a->is_explicit("speculative-num-steps"));
  EXPECT_EQ(a->speculative_num_steps, 3);
  auto given = parse_serve_options({"--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2"});
  ASSERT_TRUE(given);
  EXPECT_TRUE(given->is_explicit("speculative-num-steps"));
  for (const char* flag : {"--context-length", "--max-running-requests", "--max-total-tokens", "--max-mamba-cache-size",
                           "--chunked-prefill-size", "--max-prefill-tokens", "--mixed-prefill-tokens",
                           "--cuda-graph-max-bs", "--http-threads", "--mem-fraction-static", "--max-memory"}) {
    auto r = parse_serve_options({flag, "0"});
    ASSERT_FALSE(r) << flag;
    EXPECT_NE(r.status().message().find(std::string(flag) + " 0: give a positive value, or auto"), std::string::npos)
        << r.status().message();
    EXPECT_TRUE(parse_serve_options({flag, "auto"})) << flag;
  }
  auto z = parse_serve_options({"--speculative-algorithm", "NEXTN", "--speculative-num-steps", "0"});
  ASSERT_FALSE(z);
  EXPECT_NE(z.status().message().find("--speculative-num-steps 0"), std::string::npos) << z.status().message();
  // --random-seed 0 is a seed, and renders as one (a TOML dump replays it).
  auto seed0 = parse_serve_options({"--random-seed", "0"});
  ASSERT_TRUE(seed0) << seed0.status().message();
  EXPECT_TRUE(seed0->is_explicit("random-seed"));
  EXPECT_EQ(as_map(*seed0)["random-seed"], "0");
  auto unseeded = parse_serve_options({});
  ASSERT_TRUE(unseeded);
  EXPECT_FALSE(unseeded->is_explicit("random-seed"));
  EXPECT_EQ(as_map(*unseeded)["random-seed"], "auto");
  // Other limits the help states.
  auto origins = parse_serve_options({"--allowed-origins", " , "});
  ASSERT_FALSE(origins);
  EXPECT_NE(origins.status().message().find("--allowed-origins names no origin"), std::string::npos);
  auto dog = parse_serve_options({"--watchdog-timeout", "1e300"});
  ASSERT_FALSE(dog);
  EXPECT_NE(dog.status().message().find("--watchdog-timeout must be 0..604800"), std::string::npos);
}

TEST(ServeOptions, ReasoningParserListsEveryAcceptedValue) {
  for (const char* v : {"qwen3", "qwen3-thinking", "deepseek-r1"}) EXPECT_TRUE(parse_serve_options({"--reasoning-parser", v})) << v;
  auto r = parse_serve_options({"--reasoning-parser", "bogus"});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().message(), "--reasoning-parser: 'bogus' is not one of qwen3,qwen3-thinking,deepseek-r1");
}

// generate / bench-offline refuse what only the HTTP server reads; the CPU refuses GPU-only
// settings and GPUs --max-memory (plan and serve share check_device_flags).
TEST(ServeOptions, ServeOnlyAndDeviceOnlyFlagsAreNamed) {
  auto o = parse_serve_options({"--port", "5", "--api-key", "k", "--chat-template", "/t", "--tokenizer-path", "/x"});
  ASSERT_TRUE(o);
  EXPECT_EQ(explicit_serve_only_flags(*o), (std::vector<std::string>{"--chat-template", "--port", "--api-key"}));
  auto g = parse_serve_options({"--cuda-graph-max-bs", "4", "--mem-fraction-static", "0.5", "--sampling-backend", "device"});
  ASSERT_TRUE(g);
  Status cpu = check_device_flags(*g, PlanDevice::Cpu);
  ASSERT_FALSE(cpu);
  EXPECT_EQ(cpu.message(), "--mem-fraction-static, --cuda-graph-max-bs, --sampling-backend device apply to GPUs "
                           "(--device cuda); this run is on the CPU: remove them");
  EXPECT_TRUE(check_device_flags(*g, PlanDevice::Cuda));
  auto m = parse_serve_options({"--max-memory", "1GiB"});
  ASSERT_TRUE(m);
  EXPECT_TRUE(check_device_flags(*m, PlanDevice::Cpu));
  EXPECT_FALSE(check_device_flags(*m, PlanDevice::Cuda));
  EXPECT_TRUE(check_device_flags(ServeOptions(), PlanDevice::Cpu));
  // SGLang's batch-invariant mode: what the CPU's kernels are (tests/model/batch_invariance_test.cpp);
  // the GPU's are not, so CUDA refuses it rather than ignore it.
  auto d = parse_serve_options({"--enable-deterministic-inference"});
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->enable_deterministic_inference);
  EXPECT_TRUE(check_device_flags(*d, PlanDevice::Cpu));
  Status cuda = check_device_flags(*d, PlanDevice::Cuda);
  ASSERT_FALSE(cuda);
  EXPECT_EQ(cuda.message().rfind("--enable-deterministic-inference: the CUDA kernels are not batch invariant", 0), 0u)
      << cuda.message();
  // --dtype float32: the CPU's matmuls take f32 weights, the CUDA ones bf16.
  auto f = parse_serve_options({"--dtype", "float32"});
  ASSERT_TRUE(f);
  EXPECT_TRUE(check_device_flags(*f, PlanDevice::Cpu));
  Status f32_cuda = check_device_flags(*f, PlanDevice::Cuda);
  ASSERT_FALSE(f32_cuda);
  EXPECT_EQ(f32_cuda.message().rfind("--dtype float32: the CUDA matmuls read bfloat16 weights", 0), 0u);
}

// --log-level: every name the table allows sets the process's level (serve, generate and
// bench-offline apply it; generate and bench-offline once accepted it and ignored it); the table
// refuses other names.
TEST(ServeOptions, EveryLogLevelTheTableAllowsSetsTheLevel) {
  const std::pair<const char*, LogLevel> names[] = {
      {"debug", LogLevel::Debug}, {"info", LogLevel::Info}, {"warning", LogLevel::Warn}, {"error", LogLevel::Error}};
  for (const auto& [name, level] : names) {
    auto o = parse_serve_options(Args{"--log-level", name});
    ASSERT_TRUE(o.is_ok()) << name;
    EXPECT_TRUE(set_log_level(o->log_level)) << name;
    EXPECT_EQ(log_level(), level) << name;
  }
  EXPECT_FALSE(set_log_level("verbose"));
  EXPECT_EQ(log_level(), LogLevel::Error);  // unchanged
  EXPECT_FALSE(parse_serve_options(Args{"--log-level", "verbose"}).is_ok());
  set_log_level(LogLevel::Info);
}

TEST(ServeOptions, TableIsWellFormed) {
  std::set<std::string> names;
  for (const auto& s : serve_flag_specs()) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name;
    EXPECT_NE(std::string(s.help), "") << s.name;
    EXPECT_EQ(find_serve_flag(s.name), &s);
    EXPECT_EQ(find_serve_flag(std::string("--") + s.name), &s);
  }
  EXPECT_EQ(find_serve_flag("mem_fraction_static"), find_serve_flag("mem-fraction-static"));
  EXPECT_EQ(find_serve_flag("nope"), nullptr);
  // SGLang names the brief lists are all present.
  for (const char* n :
       {"model-path", "model", "port", "host", "tp-size", "tensor-parallel-size", "mem-fraction-static",
        "context-length", "max-running-requests", "mamba-full-memory-ratio", "mamba-scheduler-strategy",
        "reasoning-parser", "tool-call-parser", "speculative-algorithm", "speculative-num-steps",
        "speculative-eagle-topk", "speculative-num-draft-tokens", "served-model-name", "api-key",
        "chunked-prefill-size", "max-prefill-tokens", "max-request-bytes", "device", "load-format",
        "threads", "max-memory", "state-dir", "config", "log-level", "chat-template",
        "trust-remote-code", "dtype", "kv-cache-dtype", "mamba-ssm-dtype", "enable-metrics", "disable-cuda-graph",
        "cuda-graph-max-bs", "attention-backend", "sampling-backend"})
    EXPECT_NE(find_serve_flag(n), nullptr) << n;
  std::string help = serve_options_help();
  EXPECT_NE(help.find("--mem-fraction-static"), std::string::npos);
  EXPECT_NE(help.find("[no effect]"), std::string::npos);
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ds-serve-opts-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path write(const std::string& name, const std::string& text) {
    auto p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }
  std::filesystem::path dir_;
};

using ServeOptionsToml = TempDir;

TEST_F(ServeOptionsToml, ConfigFileThenCommandLineWins) {
  auto file = write("serve.toml",
                    "model_path = \"/models/qwen3.6-27b\"\n"
                    "tp-size = 2\n"
                    "mem_fraction_static = 0.88\n"
                    "speculative_algorithm = \"NEXTN\"\n"
                    "speculative_num_steps = 3\n"
                    "trust_remote_code = true\n"
                    "max_request_bytes = \"64MiB\"\n");
  auto r = parse_serve_options({"--config", file.string(), "--speculative-num-steps", "2"});
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->model_path, "/models/qwen3.6-27b");
  EXPECT_EQ(r->tp_size, 2);
  EXPECT_DOUBLE_EQ(r->mem_fraction_static, 0.88);
  EXPECT_EQ(r->speculative_num_steps, 2);  // command line wins
  EXPECT_EQ(r->speculative_num_draft_tokens, 3);
  EXPECT_TRUE(r->trust_remote_code);
  EXPECT_EQ(r->max_request_bytes, 64 << 20);
  EXPECT_EQ(r->config, file.string());
}

TEST_F(ServeOptionsToml, RoundTripThroughToml) {
  auto a = parse_serve_options({"--model-path", "/m", "--port", "31000", "--max-memory", "48GiB",
                                "--disable-radix-cache", "--context-length", "131072"});
  ASSERT_TRUE(a) << a.status().message();
  auto file = write("rt.toml", serve_options_to_toml(*a));
  auto b = parse_serve_options({"--config", file.string()});
  ASSERT_TRUE(b) << b.status().message();
  auto ma = as_map(*a), mb = as_map(*b);
  ma.erase("config");
  mb.erase("config");
  for (auto& [k, v] : ma) EXPECT_EQ(v, mb[k]) << k;
  // The full dump parses back too.
  auto full = write("all.toml", serve_options_to_toml(*a, /*all=*/true));
  auto c = parse_serve_options({"--config", full.string()});
  ASSERT_TRUE(c) << c.status().message();
  auto mc = as_map(*c);
  mc.erase("config");
  for (auto& [k, v] : ma) EXPECT_EQ(v, mc[k]) << k;
}

TEST_F(ServeOptionsToml, BadFilesGiveClearErrors) {
  auto missing = parse_serve_options({"--config", (dir_ / "nope.toml").string()});
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("cannot read config file"), std::string::npos);

  auto bad = write("bad.toml", "port = = 3\n");
  auto r = parse_serve_options({"--config", bad.string()});
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("not valid TOML"), std::string::npos);

  auto unknown = write("unknown.toml", "warp_drive = true\n");
  auto u = parse_serve_options({"--config", unknown.string()});
  ASSERT_FALSE(u);
  EXPECT_NE(u.status().message().find("warp_drive"), std::string::npos);

  auto typed = write("typed.toml", "port = \"abc\"\n");
  auto t = parse_serve_options({"--config", typed.string()});
  ASSERT_FALSE(t);
  EXPECT_NE(t.status().message().find("--port"), std::string::npos);

  // Two keys for one setting (aliases, or the top level and [serve]) are refused, naming both; the
  // winner would otherwise be the table's hash order.
  for (const char* text : {"tp = 2\ntp_size = 4\n", "context_length = 4096\ncontext-length = 8192\n",
                           "tp_size = 2\n[serve]\ntensor_parallel_size = 4\n"}) {
    auto twice = write("twice.toml", text);
    auto d = parse_serve_options({"--config", twice.string()});
    ASSERT_FALSE(d) << text;
    EXPECT_NE(d.status().message().find("keep one"), std::string::npos) << d.status().message();
  }
}

// --config is matched as every other flag is (dashes, case, '_'); `help` is refused in a file.
TEST_F(ServeOptionsToml, ConfigIsMatchedInEverySpellingAndHelpIsRefusedInAFile) {
  auto file = write("c.toml", "port = 31609\ncontext_length = 1234\n");
  for (const Args& args : {Args{"--CONFIG", file.string()}, Args{"-config", file.string()},
                           Args{"--Config=" + file.string()}, Args{"---config", file.string()}}) {
    auto r = parse_serve_options(args);
    ASSERT_TRUE(r) << args[0] << ": " << r.status().message();
    EXPECT_EQ(r->port, 31609) << args[0];
    EXPECT_EQ(r->context_length, 1234) << args[0];
    EXPECT_EQ(r->config, file.string());
  }
  auto help = write("help.toml", "help = true\n");
  auto h = parse_serve_options({"--config", help.string()});
  ASSERT_FALSE(h);
  EXPECT_NE(h.status().message().find("'help' cannot be set inside a config file"), std::string::npos);
}

TEST(ByteSize, ParseAndFormat) {
  EXPECT_EQ(*parse_byte_size("x", "4096"), 4096);
  EXPECT_EQ(*parse_byte_size("x", "512MiB"), int64_t(512) << 20);
  EXPECT_EQ(*parse_byte_size("x", "48GiB"), int64_t(48) << 30);
  EXPECT_EQ(*parse_byte_size("x", "1.5GB"), int64_t(1500000000));
  EXPECT_EQ(*parse_byte_size("x", "auto"), 0);
  EXPECT_FALSE(parse_byte_size("x", "-3GiB"));
  EXPECT_FALSE(parse_byte_size("x", "GiB"));
  EXPECT_EQ(format_byte_size(int64_t(32) << 20), "32MiB");
  EXPECT_EQ(format_byte_size(1000), "1000B");
  EXPECT_EQ(format_byte_size(1500000000), "1500000000B");
}

// Sizes and decimals are written exactly (systemd-unit, TOML, launch records, config diff): a
// size no binary unit divides stays bytes (1000000 was "976.56KiB", 999,997 bytes read back), a
// decimal keeps every digit it was given (0.8812345 was "0.881235").
TEST(ServeOptions, SizesAndDecimalsAreWrittenExactly) {
  auto o = parse_serve_options({"--max-request-bytes", "1000000", "--mem-fraction-static", "0.8812345",
                                "--max-memory", "1.5GB", "--shutdown-timeout", "0.1"});
  ASSERT_TRUE(o) << o.status().message();
  EXPECT_EQ(serve_option_text(*o, "max-request-bytes"), "1000000B");
  EXPECT_EQ(serve_option_text(*o, "mem-fraction-static"), "0.8812345");
  EXPECT_EQ(serve_option_text(*o, "max-memory"), "1500000000B");
  EXPECT_EQ(serve_option_text(*o, "shutdown-timeout"), "0.1");
  EXPECT_EQ(format_byte_size(int64_t(3) << 30), "3GiB");  // a unit that divides is still used
  // What is written reads back as the same values.
  auto back = parse_serve_options(explicit_args(*o));
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->max_request_bytes, 1000000);
  EXPECT_EQ(back->mem_fraction_static, 0.8812345);
  EXPECT_EQ(back->max_memory, 1500000000);
  EXPECT_EQ(back->shutdown_timeout, 0.1);
  auto other = parse_serve_options({"--max-request-bytes", "999999"});
  ASSERT_TRUE(other);
  EXPECT_NE(serve_option_text(*other, "max-request-bytes"), serve_option_text(*o, "max-request-bytes"));
}

// Speculative decoding with neither count given leaves the draft steps to the start-up probe (it
// may turn MTP off): they show as auto, not as the 3 the probe starts from, and a full TOML dump
// read back leaves them to the probe still.
TEST(ServeOptions, SpeculativeStepsLeftToTheProbeShowAsAuto) {
  auto probe = parse_serve_options({"--speculative-algorithm", "NEXTN"});
  ASSERT_TRUE(probe) << probe.status().message();
  EXPECT_EQ(probe->speculative_num_steps, 3);  // where the probe starts
  EXPECT_EQ(serve_option_text(*probe, "speculative-num-steps"), "auto");
  EXPECT_EQ(serve_option_text(*probe, "speculative-num-draft-tokens"), "auto");
  auto given = parse_serve_options({"--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"});
  ASSERT_TRUE(given);
  EXPECT_EQ(serve_option_text(*given, "speculative-num-steps"), "3");
  EXPECT_EQ(serve_option_text(*given, "speculative-num-draft-tokens"), "4");
  auto drafts = parse_serve_options({"--speculative-algorithm", "NEXTN", "--speculative-num-draft-tokens", "3"});
  ASSERT_TRUE(drafts);
  EXPECT_EQ(serve_option_text(*drafts, "speculative-num-steps"), "2");
  auto back = parse_serve_options(Args{"--speculative-algorithm", "NEXTN"});
  ASSERT_TRUE(back);
  ServeOptions reread;
  ASSERT_TRUE(parse_serve_config_toml_text(serve_options_to_toml(*back, /*all=*/true), "all.toml", reread));
  EXPECT_FALSE(reread.is_explicit("speculative-num-steps"));
  EXPECT_FALSE(reread.is_explicit("speculative-num-draft-tokens"));
}

// SGLang's spellings of a value are accepted (checked against SGLang's server_args.py) and stored
// as the one value they mean, so diffs and records never see two spellings of one setting.
TEST(ServeOptions, SglangSpellingsAreStoredAsOneValue) {
  struct Case {
    const char* flag;
    const char* typed;
    const char* stored;
  };
  for (const Case& c : {Case{"--dtype", "float", "float32"}, Case{"--dtype", "half", "float16"},
                        Case{"--dtype", "FLOAT32", "float32"}, Case{"--load-format", "safetensors", "auto"},
                        Case{"--kv-cache-dtype", "bfloat16", "bf16"}, Case{"--sampling-backend", "flashinfer", "auto"},
                        Case{"--sampling-backend", "pytorch", "auto"}, Case{"--log-level", "critical", "error"},
                        Case{"--speculative-algorithm", "EAGLE", "NEXTN"}, Case{"--speculative-algorithm", "mtp", "NEXTN"}}) {
    auto r = parse_serve_args_raw({c.flag, c.typed});
    ASSERT_TRUE(r) << c.flag << " " << c.typed << ": " << r.status().message();
    EXPECT_EQ(serve_option_text(*r, std::string(c.flag).substr(2)), c.stored) << c.flag << " " << c.typed;
  }
  // float is the CPU's float32; half is float16, which is not built (refused by that name).
  auto f = parse_serve_options({"--dtype", "float", "--device", "cpu"});
  ASSERT_TRUE(f) << f.status().message();
  EXPECT_EQ(f->dtype, "float32");
  auto half = parse_serve_options({"--dtype", "half"});
  ASSERT_FALSE(half);
  EXPECT_NE(half.status().message().find("--dtype float16 is not built"), std::string::npos) << half.status().message();
  // --log-level critical sets the quietest level built.
  auto crit = parse_serve_options({"--log-level", "critical"});
  ASSERT_TRUE(crit) << crit.status().message();
  EXPECT_TRUE(set_log_level(crit->log_level));
  EXPECT_EQ(log_level(), LogLevel::Error);
  set_log_level(LogLevel::Info);
  // --nccl-init-addr: SGLang's older name of --dist-init-addr.
  auto nccl = parse_serve_options({"--nnodes", "2", "--tp-size", "2", "--nccl-init-addr", "10.0.0.1:5000"});
  ASSERT_TRUE(nccl) << nccl.status().message();
  EXPECT_EQ(nccl->dist_init_addr, "10.0.0.1:5000");
  // The help lists every spelling; an unknown one is refused with them.
  auto bad = parse_serve_args_raw({"--kv-cache-dtype", "int8"});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.status().message(), "--kv-cache-dtype: 'int8' is not one of auto,bf16,bfloat16,fp8_e4m3,fp8_e5m2");
  EXPECT_NE(serve_options_help().find("{auto,bfloat16,float16,float32,half,float}"), std::string::npos);
}

// --dist-init-addr / --dist-timeout with one node have nothing to join: the start-up warnings
// (and `plan`) name them instead of ignoring them silently.
TEST(ServeOptions, DistFlagsWithOneNodeAreNamedInAWarning) {
  std::vector<std::string> warnings;
  ASSERT_TRUE(parse_serve_options({"--nnodes", "1", "--dist-init-addr", "10.0.0.1:5000", "--dist-timeout", "60"},
                                  &warnings));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "--dist-init-addr, --dist-timeout: no effect with --nnodes 1 (one node has no others to join)");
  warnings.clear();
  ASSERT_TRUE(parse_serve_options({"--dist-init-addr", "10.0.0.1:5000"}, &warnings));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("--dist-init-addr"), std::string::npos);
  warnings.clear();
  ASSERT_TRUE(parse_serve_options({"--nnodes", "2", "--tp-size", "2", "--dist-init-addr", "10.0.0.1:5000",
                                   "--dist-timeout", "60"},
                                  &warnings));
  EXPECT_TRUE(warnings.empty());
}

// SGLang's --config is YAML (server_args_config_parser.py): a flat mapping of flag names to
// scalars or lists, under the command line. It was read as TOML ("not valid TOML").
TEST_F(ServeOptionsToml, YamlConfigIsReadAsSglangWritesIt) {
  auto file = write("serve.yaml",
                    "# SGLang launch settings\n"
                    "---\n"
                    "model-path: /models/qwen3.6-27b   # the checkpoint\n"
                    "tp-size: 2\n"
                    "mem-fraction-static: 0.88\n"
                    "served-model-name: \"qwen # 27b\"\n"
                    "chat-template: 'it''s.jinja'\n"
                    "trust-remote-code: true\n"
                    "disable-radix-cache: false\n"
                    "enable-metrics: yes\n"
                    "speculative_algorithm: NEXTN\n"
                    "speculative-num-steps:\n"
                    "  - 3\n"
                    "context-length: [65536]\n"
                    "attention-backend: []\n"
                    "\n");
  auto r = parse_serve_options({"--config", file.string(), "--speculative-num-steps", "2"});
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->model_path, "/models/qwen3.6-27b");
  EXPECT_EQ(r->tp_size, 2);
  EXPECT_DOUBLE_EQ(r->mem_fraction_static, 0.88);
  EXPECT_EQ(r->served_model_name, "qwen # 27b");
  EXPECT_EQ(r->chat_template, "it's.jinja");
  EXPECT_TRUE(r->trust_remote_code);
  EXPECT_FALSE(r->disable_radix_cache);
  EXPECT_TRUE(r->enable_metrics);
  EXPECT_EQ(r->speculative_algorithm, "NEXTN");
  EXPECT_EQ(r->speculative_num_steps, 2);  // the command line wins
  EXPECT_EQ(r->context_length, 65536);
  EXPECT_FALSE(r->is_explicit("attention-backend"));  // an empty list is skipped, as SGLang does
  EXPECT_EQ(r->config, file.string());
  // .yml too; .toml stays TOML.
  auto yml = write("s.yml", "port: 31001\n");
  auto y = parse_serve_options({"--config", yml.string()});
  ASSERT_TRUE(y) << y.status().message();
  EXPECT_EQ(y->port, 31001);
  auto toml = write("s.toml", "port = 31002\n");
  auto t = parse_serve_options({"--config", toml.string()});
  ASSERT_TRUE(t) << t.status().message();
  EXPECT_EQ(t->port, 31002);
  // Anything nested is refused by line, never misread.
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"serve:\n  port: 3\n", "s.yaml:2: nested settings are not read"},
           {"port: {a: 1}\n", "s.yaml:1: '{a: 1}' is not a plain value"},
           {"tp-size: [1, [2]]\n", "s.yaml:1: nested lists and mappings are not read"},
           {"tp-size:\n  - a: 1\n", "s.yaml:2: a mapping in a list is not read"},
           {"tp-size: [1, 2]\n", "s.yaml:1: 'tp-size' has 2 values; --tp-size takes one"},
           {"port 3\n", "s.yaml:1: expected `flag-name: value`"},
           {"warp-drive: on\n", "unknown setting 'warp-drive'"},
           {"tp: 2\ntp-size: 4\n", "keep one"}}) {
    auto f = write("s.yaml", text);
    auto e = parse_serve_options({"--config", f.string()});
    ASSERT_FALSE(e) << text;
    EXPECT_NE(e.status().message().find(want), std::string::npos) << text << " -> " << e.status().message();
  }
}

}  // namespace
}  // namespace deltaserve
