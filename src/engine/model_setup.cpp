#include "engine/model_setup.h"

#include "backend/backend_factory.h"

namespace deltaserve {

Result<std::unique_ptr<ModelSetup>> ModelSetup::create(const SetupOptions& o, int max_tokens,
                                                       int max_seqs, int max_context,
                                                       int max_logit_rows) {
  auto s = std::make_unique<ModelSetup>();
  DS_ASSIGN_OR_RETURN(s->backend, make_backend(o.device, o.n_threads));
  ModelLoadOptions lo;
  lo.dummy_weights = o.dummy_weights;
  DS_ASSIGN_OR_RETURN(s->model, load_model(o.model_dir, *s->backend, lo));
  CacheConfig cc;
  cc.block_size = 16;
  const int blocks_per_seq = (max_context + cc.block_size - 1) / cc.block_size;
  cc.n_blocks = blocks_per_seq * max_seqs;
  cc.n_slots = max_seqs;
  cc.pending_depth = o.pending_depth;
  cc.kv_dtype = o.kv_dtype;
  cc.kv_scales = s->model->kv_scales();
  s->cache = std::make_unique<CacheMemory>(*s->backend, s->model->memory_spec(), cc);
  // Decode batches replay CUDA graphs (the CUDA fixture tests thus check graph replay against
  // the references); the CPU backend has no graphs.
  RunnerLimits lim;
  lim.max_tokens = max_tokens;
  lim.max_seqs = max_seqs;
  lim.max_blocks_per_seq = blocks_per_seq;
  lim.max_logit_rows = max_logit_rows;
  lim.graph_max_seqs = s->backend->device() == Device::Cpu ? 0 : max_seqs;
  lim.mtp = o.pending_depth > 0;
  s->runner = std::make_unique<ModelRunner>(*s->backend, *s->model, *s->cache, lim);
  return s;
}

}  // namespace deltaserve
