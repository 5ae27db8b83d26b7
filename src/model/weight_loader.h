// WeightLoader: turns checkpoint tensors (or, with dummy weights, random values) into backend
// weights, checking every name and shape, and remembering which tensors were used so that
// leftovers (other than the vision tower) are reported.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/safetensors.h"
#include "model/tensor_parallel.h"

namespace deltaserve {

// The matmul weights' dtype on the backend (--dtype). Auto: the checkpoint's where the backend
// keeps it (CPU: bf16 stays bf16, f16 and f32 become f32; CUDA: always bf16). BF16: every
// checkpoint rounded to bf16 (nearest even). F32: widened to f32 (CPU only; engine_setup refuses it
// on CUDA, whose matmuls read bf16). Embeddings, norms and other vectors are not matmul weights.
enum class WeightDType { Auto, BF16, F32 };

// An owned device tensor (buffer + view).
struct DeviceTensor {
  DeviceBuffer buffer;
  Tensor view;
};

// One source tensor of a matmul weight, and (tensor parallelism) the row ranges of it that this
// rank keeps, in order; `take` empty: all `rows`.
struct LinearPart {
  std::string name;
  int64_t rows = 0;
  std::vector<RowRange> take;
};

class WeightLoader {
 public:
  // checkpoint == nullptr: dummy mode (random weights shaped by the config, as vLLM/SGLang's
  // --load-format dummy).
  WeightLoader(const Checkpoint* checkpoint, Backend& backend, std::string source,
               WeightDType weight_dtype = WeightDType::Auto, uint64_t seed = 1234);

  // A matmul weight made of one or more [n_i, k] tensors stacked along n (fused projections).
  Result<std::unique_ptr<LinearWeight>> linear(const std::vector<std::string>& names,
                                               const std::vector<int64_t>& rows, int64_t k);
  // The same from parts that may keep only some of their rows, and only input columns `cols`
  // (size 0: all k): a tensor-parallel rank's shard.
  Result<std::unique_ptr<LinearWeight>> linear(const std::vector<LinearPart>& parts, int64_t k, RowRange cols = {});
  // An f32 vector/matrix of the given shape; add_one stores (1 + w) for zero-centred norms.
  // take: keep only these ranges of the first dimension (empty: all).
  Result<DeviceTensor> f32(const std::string& name, const std::vector<int64_t>& shape,
                           bool add_one = false, const std::vector<RowRange>& take = {});
  // A positive finite scalar ([] or [1]), if the checkpoint has it (nullopt when it does not, and
  // with dummy weights): checkpoint scales such as the fp8 KV cache's k_scale.
  Result<std::optional<float>> optional_scalar(const std::string& name);
  // -exp(A_log) as f32 (elements `take`, or all n).
  Result<DeviceTensor> neg_exp(const std::string& name, int64_t n, const std::vector<RowRange>& take = {});
  // An embedding table [v, h] kept in its checkpoint dtype (bf16 stays bf16; f16 becomes f32);
  // rows: a vocabulary-parallel rank's rows (size 0: all).
  Result<DeviceTensor> embedding(const std::string& name, int64_t v, int64_t h, RowRange rows = {});

  bool has(const std::string& name) const;
  // Tensors never asked for, except those matching ignore_prefixes.
  std::vector<std::string> unused(const std::vector<std::string>& ignore_prefixes) const;
  std::size_t bytes_loaded() const { return bytes_loaded_; }

 private:
  // Host f32 copy of a tensor, checking its shape; only the first-dimension ranges `take` (all
  // when empty).
  Result<std::vector<float>> host_f32(const std::string& name, const std::vector<int64_t>& shape,
                                      const std::vector<RowRange>& take = {});
  Status check(const std::string& name, const std::vector<int64_t>& shape, const TensorEntry** out);
  std::vector<uint16_t> random_bf16(int64_t n, float scale);

  const Checkpoint* checkpoint_;
  Backend& backend_;
  std::string source_;
  WeightDType weight_dtype_;
  std::set<std::string> used_;
  std::mt19937_64 rng_;
  std::size_t bytes_loaded_ = 0;
};

}  // namespace deltaserve
