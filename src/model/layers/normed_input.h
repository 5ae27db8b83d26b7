// NormedInput: a block's input as the residual stream and the RMSNorm in front of the block's
// first projection. The block hands all of it to Kernels::rms_norm_matmul, which folds the norm
// into the matmul where it can (CUDA, one row) and otherwise writes rms_norm(x) into `normed` first.
#pragma once

#include "core/tensor.h"

namespace deltaserve {

struct NormedInput {
  Tensor x;       // [T, H] residual stream
  Tensor norm;    // [H] norm weight (stored as 1 + w for zero-centred norms)
  float eps = 0.f;
  Tensor normed;  // [T, H] scratch for rms_norm(x)
};

}  // namespace deltaserve
