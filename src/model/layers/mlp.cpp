#include "model/layers/mlp.h"

namespace deltaserve {

Result<Mlp> Mlp::load(WeightLoader& w, const std::string& prefix, const ModelConfig& c, const TpShard& tp) {
  Mlp m;
  const std::string p = prefix + ".mlp.";
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const RowRange rows = tp.part(I);
  DS_ASSIGN_OR_RETURN(m.gate_up, w.linear({LinearPart{p + "gate_proj.weight", I, {rows}},
                                           LinearPart{p + "up_proj.weight", I, {rows}}},
                                          H));
  DS_ASSIGN_OR_RETURN(m.down, w.linear({LinearPart{p + "down_proj.weight", H, {}}}, I, rows));
  return m;
}

void Mlp::forward(Kernels& k, const NormedInput& in, Tensor gu, Tensor act, Tensor residual, Communicator* comm) const {
  k.mlp(in.x, in.norm, in.eps, *gate_up, *down, residual, /*accumulate=*/comm == nullptr || comm->rank() == 0,
        in.normed, gu, act);
  if (comm) comm->all_reduce_sum(residual);
}

}  // namespace deltaserve
