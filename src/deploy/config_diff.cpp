#include "deploy/config_diff.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "deploy/launch_db.h"
#include "deploy/unit_file.h"
#include "util/json_parse.h"

namespace deltaserve {
namespace fs = std::filesystem;
namespace {

bool read_file(const fs::path& p, std::string* out) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return false;
  std::ostringstream os;
  os << in.rdbuf();
  *out = os.str();
  return true;
}

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

bool is_var_assignment(const std::string& w) {
  auto eq = w.find('=');
  if (eq == std::string::npos || eq == 0) return false;
  for (size_t i = 0; i < eq; ++i) {
    char c = w[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return !std::isdigit(static_cast<unsigned char>(w[0]));
}

std::string basename_of(const std::string& w) {
  auto slash = w.rfind('/');
  return slash == std::string::npos ? w : w.substr(slash + 1);
}

// Notes for settings that change speed or memory.
const std::map<std::string, std::string>& perf_notes() {
  static const std::map<std::string, std::string> k = {
      {"speculative-num-steps", "MTP draft steps per verification: more steps, more tokens per step when drafts are accepted (speed)"},
      {"speculative-num-draft-tokens", "tokens verified per step (speed, pending GDN rows)"},
      {"speculative-algorithm", "speculative decoding on/off (speed)"},
      {"speculative-eagle-topk", "drafts per step (speed)"},
      {"context-length", "longest request; bounds KV the scheduler reserves (memory)"},
      {"mem-fraction-static", "GPU memory for weights + KV + state (memory, concurrency)"},
      {"max-running-requests", "requests decoding at once (throughput under load)"},
      {"tp-size", "GPUs per replica (speed, memory per GPU)"},
      {"mamba-full-memory-ratio", "state slots vs KV split (concurrency vs context)"},
      {"max-total-tokens", "KV capacity (memory)"},
      {"max-mamba-cache-size", "GDN state slots (concurrency)"},
      {"chunked-prefill-size", "prefill chunk (TTFT vs decode stalls, activation memory)"},
      {"max-prefill-tokens", "prefill tokens per step (TTFT vs ITL)"},
      {"mixed-prefill-tokens", "prefill tokens beside running decodes (TTFT of arrivals vs ITL of running requests)"},
      {"max-memory", "CPU memory budget (memory)"},
      {"kv-cache-dtype", "KV bytes per token (memory, accuracy)"},
      {"dtype", "weight/activation precision (speed, memory)"},
      {"disable-cuda-graph", "decode launch overhead (speed)"},
      {"disable-overlap-schedule", "host work between decode steps (speed)"},
      {"cuda-graph-max-bs", "largest graph-captured batch (speed)"},
      {"sampling-backend", "where non-greedy tokens are drawn (speed under sampling)"},
      {"disable-radix-cache", "prefix reuse (TTFT for shared prompts)"},
      {"device", "CPU vs GPU (speed)"},
      {"threads", "CPU kernel threads (speed)"},
  };
  return k;
}

Result<ConfigSource> from_args(const std::vector<std::string>& args, const std::string& label,
                               const std::string& kind, KeyValues env) {
  auto opts = parse_serve_args_raw(args);
  if (!opts) return error(label, ": ", opts.status().message());
  ConfigSource src;
  src.label = label;
  src.kind = kind;
  src.options = std::move(*opts);
  ServeOptions check = src.options;
  Status v = validate_serve_options(check);
  if (!v) src.notes.push_back("this configuration would not start: " + v.message());
  resolve_serve_defaults(src.options);
  src.settings = effective_config(src.options);
  src.environment = std::move(env);
  return src;
}

}  // namespace

std::vector<std::string> split_shell_commands(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    if (cur.find_first_not_of(" \t\r\n") != std::string::npos) out.push_back(cur);
    cur.clear();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\\' && i + 1 < text.size()) {
      cur += c;
      cur += text[++i];
    } else if (c == '\'' || c == '"') {
      size_t close = i + 1;  // (an unterminated quote runs to the end: split_command_words says so)
      while (close < text.size() && text[close] != c) close += c == '"' && text[close] == '\\' ? 2 : 1;
      const size_t end = std::min(text.size(), close + 1);
      cur += text.substr(i, end - i);
      i = end - 1;
    } else if (c == '\n' || c == ';' || c == '|' || (c == '&' && !(!cur.empty() && cur.back() == '>') &&
                                                      !(i + 1 < text.size() && text[i + 1] == '>'))) {
      flush();
    } else {
      cur += c;
    }
  }
  flush();
  return out;
}

