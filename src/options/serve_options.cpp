// The serve flag table: the only place a serve flag is defined. Each row binds a FlagSpec to the
// ServeOptions field that holds its typed value.
#include "options/serve_options.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <variant>

#include <pwd.h>
#include <unistd.h>

#include <toml.hpp>

#include "util/tcp.h"

namespace deltaserve {
namespace {

using Field = std::variant<std::string ServeOptions::*, int64_t ServeOptions::*,
                           double ServeOptions::*, bool ServeOptions::*>;

struct Row {
  FlagSpec spec;
  Field field;
};

constexpr FlagType S = FlagType::String, C = FlagType::Choice, I = FlagType::Int,
                   F = FlagType::Float, B = FlagType::Bytes, BOOL = FlagType::Bool;
constexpr FlagSupport YES = FlagSupport::Yes, IGNORED = FlagSupport::Ignored;
constexpr bool PERF = true, NO_PERF = false;
// FlagSpec::scope (else Any). --disable-cuda-graph and --disable-overlap-schedule are Any: what they
// ask for holds on the CPU, which has neither, and SGLang's CPU command lines pass them.
constexpr FlagScope SERVE = FlagScope::Serve, GPU = FlagScope::Gpu;

// clang-format off
const std::vector<Row>& rows() {
  static const std::vector<Row> kRows = {
    // Model and API.
    {{"model-path", "model", S, "", "", "model directory (HF layout: config.json, *.safetensors)", YES, NO_PERF}, &ServeOptions::model_path},
    {{"tokenizer-path", "", S, "", "", "tokenizer directory (default: the model directory)", YES, NO_PERF}, &ServeOptions::tokenizer_path},
    {{"served-model-name", "", S, "", "", "model name reported by /v1/models (default: the model path)", YES, NO_PERF, SERVE}, &ServeOptions::served_model_name},
    {{"chat-template", "", S, "", "", "Jinja chat template file (default: the model's own)", YES, NO_PERF, SERVE}, &ServeOptions::chat_template},
    {{"reasoning-parser", "", C, "", "qwen3,qwen3-thinking,deepseek-r1", "split <think> reasoning into reasoning_content", YES, NO_PERF, SERVE}, &ServeOptions::reasoning_parser},
    {{"tool-call-parser", "", S, "", "", "parse tool calls from the output (qwen3_coder, qwen25)", YES, NO_PERF, SERVE}, &ServeOptions::tool_call_parser},
    {{"load-format", "", C, "auto", "auto,dummy,safetensors=auto", "auto: read the safetensors; dummy: random weights shaped by config.json (SGLang's safetensors: auto, the only format read)", YES, NO_PERF}, &ServeOptions::load_format},
    {{"dtype", "", C, "auto", "auto,bfloat16,float16,float32,half=float16,float=float32", "the matmul weights' dtype (hidden states are float32 between kernels): auto keeps the checkpoint's (CPU: bfloat16 stays bfloat16, float16 and float32 load as float32; CUDA: bfloat16); bfloat16 rounds any checkpoint to it; float32 widens (CPU only); float16 is not built", YES, PERF}, &ServeOptions::dtype},
    {{"kv-cache-dtype", "", C, "auto", "auto,bf16,bfloat16=bf16,fp8_e4m3,fp8_e5m2", "KV cache dtype; fp8 uses the checkpoint's k_scale/v_scale (1 without) (auto: bf16 on GPU, f32 on CPU)", YES, PERF}, &ServeOptions::kv_cache_dtype},
    {{"mamba-ssm-dtype", "", C, "auto", "auto,float32,bfloat16", "GDN recurrent state dtype (auto: the config's mamba_ssm_dtype, float32 for Qwen3.5/3.6); bfloat16 halves the state's memory and what a decode step reads and writes of it", YES, PERF}, &ServeOptions::mamba_ssm_dtype},
    {{"quantization", "", S, "", "", "weight quantization method: none is built (checkpoints load in bf16 or f32); any value is refused", YES, PERF}, &ServeOptions::quantization},
    {{"trust-remote-code", "", BOOL, "false", "", "accepted for SGLang compatibility; no remote code is ever run", IGNORED, NO_PERF}, &ServeOptions::trust_remote_code},
    // HTTP.
    {{"host", "", S, "127.0.0.1", "", "address to listen on", YES, NO_PERF, SERVE}, &ServeOptions::host},
    {{"port", "", I, "30000", "", "port to listen on (0: any free port, printed in the 'listening on' line)", YES, NO_PERF, SERVE}, &ServeOptions::port},
    {{"api-key", "", S, "", "", "require `Authorization: Bearer KEY` (default: no auth)", YES, NO_PERF, SERVE}, &ServeOptions::api_key},
    {{"max-request-bytes", "", B, "32MiB", "", "largest accepted request body", YES, NO_PERF, SERVE}, &ServeOptions::max_request_bytes},
    {{"http-threads", "", I, "auto", "", "HTTP io threads (auto: 1 on CPU, where compute threads take every core; 4 on GPU)", YES, PERF, SERVE}, &ServeOptions::http_threads},
    {{"enable-cors", "", BOOL, "false", "", "answer browsers: CORS headers and OPTIONS preflight for the origins in --allowed-origins", YES, NO_PERF, SERVE}, &ServeOptions::enable_cors},
    {{"allowed-origins", "", S, "*", "", "comma-separated origins CORS allows (* = any); setting it turns --enable-cors on", YES, NO_PERF, SERVE}, &ServeOptions::allowed_origins},
    {{"stream-interval", "", I, "1", "", "a streamed response is written to its connection every N generated tokens (and at its first and last): fewer writes and wake-ups per token, each token still its own SSE event (SGLang's flag), 1..1024", YES, PERF, SERVE}, &ServeOptions::stream_interval},
    // Hardware.
    {{"device", "", C, "auto", "auto,cpu,cuda", "where to run (auto: cuda when built with CUDA and a GPU is present)", YES, PERF}, &ServeOptions::device},
    {{"tp-size", "tensor-parallel-size,tp", I, "1", "", "tensor parallel: GPUs per model replica (--device cpu: threads of one process; CUDA: one GPU per rank, one-shot peer all-reduce for small messages and NCCL above)", YES, PERF}, &ServeOptions::tp_size},
    {{"dp-size", "data-parallel-size,dp", I, "1", "", "data parallel: model replicas behind one server, least-loaded dispatch (serve; GPUs: each replica on --tp-size GPUs of its own; CPU: the cores and memory shared out)", YES, PERF}, &ServeOptions::dp_size},
    {{"nnodes", "", I, "1", "", "nodes of one deployment, --tp-size / --nnodes ranks each (SGLang's flag; serve only): node 0 schedules and serves HTTP, the others run their ranks", YES, PERF}, &ServeOptions::nnodes},
    {{"node-rank", "", I, "0", "", "this node's rank among --nnodes (0 serves HTTP)", YES, NO_PERF}, &ServeOptions::node_rank},
    {{"dist-init-addr", "nccl-init-addr", S, "", "", "HOST:PORT where node 0 listens and the other nodes join it (SGLang's flag, also its older --nccl-init-addr; needed with --nnodes > 1; no effect with --nnodes 1)", YES, NO_PERF}, &ServeOptions::dist_init_addr},
    {{"dist-timeout", "", I, "300", "", "seconds a node waits for the others at --dist-init-addr before failing (no effect with --nnodes 1)", YES, NO_PERF}, &ServeOptions::dist_timeout},
    {{"threads", "", I, "0", "", "CPU kernel threads, 0..1024 (0: all usable CPUs)", YES, PERF}, &ServeOptions::threads},
    {{"max-memory", "", B, "auto", "", "CPU: bytes for weights + KV + state (auto: 70% of available RAM)", YES, PERF}, &ServeOptions::max_memory},
    {{"mem-fraction-static", "", F, "auto", "", "GPU: fraction of GPU memory for weights + KV + state (auto: by GPU size)", YES, PERF, GPU}, &ServeOptions::mem_fraction_static},
    // Capacity.
    {{"context-length", "", I, "auto", "", "max prompt + output tokens per request (auto: the model's, capped to what fits)", YES, PERF}, &ServeOptions::context_length},
    {{"max-running-requests", "", I, "auto", "", "requests decoding at once (auto: what the memory plan fits)", YES, PERF}, &ServeOptions::max_running_requests},
    {{"max-total-tokens", "", I, "auto", "", "KV cache capacity in tokens (auto: what the memory plan fits)", YES, PERF}, &ServeOptions::max_total_tokens},
    {{"max-mamba-cache-size", "", I, "auto", "", "GDN state slots: request slots + prefix-cache checkpoints (auto: what the memory plan fits, a checkpoint per request slot)", YES, PERF}, &ServeOptions::max_mamba_cache_size},
    {{"mamba-full-memory-ratio", "", F, "0.9", "", "state-slot memory / KV memory: splits the cache budget (SGLang meaning)", YES, PERF}, &ServeOptions::mamba_full_memory_ratio},
    {{"mamba-scheduler-strategy", "", C, "auto", "auto,no_buffer,extra_buffer", "GDN checkpoints for the prefix cache: no_buffer at prompt and prefill-chunk ends; extra_buffer (auto) also each request's last block boundary, cached when it finishes", YES, PERF}, &ServeOptions::mamba_scheduler_strategy},
    {{"page-size", "", I, "16", "", "tokens per KV block", YES, PERF}, &ServeOptions::page_size},
    {{"chunked-prefill-size", "", I, "auto", "", "longest prefill chunk per request per step (auto: 8192 GPU, 512 CPU; SGLang's -1, no chunking, means auto here)", YES, PERF}, &ServeOptions::chunked_prefill_size},
    {{"max-prefill-tokens", "", I, "auto", "", "prefill tokens per step over all requests (auto: chunked-prefill-size; the step buffers the plan reserves scale with it)", YES, PERF}, &ServeOptions::max_prefill_tokens},
    {{"mixed-prefill-tokens", "", I, "auto", "", "prefill tokens in a step that also decodes running requests, whose next tokens wait for that step (auto: what keeps such a step within ~2.5 decode steps, from the step times measured while serving; --max-prefill-tokens or more: no separate limit)", YES, PERF}, &ServeOptions::mixed_prefill_tokens},
    {{"schedule-policy", "", C, "fcfs", "fcfs,lpm", "waiting-queue order: first come first served, or longest cached prefix first", YES, PERF}, &ServeOptions::schedule_policy},
    {{"disable-radix-cache", "", BOOL, "false", "", "turn prefix caching off", YES, PERF}, &ServeOptions::disable_radix_cache},
    // Speculative decoding.
    {{"speculative-algorithm", "", C, "", "NEXTN,MTP=NEXTN,EAGLE=NEXTN", "speculative decoding with the model's MTP head (NEXTN; MTP and EAGLE are aliases)", YES, PERF}, &ServeOptions::speculative_algorithm},
    {{"speculative-num-steps", "", I, "auto", "", "draft steps per verification, 1..8 (auto: a start-up probe times plain decoding and 3, 2 and 1 steps and keeps the fastest, 0 unless some k beats plain decoding by 3%; the log gives every figure)", YES, PERF}, &ServeOptions::speculative_num_steps},
    {{"speculative-eagle-topk", "", I, "auto", "", "drafts per step; only 1 is supported (auto: 1)", YES, PERF}, &ServeOptions::speculative_eagle_topk},
    {{"speculative-token-map", "", S, "", "", "file of token ids (JSON array or whitespace-separated) the MTP drafts choose among; each draft step then scores these rows of the lm_head only, not the whole vocabulary (verification still scores all tokens: the output is unchanged)", YES, PERF}, &ServeOptions::speculative_token_map},
    {{"speculative-num-draft-tokens", "", I, "auto", "", "tokens verified per step: num-steps + 1 when topk is 1 (auto: derived)", YES, PERF}, &ServeOptions::speculative_num_draft_tokens},
    // GPU execution.
    {{"disable-cuda-graph", "", BOOL, "false", "", "run decode without CUDA graphs", YES, PERF}, &ServeOptions::disable_cuda_graph},
    {{"disable-overlap-schedule", "", BOOL, "false", "", "launch every step only after the last one's tokens are read (default on GPUs: a greedy decode step is launched while the one before it computes, hiding the host's work; one GPU per replica, without speculative decoding; the CPU never overlaps)", YES, PERF}, &ServeOptions::disable_overlap_schedule},
    {{"sampling-backend", "", C, "auto", "auto,device,host,flashinfer=auto,pytorch=auto", "where non-greedy tokens are drawn: device (a GPU kernel per row; logits stay on the GPU) or host (the CPU sampler over fetched logits); rows with logprobs, grammars or speculative verification always use the host (auto: device on GPU, host on CPU; SGLang's flashinfer and pytorch mean auto)", YES, PERF}, &ServeOptions::sampling_backend},
    {{"disable-custom-all-reduce", "", BOOL, "false", "", "GPU tensor parallelism: NCCL for every collective, no one-shot peer all-reduce (needs libnccl.so.2)", YES, PERF, GPU}, &ServeOptions::disable_custom_all_reduce},
    {{"cuda-graph-max-bs", "", I, "auto", "", "largest decode batch replayed as a CUDA graph (auto: max running requests, at most 64)", YES, PERF, GPU}, &ServeOptions::cuda_graph_max_bs},
    {{"attention-backend", "", S, "", "", "accepted for SGLang compatibility; no effect (one attention implementation is built in)", IGNORED, NO_PERF}, &ServeOptions::attention_backend},
    {{"enable-torch-compile", "", BOOL, "false", "", "accepted for SGLang compatibility; no effect", IGNORED, NO_PERF}, &ServeOptions::enable_torch_compile},
    {{"enable-deterministic-inference", "", BOOL, "false", "", "results that do not depend on what a request is batched with (SGLang): the CPU's kernels are batch invariant, so it holds there as is; the CUDA backend refuses it (cuBLAS picks its GEMM algorithms by row count)", YES, NO_PERF}, &ServeOptions::enable_deterministic_inference},
    // Operations.
    {{"state-dir", "", S, "", "", "launch records database folder (default: $XDG_STATE_HOME/deltaserve or ~/.local/state/deltaserve)", YES, NO_PERF, SERVE}, &ServeOptions::state_dir},
    {{"config", "", S, "", "", "read settings from a YAML file (SGLang's format: flat `flag-name: value` lines) or a .toml file (keys are these flag names); flags given on the command line win", YES, NO_PERF}, &ServeOptions::config},
    {{"shutdown-timeout", "", F, "30", "", "on SIGTERM/SIGINT: seconds running requests may take to finish before they are aborted", YES, NO_PERF, SERVE}, &ServeOptions::shutdown_timeout},
    {{"log-level", "", C, "info", "debug,info,warning,error,critical=error", "log verbosity (SGLang's critical: error, the quietest level built)", YES, NO_PERF}, &ServeOptions::log_level},
    {{"log-requests", "", BOOL, "false", "", "log a line when each generation request starts and one when its response ends (INFO: refused with --log-level warning or error, which would hide them); what they hold: --log-requests-level", YES, NO_PERF, SERVE}, &ServeOptions::log_requests},
    {{"log-requests-level", "", I, "2", "", "with --log-requests (SGLang's levels): 0 metadata (id, route, token counts, status, finish reasons, times); 1 and the sampling parameters; 2 and the prompt and output text, 2,048 characters of each; 3 and the whole texts", YES, NO_PERF, SERVE}, &ServeOptions::log_requests_level},
    {{"enable-metrics", "", BOOL, "false", "", "Prometheus /metrics (served with or without this flag)", YES, NO_PERF, SERVE}, &ServeOptions::enable_metrics},
    {{"random-seed", "", I, "auto", "", "seed for sampling without a per-request seed; any integer, 0 included, is a fixed seed, as in SGLang (auto: a random one each launch)", YES, NO_PERF}, &ServeOptions::random_seed},
    {{"skip-server-warmup", "", BOOL, "false", "", "skip the warm-up at start-up (CUDA: batches of 1-64 requests that capture graphs and time GEMM algorithms)", YES, NO_PERF, SERVE}, &ServeOptions::skip_server_warmup},
    {{"watchdog-timeout", "", F, "300", "", "seconds the engine may make no progress with requests pending before the server exits (1); under systemd it pings WatchdogSec only while the engine progresses (0: off)", YES, NO_PERF, SERVE}, &ServeOptions::watchdog_timeout},
    {{"help", "h", BOOL, "false", "", "print this help", YES, NO_PERF}, &ServeOptions::help},
  };
  return kRows;
}
// clang-format on

std::string normalize_name(std::string_view name) {
  while (!name.empty() && name.front() == '-') name.remove_prefix(1);
  std::string out(name);
  for (char& c : out) {
    if (c == '_') c = '-';
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::string> split_commas(std::string_view s) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < s.size()) {
    std::size_t comma = s.find(',', pos);
    if (comma == std::string_view::npos) comma = s.size();
    if (comma > pos) out.emplace_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

const Row* find_row(std::string_view name) {
  std::string n = normalize_name(name);
  for (const Row& r : rows()) {
    if (n == r.spec.name) return &r;
    for (const auto& a : split_commas(r.spec.aliases))
      if (n == a) return &r;
  }
  return nullptr;
}

bool default_is_auto(const FlagSpec& s) { return std::string_view(s.default_value) == "auto"; }

Result<int64_t> parse_int_text(const FlagSpec& s, std::string_view text) {
  std::string t(text);
  if (lower(t) == "auto" && default_is_auto(s)) return int64_t{0};
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(t.c_str(), &end, 10);
  if (t.empty() || *end != '\0' || errno == ERANGE)
    return error("--", s.name, ": '", t, "' is not an integer",
                 default_is_auto(s) ? " (or auto)" : "");
  return static_cast<int64_t>(v);
}

Result<double> parse_float_text(const FlagSpec& s, std::string_view text) {
  std::string t(text);
  if (lower(t) == "auto" && default_is_auto(s)) return 0.0;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (t.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    return error("--", s.name, ": '", t, "' is not a number", default_is_auto(s) ? " (or auto)" : "");
  return v;
}

Result<bool> parse_bool_text(const FlagSpec& s, std::string_view text) {
  std::string t = lower(text);
  if (t.empty() || t == "true" || t == "1" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "0" || t == "no" || t == "off") return false;
  return error("--", s.name, ": '", std::string(text), "' is not a boolean (true or false)");
}

// A Choice's accepted spellings, each with the canonical value it stands for. The table writes a
// synonym as "spelling=canonical" (SGLang's "half" is "float16"), so that a setting holds one value
// whatever was typed: diffs, launch records and the engine compare one spelling, never two.
std::vector<std::pair<std::string, std::string>> choice_spellings(const FlagSpec& s) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& c : split_commas(s.choices)) {
    const std::size_t eq = c.find('=');
    if (eq == std::string::npos) out.emplace_back(c, c);
    else out.emplace_back(c.substr(0, eq), c.substr(eq + 1));
  }
  return out;
}

// "a,b,c" of every accepted spelling (help and error messages).
std::string choice_list(const FlagSpec& s) {
  std::string out;
  for (const auto& [spelling, canonical] : choice_spellings(s)) out += (out.empty() ? "" : ",") + spelling;
  return out;
}

Result<std::string> parse_choice_text(const FlagSpec& s, std::string_view text) {
  std::string t = lower(text);
  if (t.empty() && std::string_view(s.default_value).empty()) return std::string();
  for (const auto& [spelling, canonical] : choice_spellings(s))
    if (lower(spelling) == t) return canonical;
  return error("--", s.name, ": '", std::string(text), "' is not one of ", choice_list(s));
}

// Shortest text that reads back as the same double (0.8812345 stays 0.8812345): a value written
// out (systemd-unit, TOML, launch records, config diff) is the value that was given.
std::string format_double(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  DS_CHECK(ec == std::errc(), "to_chars(double) failed");
  return std::string(buf, end);
}

Status apply_text(const Row& row, ServeOptions& opts, std::string_view value) {
  const FlagSpec& s = row.spec;
  return std::visit(
      [&](auto member) -> Status {
        using T = std::remove_reference_t<decltype(opts.*member)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (s.type == FlagType::Choice) {
            auto v = parse_choice_text(s, value);
            if (!v) return v.status();
            opts.*member = *v;
          } else {
            opts.*member = std::string(value);
          }
        } else if constexpr (std::is_same_v<T, int64_t>) {
          auto v = s.type == FlagType::Bytes ? parse_byte_size(s.name, value) : parse_int_text(s, value);
          if (!v) return v.status();
          opts.*member = *v;
        } else if constexpr (std::is_same_v<T, double>) {
          auto v = parse_float_text(s, value);
          if (!v) return v.status();
          opts.*member = *v;
        } else {
          auto v = parse_bool_text(s, value);
          if (!v) return v.status();
          opts.*member = *v;
        }
        return Status::ok();
      },
      row.field);
}

std::string render(const Row& row, const ServeOptions& opts) {
  const FlagSpec& s = row.spec;
  return std::visit(
      [&](auto member) -> std::string {
        using T = std::remove_cvref_t<decltype(opts.*member)>;
        const T& v = opts.*member;
        if constexpr (std::is_same_v<T, std::string>) {
          return v;
        } else if constexpr (std::is_same_v<T, int64_t>) {
          // (0 given explicitly survives validation only where it is a value: --random-seed 0.)
          if (v == 0 && default_is_auto(s) && !opts.is_explicit(s.name)) return "auto";
          // Speculative decoding with neither count given: the start-up probe picks the draft steps
          // (speculation_choice.h; it may turn MTP off), so the 3 (and 4) resolve_serve_defaults
          // fills in are only where it starts. Shown as auto, a diff against a given 3 says so.
          const std::string_view name = s.name;
          if ((name == "speculative-num-steps" || name == "speculative-num-draft-tokens") &&
              opts.speculative_enabled() && !opts.is_explicit("speculative-num-steps") &&
              !opts.is_explicit("speculative-num-draft-tokens"))
            return "auto";
          return s.type == FlagType::Bytes ? format_byte_size(v) : std::to_string(v);
        } else if constexpr (std::is_same_v<T, double>) {
          if (v == 0 && default_is_auto(s)) return "auto";
          return format_double(v);
        } else {
          return v ? "true" : "false";
        }
      },
      row.field);
}

Status apply_args(const std::vector<std::string>& args, ServeOptions& opts) {
  // --config first, so that the command line overrides the file.
  // Its name is matched as every flag's is (find_row: dashes, case, '_').
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 2 || a[0] != '-') continue;
    const std::size_t eq = a.find('=');
    const Row* row = find_row(a.substr(0, eq));
    if (!row || std::string_view(row->spec.name) != "config") continue;
    if (eq == std::string::npos && i + 1 >= args.size())
      return error("option --config needs a value (a .yaml or .toml file)");
    std::string file = eq == std::string::npos ? args[++i] : a.substr(eq + 1);
    DS_RETURN_IF_ERROR(load_serve_config_file(file, opts));
    opts.config = file;
  }
  bool seen_positional = false, seen_model_flag = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 2 || a[0] != '-') {
      if (seen_positional)
        return error("unexpected argument '", a, "' (only the model path may be given without a flag)");
      if (seen_model_flag)
        return error("unexpected argument '", a, "': the model path is already given by --model-path");
      seen_positional = true;
      DS_RETURN_IF_ERROR(set_serve_option(opts, "model-path", a));
      continue;
    }
    std::string name = a, value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const Row* row = find_row(name);
    if (!row) return error("unknown flag ", name, " (see `deltaserve serve --help`)");
    if (std::string_view(row->spec.name) == "model-path") {
      if (seen_positional)
        return error("--", row->spec.name, " and a positional model path are both given: give one of them");
      seen_model_flag = true;
    }
    if (std::string_view(row->spec.name) == "config") {
      if (!has_value) ++i;  // already read above
      continue;
    }
    if (row->spec.type == FlagType::Bool) {
      if (!has_value && i + 1 < args.size()) DS_RETURN_IF_ERROR(refuse_separate_bool_value(row->spec, args[i + 1]));
      DS_RETURN_IF_ERROR(set_serve_option(opts, row->spec.name, has_value ? value : "true"));
      continue;
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return error("flag --", row->spec.name, " needs a value");
      value = args[++i];
    }
    DS_RETURN_IF_ERROR(set_serve_option(opts, row->spec.name, value));
  }
  return Status::ok();
}

}  // namespace

