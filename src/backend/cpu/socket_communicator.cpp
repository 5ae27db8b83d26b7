#include "backend/cpu/socket_communicator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace deltaserve {

namespace {

class SocketCommunicator final : public Communicator {
 public:
  SocketCommunicator(int rank, int size, std::vector<TcpStream> streams)
      : rank_(rank), size_(size), streams_(std::move(streams)) {
    DS_CHECK(static_cast<int>(streams_.size()) == (rank == 0 ? size - 1 : 1), "rank ", rank, " of ", size, " with ",
             streams_.size(), " streams");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(Tensor x) override {
    DS_CHECK(x.dtype == DType::F32 && x.device == Device::Cpu, "all_reduce_sum: f32 host tensor");
    const std::size_t bytes = x.nbytes();
    float* v = x.f32();
    if (rank_ != 0) {
      exchange(v, bytes, v, bytes);
      return;
    }
    // Rank order: (x0 + x1) + x2 ..., as CpuCommunicator.
    const int64_t n = x.numel();
    if (staging_.size() < static_cast<std::size_t>(n)) staging_.resize(static_cast<std::size_t>(n));  // reserve() sized it
    for (int r = 1; r < size_; ++r) {
      check(streams_[r - 1].recv_all(staging_.data(), bytes), r);
      for (int64_t i = 0; i < n; ++i) v[i] += staging_[i];
    }
    for (int r = 1; r < size_; ++r) check(streams_[r - 1].send_all(v, bytes), r);
  }

  void all_gather(const Tensor& in, Tensor out) override {
    DS_CHECK(out.nbytes() == in.nbytes() * size_ && in.device == Device::Cpu, "all_gather: out must hold size x in");
    const std::size_t n = in.nbytes();
    auto* o = static_cast<char*>(out.data);
    if (rank_ != 0) {
      exchange(in.data, n, o, n * size_);
      return;
    }
    std::memmove(o, in.data, n);
    for (int r = 1; r < size_; ++r) check(streams_[r - 1].recv_all(o + std::size_t(r) * n, n), r);
    for (int r = 1; r < size_; ++r) check(streams_[r - 1].send_all(o, n * size_), r);
  }

  void reserve(std::size_t bytes) override {
    if (rank_ == 0) staging_.resize(std::max(staging_.size(), bytes / sizeof(float)));
  }

  void barrier() override {
    char b = 0;
    if (rank_ != 0) {
      exchange(&b, 1, &b, 1);
      return;
    }
    for (int r = 1; r < size_; ++r) check(streams_[r - 1].recv_all(&b, 1), r);
    for (int r = 1; r < size_; ++r) check(streams_[r - 1].send_all(&b, 1), r);
  }

 private:
  // Ranks 1..: send this rank's part to rank 0, read back what it made of them all.
  void exchange(const void* out, std::size_t n_out, void* in, std::size_t n_in) {
    check(streams_[0].send_all(out, n_out), 0);
    check(streams_[0].recv_all(in, n_in), 0);
  }
  void check(const Status& st, int peer) const {
    if (st.is_ok()) return;
    std::fprintf(stderr, "deltaserve: fatal: tensor-parallel rank %d lost rank %d: %s (did its node stop?)\n", rank_,
                 peer, st.message().c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }

  int rank_, size_;
  std::vector<TcpStream> streams_;
  std::vector<float> staging_;
};

}  // namespace

std::unique_ptr<Communicator> make_socket_communicator(int rank, int size, std::vector<TcpStream> streams) {
  return std::make_unique<SocketCommunicator>(rank, size, std::move(streams));
}

}  // namespace deltaserve
