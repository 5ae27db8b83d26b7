// What machine a launch ran on: CPU model, RAM, GPUs (nvidia-smi when present; optional).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace deltaserve {

struct GpuInfo {
  std::string name;          // "NVIDIA RTX A6000"
  int64_t memory_bytes = 0;  // total
};

struct HostInfo {
  std::string hostname;
  std::string cpu_model;     // /proc/cpuinfo "model name"
  int n_cpus = 0;
  int64_t ram_total_bytes = 0;
  int64_t ram_available_bytes = 0;
  std::vector<GpuInfo> gpus;
  // "2x NVIDIA RTX A6000 (48.00 GiB)" or "CPU: <model>"; used to match launches of one host.
  std::string summary() const;
};

// Reads /proc and runs `nvidia-smi` if it is on PATH (skipped when with_gpus is false).
HostInfo detect_host(bool with_gpus = true);

// Parses `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits` output.
std::vector<GpuInfo> parse_nvidia_smi_csv(const std::string& text);
// Parses /proc/meminfo text: MemTotal and MemAvailable in bytes.
void parse_meminfo(const std::string& text, int64_t* total, int64_t* available);

// FNV-1a 64 of a file's bytes as 16 hex digits ("" when unreadable): model identity, not security.
std::string file_fingerprint(const std::string& path);
std::string text_fingerprint(const std::string& text);

}  // namespace deltaserve
