#include "deploy/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace deltaserve {
namespace {

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::string HttpUrl::to_string() const { return "http://" + host + ":" + std::to_string(port) + base_path; }

Result<HttpUrl> parse_local_http_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0)
    return error("--url ", url, ": only http:// URLs are supported (e.g. http://127.0.0.1:30000)");
  std::string rest = url.substr(scheme.size());
  std::string hostport = rest.substr(0, rest.find('/'));
  HttpUrl u;
  if (auto slash = rest.find('/'); slash != std::string::npos) u.base_path = rest.substr(slash);
  while (!u.base_path.empty() && u.base_path.back() == '/') u.base_path.pop_back();
  if (u.base_path == "/v1") u.base_path.clear();  // accept the OpenAI base URL too
  auto colon = hostport.rfind(':');
  u.host = colon == std::string::npos ? hostport : hostport.substr(0, colon);
  if (colon != std::string::npos) {
    char* end = nullptr;
    long p = std::strtol(hostport.c_str() + colon + 1, &end, 10);
    if (*end != '\0' || p < 1 || p > 65535) return error("--url ", url, ": bad port");
    u.port = static_cast<int>(p);
  }
  if (u.host == "localhost") u.host = "127.0.0.1";
  if (u.host != "127.0.0.1")
    return error("--url ", url, ": the bench client talks to local servers only (127.0.0.1 or localhost)");
  return u;
}

Result<HttpResponse> http_request(const HttpUrl& url, const std::string& method, const std::string& path,
                                  const std::string& body, const BodyCallback& on_body, double timeout_s) {
  Socket s(::socket(AF_INET, SOCK_STREAM, 0));
  if (s.fd() < 0) return error("socket: ", std::strerror(errno));
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout_s);
  tv.tv_usec = static_cast<suseconds_t>((timeout_s - double(tv.tv_sec)) * 1e6);
  if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;  // {0, 0} means no timeout at all
  setsockopt(s.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(s.fd(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(url.port));
  inet_pton(AF_INET, url.host.c_str(), &addr.sin_addr);
  if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return error("cannot connect to ", url.to_string(), ": ", std::strerror(errno));

  std::string req = method + " " + url.base_path + path + " HTTP/1.1\r\nHost: " + url.host + ":" +
                    std::to_string(url.port) + "\r\nConnection: close\r\nAccept: */*\r\n";
  if (!body.empty() || method == "POST")
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  for (size_t sent = 0; sent < req.size();) {
    ssize_t n = ::send(s.fd(), req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return error("send to ", url.to_string(), ": ", std::strerror(errno));
    sent += static_cast<size_t>(n);
  }

  HttpResponse resp;
  std::string buf;
  char tmp[16384];
  bool eof = false;
  auto fill = [&]() -> Status {
    ssize_t n = ::recv(s.fd(), tmp, sizeof tmp, 0);
    if (n < 0) return error("read from ", url.to_string(), ": ", errno == EAGAIN ? "timed out" : std::strerror(errno));
    if (n == 0) eof = true;
    buf.append(tmp, static_cast<size_t>(n));
    return Status::ok();
  };
  size_t header_end;
  while ((header_end = buf.find("\r\n\r\n")) == std::string::npos) {
    if (eof) return error(url.to_string(), path, ": connection closed before the response headers");
    DS_RETURN_IF_ERROR(fill());
  }
  {
    std::string head = buf.substr(0, header_end);
    buf.erase(0, header_end + 4);
    size_t line_end = head.find("\r\n");
    std::string status_line = head.substr(0, line_end);
    if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12)
      return error(url.to_string(), path, ": not an HTTP response: ", status_line);
    resp.status = std::atoi(status_line.c_str() + 9);
    size_t pos = line_end == std::string::npos ? head.size() : line_end + 2;
    while (pos < head.size()) {
      size_t e = head.find("\r\n", pos);
      if (e == std::string::npos) e = head.size();
      std::string line = head.substr(pos, e - pos);
      auto colon = line.find(':');
      if (colon != std::string::npos) {
        std::string v = line.substr(colon + 1);
        while (!v.empty() && v.front() == ' ') v.erase(0, 1);
        resp.headers.emplace_back(lower(line.substr(0, colon)), v);
      }
      pos = e + 2;
    }
  }
  bool chunked = false;
  long long content_length = -1;
  for (const auto& [k, v] : resp.headers) {
    if (k == "transfer-encoding" && lower(v).find("chunked") != std::string::npos) chunked = true;
    if (k == "content-length") content_length = std::atoll(v.c_str());
  }
  auto deliver = [&](std::string_view piece) {
    if (on_body) return on_body(piece);
    resp.body.append(piece);
    return true;
  };
  if (chunked) {
    while (true) {
      size_t le;
      while ((le = buf.find("\r\n")) == std::string::npos) {
        if (eof) return error(url.to_string(), path, ": connection closed inside a chunked body");
        DS_RETURN_IF_ERROR(fill());
      }
      unsigned long long size = std::strtoull(buf.substr(0, le).c_str(), nullptr, 16);
      buf.erase(0, le + 2);
      if (size == 0) break;
      while (buf.size() < size + 2) {
        if (eof) return error(url.to_string(), path, ": connection closed inside a chunk");
        DS_RETURN_IF_ERROR(fill());
      }
      if (!deliver(std::string_view(buf).substr(0, size))) return resp;
      buf.erase(0, size + 2);
    }
  } else {
    long long got = 0;
    while (true) {
      if (!buf.empty()) {
        size_t take = buf.size();
        if (content_length >= 0) take = static_cast<size_t>(std::min<long long>(take, content_length - got));
        if (!deliver(std::string_view(buf).substr(0, take))) return resp;
        got += static_cast<long long>(take);
        buf.clear();
      }
      if ((content_length >= 0 && got >= content_length) || eof) break;
      DS_RETURN_IF_ERROR(fill());
    }
  }
  return resp;
}

void SseParser::feed(std::string_view piece) {
  buf_.append(piece);
  size_t pos;
  while ((pos = buf_.find('\n')) != std::string::npos) {
    std::string l = buf_.substr(0, pos);
    buf_.erase(0, pos + 1);
    if (!l.empty() && l.back() == '\r') l.pop_back();
    line(l);
  }
}

void SseParser::finish() {
  if (!buf_.empty()) line(buf_);
  buf_.clear();
  line("");
}

void SseParser::line(const std::string& l) {
  if (l.empty()) {
    if (has_data_) on_data_(data_);
    data_.clear();
    has_data_ = false;
    return;
  }
  if (l.rfind("data:", 0) == 0) {
    std::string d = l.substr(5);
    if (!d.empty() && d[0] == ' ') d.erase(0, 1);
    if (has_data_) data_ += "\n";
    data_ += d;
    has_data_ = true;
  }
}

}  // namespace deltaserve
