// One loader per architecture family; registry.cpp maps `architectures[0]` to these.
#pragma once

#include <memory>

#include "model/model.h"
#include "model/safetensors.h"

namespace deltaserve {

Result<std::unique_ptr<Model>> load_qwen3(const ModelConfig& c, const Checkpoint* ck, Backend& b,
                                          const ModelLoadOptions& o, const std::string& source);
Result<std::unique_ptr<Model>> load_qwen3_5(const ModelConfig& c, const Checkpoint* ck, Backend& b,
                                            const ModelLoadOptions& o, const std::string& source);

}  // namespace deltaserve
