// deltaserve: one binary, subcommands. This table is the only place that maps a subcommand name to
// its implementation (src/app/cmd_*.cpp).
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "app/commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(const deltaserve::Args&);
  const char* summary;
};

constexpr Command kCommands[] = {
    {"serve", deltaserve::cmd_serve, "OpenAI-compatible HTTP server (SGLang flags)"},
    {"logits", deltaserve::cmd_logits, "write f32 logits (and MTP logits) for a token list"},
    {"generate", deltaserve::cmd_generate, "offline prefill + decode through the engine"},
    {"bench-offline", deltaserve::cmd_bench_offline, "offline decode/prefill throughput"},
    {"plan", deltaserve::cmd_plan, "the memory plan serve would use for these flags, explained"},
    {"history", deltaserve::cmd_history, "recorded serve launches with key settings and best throughput"},
    {"config", deltaserve::cmd_config, "config diff A B / config show A (launch ids, unit files, commands, TOML)"},
    {"bench", deltaserve::cmd_bench, "HTTP load generator against a running server (/v1/completions)"},
    {"systemd-unit", deltaserve::cmd_systemd_unit, "write a systemd unit that runs serve with these flags"},
    {"chat-template", deltaserve::cmd_chat_template, "render a conversation with the model's chat template"},
    {"token-map", deltaserve::cmd_token_map, "a draft vocabulary for --speculative-token-map: a corpus's most frequent tokens"},
    {"tokenize", deltaserve::cmd_tokenize, "encode a text with a model's tokenizer, print {\"ids\": [...]}"},
};

void print_usage() {
  std::printf("usage: deltaserve <command> [options]\n\ncommands:\n");
  for (const auto& c : kCommands) std::printf("  %-16s %s\n", c.name, c.summary);
  std::printf("\nRun `deltaserve <command> --help` for a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::printf("deltaserve %s\n", DELTASERVE_VERSION);
    return 0;
  }
  // Tensor-parallel collectives spin on the GPU waiting for their peers: a kernel loaded lazily on
  // first launch (the CUDA 12 default) would wait for those spinning kernels and never load. Load
  // every kernel when the context starts instead (read once, at the first CUDA call).
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  deltaserve::Args args(argv + 2, argv + argc);
  for (const auto& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    // Bad input is refused by each command with a message; an exception that still escapes is a
    // bug, but it ends with a message and status 1 rather than an abort.
    try {
      return c.run(args);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "deltaserve %s: internal error: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "deltaserve: unknown command '%s' (see `deltaserve --help`)\n", argv[1]);
  return 2;
}
