#include "engine/model_setup.h"


namespace deltaserve {

Result<std::unique_ptr<ModelSetup>> ModelSetup::create(const SetupOptions& o, int max_tokens,
                                                       int max_seqs, int max_context,
                                                       int max_logit_rows) {
  auto s = std::make_unique<ModelSetup>();
  RankGroupOptions ro;
  ro.model_dir = o.model_dir;
  ro.device = o.device;
  ro.n_threads = o.n_threads;
  ro.tp_size = o.tp_size;
  ro.load.dummy_weights = o.dummy_weights;
  ro.load.weight_dtype = o.weight_dtype;
  ro.load.draft_vocab = o.draft_vocab;
  DS_ASSIGN_OR_RETURN(s->ranks, RankGroup::create(ro));
  s->backend = &s->ranks->backend();
  s->model = &s->ranks->model();
  CacheConfig cc;
  cc.block_size = 16;
  const int blocks_per_seq = (max_context + cc.block_size - 1) / cc.block_size;
  cc.n_blocks = blocks_per_seq * max_seqs;
  cc.n_slots = max_seqs;
  cc.pending_depth = o.pending_depth;
  cc.kv_dtype = o.kv_dtype;
  cc.state_dtype = o.state_dtype;
  cc.kv_scales = s->model->kv_scales();
  s->cache = std::make_unique<CacheMemory>(s->ranks->backends(), s->model->memory_spec(), cc);
  // Decode batches replay CUDA graphs (the CUDA fixture tests thus check graph replay against
  // the references); the CPU backend has no graphs.
  RunnerLimits lim;
  lim.max_tokens = max_tokens;
  lim.max_seqs = max_seqs;
  lim.max_blocks_per_seq = blocks_per_seq;
  lim.max_logit_rows = max_logit_rows;
  lim.graph_max_seqs = s->backend->device() == Device::Cpu || !o.cuda_graphs ? 0 : max_seqs;
  lim.mtp = o.pending_depth > 0;
  s->runner = std::make_unique<ModelRunner>(*s->ranks, *s->cache, lim);
  return s;
}

}  // namespace deltaserve
