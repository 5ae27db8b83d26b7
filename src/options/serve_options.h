// ServeOptions: the flags of `deltaserve serve`, defined once in the table of serve_options.cpp
// (name, aliases, type, default, help, supported yet, affects speed/memory). Everything that
// reads serve settings (serve, plan, systemd-unit, config diff, launch records) goes through here.
//
// Usage (cmd_serve.cpp):
//
//   std::vector<std::string> warnings;
//   Result<ServeOptions> parsed = parse_serve_options(args, &warnings);  // --config FILE first,
//   if (!parsed) { fprintf(stderr, "%s\n", parsed.status().message().c_str()); return 2; }  // argv wins
//   const ServeOptions& opts = *parsed;          // validated; derived values filled in
//   if (opts.help) { fputs(serve_options_help().c_str(), stdout); return 0; }
//   for (const auto& w : warnings) log_warn(w);  // e.g. "accepted but not supported yet: --log-requests"
//   for (auto& [key, value] : effective_config(opts)) ...   // every setting incl. defaults
//
// Names and meanings follow SGLang's `python -m sglang.launch_server` so a unit file written for
// SGLang runs unchanged. Numeric "auto" settings are stored as 0 and chosen by the memory plan.
#pragma once

#include <cstdint>
#include <filesystem>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace deltaserve {

enum class FlagType : uint8_t {
  String,  // free text (paths, names)
  Choice,  // one of FlagSpec::choices
  Int,     // integer; "auto" = 0 where the default is "auto"
  Float,   // real; "auto" = 0 where the default is "auto"
  Bytes,   // integer bytes with optional suffix: 512MiB, 64GiB, 1.5GB, 4096; "auto" = 0
  Bool,    // `--name`, `--name=true|false`, TOML true/false
};

enum class FlagSupport : uint8_t {
  Yes,      // implemented
  Ignored,  // accepted for SGLang compatibility; has no meaning here (e.g. --trust-remote-code)
};

// Where a setting means something: everywhere, only to the HTTP server (`serve`: refused by
// generate and bench-offline), or only on GPUs (refused on the CPU).
enum class FlagScope : uint8_t { Any, Serve, Gpu };

struct FlagSpec {
  const char* name;           // canonical, dashed: "mem-fraction-static"
  const char* aliases;        // comma-separated, dashed, may be ""
  FlagType type;
  const char* default_value;  // as typed on a command line; "" = empty string / unset
  const char* choices;        // Choice: comma-separated canonical values (case-insensitive)
  const char* help;
  FlagSupport support;
  bool affects_performance;   // changes speed or memory: highlighted by `config diff`
  FlagScope scope = FlagScope::Any;
};

// The table, in help order.
std::span<const FlagSpec> serve_flag_specs();
// Look up by canonical name or alias, with or without leading dashes, '_' or '-' (nullptr: unknown).
const FlagSpec* find_serve_flag(std::string_view name);

struct ServeOptions {
  ServeOptions();  // every field at the table's default

  // Model and API.
  std::string model_path;            // --model-path / --model: HF directory (config.json, safetensors)
  std::string tokenizer_path;        // "" = model_path
  std::string served_model_name;     // "" = model_path
  std::string chat_template;         // "" = the model's chat_template.jinja / tokenizer_config.json
  std::string reasoning_parser;      // "" | qwen3 | deepseek-r1 ...
  std::string tool_call_parser;      // "" | qwen3_coder | qwen25 ...
  std::string load_format;           // auto | dummy
  std::string dtype;                 // auto | bfloat16 | float16 | float32
  std::string kv_cache_dtype;        // auto | bf16 | fp8_e4m3 | fp8_e5m2
  std::string mamba_ssm_dtype;       // auto | float32 | bfloat16 (the GDN recurrent state)
  std::string quantization;          // "" (none)
  bool trust_remote_code = false;

  // HTTP.
  std::string host;                  // 127.0.0.1
  int64_t port = 0;                  // 30000
  std::string api_key;               // "" = no auth
  int64_t max_request_bytes = 0;     // request body limit, 32 MiB
  int64_t http_threads = 0;          // HTTP io threads; 0 = auto (1 on CPU, 4 on GPU)
  bool enable_cors = false;          // CORS headers + OPTIONS preflight
  int64_t stream_interval = 0;       // a stream is written every N generated tokens (SGLang's flag), 1
  std::string allowed_origins;       // comma-separated; "*" = any (setting it enables CORS)