std::span<const FlagSpec> serve_flag_specs() {
  static const std::vector<FlagSpec> kSpecs = [] {
    std::vector<FlagSpec> out;
    for (const Row& r : rows()) out.push_back(r.spec);
    return out;
  }();
  return kSpecs;
}

const FlagSpec* find_serve_flag(std::string_view name) {
  const Row* r = find_row(name);
  if (!r) return nullptr;
  return &serve_flag_specs()[static_cast<std::size_t>(r - rows().data())];
}

ServeOptions::ServeOptions() {
  for (const Row& r : rows()) {
    Status s = apply_text(r, *this, r.spec.default_value);
    DS_CHECK(s.is_ok(), "bad default for --", r.spec.name, ": ", s.message());
  }
}

bool ServeOptions::is_explicit(std::string_view canonical_name) const {
  return explicit_keys.count(std::string(canonical_name)) > 0;
}

Status set_serve_option(ServeOptions& opts, std::string_view name, std::string_view value) {
  const Row* row = find_row(name);
  if (!row) return error("unknown flag --", normalize_name(name), " (see `deltaserve serve --help`)");
  DS_RETURN_IF_ERROR(apply_text(*row, opts, value));
  // "auto" for a flag whose default is auto is the default itself: not a choice the user made (so
  // `--speculative-num-steps auto` keeps the start-up probe, and diffs see no difference).
  if (default_is_auto(row->spec) && lower(value) == "auto")
    opts.explicit_keys.erase(row->spec.name);
  else
    opts.explicit_keys.insert(row->spec.name);
  return Status::ok();
}

