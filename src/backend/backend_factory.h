// make_backend: "cpu" or "cuda" (when built with DELTASERVE_CUDA) -> a Backend.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace deltaserve {

// device_index: which CUDA device (ignored on the CPU).
Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int n_threads, int device_index = 0);
bool cuda_available();
int visible_cuda_devices();  // 0 without CUDA

}  // namespace deltaserve
