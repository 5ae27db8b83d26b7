// make_backend: "cpu" or "cuda" (when built with DELTASERVE_CUDA) -> a Backend.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace deltaserve {

Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int n_threads);
bool cuda_available();

}  // namespace deltaserve