Result<ServeOptions> parse_serve_args_raw(const std::vector<std::string>& args) {
  ServeOptions opts;
  DS_RETURN_IF_ERROR(apply_args(args, opts));
  return opts;
}

Result<ServeOptions> parse_serve_options(const std::vector<std::string>& args,
                                         std::vector<std::string>* warnings) {
  ServeOptions opts;
  DS_RETURN_IF_ERROR(apply_args(args, opts));
  if (opts.help) return opts;
  DS_RETURN_IF_ERROR(validate_serve_options(opts));
  if (warnings) {
    auto w = unsupported_option_warnings(opts);
    warnings->insert(warnings->end(), w.begin(), w.end());
  }
  return opts;
}

namespace {

// One key of a config file and its value as command-line text.
struct ConfigItem {
  std::string key;
  std::string text;
};

// What TOML and YAML files share: keys are flag names (any spelling find_row accepts), each setting
// named once, `config` and `help` refused, then each value set as its flag's text.
Status apply_config_items(const std::vector<ConfigItem>& items, const std::string& source, ServeOptions& opts) {
  // One key per setting: aliases (tp, tensor_parallel_size, tp-size) or the top level and [serve]
  // naming one setting twice would leave the winner to the table's order.
  std::map<std::string, std::string> key_of_setting;
  for (const auto& item : items) {
    const Row* row = find_row(item.key);
    if (!row) continue;  // refused below
    auto [it, fresh] = key_of_setting.emplace(row->spec.name, item.key);
    if (!fresh)
      return error(source, ": '", it->second, "' and '", item.key, "' both set --", row->spec.name, ": keep one");
  }
  for (const auto& item : items) {
    const Row* row = find_row(item.key);
    if (!row) return error(source, ": unknown setting '", item.key, "' (keys are serve flag names)");
    if (std::string_view(row->spec.name) == "config" || std::string_view(row->spec.name) == "help")
      return error(source, ": '", row->spec.name, "' cannot be set inside a config file");
    Status s = set_serve_option(opts, row->spec.name, item.text);
    if (!s) return error(source, ": ", s.message());
  }
  return Status::ok();
}

std::string trim_blanks(std::string_view s) {
  std::size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t' || s[a] == '\r')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t' || s[b - 1] == '\r')) --b;
  return std::string(s.substr(a, b - a));
}

