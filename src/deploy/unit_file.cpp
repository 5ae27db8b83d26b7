#include "deploy/unit_file.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "deploy/config_diff.h"

namespace deltaserve {
namespace {

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

// Physical lines joined into logical ones. As systemd reads a unit (systemd.syntax(7)), a comment
// line is dropped before continuations are joined: one inside a backslash-continued ExecStart=
// (a flag commented out) neither ends nor cuts the command, and a comment ending in a backslash
// continues nothing.
std::vector<std::string> logical_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream ss(text);
  std::string line, acc;
  while (std::getline(ss, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (const std::string t = trim(line); !t.empty() && (t[0] == '#' || t[0] == ';')) continue;
    if (!line.empty() && line.back() == '\\') {
      acc += line.substr(0, line.size() - 1) + " ";
      continue;
    }
    lines.push_back(acc + line);
    acc.clear();
  }
  if (!acc.empty()) lines.push_back(acc);
  return lines;
}

// systemd resolves specifiers (systemd.unit(5)) in Environment= and ExecStart= before anything
// else: "%%" is a literal "%" (as `deltaserve systemd-unit` writes one). The others name this
// unit's instance, host, user, ...: they are left as written, with a note.
std::string resolve_specifiers(const std::string& value, std::vector<std::string>* notes) {
  std::string out;
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] != '%' || i + 1 >= value.size()) {
      out += value[i];
    } else if (value[i + 1] == '%') {
      out += '%';
      ++i;
    } else {
      notes->push_back(std::string("systemd specifier %") + value[i + 1] + " is left as written (it is resolved per unit)");
      out += value[i];
    }
  }
  return out;
}

const std::string* lookup(const std::vector<std::pair<std::string, std::string>>& env, const std::string& name) {
  for (auto it = env.rbegin(); it != env.rend(); ++it)
    if (it->first == name) return &it->second;
  return nullptr;
}

// ExecStart='s variables as systemd expands them (systemd.service(5), "Command lines"), on the
// words after unquoting: a word that is "$NAME" alone becomes the value split at whitespace (zero
// or more words); "${NAME}" anywhere in a word is the value as one piece; "$$" is a "$". Anything
// else with a "$" stays as written. A variable no Environment= sets is empty, as for systemd.
// A variable that is unset while an EnvironmentFile= could not be read is an error naming both:
// that file may well set it.
Result<std::vector<std::string>> expand_exec_words(const std::vector<std::string>& words,
                                                   const std::vector<std::pair<std::string, std::string>>& env,
                                                   const std::vector<std::string>& unread_files,
                                                   std::vector<std::string>* notes) {
  std::vector<std::string> out;
  Status missing = Status::ok();
  auto unset = [&](const std::string& name) {
    if (!unread_files.empty()) {
      if (missing) missing = error("it uses $", name, ", which no Environment= sets; EnvironmentFile=", unread_files[0],
                                   " may, but it cannot be read here");
      return;
    }
    notes->push_back("ExecStart= uses $" + name + ", which no Environment= sets: systemd passes it as empty");
  };
  for (const auto& w : words) {
    if (w.size() > 1 && w[0] == '$' && w[1] != '{' && w[1] != '$') {
      const std::string name = w.substr(1);
      if (const std::string* v = lookup(env, name)) {
        auto split = split_command_words(*v, {}, WordSyntax::Systemd);
        if (!split) return error("$", name, ": ", split.status().message());
        for (auto& x : *split) out.push_back(std::move(x));
      } else {
        unset(name);
      }
      continue;
    }
    std::string cur;
    for (size_t i = 0; i < w.size(); ++i) {
      if (w[i] == '$' && i + 1 < w.size() && w[i + 1] == '$') {
        cur += '$';
        ++i;
      } else if (w[i] == '$' && i + 1 < w.size() && w[i + 1] == '{' && w.find('}', i) != std::string::npos) {
        const size_t close = w.find('}', i);
        const std::string name = w.substr(i + 2, close - i - 2);
        if (const std::string* v = lookup(env, name)) cur += *v;
        else unset(name);
        i = close;
      } else {
        cur += w[i];
      }
    }
    out.push_back(std::move(cur));
  }
  if (!missing) return missing;
  return out;
}

