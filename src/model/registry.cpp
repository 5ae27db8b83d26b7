// The registry: the ONLY place that maps an HF `architectures` name to a model implementation.
// Adding a model = one arch/ file + one row here.
#include <cstring>

#include "model/arch/architectures.h"

namespace deltaserve {

namespace {

using Loader = Result<std::unique_ptr<Model>> (*)(const ModelConfig&, const Checkpoint*, Backend&,
                                                  const ModelLoadOptions&, const std::string&);
struct Entry {
  const char* architecture;
  ModelFamily family;
  Loader load;
};

constexpr Entry kRegistry[] = {
    {"Qwen3ForCausalLM", ModelFamily::Qwen3, load_qwen3},
    {"Qwen3_5ForCausalLM", ModelFamily::Qwen3_5, load_qwen3_5},
    {"Qwen3_5ForConditionalGeneration", ModelFamily::Qwen3_5, load_qwen3_5},
};

}  // namespace

Status unexpected_tensors(const std::string& source, const std::vector<std::string>& names) {
  std::string list;
  for (std::size_t i = 0; i < names.size() && i < 5; ++i) list += (i ? ", " : "") + names[i];
  return error(source, ": ", names.size(), " unexpected tensor(s) in the checkpoint: ", list);
}

Result<std::unique_ptr<Model>> load_model(const std::filesystem::path& dir, Backend& backend,
                                          const ModelLoadOptions& options) {
  DS_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  const Entry* entry = nullptr;
  for (const auto& e : kRegistry)
    if (config.architecture == e.architecture) entry = &e;
  if (!entry) {
    std::string known;
    for (const auto& e : kRegistry) known += std::string(known.empty() ? "" : ", ") + e.architecture;
    return error((dir / "config.json").string(), ": unknown architecture '", config.architecture,
                 "' (supported: ", known, ")");
  }
  if (entry->family != config.family)
    return error((dir / "config.json").string(), ": architecture ", config.architecture,
                 " does not match its model_type / layer settings");
  std::optional<Checkpoint> checkpoint;
  if (!options.dummy_weights) {
    DS_ASSIGN_OR_RETURN(Checkpoint ck, Checkpoint::open(dir));
    checkpoint = std::move(ck);
  }
  return entry->load(config, checkpoint ? &*checkpoint : nullptr, backend, options, dir.string());
}

}  // namespace deltaserve