// `s` up to a YAML comment: '#' at the start or after a blank, outside quotes.
std::string strip_yaml_comment(std::string_view s) {
  char quote = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == '\\' && quote == '"') ++i;
      else if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      if (i == 0 || s[i - 1] == ' ' || s[i - 1] == '\t' || s[i - 1] == '[' || s[i - 1] == ',' || s[i - 1] == ':')
        quote = c;
    } else if (c == '#' && (i == 0 || s[i - 1] == ' ' || s[i - 1] == '\t')) {
      return std::string(s.substr(0, i));
    }
  }
  return std::string(s);
}

// One YAML scalar as the text argparse would get (SGLang's parser passes str(value)): quotes
// removed, YAML 1.1 booleans (what PyYAML reads) as true/false. `null` is refused: SGLang would
// pass the word "None".
Result<std::string> yaml_scalar(std::string_view raw, const std::string& where) {
  const std::string t = trim_blanks(raw);
  if (t.size() >= 2 && t.front() == '\'' && t.back() == '\'') {
    std::string out;
    for (std::size_t i = 1; i + 1 < t.size(); ++i) {
      out += t[i];
      if (t[i] == '\'' && i + 2 < t.size() && t[i + 1] == '\'') ++i;  // '' is a quote
    }
    return out;
  }
  if (t.size() >= 2 && t.front() == '"' && t.back() == '"') {
    std::string out;
    for (std::size_t i = 1; i + 1 < t.size(); ++i) {
      if (t[i] != '\\' || i + 2 >= t.size()) {
        out += t[i];
        continue;
      }
      const char e = t[++i];
      out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
    }
    return out;
  }
  if (!t.empty() && (t.front() == '"' || t.front() == '\'')) return error(where, ": unterminated quote");
  if (!t.empty() && (t.front() == '{' || t.front() == '&' || t.front() == '*' || t.front() == '!' ||
                     t.front() == '|' || t.front() == '>'))
    return error(where, ": '", t, "' is not a plain value (mappings, anchors, tags and block text are not read; "
                 "the file is a flat list of `flag-name: value` lines)");
  const std::string l = lower(t);
  if (l == "true" || l == "yes" || l == "on") return std::string("true");
  if (l == "false" || l == "no" || l == "off") return std::string("false");
  if (l == "null" || l == "~" || t.empty()) return error(where, ": no value (give one, or leave the key out)");
  return t;
}

}  // namespace

