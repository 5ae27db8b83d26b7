#include "deploy/hardware.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "cache/memory_plan.h"

namespace deltaserve {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  return s.substr(i);
}

bool on_path(const std::string& exe) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (!dir.empty() && access((dir + "/" + exe).c_str(), X_OK) == 0) return true;
  return false;
}

}  // namespace

std::string HostInfo::summary() const {
  if (!gpus.empty()) {
    bool same = true;
    for (const auto& g : gpus) same = same && g.name == gpus[0].name;
    if (same)
      return std::to_string(gpus.size()) + "x " + gpus[0].name + " (" + human_bytes(gpus[0].memory_bytes) + ")";
    std::string s;
    for (const auto& g : gpus) s += (s.empty() ? "" : " + ") + g.name;
    return s;
  }
  return "CPU: " + (cpu_model.empty() ? std::string("unknown") : cpu_model) + " (" +
         std::to_string(n_cpus) + " threads, " + human_bytes(ram_total_bytes) + ")";
}

std::vector<GpuInfo> parse_nvidia_smi_csv(const std::string& text) {
  std::vector<GpuInfo> out;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    auto comma = line.rfind(',');
    if (comma == std::string::npos) continue;
    GpuInfo g;
    g.name = trim(line.substr(0, comma));
    std::string mem = trim(line.substr(comma + 1));
    char* end = nullptr;
    double mib = std::strtod(mem.c_str(), &end);
    if (g.name.empty() || end == mem.c_str()) continue;
    g.memory_bytes = static_cast<int64_t>(mib * 1024 * 1024);
    out.push_back(g);
  }
  return out;
}

void parse_meminfo(const std::string& text, int64_t* total, int64_t* available) {
  std::stringstream ss(text);
  std::string key;
  int64_t kb = 0;
  std::string unit;
  *total = *available = 0;
  std::string line;
  while (std::getline(ss, line)) {
    std::stringstream ls(line);
    if (!(ls >> key >> kb)) continue;
    if (key == "MemTotal:") *total = kb * 1024;
    if (key == "MemAvailable:") *available = kb * 1024;
  }
  if (*available == 0) *available = *total;
}

HostInfo detect_host(bool with_gpus) {
  HostInfo h;
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0) h.hostname = name;
  std::stringstream cpu(read_all("/proc/cpuinfo"));
  std::string line;
  while (std::getline(cpu, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) h.cpu_model = trim(line.substr(colon + 1));
      break;
    }
  }
  h.n_cpus = static_cast<int>(std::thread::hardware_concurrency());
  parse_meminfo(read_all("/proc/meminfo"), &h.ram_total_bytes, &h.ram_available_bytes);
  if (with_gpus && on_path("nvidia-smi")) {
    if (FILE* p = popen("nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits 2>/dev/null", "r")) {
      std::string out;
      char buf[512];
      while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
      pclose(p);
      h.gpus = parse_nvidia_smi_csv(out);
    }
  }
  return h;
}

std::string text_fingerprint(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

std::string file_fingerprint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream os;
  os << in.rdbuf();
  return text_fingerprint(os.str());
}

}  // namespace deltaserve