Result<std::vector<std::string>> split_command_words(const std::string& text,
                                                     const std::vector<std::pair<std::string, std::string>>& vars,
                                                     WordSyntax syntax, KeyValues* assigned) {
  const bool shell = syntax == WordSyntax::Shell;
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  bool quoted = false;  // the word has a quoted or escaped part (a quoted ";" is not a separator)
  auto lookup = [&](const std::string& name, std::string* out) {
    if (assigned)
      for (auto it = assigned->rbegin(); it != assigned->rend(); ++it)
        if (it->first == name) {
          *out = it->second;
          return true;
        }
    for (auto it = vars.rbegin(); it != vars.rend(); ++it)
      if (it->first == name) {
        *out = it->second;
        return true;
      }
    return false;
  };
  bool skip_next_word = false;  // the target of a redirection
  auto finish = [&]() {
    if (!in_word) return;
    if (skip_next_word) {
      skip_next_word = false;
    } else {
      words.push_back(cur);
    }
    cur.clear();
    in_word = false;
    quoted = false;
  };
  // `split`: unquoted in a shell text, where the value splits into words at blanks (ARGS="--a 1"
  // then $ARGS is two words; an empty one, none).
  // $NAME and ${NAME} inside a ${NAME:-word} default (one level: what launch scripts use).
  auto expand_word = [&](const std::string& word) {
    std::string out;
    for (size_t k = 0; k < word.size(); ++k) {
      if (word[k] != '$' || k + 1 >= word.size()) { out += word[k]; continue; }
      size_t j = k + 1;
      std::string name;
      const bool braced = word[j] == '{';
      if (braced) {
        const size_t close = word.find('}', j);
        if (close == std::string::npos) { out += word[k]; continue; }
        name = word.substr(j + 1, close - j - 1);
        j = close + 1;
      } else {
        while (j < word.size() && (std::isalnum(static_cast<unsigned char>(word[j])) || word[j] == '_')) name += word[j++];
      }
      std::string value;
      if (name.empty() || !lookup(name, &value)) { out += word[k]; continue; }
      out += value;
      k = j - 1;
    }
    return out;
  };
  auto expand = [&](size_t& i, bool split) {  // text[i] == '$'
    std::string name;
    size_t j = i + 1;
    std::string value;
    if (j < text.size() && text[j] == '{') {
      // The closing brace of this expansion (a default may hold ${OTHER}).
      size_t close = j + 1;
      for (int depth = 1; close < text.size(); ++close) {
        if (text[close] == '{') ++depth;
        if (text[close] == '}' && --depth == 0) break;
      }
      if (close >= text.size()) return false;
      const std::string inner = text.substr(j + 1, close - j - 1);
      size_t n = 0;
      while (n < inner.size() && (std::isalnum(static_cast<unsigned char>(inner[n])) || inner[n] == '_')) ++n;
      name = inner.substr(0, n);
      if (name.empty()) return false;
      if (n == inner.size()) {
        if (!lookup(name, &value)) return false;
      } else {
        // ${NAME:-word} (unset or empty: word), ${NAME-word} (unset: word), and the := / = forms,
        // which also assign NAME for what follows (`: ${PORT:=30000}` then $PORT). A variable
        // this text does not set is taken as unset: its default is what the script runs with.
        if (!shell) return false;  // (systemd expands ${NAME} only)
        const bool colon = inner[n] == ':';
        const size_t op = n + (colon ? 1 : 0);
        if (op >= inner.size() || (inner[op] != '-' && inner[op] != '=')) return false;
        const bool assign = inner[op] == '=';
        const std::string word = expand_word(inner.substr(op + 1));
        const bool set = lookup(name, &value);
        if (!set || (colon && value.empty())) {
          value = word;
          if (assign && assigned) assigned->emplace_back(name, value);
        }
      }
      j = close + 1;
    } else {
      while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '_')) name += text[j++];
      if (name.empty() || !lookup(name, &value)) return false;
    }
    i = j - 1;
    if (!split) {
      cur += value;
      in_word = true;
      return true;
    }
    for (char ch : value) {
      if (ch == ' ' || ch == '\t' || ch == '\n') {
        finish();
      } else {
        cur += ch;
        in_word = true;
      }
    }
    return true;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\\') {
      if (i + 1 < text.size() && text[i + 1] == '\n') { ++i; continue; }
      if (i + 2 < text.size() && text[i + 1] == '\r' && text[i + 2] == '\n') { i += 2; continue; }
      if (i + 1 < text.size()) { cur += text[++i]; in_word = true; quoted = true; }
      continue;
    }
    if (c == '\'') {
      size_t close = text.find('\'', i + 1);
      if (close == std::string::npos) return error("unterminated ' quote");
      cur += text.substr(i + 1, close - i - 1);
      in_word = true;
      quoted = true;
      i = close;
      continue;
    }
    if (c == '"') {
      in_word = true;
      quoted = true;
      size_t j = i + 1;
      for (; j < text.size() && text[j] != '"'; ++j) {
        if (text[j] == '\\' && j + 1 < text.size() && std::string("\"\\$`\n").find(text[j + 1]) != std::string::npos) {
          if (text[j + 1] != '\n') cur += text[j + 1];
          ++j;
        } else if (text[j] == '$') {
          if (!expand(j, false)) cur += '$';
        } else {
          cur += text[j];
        }
      }
      if (j >= text.size()) return error("unterminated \" quote");
      i = j;
      continue;
    }
    if (c == '$') {
      if (!expand(i, shell)) { cur += '$'; in_word = true; }
      continue;
    }
    if (!shell) {
      if (std::isspace(static_cast<unsigned char>(c))) {
        if (in_word && cur == ";" && !quoted) {  // a lone ";": the next command
          cur.clear();
          in_word = false;
          if (!words.empty()) break;
          continue;
        }
        finish();
        continue;
      }
      cur += c;
      in_word = true;
      continue;
    }
    if (c == '#' && !in_word) {  // comment to end of line
      while (i < text.size() && text[i] != '\n') ++i;
      finish();
      if (!words.empty()) break;
      continue;
    }
    if (c == '\n' || c == ';' || c == '|' || c == '&') {
      // "2>&1" is a redirection, not a control operator.
      if (c == '&' && !cur.empty() && cur.back() == '>') { cur += c; continue; }
      finish();
      if (!words.empty()) break;
      continue;
    }
    if (c == '>' || c == '<') {
      // Redirections: drop "N>file", "> file", ">>file", "2>&1".
      bool digits = !cur.empty() && std::all_of(cur.begin(), cur.end(), ::isdigit);
      if (digits) { cur.clear(); in_word = false; }
      else finish();
      size_t j = i;
      while (j + 1 < text.size() && (text[j + 1] == '>' || text[j + 1] == '&')) ++j;
      i = j;
      if (text[j] == '&') {  // >&1
        while (i + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[i + 1]))) ++i;
      } else {
        skip_next_word = true;
      }
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c))) {
      finish();
      continue;
    }
    cur += c;
    in_word = true;
  }
  if (!shell && in_word && cur == ";" && !quoted) return words;
  finish();
  return words;
}

