#include "model/layers/mlp.h"

namespace deltaserve {

Result<Mlp> Mlp::load(WeightLoader& w, const std::string& prefix, const ModelConfig& c) {
  Mlp m;
  const std::string p = prefix + ".mlp.";
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  DS_ASSIGN_OR_RETURN(m.gate_up, w.linear({p + "gate_proj.weight", p + "up_proj.weight"}, {I, I}, H));
  DS_ASSIGN_OR_RETURN(m.down, w.linear({p + "down_proj.weight"}, {H}, I));
  return m;
}

void Mlp::forward(Kernels& k, const Tensor& x, Tensor gu, Tensor act, Tensor residual) const {
  k.matmul(x, *gate_up, gu);
  k.silu_mul(gu, act);
  k.matmul(act, *down, residual, /*accumulate=*/true);
}

}  // namespace deltaserve
