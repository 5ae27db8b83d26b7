#include "backend/backend_factory.h"

#include "backend/cpu/cpu_backend.h"

#ifdef DELTASERVE_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda_option_env.h"
#endif

namespace deltaserve {

int visible_cuda_devices() {
#ifdef DELTASERVE_WITH_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

bool cuda_available() { return visible_cuda_devices() > 0; }

Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int n_threads, int device_index) {
  if (device == "cpu") return make_cpu_backend(n_threads);
  if (device == "cuda") {
#ifdef DELTASERVE_WITH_CUDA
    if (!cuda_available()) return error("--device cuda: no CUDA device found");
    if (device_index < 0 || device_index >= cuda_device_count())
      return error("CUDA device ", device_index, " does not exist (", cuda_device_count(), " visible)");
    auto options = cuda_options_from(cuda_option_variables());
    if (!options) return options.status();
    return make_cuda_backend(device_index, *options);
#else
    (void)device_index;
    return error("--device cuda: this build has no CUDA backend (configure with -DDELTASERVE_CUDA=ON)");
#endif
  }
  return error("--device: unknown device '", device, "' (expected cpu or cuda)");
}

}  // namespace deltaserve