bool find_server_args(const std::vector<std::string>& words, std::vector<std::string>* args, KeyValues* env) {
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    const std::string base = basename_of(w);
    if (w == "-m" && i + 1 < words.size() &&
        (words[i + 1] == "sglang.launch_server" || words[i + 1] == "sglang_router.launch_server")) {
      args->assign(words.begin() + static_cast<long>(i) + 2, words.end());
    } else if ((base == "sglang" || base == "deltaserve") && i + 1 < words.size() && words[i + 1] == "serve") {
      args->assign(words.begin() + static_cast<long>(i) + 2, words.end());
    } else {
      continue;
    }
    if (env)
      for (size_t k = 0; k < i; ++k)
        if (is_var_assignment(words[k])) {
          auto eq = words[k].find('=');
          env->emplace_back("env:" + words[k].substr(0, eq), words[k].substr(eq + 1));
        }
    return true;
  }
  return false;
}

Result<ConfigSource> config_source_from_unit(const std::string& text, const std::string& name,
                                             const std::vector<UnitDropIn>& drop_ins) {
  DS_ASSIGN_OR_RETURN(UnitExec unit, read_unit_exec(text, name, drop_ins));
  KeyValues env;
  for (const auto& [k, v] : unit.environment) env.emplace_back("env:" + k, v);
  std::vector<std::string> args;
  std::vector<std::string> words = unit.words;
  // ExecStart=/bin/sh -c 'SCRIPT' (for a pipe or a redirection): the script as that shell reads it,
  // its $VARs from the unit's environment. The shell's options come before the script, -c among
  // them in any spelling: `bash -lc`, `-ec`, `-l -c`, `-euo pipefail -c`, `--login -c`.
  for (size_t i = 0; i + 2 < words.size(); ++i) {
    const std::string base = basename_of(words[i]);
    if (base != "sh" && base != "bash" && base != "dash" && base != "zsh") continue;
    bool dash_c = false;
    size_t k = i + 1;
    for (; k < words.size(); ++k) {
      const std::string& w = words[k];
      if (w == "--") { ++k; break; }
      if (w.rfind("--", 0) == 0) continue;  // --login, --norc, --noprofile
      if (w.size() < 2 || (w[0] != '-' && w[0] != '+')) break;
      const std::string cluster = w.substr(1);
      if (!std::all_of(cluster.begin(), cluster.end(), [](char ch) { return std::isalpha(static_cast<unsigned char>(ch)); }))
        break;
      if (w[0] == '-' && cluster.find('c') != std::string::npos) dash_c = true;
      if (cluster.back() == 'o' || cluster.back() == 'O') ++k;  // -o OPTION / +O shopt: its argument
    }
    if (dash_c && k < words.size()) {
      // The script's commands in turn ("source venv/bin/activate && exec python3 -m ..."): the
      // first that runs the server.
      const std::string script = words[k];
      words.clear();
      std::vector<std::pair<std::string, std::string>> vars = unit.environment;
      for (const auto& command : split_shell_commands(script)) {
        KeyValues assigned;  // ${NAME:=word}
        auto inner = split_command_words(command, vars, WordSyntax::Shell, &assigned);
        if (!inner) return error(name, ": ExecStart= ", base, " -c: ", inner.status().message());
        vars.insert(vars.end(), assigned.begin(), assigned.end());
        std::vector<std::string> probe;
        if (find_server_args(*inner, &probe)) {
          words = std::move(*inner);
          break;
        }
      }
      break;
    }
  }
  if (!find_server_args(words, &args, &env))
    return error(name, ": ExecStart= does not run sglang.launch_server, `sglang serve` or `deltaserve serve`");
  // systemd runs no shell: a pipe or a redirection in ExecStart= reaches the server as arguments.
  for (const auto& a : args)
    if (a == "|" || a == "||" || a == "&&" || a == "&" || a == "2>&1" || a.rfind(">", 0) == 0 ||
        a.rfind("2>", 0) == 0 || a.rfind("<", 0) == 0 || a.rfind("|", 0) == 0)
      return error(name, ": ExecStart= passes '", a,
                   "' to the server as an argument (systemd runs no shell: a pipe or a redirection needs "
                   "/bin/sh -c '...')");
  auto src = from_args(args, name, "systemd-unit", env);
  if (!src) return error(src.status().message() + " (in ExecStart=)");
  for (auto& n : unit.notes) src->notes.push_back(n);
  return src;
}

