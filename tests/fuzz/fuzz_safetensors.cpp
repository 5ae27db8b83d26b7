// safetensors files (8-byte header length + JSON header + data): any bytes open as a checkpoint
// whose every tensor lies inside the file, or fail with a Status.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("fuzz.safetensors", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  FUZZ_CHECK(fd >= 0);
  FUZZ_CHECK(ftruncate(fd, 0) == 0);
  if (size > 0) FUZZ_CHECK(pwrite(fd, data, size, 0) == static_cast<ssize_t>(size));
  auto ck = deltaserve::Checkpoint::open_file(path);
  if (!ck) {
    FUZZ_CHECK(!ck.status().message().empty());
    return 0;
  }
  for (const auto& [name, t] : ck->tensors()) {
    FUZZ_CHECK(t.numel() >= 0);
    FUZZ_CHECK(ck->find(name) != nullptr);
  }
  return 0;
}
