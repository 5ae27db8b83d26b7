// Dense Qwen3 (Qwen3ForCausalLM): every layer is attention without output gate; plain RMSNorm
// (x̂ · w); tied embeddings in the small models. Weights under "model.*".
#include "model/arch/architectures.h"
#include "model/decoder_model.h"

namespace deltaserve {

Result<std::unique_ptr<Model>> load_qwen3(const ModelConfig& c, const Checkpoint* ck, Backend& b,
                                          const ModelLoadOptions& o, const std::string& source) {
  DecoderNaming n{"model.layers", "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                  "mtp", {}};
  DecoderOptions opt{/*zero_centred_norm=*/false, /*load_mtp=*/false};
  DS_ASSIGN_OR_RETURN(auto m, DecoderModel::load(c, ck, b, n, opt, source));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace deltaserve
