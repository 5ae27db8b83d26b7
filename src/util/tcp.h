// Tcp: blocking TCP streams with deadlines, for the nodes of a multi-node group (the rendezvous at
// --dist-init-addr, node 0's commands to the other nodes, and the CPU socket communicator).
// Every wait is bounded where a peer may never come (accept, connect, a reply expected within a
// timeout); a peer that goes away reads as an error naming it, never as a hang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "util/status.h"

namespace deltaserve {

struct HostPort {
  std::string host;
  int port = 0;
  std::string str() const;
};
// "HOST:PORT" or "[IPv6]:PORT" (as SGLang's --dist-init-addr).
Result<HostPort> parse_host_port(std::string_view s);

class TcpStream {
 public:
  TcpStream() = default;
  explicit TcpStream(int fd) : fd_(fd) {}
  TcpStream(TcpStream&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  TcpStream& operator=(TcpStream&& o) noexcept;
  TcpStream(const TcpStream&) = delete;
  TcpStream& operator=(const TcpStream&) = delete;
  ~TcpStream() { close(); }

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void close();
  // Whether the peer has closed its end (or the connection failed), without reading anything.
  bool peer_hung_up() const;
  Status send_all(const void* data, std::size_t n);
  // Reads exactly n bytes. timeout_s < 0: wait as long as the peer keeps the connection.
  Status recv_all(void* data, std::size_t n, double timeout_s = -1);
  // Length-prefixed frames (u64 little-endian length, then the bytes).
  Status send_frame(const std::vector<uint8_t>& payload);
  Result<std::vector<uint8_t>> recv_frame(double timeout_s = -1, std::size_t max_bytes = std::size_t(1) << 30);
  // The same into `out` (its capacity kept between frames).
  Status recv_frame_into(std::vector<uint8_t>& out, double timeout_s = -1, std::size_t max_bytes = std::size_t(1) << 30);

 private:
  int fd_ = -1;
};

class TcpListener {
 public:
  TcpListener() = default;
  TcpListener(TcpListener&& o) noexcept : fd_(o.fd_), port_(o.port_) { o.fd_ = -1; }
  TcpListener& operator=(TcpListener&& o) noexcept;
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;
  ~TcpListener();
  // Binds HOST:PORT (port 0: any free port, see port()).
  static Result<TcpListener> listen(const HostPort& at);
  int port() const { return port_; }
  // The next connection, or an error after timeout_s.
  Result<TcpStream> accept(double timeout_s);

 private:
  int fd_ = -1;
  int port_ = 0;
};

// True when the connected socket fd is joined to itself (source address == peer address): what
// connecting to a free local port in the ephemeral range can give (TCP simultaneous open).
bool is_self_connection(int fd);

// Connects to HOST:PORT, retrying while nobody listens there yet (or the connection came back to
// itself), until timeout_s.
Result<TcpStream> tcp_connect(const HostPort& to, double timeout_s);

// Little-endian encoding of the messages carried over these streams.
class ByteWriter {
 public:
  template <typename T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void put_bytes(const void* data, std::size_t n);
  void put_string(std::string_view s);
  template <typename T>
  void put_array(const T* data, std::size_t n) {
    put<uint64_t>(n);
    put_bytes(data, n * sizeof(T));
  }
  std::vector<uint8_t> bytes;
};

// Reads what ByteWriter wrote; a short or malformed message sets ok() false (every read after it
// returns zeros) instead of reading past the end.
class ByteReader {
 public:
  explicit ByteReader(const std::vector<uint8_t>& b) : data_(b.data()), n_(b.size()) {}
  template <typename T>
  T get() {
    T v{};
    get_bytes(&v, sizeof(T));
    return v;
  }
  void get_bytes(void* out, std::size_t n);
  std::string get_string();
  template <typename T>
  std::vector<T> get_array(std::size_t max_elems = std::size_t(1) << 28) {
    const uint64_t n = get<uint64_t>();
    if (n > max_elems || n * sizeof(T) > n_ - pos_) {
      ok_ = false;
      return {};
    }
    std::vector<T> v(n);
    get_bytes(v.data(), n * sizeof(T));
    return v;
  }
  // Appends an array to dst (no allocation once dst has the capacity); returns its length.
  template <typename T>
  std::size_t append_array(std::vector<T>& dst, std::size_t max_elems = std::size_t(1) << 28) {
    const uint64_t n = get<uint64_t>();
    if (n > max_elems || n * sizeof(T) > n_ - pos_) {
      ok_ = false;
      return 0;
    }
    const std::size_t at = dst.size();
    dst.resize(at + n);
    get_bytes(dst.data() + at, n * sizeof(T));
    return n;
  }
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == n_; }

 private:
  const uint8_t* data_;
  std::size_t n_, pos_ = 0;
  bool ok_ = true;
};

}  // namespace deltaserve