Status parse_serve_config_toml_text(const std::string& text, const std::string& source,
                                    ServeOptions& opts) {
  toml::value root;
  try {
    std::istringstream is(text);
    root = toml::parse(is, source);
  } catch (const std::exception& e) {
    return error(source, ": not valid TOML: ", e.what());
  }
  if (!root.is_table()) return error(source, ": expected key = value lines");
  // Accept flags at the top level, or under a [serve] table.
  std::vector<std::pair<std::string, const toml::value*>> entries;
  for (const auto& [key, value] : root.as_table()) {
    if (key == "serve" && value.is_table()) {
      for (const auto& [k2, v2] : value.as_table()) entries.emplace_back(k2, &v2);
    } else {
      entries.emplace_back(key, &value);
    }
  }
  std::vector<ConfigItem> items;
  for (const auto& [key, vp] : entries) {
    const toml::value& v = *vp;
    std::string text;
    if (v.is_string()) {
      text = v.as_string().str;
    } else if (v.is_integer()) {
      text = std::to_string(v.as_integer());
    } else if (v.is_floating()) {
      text = format_double(v.as_floating());
    } else if (v.is_boolean()) {
      text = v.as_boolean() ? "true" : "false";
    } else {
      // (An unknown key is named as unknown, not as a bad value.)
      if (!find_row(key)) return error(source, ": unknown setting '", key, "' (keys are serve flag names)");
      return error(source, ": setting '", key, "' must be a string, number or boolean");
    }
    items.push_back({key, std::move(text)});
  }
  return apply_config_items(items, source, opts);
}

Status parse_serve_config_yaml_text(const std::string& text, const std::string& source, ServeOptions& opts) {
  // SGLang's --config (server_args_config_parser.py) reads a YAML mapping of flag names to scalars
  // or lists and turns it into `--key value` arguments placed before the command line's. That flat
  // form is read here; anything nested is refused by line rather than misread.
  std::vector<ConfigItem> items;
  std::istringstream in(text);
  std::string raw;
  int line_no = 0;
  // A key whose value is on the following `- item` lines.
  std::string list_key;
  int list_line = 0;
  std::vector<std::string> list_items;
  bool in_list = false;
  auto add = [&](const std::string& key, std::vector<std::string> values, int at) -> Status {
    const std::string where = str_cat(source, ":", at);
    // SGLang skips an empty list and passes a list's items as separate words; every flag here takes
    // one value.
    if (values.empty()) return Status::ok();
    if (values.size() > 1)
      return error(where, ": '", key, "' has ", values.size(), " values; --", normalize_name(key), " takes one");
    items.push_back({key, std::move(values[0])});
    return Status::ok();
  };
  auto end_list = [&]() -> Status {
    if (!in_list) return Status::ok();
    in_list = false;
    if (list_items.empty())
      return error(source, ":", list_line, ": '", list_key, "' has no value (give one, or leave the key out)");
    return add(list_key, std::move(list_items), list_line);
  };
  bool started = false;
  while (std::getline(in, raw)) {
    ++line_no;
    const std::string where = str_cat(source, ":", line_no);
    if (raw.find('\t') != std::string::npos && raw.find_first_not_of(" \t") < raw.size() &&
        raw[raw.find_first_not_of(" ")] == '\t')
      return error(where, ": a tab indents the line (YAML indents with spaces)");
    const std::string line = strip_yaml_comment(raw);
    const std::string t = trim_blanks(line);
    if (t.empty()) continue;
    if (t == "---" && !started) continue;
    if (t == "...") break;
    if (t == "---") return error(where, ": a second YAML document; give one mapping of settings");
    started = true;
    const bool indented = line[0] == ' ';
    if (t.rfind("- ", 0) == 0 || t == "-") {
      if (!in_list) return error(where, ": a list item outside a setting (the file is `flag-name: value` lines)");
      const std::string item = trim_blanks(t.substr(1));
      if (item.find(": ") != std::string::npos && item.front() != '"' && item.front() != '\'')
        return error(where, ": a mapping in a list is not read; the file is a flat list of `flag-name: value` lines");
      DS_ASSIGN_OR_RETURN(std::string v, yaml_scalar(item, where));
      list_items.push_back(std::move(v));
      continue;
    }
    if (indented)
      return error(where, ": nested settings are not read; the file is a flat list of `flag-name: value` lines "
                   "(as SGLang's --config)");
    DS_RETURN_IF_ERROR(end_list());
    const std::size_t colon = t.find(": ") != std::string::npos ? t.find(": ")
                              : (t.back() == ':' ? t.size() - 1 : std::string::npos);
    if (colon == std::string::npos || colon == 0)
      return error(where, ": expected `flag-name: value` (a YAML mapping of serve flags)");
    std::string key = trim_blanks(t.substr(0, colon));
    if (key.size() >= 2 && (key.front() == '"' || key.front() == '\'') && key.back() == key.front())
      key = key.substr(1, key.size() - 2);
    const std::string value = trim_blanks(t.substr(colon + 1));
    if (value.empty()) {  // `key:` then `- item` lines (or nothing: refused at the next key)
      in_list = true;
      list_key = key;
      list_line = line_no;
      list_items.clear();
      continue;
    }
    if (value.front() == '[') {
      if (value.back() != ']') return error(where, ": a [list] must close on its line");
      std::vector<std::string> values;
      const std::string inner = trim_blanks(value.substr(1, value.size() - 2));
      if (!inner.empty()) {
        // Split at commas outside quotes.
        std::string cur;
        char quote = 0;
        for (char c : inner) {
          if (quote) {
            if (c == quote) quote = 0;
          } else if (c == '"' || c == '\'') {
            quote = c;
          } else if (c == ',') {
            DS_ASSIGN_OR_RETURN(std::string v, yaml_scalar(cur, where));
            values.push_back(std::move(v));
            cur.clear();
            continue;
          } else if (c == '[' || c == '{') {
            return error(where, ": nested lists and mappings are not read");
          }
          cur += c;
        }
        DS_ASSIGN_OR_RETURN(std::string v, yaml_scalar(cur, where));
        values.push_back(std::move(v));
      }
      DS_RETURN_IF_ERROR(add(key, std::move(values), line_no));
      continue;
    }
    DS_ASSIGN_OR_RETURN(std::string v, yaml_scalar(value, where));
    if (v.find(": ") != std::string::npos && value.front() != '"' && value.front() != '\'')
      return error(where, ": nested settings are not read; the file is a flat list of `flag-name: value` lines");
    DS_RETURN_IF_ERROR(add(key, {std::move(v)}, line_no));
  }
  DS_RETURN_IF_ERROR(end_list());
  return apply_config_items(items, source, opts);
}

