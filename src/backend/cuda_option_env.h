// The CUDA backend's developer overrides (CudaOptions) from environment variables, for A/B
// measurements and exact-numerics runs; production runs set none. The variables, their values and
// the fields they set: the table in cuda_option_env.cpp (one place). A variable named like ours
// that the table lacks (a typo, a knob since removed), or a value its knob does not take, is an
// error naming both: an override is never silently ignored.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "backend/cuda_options.h"
#include "util/status.h"

namespace deltaserve {

using EnvVariables = std::vector<std::pair<std::string, std::string>>;  // name, value

// The variables of this process's environment named like the overrides (DELTASERVE_CUDA_*,
// DELTASERVE_FLASH_*, DELTASERVE_GEMV_*, DELTASERVE_CUBLAS_*), sorted by name.
EnvVariables cuda_option_variables();

// CudaOptions{} (the production settings) with `vars` applied.
Result<CudaOptions> cuda_options_from(const EnvVariables& vars);

// "NAME=VALUES" for every override, one per line (the values it takes), for error messages and docs.
std::string cuda_option_table();

}  // namespace deltaserve