Result<ConfigSource> config_source_from_script(const std::string& text, const std::string& name) {
  // Simple VAR=value assignments (and `export VAR=value`) before the launch line are substituted.
  std::vector<std::pair<std::string, std::string>> vars;
  std::string joined;
  {
    std::stringstream ss(text);
    std::string line, acc;
    std::vector<std::string> logical;
    while (std::getline(ss, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty() && line.back() == '\\') {
        acc += line.substr(0, line.size() - 1) + " ";
        continue;
      }
      logical.push_back(acc + line);
      acc.clear();
    }
    if (!acc.empty()) logical.push_back(acc);
    std::vector<std::string> exported;
    std::vector<std::string> commands;  // each line's commands ("source venv/bin/activate && exec python3 -m ...")
    for (const auto& l : logical) {
      const std::string t = trim(l);
      if (t.empty() || t[0] == '#') continue;
      for (auto& c : split_shell_commands(t)) commands.push_back(std::move(c));
    }
    for (const auto& command : commands) {
      std::string t = trim(command);
      if (t.empty() || t[0] == '#') continue;
      bool is_export = t.rfind("export ", 0) == 0;
      if (is_export) t = trim(t.substr(7));
      KeyValues assigned;  // ${NAME:=word}
      auto words = split_command_words(t, vars, WordSyntax::Shell, &assigned);
      if (!words) return error(name, ": ", words.status().message());
      vars.insert(vars.end(), assigned.begin(), assigned.end());
      if (words->empty()) continue;
      std::vector<std::string> args;
      KeyValues env;
      if (find_server_args(*words, &args, &env)) {
        for (const auto& [k, v] : vars)  // exported variables reach the server's environment
          if (std::find(exported.begin(), exported.end(), k) != exported.end()) env.emplace_back("env:" + k, v);
        return from_args(args, name, "command", env);
      }
      if (words->size() == 1 && is_var_assignment((*words)[0])) {
        auto eq = (*words)[0].find('=');
        vars.emplace_back((*words)[0].substr(0, eq), (*words)[0].substr(eq + 1));
        if (is_export) exported.push_back((*words)[0].substr(0, eq));
      }
    }
  }
  return error(name, ": no `python -m sglang.launch_server`, `sglang serve` or `deltaserve serve` command found");
}