Status load_serve_config_toml(const std::filesystem::path& file, ServeOptions& opts) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return error("cannot read config file ", file.string());
  std::ostringstream os;
  os << in.rdbuf();
  return parse_serve_config_toml_text(os.str(), file.string(), opts);
}

bool is_yaml_config_path(const std::filesystem::path& file) {
  const std::string ext = lower(file.extension().string());
  return ext == ".yaml" || ext == ".yml";
}

Status load_serve_config_file(const std::filesystem::path& file, ServeOptions& opts) {
  if (!is_yaml_config_path(file)) return load_serve_config_toml(file, opts);
  std::ifstream in(file, std::ios::binary);
  if (!in) return error("cannot read config file ", file.string());
  std::ostringstream os;
  os << in.rdbuf();
  return parse_serve_config_yaml_text(os.str(), file.string(), opts);
}

void resolve_serve_defaults(ServeOptions& o) {
  // Giving --allowed-origins turns CORS on (so the effective config says so, and diffs see it),
  // unless --enable-cors itself is given (a full TOML dump names both).
  if (o.is_explicit("allowed-origins") && !o.is_explicit("enable-cors")) o.enable_cors = true;
  if (o.speculative_algorithm.empty() &&
      (o.speculative_num_steps > 0 || o.speculative_num_draft_tokens > 0)) {
    // SGLang requires the algorithm; we infer it, since the MTP head is the only drafter.
    o.speculative_algorithm = "NEXTN";
  }
  if (o.speculative_enabled()) {
    // Only the verified tokens given (SGLang reads them as steps + 1 with one draft per step).
    if (o.speculative_num_steps == 0 && o.speculative_num_draft_tokens > 1 && o.speculative_eagle_topk <= 1)
      o.speculative_num_steps = o.speculative_num_draft_tokens - 1;
    if (o.speculative_num_steps == 0) o.speculative_num_steps = 3;
    if (o.speculative_eagle_topk == 0) o.speculative_eagle_topk = 1;
    if (o.speculative_num_draft_tokens == 0 && o.speculative_eagle_topk == 1)
      o.speculative_num_draft_tokens = o.speculative_num_steps + 1;
  }
}

