#include "backend/cuda/cuda_communicator.h"

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_launch.h"

namespace deltaserve {

namespace {

// What the ranks share: each rank's staging buffers and flag arrays (device pointers), and a host
// barrier for reserve() (which exchanges the staging pointers).
struct PeerGroup {
  explicit PeerGroup(int n) : size(n) {}
  const int size;
  cuda::PeerPtrs staging[2] = {};
  cuda::PeerPtrs flags = {};
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t phase = 0;
  void host_barrier() {
    std::unique_lock<std::mutex> lk(mu);
    const uint64_t my = phase;
    if (++arrived == size) {
      arrived = 0;
      ++phase;
      cv.notify_all();
      return;
    }
    cv.wait(lk, [&] { return phase != my; });
  }
};

class CudaPeerCommunicator final : public Communicator {
 public:
  CudaPeerCommunicator(std::shared_ptr<PeerGroup> g, int rank, Backend& backend, bool host_sync)
      : g_(std::move(g)),
        rank_(rank),
        backend_(backend),
        stream_(static_cast<cudaStream_t>(cuda_stream(backend))),
        host_sync_(host_sync) {
    // flags [kMaxPeers] | epoch: zero-filled.
    state_ = backend.allocate((cuda::kMaxPeers + 1) * sizeof(uint32_t));
    flags_ = static_cast<uint32_t*>(state_.data());
    epoch_ = flags_ + cuda::kMaxPeers;
    g_->flags.p[rank] = flags_;
  }
  int rank() const override { return rank_; }
  int size() const override { return g_->size; }
  bool graph_capturable() const override { return !host_sync_; }

  void reserve(std::size_t bytes) override {
    bytes = (bytes + 15) / 16 * 16;
    if (bytes > capacity_) {
      for (int b = 0; b < 2; ++b) {
        staging_[b] = backend_.allocate(bytes);
        g_->staging[b].p[rank_] = staging_[b].data();
      }
      capacity_ = bytes;
    }
    backend_.synchronize();
    g_->host_barrier();  // every rank's pointers are in the table (and zeroed)
    for (int b = 0; b < 2; ++b) peers_[b] = g_->staging[b];
    peer_flags_ = g_->flags;
    own_flags_only_.p[0] = flags_;
    mine_.p[0] = staging_[0].data();
    mine_.p[1] = staging_[1].data();
    g_->host_barrier();  // nobody reallocates while another still reads the table
  }

  void all_reduce_sum(Tensor x) override {
    DS_CHECK(x.dtype == DType::F32 && x.device == Device::Cuda, "all_reduce_sum: f32 device tensor");
    const int64_t n = x.numel();
    DS_CHECK(static_cast<std::size_t>(n) * 4 <= capacity_, "all_reduce_sum of ", n * 4, " bytes exceeds reserve(",
             capacity_, ")");
    cuda::launch_comm_stage(x.data, n, mine_, epoch_, stream_);
    sync_point();
    cuda::launch_comm_sum(x.f32(), n, peers_[0], peers_[1], g_->size, epoch_, stream_);
  }

  void all_gather(const Tensor& in, Tensor out) override {
    const std::size_t bytes = in.nbytes();
    DS_CHECK(bytes % 4 == 0 && out.nbytes() == bytes * g_->size, "all_gather: out must hold size x in (32-bit words)");
    DS_CHECK(bytes <= capacity_, "all_gather of ", bytes, " bytes exceeds reserve(", capacity_, ")");
    const int64_t words = static_cast<int64_t>(bytes / 4);
    cuda::launch_comm_stage(in.data, words, mine_, epoch_, stream_);
    sync_point();
    cuda::launch_comm_gather(out.data, words, peers_[0], peers_[1], g_->size, epoch_, stream_);
  }

  void barrier() override { sync_point(); }

 private:
  // Every rank has staged (and finished reading what it staged two collectives ago). Device
  // mode: the barrier kernel (epoch + 1, flags). Host mode: the same epoch step by a 1-rank
  // barrier kernel (no peer flags), this rank's stream drained, then a host barrier.
  void sync_point() {
    if (!host_sync_) {
      cuda::launch_comm_barrier(epoch_, peer_flags_, flags_, rank_, g_->size, stream_);
      return;
    }
    cuda::launch_comm_barrier(epoch_, own_flags_only_, flags_, 0, 1, stream_);
    DS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    g_->host_barrier();
  }

  std::shared_ptr<PeerGroup> g_;
  int rank_;
  Backend& backend_;
  cudaStream_t stream_;
  DeviceBuffer state_, staging_[2];
  uint32_t* flags_ = nullptr;
  uint32_t* epoch_ = nullptr;
  std::size_t capacity_ = 0;
  bool host_sync_ = false;
  cuda::PeerPtrs mine_ = {}, peers_[2] = {}, peer_flags_ = {}, own_flags_only_ = {};
};

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> make_cuda_peer_communicators(const std::vector<Backend*>& backends) {
  const int P = static_cast<int>(backends.size());
  if (P < 1 || P > cuda::kMaxPeers) return error("tensor parallel group of ", P, " ranks (1..", cuda::kMaxPeers, ")");
  // Peer access between every pair of distinct devices.
  for (int a = 0; a < P; ++a)
    for (int b = 0; b < P; ++b) {
      const int da = cuda_device_index(*backends[a]), db = cuda_device_index(*backends[b]);
      if (da == db) continue;
      int ok = 0;
      DS_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, da, db));
      if (!ok) return error("GPU ", da, " cannot access GPU ", db, " peer-to-peer: tensor parallelism over them needs NCCL");
      backends[a]->bind_thread();
      const cudaError_t e = cudaDeviceEnablePeerAccess(db, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
        return error("cudaDeviceEnablePeerAccess(", da, " -> ", db, "): ", cudaGetErrorString(e));
      (void)cudaGetLastError();
    }
  bool shared_device = false;
  for (int a = 0; a < P; ++a)
    for (int b = a + 1; b < P; ++b)
      shared_device = shared_device || cuda_device_index(*backends[a]) == cuda_device_index(*backends[b]);
  const char* force = std::getenv("DELTASERVE_TP_DEVICE_BARRIER");
  const bool host_sync = shared_device && !(force && std::string(force) == "1");
  auto g = std::make_shared<PeerGroup>(P);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < P; ++r) out.push_back(std::make_unique<CudaPeerCommunicator>(g, r, *backends[r], host_sync));
  return out;
}

}  // namespace deltaserve
