// SwiGLU MLP: down(silu(gate(x)) * up(x)) with gate and up fused into one projection.
// Checkpoint names: <prefix>.mlp.{gate_proj,up_proj,down_proj}.weight
#pragma once

#include <memory>
#include <string>

#include "backend/communicator.h"
#include "model/config.h"
#include "model/tensor_parallel.h"
#include "model/layers/normed_input.h"
#include "model/weight_loader.h"

namespace deltaserve {

struct Mlp {
  std::unique_ptr<LinearWeight> gate_up;  // [2I, H] (I: this tensor-parallel rank's rows)
  std::unique_ptr<LinearWeight> down;     // [H, I]

  static Result<Mlp> load(WeightLoader& w, const std::string& prefix, const ModelConfig& c, const TpShard& tp);
  int64_t intermediate() const { return down->k(); }
  // residual += down(silu(gate(h)) * up(h)), h = rms_norm(in.x). gu scratch [T, 2I]; act scratch
  // [T, I]. comm: as AttentionLayer::forward.
  void forward(Kernels& k, const NormedInput& in, Tensor gu, Tensor act, Tensor residual, Communicator* comm) const;
};

}  // namespace deltaserve
