#include "backend/cuda_option_env.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <iterator>
#include <string_view>

extern char** environ;  // POSIX: the process's environment

namespace deltaserve {
namespace {

// One override: the variable, the values it takes (as shown in errors), and its setter, which
// returns false for a value it does not take.
struct Knob {
  const char* name;
  const char* values;
  bool (*set)(CudaOptions& o, std::string_view v);
};

bool parse_int(std::string_view v, int* out) {
  if (v.empty()) return false;
  const char* end = v.data() + v.size();
  auto [p, ec] = std::from_chars(v.data(), end, *out);
  return ec == std::errc() && p == end;
}

// "0" turns the feature off, "1" leaves it on (the default).
template <bool CudaOptions::*F>
bool on_off(CudaOptions& o, std::string_view v) {
  if (v != "0" && v != "1") return false;
  o.*F = v == "1";
  return true;
}

template <int CudaOptions::*F, int Lo, int Hi>
bool in_range(CudaOptions& o, std::string_view v) {
  int x = 0;
  if (!parse_int(v, &x) || x < Lo || x > Hi) return false;
  o.*F = x;
  return true;
}

template <int CudaOptions::*F, int... Allowed>
bool one_of(CudaOptions& o, std::string_view v) {
  int x = 0;
  if (!parse_int(v, &x) || ((x != Allowed) && ...)) return false;
  o.*F = x;
  return true;
}

bool gemm_mode(CudaOptions& o, std::string_view v) {
  if (v != "exact" && v != "bf16") return false;
  o.exact_gemm = v == "exact";
  return true;
}

// GDN runs of more than 8 tokens (prefill, verification): which kernel.
bool gdn_kernel(CudaOptions& o, std::string_view v) {
  if (v != "mma" && v != "chunked" && v != "rows" && v != "thread") return false;
  o.gdn_thread_per_row = v == "thread";
  o.gdn_chunked = v == "mma" || v == "chunked";
  o.gdn_chunked_mma = v == "mma";
  return true;
}

bool flash_wgmma(CudaOptions& o, std::string_view v) {
  if (v != "0" && v != "1" && v != "auto") return false;
  o.flash_wgmma = v == "auto" ? -1 : v == "1" ? 1 : 0;
  return true;
}

// Every override, by name. The fields' meanings: cuda_options.h.
constexpr Knob kKnobs[] = {
    {"DELTASERVE_CUBLAS_WORKSPACE_MB", "-1 (by the GPU), 0 (cuBLAS's default) or MiB up to 4096",
     in_range<&CudaOptions::cublas_workspace_mb, -1, 4096>},
    {"DELTASERVE_CUDA_DECODE_ATTN", "0 or 1", on_off<&CudaOptions::decode_attention>},
    {"DELTASERVE_CUDA_DECODE_BLOCKS_PER_SM", "1-64", in_range<&CudaOptions::decode_blocks_per_sm, 1, 64>},
    {"DELTASERVE_CUDA_DECODE_FUSED_PREP", "0 or 1", on_off<&CudaOptions::decode_fused_prep>},
    {"DELTASERVE_CUDA_DECODE_KEYS", "4 or 8", one_of<&CudaOptions::decode_keys_per_step, 4, 8>},
    {"DELTASERVE_CUDA_DECODE_MAX_SPLITS", "1-1024", in_range<&CudaOptions::decode_max_splits, 1, 1024>},
    {"DELTASERVE_CUDA_DECODE_MIN_BLOCKS", "0-3", in_range<&CudaOptions::decode_min_blocks, 0, 3>},
    {"DELTASERVE_CUDA_DECODE_MIN_KEYS", "1-1048576", in_range<&CudaOptions::decode_min_keys, 1, 1 << 20>},
    {"DELTASERVE_CUDA_DECODE_MMA", "0 or 1", on_off<&CudaOptions::decode_tensor_cores>},
    {"DELTASERVE_CUDA_DECODE_MMA_BLOCKS_PER_SM", "0 (by shared memory) or 1-64",
     in_range<&CudaOptions::decode_mma_blocks_per_sm, 0, 64>},
    {"DELTASERVE_CUDA_DECODE_MMA_KEYS", "0 (by the batch), 32 or 64", one_of<&CudaOptions::decode_mma_keys, 0, 32, 64>},
    {"DELTASERVE_CUDA_DECODE_MMA_STAGES", "0 (by the batch), 2, 3 or 4",
     one_of<&CudaOptions::decode_mma_stages, 0, 2, 3, 4>},
    {"DELTASERVE_CUDA_FLASH", "0 or 1", on_off<&CudaOptions::flash_attention>},
    {"DELTASERVE_CUDA_FLASH_SPLITS", "1-1024", in_range<&CudaOptions::flash_max_splits, 1, 1024>},
    {"DELTASERVE_CUDA_FLASH_WGMMA", "0, 1 or auto", flash_wgmma},
    {"DELTASERVE_CUDA_FUSED_GEMV", "0, 1 or 2", in_range<&CudaOptions::fused_gemv, 0, 2>},
    {"DELTASERVE_CUDA_GDN", "mma, chunked, rows or thread", gdn_kernel},
    {"DELTASERVE_CUDA_GDN_CLUSTER", "0 (by the batch), 1, 2, 4 or 8",
     one_of<&CudaOptions::gdn_decode_cluster, 0, 1, 2, 4, 8>},
    {"DELTASERVE_CUDA_GDN_FUSED", "0 or 1", on_off<&CudaOptions::gdn_fused_decode>},
    {"DELTASERVE_CUDA_GDN_LAYOUT", "0 (82), 82 or 44", one_of<&CudaOptions::gdn_decode_layout, 0, 82, 44>},
    {"DELTASERVE_CUDA_GDN_PF", "0 or 1", on_off<&CudaOptions::gdn_chunk_prefetch>},
    {"DELTASERVE_CUDA_GDN_STAGE", "0, 1 or 2", in_range<&CudaOptions::gdn_decode_stage, 0, 2>},
    {"DELTASERVE_CUDA_GDN_TF32", "1 or 3", one_of<&CudaOptions::gdn_tf32_parts, 1, 3>},
    {"DELTASERVE_CUDA_GDN_WARPS", "0 (by the batch) or 1-32", in_range<&CudaOptions::gdn_decode_warps, 0, 32>},
    {"DELTASERVE_CUDA_GEMM", "exact or bf16", gemm_mode},
    {"DELTASERVE_CUDA_GEMM_ALGO", "-1 (timed), 0 (GemmEx) or 1-16 (cuBLASLt's k-th)",
     in_range<&CudaOptions::gemm_algo, -1, 16>},
    {"DELTASERVE_CUDA_GEMM_TUNE_ROWS", "0-4096", in_range<&CudaOptions::gemm_tune_rows, 0, 4096>},
    {"DELTASERVE_CUDA_L2_PREFETCH_MB", "0-1024", in_range<&CudaOptions::l2_prefetch_mb, 0, 1024>},
    {"DELTASERVE_CUDA_MIXED_DECODE", "0 or 1", on_off<&CudaOptions::mixed_decode_rows>},
    {"DELTASERVE_CUDA_PDL", "0 or 1", on_off<&CudaOptions::pdl>},
    {"DELTASERVE_CUDA_PDL_CHAIN", "0 or 1", on_off<&CudaOptions::pdl_chain>},
    {"DELTASERVE_CUDA_SMEM_CAP", "0 (the device's) or bytes", in_range<&CudaOptions::smem_per_block_cap, 0, 1 << 30>},
    {"DELTASERVE_FLASH_BN", "0 (64), 32 or 64", one_of<&CudaOptions::flash_keys_per_tile, 0, 32, 64>},
    {"DELTASERVE_FLASH_HB", "0 (by the shape) or 1-8", in_range<&CudaOptions::flash_heads_per_block, 0, 8>},
    {"DELTASERVE_FLASH_MT", "0 (by the shape) or 1-8", in_range<&CudaOptions::flash_m_tiles, 0, 8>},
    {"DELTASERVE_GEMV_SHAPE", "0 (by the matrix), 24, 42 or 81", one_of<&CudaOptions::gemv_shape, 0, 24, 42, 81>},
};

constexpr const char* kPrefixes[] = {"DELTASERVE_CUDA_", "DELTASERVE_FLASH_", "DELTASERVE_GEMV_", "DELTASERVE_CUBLAS_"};

bool ours(std::string_view name) {
  return std::any_of(std::begin(kPrefixes), std::end(kPrefixes),
                     [&](const char* p) { return name.substr(0, std::strlen(p)) == p; });
}

}  // namespace

EnvVariables cuda_option_variables() {
  EnvVariables vars;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::size_t eq = entry.find('=');
    if (eq == std::string_view::npos || !ours(entry.substr(0, eq))) continue;
    vars.emplace_back(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  std::sort(vars.begin(), vars.end());
  return vars;
}

Result<CudaOptions> cuda_options_from(const EnvVariables& vars) {
  CudaOptions o;
  for (const auto& [name, value] : vars) {
    const Knob* k = std::find_if(std::begin(kKnobs), std::end(kKnobs), [&](const Knob& x) { return name == x.name; });
    if (k == std::end(kKnobs))
      return error("environment: ", name, " is not a CUDA backend override (they are:\n", cuda_option_table(), ")");
    if (!k->set(o, value)) return error("environment: ", name, "=", value, ": it takes ", k->values);
  }
  return o;
}

std::string cuda_option_table() {
  std::string out;
  for (const Knob& k : kKnobs) out += str_cat("  ", k.name, "=", k.values, "\n");
  return out;
}

}  // namespace deltaserve
