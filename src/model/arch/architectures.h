// One file per architecture family (arch/<family>.cpp): its Model class owns the forward pass (the
// layer loop over model/layers/*, the MTP head) and its checkpoint names. registry.cpp maps
// `architectures[0]` to these loaders. docs/adding-a-model.md walks through adding one.
#pragma once

#include <memory>

#include "model/model.h"
#include "model/safetensors.h"

namespace deltaserve {

// "<source>: N unexpected tensor(s) in the checkpoint: a, b, ..." (the first five).
Status unexpected_tensors(const std::string& source, const std::vector<std::string>& names);

Result<std::unique_ptr<Model>> load_qwen3(const ModelConfig& c, const Checkpoint* ck, Backend& b,
                                          const ModelLoadOptions& o, const std::string& source);
Result<std::unique_ptr<Model>> load_qwen3_5(const ModelConfig& c, const Checkpoint* ck, Backend& b,
                                            const ModelLoadOptions& o, const std::string& source);

}  // namespace deltaserve
