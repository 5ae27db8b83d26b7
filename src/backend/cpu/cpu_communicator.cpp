#include "backend/cpu/cpu_communicator.h"

#include <atomic>
#include <cstring>
#include <thread>

namespace deltaserve {

namespace {

// What the ranks of one group share: a sense-reversing barrier and one staging slot per rank.
struct CpuGroup {
  explicit CpuGroup(int n) : size(n), slots(static_cast<std::size_t>(n)) {}
  const int size;
  alignas(64) std::atomic<int> arrived{0};
  alignas(64) std::atomic<uint32_t> phase{0};
  alignas(64) std::atomic<int> sleepers{0};
  std::vector<std::vector<unsigned char>> slots;  // [size]; slot r is written by rank r only

  // Spins (collectives come back to back in a forward, a few microseconds apart), then sleeps on
  // a futex: on a busy machine the rank being waited for may not be running, and spinning or
  // yielding would only take the core from it.
  void wait_all() {
    const uint32_t my_phase = phase.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) == size - 1) {
      arrived.store(0, std::memory_order_relaxed);
      phase.store(my_phase + 1, std::memory_order_seq_cst);
      if (sleepers.load(std::memory_order_seq_cst) > 0) phase.notify_all();
      return;
    }
    for (int spin = 0; spin < 4000; ++spin)
      if (phase.load(std::memory_order_acquire) != my_phase) return;
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    while (phase.load(std::memory_order_seq_cst) == my_phase) phase.wait(my_phase, std::memory_order_seq_cst);
    sleepers.fetch_sub(1, std::memory_order_relaxed);
  }
};

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<CpuGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size; }

  void all_reduce_sum(Tensor x) override {
    DS_CHECK(x.dtype == DType::F32 && x.device == Device::Cpu, "all_reduce_sum: f32 host tensor");
    const int64_t n = x.numel();
    publish(x.data, n * 4);
    float* out = x.f32();
    // Rank order on every rank: the same float sums everywhere.
    std::memcpy(out, group_->slots[0].data(), static_cast<std::size_t>(n) * 4);
    for (int r = 1; r < group_->size; ++r) {
      const float* s = reinterpret_cast<const float*>(group_->slots[r].data());
      for (int64_t i = 0; i < n; ++i) out[i] += s[i];
    }
    group_->wait_all();
  }

  void all_gather(const Tensor& in, Tensor out) override {
    const std::size_t bytes = in.nbytes();
    DS_CHECK(out.nbytes() == bytes * group_->size && in.device == Device::Cpu, "all_gather: out must hold size x in");
    publish(in.data, bytes);
    for (int r = 0; r < group_->size; ++r)
      std::memcpy(static_cast<unsigned char*>(out.data) + bytes * r, group_->slots[r].data(), bytes);
    group_->wait_all();
  }

  void barrier() override { group_->wait_all(); }

 private:
  // Copies this rank's data into its slot (grown only here, before the first barrier, when no
  // other rank can be reading it) and waits for every rank to do the same.
  void publish(const void* data, std::size_t bytes) {
    auto& slot = group_->slots[rank_];
    if (slot.size() < bytes) slot.resize(bytes);
    std::memcpy(slot.data(), data, bytes);
    group_->wait_all();
  }

  std::shared_ptr<CpuGroup> group_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(int size) {
  DS_CHECK(size >= 1, "communicator group of ", size);
  auto group = std::make_shared<CpuGroup>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<CpuCommunicator>(group, r));
  return out;
}

}  // namespace deltaserve