Status validate_serve_options(ServeOptions& o) {
  // These hold 0 for auto: an explicit 0 is refused, never read as auto ("auto" itself is not
  // explicit, set_serve_option); checked before the defaults resolve.
  for (auto [flag, zero] : {std::pair{"context-length", o.context_length == 0},
                            {"max-running-requests", o.max_running_requests == 0},
                            {"max-total-tokens", o.max_total_tokens == 0},
                            {"max-mamba-cache-size", o.max_mamba_cache_size == 0},
                            {"chunked-prefill-size", o.chunked_prefill_size == 0},
                            {"max-prefill-tokens", o.max_prefill_tokens == 0},
                            {"mixed-prefill-tokens", o.mixed_prefill_tokens == 0},
                            {"cuda-graph-max-bs", o.cuda_graph_max_bs == 0}, {"http-threads", o.http_threads == 0},
                            {"mem-fraction-static", o.mem_fraction_static == 0}, {"max-memory", o.max_memory == 0},
                            {"speculative-num-steps", o.speculative_num_steps == 0},
                            {"speculative-num-draft-tokens", o.speculative_num_draft_tokens == 0},
                            {"speculative-eagle-topk", o.speculative_eagle_topk == 0}})
    if (zero && o.is_explicit(flag)) return error("--", flag, " 0: give a positive value, or auto");
  resolve_serve_defaults(o);
  if (o.port < 0 || o.port > 65535) return error("--port must be 0..65535 (got ", o.port, ")");
  if (o.allowed_origins.find_first_not_of(", \t") == std::string::npos)
    return error("--allowed-origins names no origin: give origins (comma-separated), or * for any");
  if (o.tp_size < 1) return error("--tp-size must be at least 1 (got ", o.tp_size, ")");
  if (o.dp_size < 1) return error("--dp-size must be at least 1 (got ", o.dp_size, ")");
  if (o.nnodes < 1) return error("--nnodes must be at least 1 (got ", o.nnodes, ")");
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    return error("--node-rank ", o.node_rank, " is not in 0..", o.nnodes - 1, " (--nnodes ", o.nnodes, ")");
  if (o.dist_timeout < 1) return error("--dist-timeout must be at least 1 second (got ", o.dist_timeout, ")");
  if (o.nnodes > 1) {
    if (o.dist_init_addr.empty())
      return error("--nnodes ", o.nnodes, " needs --dist-init-addr HOST:PORT (where node 0 listens for the others)");
    if (auto a = parse_host_port(o.dist_init_addr); !a) return error("--dist-init-addr ", a.status().message());
    if (o.tp_size % o.nnodes != 0)
      return error("--tp-size ", o.tp_size, " cannot be split over --nnodes ", o.nnodes,
                   ": every node runs --tp-size / --nnodes ranks");
    if (o.dp_size != 1)
      return error("--dp-size ", o.dp_size, " with --nnodes ", o.nnodes, ": data parallelism over nodes is not built; "
                   "use --dp-size 1");
  } else if (!o.dist_init_addr.empty()) {
    if (auto a = parse_host_port(o.dist_init_addr); !a) return error("--dist-init-addr ", a.status().message());
  }
  if (o.threads < 0 || o.threads > kMaxThreads)
    return error("--threads must be 0..", kMaxThreads, " (0: all usable CPUs) (got ", o.threads, ")");
  // The engine holds these as int: a larger value is refused here, never narrowed (plan and serve
  // then agree).
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  for (auto [flag, v] : {std::pair{"tp-size", o.tp_size}, {"dp-size", o.dp_size}, {"nnodes", o.nnodes},
                         {"context-length", o.context_length}, {"max-running-requests", o.max_running_requests},
                         {"max-total-tokens", o.max_total_tokens}, {"max-mamba-cache-size", o.max_mamba_cache_size},
                         {"chunked-prefill-size", o.chunked_prefill_size}, {"max-prefill-tokens", o.max_prefill_tokens},
                         {"mixed-prefill-tokens", o.mixed_prefill_tokens}, {"cuda-graph-max-bs", o.cuda_graph_max_bs}})
    if (v > kIntMax) return error("--", flag, " must be at most ", kIntMax, " (got ", v, ")");
  if (o.cuda_graph_max_bs < 0) return error("--cuda-graph-max-bs must be positive, or auto (got ", o.cuda_graph_max_bs, ")");
  if (!(o.watchdog_timeout >= 0) || o.watchdog_timeout > 604800)
    return error("--watchdog-timeout must be 0..604800 seconds (0: off) (got ", o.watchdog_timeout, ")");
  if (!(o.shutdown_timeout >= 0) || o.shutdown_timeout > 86400)
    return error("--shutdown-timeout must be 0..86400 seconds (got ", o.shutdown_timeout, ")");
  if (o.http_threads < 0 || o.http_threads > 256)
    return error("--http-threads must be 1..256, or auto (got ", o.http_threads, ")");
  if (o.mem_fraction_static < 0 || o.mem_fraction_static >= 1)
    return error("--mem-fraction-static must be in (0, 1), e.g. 0.88 (got ", o.mem_fraction_static, ")");
  if (o.mamba_full_memory_ratio <= 0 || o.mamba_full_memory_ratio > 100)
    return error("--mamba-full-memory-ratio must be a positive ratio such as 0.9 (got ",
                 o.mamba_full_memory_ratio, ")");
  if (o.context_length < 0) return error("--context-length must be positive (got ", o.context_length, ")");
  if (o.max_running_requests < 0)
    return error("--max-running-requests must be positive (got ", o.max_running_requests, ")");
  if (o.max_total_tokens < 0) return error("--max-total-tokens must be positive");
  if (o.max_mamba_cache_size < 0) return error("--max-mamba-cache-size must be positive");
  if (o.max_memory < 0) return error("--max-memory must be positive");
  if (o.dtype == "float16")
    return error("--dtype float16 is not built: the matmul weights load in bfloat16 (--dtype bfloat16 or auto) or, on the "
                 "CPU, float32");
  if (!o.quantization.empty())
    return error("--quantization ", o.quantization, " is not built: deltaserve loads unquantized checkpoints (bf16, f16 "
                 "or f32 weights); remove the flag, and point --model-path at an unquantized checkpoint");
  if (o.log_requests_level < 0 || o.log_requests_level > 3)
    return error("--log-requests-level must be 0..3 (got ", o.log_requests_level, ")");
  // (The default level alone is accepted: a full config dump writes every key.)
  if (o.is_explicit("log-requests-level") && !o.log_requests && o.log_requests_level != ServeOptions().log_requests_level)
    return error("--log-requests-level sets what --log-requests logs: add --log-requests (or drop the level)");
  if (o.stream_interval < 1 || o.stream_interval > 1024)
    return error("--stream-interval must be 1..1024 (got ", o.stream_interval, ")");
  if (o.page_size < 1 || o.page_size > 4096)
    return error("--page-size must be 1..4096 (got ", o.page_size, ")");
  if (o.chunked_prefill_size < 0 && o.chunked_prefill_size != -1)
    return error("--chunked-prefill-size must be positive");
  if (o.max_prefill_tokens < 0) return error("--max-prefill-tokens must be positive");
  if (o.mixed_prefill_tokens < 0) return error("--mixed-prefill-tokens must be positive");
  if (o.max_request_bytes < 1024) return error("--max-request-bytes must be at least 1KiB");
  if (!o.speculative_enabled()) {
    if (o.speculative_eagle_topk != 0)
      return error("--speculative-eagle-topk is set but speculative decoding is off: add "
                   "--speculative-algorithm NEXTN");
    if (!o.speculative_token_map.empty())
      return error("--speculative-token-map is set but speculative decoding is off: add "
                   "--speculative-algorithm NEXTN");
    return Status::ok();
  }
  if (o.speculative_num_steps < 1 || o.speculative_num_steps > 8)
    return error("--speculative-num-steps must be 1..8 (got ", o.speculative_num_steps, ")");
  if (o.speculative_eagle_topk != 1)
    return error("--speculative-eagle-topk ", o.speculative_eagle_topk,
                 ": not supported yet (only 1, chained drafts); remove it or set it to 1");
  if (o.speculative_num_draft_tokens != o.speculative_num_steps + 1)
    return error("--speculative-num-draft-tokens must be --speculative-num-steps + 1 when "
                 "--speculative-eagle-topk is 1: set --speculative-num-draft-tokens ",
                 o.speculative_num_steps + 1, " (or leave it out), got ",
                 o.speculative_num_draft_tokens);
  return Status::ok();
}

std::vector<std::string> unsupported_option_warnings(const ServeOptions& opts) {
  std::vector<std::string> out;
  std::string names;
  for (const Row& r : rows()) {
    if (r.spec.support != FlagSupport::Ignored || !opts.is_explicit(r.spec.name)) continue;
    if (!names.empty()) names += ", ";
    names += str_cat("--", r.spec.name);
  }
  if (!names.empty()) out.push_back("accepted for SGLang compatibility, no effect here: " + names);
  // One node has nothing to join: SGLang ignores these too, but a unit file that sets them expects a
  // multi-node group, so the start-up log says they did nothing.
  if (opts.nnodes <= 1) {
    std::string dist;
    for (const char* flag : {"dist-init-addr", "dist-timeout"})
      if (opts.is_explicit(flag)) dist += str_cat(dist.empty() ? "" : ", ", "--", flag);
    if (!dist.empty()) out.push_back(str_cat(dist, ": no effect with --nnodes 1 (one node has no others to join)"));
  }
  if (opts.chunked_prefill_size == -1)
    out.push_back("--chunked-prefill-size -1 (SGLang: no chunking) is not built: prefills are chunked at the auto "
                  "size (8192 tokens on GPU, 512 on CPU)");
  return out;
}

Status refuse_separate_bool_value(const FlagSpec& flag, std::string_view next) {
  const std::string t = lower(next);
  for (const char* word : {"true", "false", "1", "0", "yes", "no", "on", "off"})
    if (t == word)
      return error("--", flag.name, " takes no separate value (use --", flag.name, "=", t, ")");
  return Status::ok();
}

namespace {
// The flags of one scope the user set, as "--name", in table order.
std::vector<std::string> explicit_of(const ServeOptions& opts, FlagScope scope) {
  std::vector<std::string> out;
  for (const Row& r : rows())
    if (r.spec.scope == scope && opts.is_explicit(r.spec.name)) out.push_back(str_cat("--", r.spec.name));
  return out;
}
}  // namespace

std::vector<std::string> explicit_serve_only_flags(const ServeOptions& opts) { return explicit_of(opts, FlagScope::Serve); }