  // Hardware.
  std::string device;                // auto | cpu | cuda
  int64_t tp_size = 0;               // tensor parallel GPUs, 1
  int64_t dp_size = 0;               // data parallel replicas, 1
  int64_t nnodes = 1;                // nodes of the deployment (engine/node_link.h)
  int64_t node_rank = 0;             // this node's rank among them (0 serves HTTP)
  std::string dist_init_addr;        // HOST:PORT where node 0 listens for the others
  int64_t dist_timeout = 300;        // seconds a node waits for the others
  int64_t threads = 0;               // CPU kernel threads, 0 = all usable CPUs
  int64_t max_memory = 0;            // CPU: bytes for weights+KV+state; 0 = auto (a share of RAM)
  double mem_fraction_static = 0;    // GPU: fraction for weights+KV+state; 0 = auto

  // Capacity (0 = auto: chosen by the memory plan).
  int64_t context_length = 0;        // prompt + output tokens per request
  int64_t max_running_requests = 0;  // requests decoding at once
  int64_t max_total_tokens = 0;      // KV cache capacity in tokens
  int64_t max_mamba_cache_size = 0;  // GDN state slots
  double mamba_full_memory_ratio = 0;  // state-slot bytes / KV bytes split, SGLang default 0.9
  std::string mamba_scheduler_strategy;  // auto | no_buffer | extra_buffer
  int64_t page_size = 0;             // tokens per KV block, 16
  int64_t chunked_prefill_size = 0;  // longest prefill chunk per request per step; 0 = auto
  int64_t max_prefill_tokens = 0;    // prefill tokens per step, 16384
  int64_t mixed_prefill_tokens = 0;  // prefill tokens in a step that also decodes; 0 = auto (step times)
  std::string schedule_policy;       // fcfs | lpm
  bool disable_radix_cache = false;  // prefix caching off

  // Speculative decoding (MTP head = NEXTN).
  std::string speculative_algorithm;       // "" (off) | NEXTN (aliases MTP, EAGLE)
  int64_t speculative_num_steps = 0;       // draft steps k, 1..8; 0 = off / auto (3 when on)
  int64_t speculative_eagle_topk = 0;      // 1 only
  int64_t speculative_num_draft_tokens = 0;  // k+1 when topk is 1; 0 = derive
  std::string speculative_token_map;         // the drafts' vocabulary (model/token_map.h); "" = all

  // GPU execution.
  bool disable_cuda_graph = false;
  bool disable_overlap_schedule = false;
  std::string sampling_backend = "auto";  // auto, device, host (SGLang's flashinfer / pytorch: auto)
  bool disable_custom_all_reduce = false;  // GPU tensor parallelism: NCCL for every collective
  int64_t cuda_graph_max_bs = 0;     // 0 = auto
  std::string attention_backend;     // "" = auto
  bool enable_torch_compile = false;
  bool enable_deterministic_inference = false;  // batch-invariant results: the CPU's kernels; CUDA refuses it

  // Operations.
  std::string state_dir;             // launch records; "" = $XDG_STATE_HOME/deltaserve
  std::string config;                // --config FILE (.yaml / .toml) it was read from ("" = none)
  std::string log_level;             // debug | info | warning | error
  double shutdown_timeout = 30;      // seconds running requests get to finish after SIGTERM/SIGINT
  bool log_requests = false;
  int64_t log_requests_level = 2;    // what --log-requests logs: 0..3 (SGLang's levels)
  bool enable_metrics = false;
  int64_t random_seed = 0;           // when explicit (any value); else random
  bool skip_server_warmup = false;
  double watchdog_timeout = 0;       // seconds without engine progress (requests pending) before exit; 0 = off
  bool help = false;                 // --help was given

  // Canonical names (dashed) set explicitly on the command line or in the config file. The
  // memory plan treats these as requests it must honour or refuse, never silently lower.
  std::set<std::string> explicit_keys;
  bool is_explicit(std::string_view canonical_name) const;

  bool speculative_enabled() const { return !speculative_algorithm.empty(); }
};

// One setting by flag name (canonical, alias, dashes or underscores) and its text value ("" with
// a Bool means true). Marks the key explicit. Errors name the flag and say what is accepted.
Status set_serve_option(ServeOptions& opts, std::string_view name, std::string_view value);

// Parse a command line (the arguments after `serve`): `--name value`, `--name=value`, booleans
// `--name` / `--name=false`; one positional argument is taken as --model-path. `--config FILE`
// is read first, then every other argument overrides it. Validates and resolves (see below).
// `warnings` (optional) receives the start-up warnings (unsupported flags that were set).
Result<ServeOptions> parse_serve_options(const std::vector<std::string>& args,
                                         std::vector<std::string>* warnings = nullptr);
// Same, without validate_serve_options (for `config diff`, which reports rather than refuses).
Result<ServeOptions> parse_serve_args_raw(const std::vector<std::string>& args);

