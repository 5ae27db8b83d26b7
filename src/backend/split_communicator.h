// SplitCommunicator: small collectives through one communicator, large ones through another (the
// one-shot peer all-reduce below a size, NCCL above it, as SGLang and vLLM split custom
// all-reduce and NCCL). Both must belong to the same ranks; every rank makes the same choice
// because the choice depends on the message size only.
#pragma once

#include <algorithm>
#include <memory>

#include "backend/communicator.h"

namespace deltaserve {

class SplitCommunicator final : public Communicator {
 public:
  SplitCommunicator(std::unique_ptr<Communicator> small, std::unique_ptr<Communicator> large, std::size_t max_small_bytes)
      : small_(std::move(small)), large_(std::move(large)), max_small_(max_small_bytes) {}
  int rank() const override { return large_->rank(); }
  int size() const override { return large_->size(); }
  void all_reduce_sum(Tensor x) override { pick(x.nbytes()).all_reduce_sum(x); }
  void all_gather(const Tensor& in, Tensor out) override { pick(in.nbytes()).all_gather(in, out); }
  void barrier() override { large_->barrier(); }
  void reserve(std::size_t bytes) override {
    small_->reserve(std::min(bytes, max_small_));
    large_->reserve(bytes);
  }
  bool graph_capturable() const override { return small_->graph_capturable() && large_->graph_capturable(); }
  std::size_t max_small_bytes() const { return max_small_; }

 private:
  Communicator& pick(std::size_t bytes) { return bytes <= max_small_ ? *small_ : *large_; }
  std::unique_ptr<Communicator> small_, large_;
  std::size_t max_small_;
};

}  // namespace deltaserve
