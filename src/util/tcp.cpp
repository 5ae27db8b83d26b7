#include "util/tcp.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "util/timer.h"

namespace deltaserve {

namespace {

// Waits until fd is ready for `events`; false on timeout. timeout_s < 0: no limit.
bool wait_fd(int fd, short events, double timeout_s) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int ms = timeout_s < 0 ? -1 : static_cast<int>(timeout_s * 1000.0 + 0.5);
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;  // let the following call report the error
  }
}

Result<addrinfo*> resolve(const HostPort& hp, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(hp.port);
  const int rc = ::getaddrinfo(hp.host.empty() ? nullptr : hp.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) return error("cannot resolve ", hp.str(), ": ", ::gai_strerror(rc));
  return res;
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

std::string HostPort::str() const {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<HostPort> parse_host_port(std::string_view s) {
  HostPort hp;
  std::string_view port;
  if (!s.empty() && s.front() == '[') {
    const auto close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':')
      return error("'", s, "' is not HOST:PORT (an IPv6 address as [ADDR]:PORT)");
    hp.host = std::string(s.substr(1, close - 1));
    if (hp.host.empty()) return error("'", s, "': the address in [] is empty");  // ([]:P bound every interface)
    port = s.substr(close + 2);
  } else {
    const auto colon = s.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || s.find(':') != colon)
      return error("'", s, "' is not HOST:PORT");
    hp.host = std::string(s.substr(0, colon));
    port = s.substr(colon + 1);
  }
  int v = 0;
  if (port.empty() || port.size() > 5) return error("'", s, "': the port must be 1..65535");
  for (char c : port) {
    if (c < '0' || c > '9') return error("'", s, "': the port must be 1..65535");
    v = v * 10 + (c - '0');
  }
  if (v < 1 || v > 65535) return error("'", s, "': the port must be 1..65535");
  hp.port = v;
  return hp;
}

TcpStream& TcpStream::operator=(TcpStream&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void TcpStream::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool TcpStream::peer_hung_up() const {
  pollfd p{fd_, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

Status TcpStream::send_all(const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return error("the peer closed the connection (", std::strerror(errno), ")");
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return Status::ok();
}

Status TcpStream::recv_all(void* data, std::size_t n, double timeout_s) {
  auto* p = static_cast<char*>(data);
  const double deadline = now_seconds() + timeout_s;
  while (n > 0) {
    if (timeout_s >= 0) {
      const double left = deadline - now_seconds();
      if (left <= 0 || !wait_fd(fd_, POLLIN, left)) return error("no reply within ", timeout_s, " s");
    }
    const ssize_t r = ::recv(fd_, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return error("the peer closed the connection");
    if (r < 0) return error("the connection failed (", std::strerror(errno), ")");
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return Status::ok();
}

Status TcpStream::send_frame(const std::vector<uint8_t>& payload) {
  const uint64_t n = payload.size();
  DS_RETURN_IF_ERROR(send_all(&n, sizeof n));
  return send_all(payload.data(), payload.size());
}

Status TcpStream::recv_frame_into(std::vector<uint8_t>& out, double timeout_s, std::size_t max_bytes) {
  uint64_t n = 0;
  DS_RETURN_IF_ERROR(recv_all(&n, sizeof n, timeout_s));
  if (n > max_bytes) return error("a message of ", n, " bytes (at most ", max_bytes, " expected): not a deltaserve node");
  out.resize(n);
  return recv_all(out.data(), out.size(), timeout_s);
}

Result<std::vector<uint8_t>> TcpStream::recv_frame(double timeout_s, std::size_t max_bytes) {
  std::vector<uint8_t> out;
  DS_RETURN_IF_ERROR(recv_frame_into(out, timeout_s, max_bytes));
  return out;
}

TcpListener::~TcpListener() {
  if (fd_ >= 0) ::close(fd_);
}

TcpListener& TcpListener::operator=(TcpListener&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    port_ = o.port_;
    o.fd_ = -1;
  }
  return *this;
}

Result<TcpListener> TcpListener::listen(const HostPort& at) {
  DS_ASSIGN_OR_RETURN(addrinfo* res, resolve(at, true));
  std::string last = "no address";
  TcpListener l;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      l.fd_ = fd;
      l.port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      break;
    }
    last = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (l.fd_ < 0) return error("cannot listen on ", at.str(), ": ", last);
  return l;
}

Result<TcpStream> TcpListener::accept(double timeout_s) {
  if (!wait_fd(fd_, POLLIN, timeout_s)) return error("nobody connected within ", timeout_s, " s");
  const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return error("accept failed: ", std::strerror(errno));
  set_nodelay(fd);
  return TcpStream(fd);
}

bool is_self_connection(int fd) {
  sockaddr_storage self{}, peer{};
  socklen_t self_len = sizeof self, peer_len = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) != 0) return false;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
  return self_len == peer_len && std::memcmp(&self, &peer, self_len) == 0;
}

Result<TcpStream> tcp_connect(const HostPort& to, double timeout_s) {
  const double deadline = now_seconds() + timeout_s;
  std::string last = "timed out";
  for (;;) {
    DS_ASSIGN_OR_RETURN(addrinfo* res, resolve(to, false));
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
      if (fd < 0) continue;
      int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        const double left = deadline - now_seconds();
        if (left > 0 && wait_fd(fd, POLLOUT, left)) {
          int err = 0;
          socklen_t len = sizeof err;
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          rc = err == 0 ? 0 : -1;
          errno = err;
        } else {
          errno = ETIMEDOUT;
        }
      }
      if (rc == 0 && is_self_connection(fd)) {
        // Nobody listens and the kernel picked the target port as our own source port: TCP's
        // simultaneous open joined the socket to itself. Drop it, or it holds the port the
        // listener is about to bind and echoes our own messages back to us.
        rc = -1;
        errno = ECONNREFUSED;
      }
      if (rc == 0) {
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        set_nodelay(fd);
        ::freeaddrinfo(res);
        return TcpStream(fd);
      }
      last = std::strerror(errno);
      ::close(fd);
    }
    ::freeaddrinfo(res);
    if (deadline - now_seconds() <= 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // nobody listens yet: try again
  }
  return error("cannot reach ", to.str(), " within ", timeout_s, " s (", last, ")");
}

void ByteWriter::put_bytes(const void* data, std::size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  bytes.insert(bytes.end(), p, p + n);
}

void ByteWriter::put_string(std::string_view s) {
  put<uint64_t>(s.size());
  put_bytes(s.data(), s.size());
}

void ByteReader::get_bytes(void* out, std::size_t n) {
  if (!ok_ || n > n_ - pos_) {
    ok_ = false;
    std::memset(out, 0, n);
    return;
  }
  std::memcpy(out, data_ + pos_, n);
  pos_ += n;
}

std::string ByteReader::get_string() {
  const uint64_t n = get<uint64_t>();
  if (!ok_ || n > n_ - pos_) {
    ok_ = false;
    return {};
  }
  std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
  pos_ += n;
  return s;
}

}  // namespace deltaserve
