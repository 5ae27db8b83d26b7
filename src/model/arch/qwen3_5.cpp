// Qwen3.5 / Qwen3.6 hybrid (Gated DeltaNet + gated attention, zero-centred RMSNorm, MTP head).
// Qwen3_5ForConditionalGeneration nests the text model under "model.language_model.*" and ships
// a vision tower ("model.visual.*", skipped for text serving); Qwen3_5ForCausalLM is flat.
#include "model/arch/architectures.h"
#include "model/decoder_model.h"

namespace deltaserve {

Result<std::unique_ptr<Model>> load_qwen3_5(const ModelConfig& c, const Checkpoint* ck, Backend& b,
                                            const ModelLoadOptions& o, const std::string& source) {
  const std::string base = c.nested_layout ? "model.language_model" : "model";
  DecoderNaming n{base + ".layers", base + ".embed_tokens.weight", base + ".norm.weight",
                  "lm_head.weight", "mtp", {"model.visual."}};
  DecoderOptions opt{/*zero_centred_norm=*/true, o.load_mtp};
  DS_ASSIGN_OR_RETURN(auto m, DecoderModel::load(c, ck, b, n, opt, source));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace deltaserve