Result<ConfigSource> config_source_from_toml(const std::string& text, const std::string& name) {
  return config_source_from_config_file(text, name, "toml");
}

Result<ConfigSource> config_source_from_yaml(const std::string& text, const std::string& name) {
  return config_source_from_config_file(text, name, "yaml");
}

Result<ConfigSource> config_source_from_config_file(const std::string& text, const std::string& name,
                                                    const std::string& kind) {
  ConfigSource src;
  src.label = name;
  src.kind = kind;
  Status s = kind == "yaml" ? parse_serve_config_yaml_text(text, name, src.options)
                            : parse_serve_config_toml_text(text, name, src.options);
  if (!s) return s;
  ServeOptions check = src.options;
  Status v = validate_serve_options(check);
  if (!v) src.notes.push_back("this configuration would not start: " + v.message());
  resolve_serve_defaults(src.options);
  src.settings = effective_config(src.options);
  return src;
}

ConfigSource config_source_from_settings(const KeyValues& settings, const std::vector<std::string>& args,
                                         const std::string& label, KeyValues environment) {
  ConfigSource src;
  src.label = label;
  src.kind = "launch";
  src.environment = std::move(environment);
  // Explicit settings first (so is_explicit holds), then the recorded effective values win.
  // (explicit_args' forms: "--name value", and "--name" / "--name=false" for a boolean.)
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].rfind("--", 0) != 0) continue;
    const size_t eq = args[i].find('=');
    const FlagSpec* f = find_serve_flag(args[i].substr(0, eq));
    if (!f) continue;
    Status ignored;
    if (f->type == FlagType::Bool)
      ignored = set_serve_option(src.options, f->name, eq == std::string::npos ? "true" : args[i].substr(eq + 1));
    else if (eq != std::string::npos)
      ignored = set_serve_option(src.options, f->name, args[i].substr(eq + 1));
    else if (i + 1 < args.size())
      ignored = set_serve_option(src.options, f->name, args[++i]);
    (void)ignored;
  }
  src.settings = settings;  // exactly what that launch ran with
  for (auto& [k, v] : src.settings) {
    const FlagSpec* f = find_serve_flag(k);
    if (!f) {
      src.notes.push_back("recorded setting '" + k + "' is unknown to this deltaserve");
      continue;
    }
    ServeOptions probe = src.options;
    if (set_serve_option(probe, k, v)) {
      const bool was_explicit = src.options.is_explicit(f->name);
      src.options = std::move(probe);
      if (!was_explicit) src.options.explicit_keys.erase(f->name);
      // A synonym an older record kept as typed (bfloat16, flashinfer) reads as its one value.
      if (f->type == FlagType::Choice) v = serve_option_text(src.options, f->name);
    }
  }
  return src;
}