// Read a TOML file whose top-level keys are flag names (dashes or underscores) into opts.
Status load_serve_config_toml(const std::filesystem::path& file, ServeOptions& opts);
Status parse_serve_config_toml_text(const std::string& text, const std::string& source,
                                    ServeOptions& opts);
// SGLang's --config: a flat YAML mapping of flag names to scalars (plain, quoted, booleans) or
// one-item lists (`- item` lines or `[item]`), comments allowed; anything nested is refused.
Status parse_serve_config_yaml_text(const std::string& text, const std::string& source, ServeOptions& opts);
// `--config FILE`: YAML for .yaml / .yml (as SGLang), TOML otherwise.
bool is_yaml_config_path(const std::filesystem::path& file);
Status load_serve_config_file(const std::filesystem::path& file, ServeOptions& opts);

// Checks ranges and combinations, with messages that say what to set; fills derived values
// (speculative defaults: steps 3, topk 1, draft tokens steps+1 when the algorithm is on).
Status validate_serve_options(ServeOptions& opts);
// Fills derived values without rejecting anything (used by validate and by `config diff`).
void resolve_serve_defaults(ServeOptions& opts);

// Warnings for IGNORED flags that were given (they have no effect here), for values that mean
// something else here, and for multi-node flags given with --nnodes 1.
std::vector<std::string> unsupported_option_warnings(const ServeOptions& opts);

// Upper bound of --threads (and `logits --threads`): more kernel threads than this only fail to
// start or thrash; a fixed bound keeps `plan` and `serve` agreeing across machines.
inline constexpr int64_t kMaxThreads = 1024;

// A boolean flag given a separate word (`--disable-radix-cache false`): argparse's store_true
// flags refuse that too. Error naming the flag and suggesting `--flag=VALUE` when `next` reads as
// a boolean; ok otherwise.
Status refuse_separate_bool_value(const FlagSpec& flag, std::string_view next);

// Settings that only the HTTP server (`deltaserve serve`) reads, given explicitly: generate and
// bench-offline refuse them by name. As "--name" in table order.
std::vector<std::string> explicit_serve_only_flags(const ServeOptions& opts);
// GPU-only settings given explicitly (--mem-fraction-static, --cuda-graph-max-bs, ...): refused
// by name when the run is on the CPU. As "--name" in table order.
std::vector<std::string> explicit_gpu_only_flags(const ServeOptions& opts);

// Every setting (table order), incl. defaults, as (canonical name, text): "auto" for 0-auto values.
std::vector<std::pair<std::string, std::string>> effective_config(const ServeOptions& opts);
// The text of one setting as effective_config renders it ("" if unknown).
std::string serve_option_text(const ServeOptions& opts, std::string_view canonical_name);
// The type of a flag of the table (String for a name it does not have).
FlagType serve_flag_type(std::string_view canonical_name);
// A command line (`--name value ...`) for the explicit settings, in table order.
std::vector<std::string> explicit_args(const ServeOptions& opts);
// TOML text for the explicit settings (or all settings with all=true). Secret settings
// (is_secret_serve_flag) are written as a comment saying they are set, never their value.
std::string serve_options_to_toml(const ServeOptions& opts, bool all = false);

// Settings whose values are secrets (--api-key): never recorded in the launch database, printed
// by `history` / `config show` / `config diff`, or reported by /get_server_info.
bool is_secret_serve_flag(std::string_view name);
inline constexpr const char* kRedactedValue = "<redacted>";
// `settings` with every non-empty secret value replaced by kRedactedValue.
std::vector<std::pair<std::string, std::string>> redact_secret_settings(
    std::vector<std::pair<std::string, std::string>> settings);
// A command line with the value of every secret flag (`--api-key X`, `--api-key=X`) redacted.
std::vector<std::string> redact_secret_args(std::vector<std::string> args);

// `deltaserve serve --help` text generated from the table.
std::string serve_options_help();

// Parse "64GiB", "512MiB", "1.5GB", "4096", "auto" (0). `option` names the flag in errors.
Result<int64_t> parse_byte_size(std::string_view option, std::string_view text);
// 34359738368 -> "32GiB": the largest binary unit that divides it, else bytes ("1000000B"); always exact.
std::string format_byte_size(int64_t bytes);

// The model commands use when none is given: $DELTASERVE_MODEL, else the bundled
// models/tiny-coder of the source tree the binary was built from.
std::string default_model_dir();

// $XDG_STATE_HOME/deltaserve (an absolute one), else $HOME/.local/state/deltaserve, else the
// password database's home/.local/state/deltaserve, else an absolute ./.deltaserve-state.
std::filesystem::path default_state_dir();

}  // namespace deltaserve