std::vector<std::string> explicit_gpu_only_flags(const ServeOptions& opts) {
  std::vector<std::string> out = explicit_of(opts, FlagScope::Gpu);
  // --sampling-backend device: a GPU kernel draws the tokens.
  if (opts.sampling_backend == "device") out.push_back("--sampling-backend device");
  return out;
}

std::vector<std::pair<std::string, std::string>> effective_config(const ServeOptions& opts) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Row& r : rows()) {
    if (std::string_view(r.spec.name) == "help") continue;
    std::string v = render(r, opts);
    if (std::string_view(r.spec.name) == "state-dir" && v.empty()) v = default_state_dir().string();
    out.emplace_back(r.spec.name, v);
  }
  return out;
}

std::string serve_option_text(const ServeOptions& opts, std::string_view canonical_name) {
  const Row* r = find_row(canonical_name);
  return r ? render(*r, opts) : std::string();
}

FlagType serve_flag_type(std::string_view canonical_name) {
  const Row* r = find_row(canonical_name);
  return r ? r->spec.type : FlagType::String;
}

std::vector<std::string> explicit_args(const ServeOptions& opts) {
  std::vector<std::string> out;
  for (const Row& r : rows()) {
    if (!opts.is_explicit(r.spec.name) || std::string_view(r.spec.name) == "help") continue;
    std::string v = render(r, opts);
    if (r.spec.type == FlagType::Bool) {
      out.push_back(str_cat("--", r.spec.name) + (v == "true" ? "" : "=false"));
    } else {
      out.push_back(str_cat("--", r.spec.name));
      out.push_back(v);
    }
  }
  return out;
}

namespace {
std::string toml_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') { out += "\\n"; continue; }
    out += c;
  }
  return out + "\"";
}
}  // namespace

bool is_secret_serve_flag(std::string_view name) {
  while (!name.empty() && name.front() == '-') name.remove_prefix(1);
  const FlagSpec* f = find_serve_flag(name);
  return f && std::string_view(f->name) == "api-key";
}

std::vector<std::pair<std::string, std::string>> redact_secret_settings(
    std::vector<std::pair<std::string, std::string>> settings) {
  for (auto& [k, v] : settings)
    if (!v.empty() && is_secret_serve_flag(k)) v = kRedactedValue;
  return settings;
}

std::vector<std::string> redact_secret_args(std::vector<std::string> args) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("-", 0) != 0) continue;
    const std::size_t eq = a.find('=');
    if (!is_secret_serve_flag(a.substr(0, eq))) continue;
    if (eq != std::string::npos) {
      args[i] = a.substr(0, eq + 1) + kRedactedValue;
    } else if (i + 1 < args.size()) {
      args[++i] = kRedactedValue;
    }
  }
  return args;
}

std::string serve_options_to_toml(const ServeOptions& opts, bool all) {
  std::string out = "# deltaserve serve settings (keys are `deltaserve serve` flags)\n";
  for (const Row& r : rows()) {
    std::string_view name = r.spec.name;
    if (name == "help" || name == "config") continue;
    if (!all && !opts.is_explicit(name)) continue;
    std::string v = render(r, opts);
    std::string key(name);
    std::replace(key.begin(), key.end(), '-', '_');
    if (is_secret_serve_flag(name)) {
      out += "# " + key + (v.empty() ? " is not set" : " is set (not shown; pass it with --" + std::string(name) + ")") + "\n";
      continue;
    }
    bool bare = (r.spec.type == FlagType::Bool) ||
                ((r.spec.type == FlagType::Int || r.spec.type == FlagType::Float) && v != "auto");
    out += key + " = " + (bare ? v : toml_quote(v)) + "\n";
  }
  return out;
}

std::string serve_options_help() {
  std::string out =
      "usage: deltaserve serve --model-path DIR [flags]\n"
      "Flags use SGLang's names; `--name value`, `--name=value`; `--config FILE.yaml` (or .toml) holds the\n"
      "same keys. (*) changes speed or memory; [no effect] is accepted for SGLang command lines and\n"
      "does nothing here (a start-up note names it). A value that is not built is refused.\n\n";
  for (const Row& r : rows()) {
    const FlagSpec& s = r.spec;
    std::string left = str_cat("  --", s.name);
    if (s.type != FlagType::Bool) {
      left += s.type == FlagType::Choice ? str_cat(" {", choice_list(s), "}")
              : s.type == FlagType::Int   ? " N"
              : s.type == FlagType::Float ? " X"
              : s.type == FlagType::Bytes ? " BYTES"
                                          : " TEXT";
    }
    out += left;
    out += std::string(left.size() < 44 ? 44 - left.size() : 1, ' ');
    out += s.help;
    if (*s.default_value) out += str_cat(" [default ", s.default_value, "]");
    if (s.affects_performance) out += " (*)";
    if (s.support == FlagSupport::Ignored) out += " [no effect]";
    if (*s.aliases) {
      out += " (also";
      for (const auto& a : split_commas(s.aliases)) out += (a.size() == 1 ? " -" : " --") + a;
      out += ")";
    }
    out += "\n";
  }
  return out;
}

Result<int64_t> parse_byte_size(std::string_view option, std::string_view text) {
  std::string t = lower(text);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (t == "auto") return int64_t{0};
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(t.c_str(), &end);
  if (t.empty() || end == t.c_str() || errno == ERANGE || !std::isfinite(v) || v < 0)
    return error("--", std::string(option), ": '", std::string(text),
                 "' is not a size (e.g. 64GiB, 512MiB, 4096)");
  std::string unit(end);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "tb") mult = 1e12;
  else
    return error("--", std::string(option), ": unknown size unit '", unit, "' in '",
                 std::string(text), "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  double bytes = v * mult;
  if (bytes > 9.0e18) return error("--", std::string(option), ": '", std::string(text), "' is too large");
  return static_cast<int64_t>(std::llround(bytes));
}

std::string format_byte_size(int64_t bytes) {
  // Exact: the largest binary unit that divides the size, else bytes. A rounded "976.56KiB" read
  // back is another size (a unit file or a TOML dump must give serve what was typed).
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes == 0) return "0";
  int u = 0;
  int64_t v = bytes;
  while (u < 4 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return std::to_string(v) + kUnits[u];
}

std::string default_model_dir() {
  if (const char* env = std::getenv("DELTASERVE_MODEL"); env && *env) return env;
  return std::string(DELTASERVE_SOURCE_DIR) + "/models/tiny-coder";
}

std::filesystem::path default_state_dir() {
  // A relative XDG_STATE_HOME is to be ignored (XDG Base Directory spec); without HOME, the user's
  // home from the password database; only then a folder of the working directory, made absolute,
  // so that serve and history run from elsewhere still name the same database.
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x == '/') return std::filesystem::path(x) / "deltaserve";
  if (const char* h = std::getenv("HOME"); h && *h) return std::filesystem::path(h) / ".local" / "state" / "deltaserve";
  if (const passwd* pw = getpwuid(geteuid()); pw && pw->pw_dir && *pw->pw_dir == '/')
    return std::filesystem::path(pw->pw_dir) / ".local" / "state" / "deltaserve";
  std::error_code ec;
  return std::filesystem::absolute(".deltaserve-state", ec);
}

}  // namespace deltaserve