namespace {
Result<ConfigSource> load_config_source_unredacted(const std::string& spec, const fs::path& state_dir) {
  const bool digits = !spec.empty() && std::all_of(spec.begin(), spec.end(), ::isdigit);
  std::error_code ec;
  if (digits && !fs::exists(spec, ec)) {
    int64_t id = 0;
    if (std::from_chars(spec.data(), spec.data() + spec.size(), id).ec != std::errc())
      return error("'", spec, "' is not a launch id: too large (see `deltaserve history`)");
    auto db = LaunchDb::open_for_reading(state_dir);
    if (!db) return db.status();
    if (!*db) return error("launch #", id, " is not in ", state_dir.string(), ": no launch database there");
    auto rec = (*db)->get(id);
    if (!rec) return rec.status();
    ConfigSource src = config_source_from_settings(rec->config, rec->args, "launch #" + spec, recorded_environment(*rec));
    src.resolved = resolved_launch_values(*rec);
    return src;
  }
  if (fs::exists(spec, ec)) {
    std::string text;
    if (fs::is_directory(spec, ec) || !read_file(spec, &text)) return error("cannot read ", spec);
    const std::string label = fs::path(spec).filename().string();
    const std::string ext = fs::path(spec).extension().string();
    if (ext == ".toml") return config_source_from_toml(text, label);
    if (is_yaml_config_path(spec)) return config_source_from_yaml(text, label);  // SGLang's --config
    if (ext == ".service" || text.find("[Service]") != std::string::npos) {
      DS_ASSIGN_OR_RETURN(std::vector<UnitDropIn> drop_ins, read_unit_drop_ins(spec, label));
      return config_source_from_unit(text, label, drop_ins);
    }
    return config_source_from_script(text, label);
  }
  if (spec.find(' ') != std::string::npos) return config_source_from_script(spec, "command line");
  return error("'", spec, "' is not a launch id, a readable file, or a command line");
}
}  // namespace

Result<ConfigSource> load_config_source(const std::string& spec, const fs::path& state_dir) {
  auto src = load_config_source_unredacted(spec, state_dir);
  if (!src) return src;
  for (const auto& [k, v] : src->settings)
    if (!v.empty() && is_secret_serve_flag(k) && v != kRedactedValue) src->secrets.emplace_back(k, v);
  src->settings = redact_secret_settings(std::move(src->settings));  // printed by show / diff
  // A secret given as `--api-key $SGLANG_API_KEY` is also the value of that variable, which show
  // and diff print with the environment: any variable that holds a secret's value (or contains it,
  // ARGS="--api-key sk-...") is redacted too. Its own value joins `secrets`, so that a diff still
  // tells two keys apart without printing either.
  const size_t n_secrets = src->secrets.size();
  for (auto& [k, v] : src->environment) {
    bool secret = false;
    for (size_t i = 0; i < n_secrets && !secret; ++i) secret = v.find(src->secrets[i].second) != std::string::npos;
    if (!secret) continue;
    src->secrets.emplace_back(k, v);
    v = kRedactedValue;
  }
  return src;
}