// An EnvironmentFile= (systemd.exec(5)): NAME=value lines, "#" / ";" comments, quotes. A leading
// "-" means a missing file is fine. Returns false when the file cannot be read.
bool read_environment_file(const std::string& path, std::vector<std::pair<std::string, std::string>>* env) {
  std::ifstream in(path);
  if (!in) return false;
  std::string line;
  while (std::getline(in, line)) {
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    const auto eq = t.find('=');
    if (eq == std::string::npos) continue;
    auto value = split_command_words(t.substr(eq + 1), {}, WordSyntax::Systemd);
    std::string v;
    if (value)
      for (const auto& w : *value) v += (v.empty() ? "" : " ") + w;
    env->emplace_back(trim(t.substr(0, eq)), value ? v : trim(t.substr(eq + 1)));
  }
  return true;
}

}  // namespace

Result<std::vector<UnitDropIn>> read_unit_drop_ins(const std::string& unit_path, const std::string& label,
                                                   const std::vector<std::string>& unit_dirs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path unit(unit_path);
  const std::string name = unit.filename().string();
  // Where to look, in priority order: beside the unit, or systemd's directories when it is in one.
  const fs::path home = fs::weakly_canonical(fs::absolute(unit, ec).parent_path(), ec);  // (a linked unit: the link's)
  std::vector<fs::path> dirs;
  for (const auto& d : unit_dirs) {
    std::error_code e2;
    const fs::path c = fs::weakly_canonical(d, e2);
    if (!e2 && c == home) {
      for (const auto& x : unit_dirs) {
        const fs::path cx = fs::weakly_canonical(x, e2);
        if (std::find(dirs.begin(), dirs.end(), cx) == dirs.end()) dirs.push_back(cx);
      }
      break;
    }
  }
  const bool systemd_dir = !dirs.empty();
  if (!systemd_dir) dirs.push_back(home);
  // The drop-in directory names, most specific first: NAME.d; with systemd's, an instance's
  // template (a@x.service: a@.service.d), the dash prefixes of the name before its type
  // ("a-b-c.service": a-b-.service.d, a-.service.d) and the type's own (service.d).
  std::vector<std::string> subdirs = {name + ".d"};
  const auto dot = name.rfind('.');
  if (systemd_dir && dot != std::string::npos) {
    std::string stem = name.substr(0, dot);
    const std::string type = name.substr(dot + 1);
    if (const auto at = stem.find('@'); at != std::string::npos && at + 1 < stem.size()) {
      stem = stem.substr(0, at + 1);
      subdirs.push_back(stem + "." + type + ".d");
    }
    for (auto dash = stem.rfind('-', stem.size() >= 2 ? stem.size() - 2 : 0); dash != std::string::npos && dash > 0;
         dash = stem.rfind('-', dash - 1))
      subdirs.push_back(stem.substr(0, dash + 1) + "." + type + ".d");
    subdirs.push_back(type + ".d");
  }
  std::vector<fs::path> confs;
  std::vector<std::string> seen;  // file names already taken
  for (const auto& d : dirs)
    for (const auto& sub : subdirs) {
      if (!fs::is_directory(d / sub, ec)) continue;
      std::vector<fs::path> here;
      for (const auto& e : fs::directory_iterator(d / sub, ec))
        if (e.path().extension() == ".conf") here.push_back(e.path());
      for (const auto& c : here) {
        const std::string f = c.filename().string();
        if (std::find(seen.begin(), seen.end(), f) != seen.end()) continue;
        seen.push_back(f);
        confs.push_back(c);
      }
    }
  std::sort(confs.begin(), confs.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
  std::vector<UnitDropIn> drop_ins;
  for (const auto& c : confs) {
    std::ifstream in(c);
    if (!in) return error("cannot read ", c.string(), " (a drop-in of ", label, ")");
    std::stringstream text;
    text << in.rdbuf();
    drop_ins.push_back({c.string(), text.str()});
  }
  return drop_ins;
}

Result<UnitExec> read_unit_exec(const std::string& text, const std::string& name,
                                const std::vector<UnitDropIn>& drop_ins) {
  UnitExec unit;
  std::string section, exec;
  std::vector<std::pair<std::string, bool>> env_files;  // path, optional ("-")
  // The unit's logical lines, then each drop-in's (a file starts outside any section).
  std::vector<std::string> lines = logical_lines(text);
  for (const auto& d : drop_ins) {
    lines.push_back("[]");
    for (auto& l : logical_lines(d.text)) lines.push_back(std::move(l));
    unit.notes.push_back("drop-in " + d.name + " was read after " + name);
  }
  for (const auto& raw : lines) {
    std::string line = trim(raw);
    if (line.empty()) continue;
    if (line.front() == '[') {
      section = line;
      continue;
    }
    if (section != "[Service]") continue;
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
    if (key == "Environment" || key == "ExecStart") value = resolve_specifiers(value, &unit.notes);
    if (key == "Environment" && value.empty()) {
      unit.environment.clear();  // an empty assignment resets the list (systemd.exec(5))
    } else if (key == "Environment") {
      auto words = split_command_words(value, {}, WordSyntax::Systemd);
      if (!words) return error(name, ": Environment=: ", words.status().message());
      for (const auto& w : *words) {
        auto e = w.find('=');
        if (e == std::string::npos) continue;
        unit.environment.emplace_back(w.substr(0, e), w.substr(e + 1));
      }
    } else if (key == "EnvironmentFile" && value.empty()) {
      env_files.clear();
    } else if (key == "EnvironmentFile") {
      const bool optional = !value.empty() && value[0] == '-';
      env_files.emplace_back(optional ? value.substr(1) : value, optional);
    } else if (key == "ExecStart") {
      exec = value;  // an empty one clears the command (a drop-in's way to replace it)
    }
  }
  if (exec.empty()) return error(name, ": no ExecStart= line in a [Service] section");
  // Files' settings override Environment='s, wherever the lines are (systemd.exec(5)). They are
  // read on this machine, which is the unit's own when it is diffed where it runs.
  std::vector<std::string> unread_files;
  for (const auto& [path, optional] : env_files) {
    if (read_environment_file(path, &unit.environment)) {
      unit.notes.push_back("EnvironmentFile=" + path + " was read on this machine");
    } else if (!optional) {
      unread_files.push_back(path);
      unit.notes.push_back("EnvironmentFile=" + path + " cannot be read here: its settings are not included");
    }
  }
  bool own_argv0 = false;  // "@": the second word is argv[0], not an argument (systemd.service(5))
  while (!exec.empty() && std::string("-@+!:").find(exec.front()) != std::string::npos) {
    own_argv0 = own_argv0 || exec.front() == '@';
    exec.erase(0, 1);
  }
  auto words = split_command_words(exec, {}, WordSyntax::Systemd);  // systemd's variables are expanded below
  if (!words) return error(name, ": ExecStart=: ", words.status().message());
  if (own_argv0 && words->size() > 1) words->erase(words->begin() + 1);
  auto expanded = expand_exec_words(*words, unit.environment, unread_files, &unit.notes);
  if (!expanded) return error(name, ": ExecStart=: ", expanded.status().message());
  unit.words = std::move(*expanded);
  // One entry per name, its last value (what the process gets), at its first place.
  std::vector<std::pair<std::string, std::string>> unique;
  for (const auto& [k, v] : unit.environment) {
    auto it = std::find_if(unique.begin(), unique.end(), [&](const auto& e) { return e.first == k; });
    if (it == unique.end()) unique.emplace_back(k, v);
    else it->second = v;
  }
  unit.environment = std::move(unique);
  return unit;
}

}  // namespace deltaserve
