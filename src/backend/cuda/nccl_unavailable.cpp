// Built instead of nccl_communicator.cpp when CMake found no nccl.h.
#include "backend/cuda/nccl_communicator.h"

namespace deltaserve {

std::string nccl_unavailable_reason() { return "this build has no NCCL support (nccl.h was not found at configure time)"; }
std::string nccl_version() { return ""; }
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(const std::vector<Backend*>&) {
  return error("NCCL: ", nccl_unavailable_reason());
}

Result<std::vector<uint8_t>> nccl_unique_id() { return error("NCCL: ", nccl_unavailable_reason()); }
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(const std::vector<Backend*>&,
                                                                            const std::vector<uint8_t>&, int, int) {
  return error("NCCL: ", nccl_unavailable_reason());
}

}  // namespace deltaserve