std::vector<DiffRow> diff_settings(const KeyValues& a, const KeyValues& b) {
  std::vector<DiffRow> rows;
  std::vector<std::string> keys;
  for (const auto& [k, v] : a) keys.push_back(k);
  for (const auto& [k, v] : b)
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  auto get = [](const KeyValues& kv, const std::string& key, bool* found) {
    for (const auto& [k, v] : kv)
      if (k == key) {
        *found = true;
        return v;
      }
    *found = false;
    return std::string("(unset)");
  };
  for (const auto& k : keys) {
    if (k == "config" || k == "state-dir") continue;  // where it came from, not what it is
    bool fa, fb;
    std::string va = get(a, k, &fa), vb = get(b, k, &fb);
    if (va == vb) continue;
    DiffRow r;
    r.key = k;
    r.a = va.empty() ? "(none)" : va;
    r.b = vb.empty() ? "(none)" : vb;
    const FlagSpec* f = find_serve_flag(k);
    r.affects_performance = f && f->affects_performance;
    if (auto it = perf_notes().find(k); it != perf_notes().end()) r.note = it->second;
    else if (r.affects_performance) r.note = "changes speed or memory";
    rows.push_back(std::move(r));
  }
  return rows;
}

std::vector<DiffRow> diff_environment(const KeyValues& a, const KeyValues& b) {
  std::vector<DiffRow> rows = diff_settings(a, b);
  for (auto& r : rows) {
    const std::string name = r.key.rfind("env:", 0) == 0 ? r.key.substr(4) : r.key;
    if (name == "CUDA_VISIBLE_DEVICES" || name.rfind("DELTASERVE_TP_DEVICE", 0) == 0) {
      r.note = "which GPUs (speed, memory)";
      r.affects_performance = true;
    } else if (name.rfind("DELTASERVE_CUDA_", 0) == 0 || name.rfind("DELTASERVE_FLASH_", 0) == 0 ||
               name.rfind("DELTASERVE_GEMV_", 0) == 0 || name.rfind("DELTASERVE_CUBLAS_", 0) == 0) {
      r.note = "CUDA backend override (speed, numerics)";
      r.affects_performance = true;
    } else {
      r.note = "environment";
    }
  }
  return rows;
}

std::vector<DiffRow> diff_resolved(const KeyValues& a, const KeyValues& b) {
  static const std::map<std::string, std::string> kNotes = {
      {"device", "where it ran (speed)"},
      {"plan.context_length", "context length serve used (what auto became; memory)"},
      {"plan.max_running_requests", "running-request cap serve used (what auto became; throughput under load)"},
      {"plan.kv_tokens", "KV capacity serve used, in tokens (memory, concurrency)"},
      {"plan.state_slots", "GDN state slots serve used (concurrency)"},
      {"plan.mem_fraction_static", "GPU memory fraction serve used (what auto became; memory)"},
      {"spec.num_steps", "MTP draft steps serve used (what the start-up probe chose; decode speed)"},
      {"version", "deltaserve version (speed, behaviour)"},
      {"host", "machine it ran on (speed, memory)"},
      {"model.config_hash", "the model's config.json changed (another model under the same path?)"},
      {"model.weight_index_hash", "the model's weight files changed (another checkpoint under the same path?)"},
  };
  std::vector<DiffRow> rows = diff_settings(a, b);
  for (auto& r : rows) {
    auto it = kNotes.find(r.key);
    r.note = it != kNotes.end() ? it->second : "resolved at launch";
    r.affects_performance = true;
  }
  return rows;
}

