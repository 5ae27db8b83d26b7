// config.json -> ModelConfig: any text parses to a config or fails with a Status.
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto cfg = deltaserve::parse_model_config(text, "fuzz/config.json");
  if (!cfg) {
    FUZZ_CHECK(!cfg.status().message().empty());
    return 0;
  }
  (void)cfg->n_attention_layers();
  (void)cfg->n_linear_layers();
  (void)cfg->linear_conv_dim();
  return 0;
}