std::vector<DiffRow> diff_sources(const ConfigSource& a, const ConfigSource& b) {
  std::vector<DiffRow> rows = diff_settings(a.settings, b.settings);
  // A setting whose value is the same but given on one side only, where serve treats a given value
  // differently: the memory plan keeps a given --mamba-full-memory-ratio, and raises the default
  // one to fit --max-running-requests.
  for (const char* key : {"mamba-full-memory-ratio"}) {
    if (a.options.is_explicit(key) == b.options.is_explicit(key)) continue;
    bool listed = false;
    for (const auto& r : rows) listed = listed || r.key == key;
    if (listed) continue;
    auto shown = [&](const ConfigSource& s) {
      for (const auto& [k, v] : s.settings)
        if (k == key) return v + (s.options.is_explicit(key) ? " (given)" : " (default)");
      return std::string("(unset)");
    };
    rows.push_back({key, shown(a), shown(b), true,
                    "given, the memory plan keeps it; left to its default, the plan raises it to fit "
                    "--max-running-requests"});
  }
  // Secrets are redacted on both sides; where both sides still have their values (not launches),
  // two different keys are a difference, shown without either value.
  if (a.kind != "launch" && b.kind != "launch") {
    auto raw = [](const KeyValues& kv, const std::string& key) {
      for (const auto& [k, v] : kv)
        if (k == key) return v;
      return std::string();
    };
    KeyValues keys = a.secrets;
    keys.insert(keys.end(), b.secrets.begin(), b.secrets.end());
    for (const auto& [key, unused] : keys) {
      bool listed = false;
      for (const auto& r : rows) listed = listed || r.key == key;
      if (listed || raw(a.secrets, key) == raw(b.secrets, key)) continue;
      rows.push_back({key, std::string(kRedactedValue), std::string(kRedactedValue) + " (another value)", false,
                      "the values differ (not shown)"});
    }
  }
  for (auto& r : diff_environment(a.environment, b.environment)) rows.push_back(std::move(r));
  // Only launches have resolved values; a unit file or script is not compared with "(unset)".
  if (!a.resolved.empty() && !b.resolved.empty())
    for (auto& r : diff_resolved(a.resolved, b.resolved)) rows.push_back(std::move(r));
  return rows;
}

std::string render_diff(const std::vector<DiffRow>& rows, const std::string& label_a, const std::string& label_b) {
  if (rows.empty()) return "no differences: every setting, defaults included, is the same\n";
  size_t wk = 7, wa = label_a.size(), wb = label_b.size();
  for (const auto& r : rows) {
    wk = std::max(wk, r.key.size());
    wa = std::max(wa, r.a.size());
    wb = std::max(wb, r.b.size());
  }
  wa = std::min<size_t>(wa, 40);
  wb = std::min<size_t>(wb, 40);
  auto pad = [](const std::string& s, size_t w) { return s + std::string(w > s.size() ? w - s.size() : 0, ' '); };
  std::string out = "  " + pad("setting", wk) + "  " + pad(label_a, wa) + "  " + pad(label_b, wb) + "  note\n";
  int n_perf = 0;
  for (const auto& r : rows) {
    out += (r.affects_performance ? "* " : "  ") + pad(r.key, wk) + "  " + pad(r.a, wa) + "  " + pad(r.b, wb) + "  " +
           r.note + "\n";
    n_perf += r.affects_performance;
  }
  out += std::to_string(rows.size()) + " setting(s) differ; " + std::to_string(n_perf) +
         " marked * change speed or memory\n";
  return out;
}

std::string diff_json(const std::vector<DiffRow>& rows, const ConfigSource& a, const ConfigSource& b) {
  nlohmann::ordered_json j;
  j["a"] = {{"label", a.label}, {"kind", a.kind}, {"notes", a.notes}};
  j["b"] = {{"label", b.label}, {"kind", b.kind}, {"notes", b.notes}};
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const auto& r : rows)
    arr.push_back({{"setting", r.key}, {"a", r.a}, {"b", r.b}, {"affects_performance", r.affects_performance}, {"note", r.note}});
  j["differences"] = arr;
  return dump_lossy(j, 2);
}

}  // namespace deltaserve
