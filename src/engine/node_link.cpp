#include "engine/node_link.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "util/timer.h"

#ifdef DELTASERVE_WITH_CUDA
#include "backend/cuda/nccl_communicator.h"
#endif

namespace deltaserve {

namespace {

constexpr uint32_t kMagic = 0x314e5344;  // "DSN1": the protocol of this build
enum class HelloKind : uint32_t { Node = 0, Rank = 1 };
constexpr double kHelloTimeoutS = 10;    // a connection says who it is within this

std::vector<uint8_t> node_hello(const NodeLinkOptions& o) {
  ByteWriter w;
  w.put(kMagic);
  w.put(HelloKind::Node);
  w.put<int32_t>(o.node_rank);
  w.put<int32_t>(o.nnodes);
  w.put<int32_t>(o.tp_size);
  w.put_string(o.device);
  w.put_string(o.model_identity);
  w.put<int32_t>(static_cast<int32_t>(o.settings.size()));
  for (const auto& [k, v] : o.settings) {
    w.put_string(k);
    w.put_string(v);
  }
  return std::move(w.bytes);
}

std::vector<uint8_t> rank_hello(int rank) {
  ByteWriter w;
  w.put(kMagic);
  w.put(HelloKind::Rank);
  w.put<int32_t>(rank);
  return std::move(w.bytes);
}

// The next connection that introduces itself as `kind` (its stream, and what it says after the
// magic and the kind), skipping any that says something else within kHelloTimeoutS (a port scan, a
// health check); an error once now_seconds() passes `deadline`.
struct Hello {
  TcpStream stream;
  std::vector<uint8_t> body;
};
Result<Hello> accept_hello(TcpListener& listener, double deadline, HelloKind kind) {
  for (;;) {
    const double left = deadline - now_seconds();
    if (left <= 0) return error("timeout");
    auto s = listener.accept(left);
    if (!s.is_ok()) return s.status();
    auto bytes = s->recv_frame(kHelloTimeoutS, 4096);
    if (!bytes.is_ok()) continue;
    ByteReader r(*bytes);
    if (r.get<uint32_t>() != kMagic || r.get<HelloKind>() != kind) continue;
    constexpr std::size_t header = sizeof(kMagic) + sizeof(HelloKind);
    return Hello{std::move(*s), std::vector<uint8_t>(bytes->begin() + header, bytes->end())};
  }
}

std::vector<uint8_t> refusal(const std::string& why) {
  ByteWriter w;
  w.put<uint8_t>(0);
  w.put_string(why);
  return std::move(w.bytes);
}

}  // namespace

Result<std::unique_ptr<NodeLink>> NodeLink::lead(const NodeLinkOptions& o, const std::vector<uint8_t>& welcome) {
  std::unique_ptr<NodeLink> l(new NodeLink());
  l->o_ = o;
  l->welcome_ = welcome;
  const std::string where = o.addr.str();
  DS_ASSIGN_OR_RETURN(l->listener_, TcpListener::listen(o.addr));
#ifdef DELTASERVE_WITH_CUDA
  if (o.device == "cuda") {
    auto id = nccl_unique_id();
    if (!id.is_ok()) return error("--nnodes ", o.nnodes, " on GPUs needs NCCL: ", id.status().message());
    l->nccl_id_ = std::move(*id);
  }
#endif
  std::vector<TcpStream> nodes(static_cast<std::size_t>(o.nnodes - 1));
  int arrived = 0;
  const double deadline = now_seconds() + o.timeout_s;
  while (arrived < o.nnodes - 1) {
    auto hello = accept_hello(l->listener_, deadline, HelloKind::Node);
    if (!hello.is_ok()) {
      std::string missing;
      for (int r = 1; r < o.nnodes; ++r)
        if (!nodes[r - 1].valid()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      return error("node(s) ", missing, " of --nnodes ", o.nnodes, " did not connect to ", where, " within ",
                   o.timeout_s, " s (--dist-timeout); start them with --node-rank and the same --dist-init-addr");
    }
    TcpStream* s = &hello->stream;
    ByteReader r(hello->body);
    const int node = r.get<int32_t>(), nnodes = r.get<int32_t>(), tp = r.get<int32_t>();
    const std::string device = r.get_string(), model = r.get_string();
    std::vector<std::pair<std::string, std::string>> given;
    const int32_t n_given = r.get<int32_t>();
    for (int32_t i = 0; r.ok() && i >= 0 && i < n_given && i < 4096; ++i) {
      std::string k = r.get_string();
      given.emplace_back(std::move(k), r.get_string());
    }
    // A stranger that knows the magic but not the rest is skipped, as any other stranger is.
    if (!r.ok()) continue;
    std::string why;
    if (nnodes != o.nnodes) why = str_cat("node ", node, " was started with --nnodes ", nnodes, ", node 0 with ", o.nnodes);
    else if (node < 1 || node >= o.nnodes) why = str_cat("--node-rank ", node, " is not in 1..", o.nnodes - 1);
    else if (nodes[node - 1].valid()) why = str_cat("two nodes say --node-rank ", node);
    else if (tp != o.tp_size) why = str_cat("node ", node, " was started with --tp-size ", tp, ", node 0 with ", o.tp_size);
    else if (device != o.device) why = str_cat("node ", node, " runs on --device ", device, ", node 0 on ", o.device);
    else if (model != o.model_identity)
      why = str_cat("node ", node, " loads another model (", model, ") than node 0 (", o.model_identity, ")");
    for (const auto& [k, v] : given) {
      if (!why.empty()) break;
      for (const auto& [k0, v0] : o.settings)
        if (k0 == k && v0 != v)
          why = str_cat("node ", node, " was started with --", k, " ", v, ", node 0 with ", v0.empty() ? "(unset)" : v0,
                        " (node 0 sets it for every node)");
    }
    if (!why.empty()) {
      (void)s->send_frame(refusal(why));
      return error("multi-node launch at ", where, ": ", why);
    }
    nodes[node - 1] = std::move(*s);
    ++arrived;
  }
  // The welcomes go out once every node is in: a welcomed node connects its ranks at once, and
  // their introductions would reach the loop above, which skips them, while later nodes are
  // still awaited (--nnodes 3 never started).
  ByteWriter w;
  w.put<uint8_t>(1);
  w.put_array(l->nccl_id_.data(), l->nccl_id_.size());
  w.put_array(welcome.data(), welcome.size());
  for (auto& s : nodes) DS_RETURN_IF_ERROR(s.send_frame(w.bytes));
  l->nodes_ = std::move(nodes);
  return l;
}

Result<std::unique_ptr<NodeLink>> NodeLink::join(const NodeLinkOptions& o) {
  std::unique_ptr<NodeLink> l(new NodeLink());
  l->o_ = o;
  const std::string where = o.addr.str();
  auto s = tcp_connect(o.addr, o.timeout_s);
  if (!s.is_ok())
    return error("node ", o.node_rank, ": node 0 is not listening at ", where, " (--dist-init-addr): ",
                 s.status().message(), " (--dist-timeout ", o.timeout_s, " s)");
  DS_RETURN_IF_ERROR(s->send_frame(node_hello(o)));
  // Node 0 answers when it has read this (at once, or once it listens): within the timeout.
  auto reply = s->recv_frame(o.timeout_s, std::size_t(64) << 20);
  if (!reply.is_ok()) return error("node ", o.node_rank, ": no welcome from node 0 at ", where, ": ", reply.status().message());
  ByteReader r(*reply);
  if (r.get<uint8_t>() != 1) {
    const std::string why = r.get_string();
    return error("node 0 at ", where, " refused node ", o.node_rank, ": ", r.ok() ? why : "(no reason)");
  }
  l->nccl_id_ = r.get_array<uint8_t>();
  l->welcome_ = r.get_array<uint8_t>();
  if (!r.ok()) return error("node ", o.node_rank, ": a malformed welcome from ", where);
  l->nodes_.push_back(std::move(*s));
  return l;
}

NodeLink::~NodeLink() {
  stop_watch_ = true;
  if (watch_.joinable()) watch_.join();
  // (No stop command here: a node 0 that fails closes the connections, and the other nodes exit 1
  // naming it; stop_nodes() is the clean stop.)
}

void NodeLink::stop_nodes() {
  if (o_.node_rank != 0) return;
  stop_watch_ = true;  // (the nodes close their connections once stopped: not a death)
  if (watch_.joinable()) watch_.join();
  std::lock_guard<std::mutex> lk(send_mu_);
  for (auto& s : nodes_)
    if (s.valid()) (void)s.send_frame({});
}

Result<std::vector<std::vector<TcpStream>>> NodeLink::rank_streams() {
  const int L = local_ranks(), P = o_.tp_size, first = first_rank();
  std::vector<std::vector<TcpStream>> out(static_cast<std::size_t>(L));
  // Every rank but 0 connects to rank 0 (node 0's listener) and says which it is.
  for (int i = o_.node_rank == 0 ? 1 : 0; i < L; ++i) {
    auto s = tcp_connect(o_.addr, o_.timeout_s);
    if (!s.is_ok()) return error("rank ", first + i, ": cannot reach rank 0 at ", o_.addr.str(), ": ", s.status().message());
    DS_RETURN_IF_ERROR(s->send_frame(rank_hello(first + i)));
    out[i].push_back(std::move(*s));
  }
  if (o_.node_rank != 0) return out;
  std::vector<TcpStream> hub(static_cast<std::size_t>(P - 1));
  const double deadline = now_seconds() + o_.timeout_s;
  for (int arrived = 0; arrived < P - 1; ++arrived) {
    auto hello = accept_hello(listener_, deadline, HelloKind::Rank);
    if (!hello.is_ok()) return error(P - 1 - arrived, " tensor-parallel rank(s) did not connect to rank 0 at ", o_.addr.str(),
                                  " within ", o_.timeout_s, " s");
    ByteReader r(hello->body);
    const int rank = r.get<int32_t>();
    if (!r.ok() || rank < 1 || rank >= P || hub[rank - 1].valid()) return error("rank 0: a connection says it is rank ", rank);
    hub[rank - 1] = std::move(hello->stream);
  }
  out[0] = std::move(hub);
  return out;
}

void NodeLink::send(const std::vector<uint8_t>& command) {
  std::lock_guard<std::mutex> lk(send_mu_);
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const Status st = nodes_[i].send_frame(command);
    if (st.is_ok()) continue;
    std::fprintf(stderr, "deltaserve: fatal: node %zu of %d went away: %s\n", i + 1, o_.nnodes, st.message().c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
}

void NodeLink::watch_node_zero(double grace_s) {
  if (o_.node_rank == 0 || watch_.joinable()) return;
  watch_ = std::thread([this, grace_s] {
    std::optional<double> gone;
    while (!stop_watch_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (!gone && nodes_[0].peer_hung_up()) gone = now_seconds();
      if (gone && now_seconds() - *gone > grace_s && !stop_watch_.load()) {
        std::fprintf(stderr, "deltaserve: fatal: node 0 at %s closed its connection %.0f s ago and node %d is still "
                     "in a step (stuck in a collective with it?); exiting\n", o_.addr.str().c_str(), grace_s,
                     o_.node_rank);
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
  });
}

void NodeLink::watch_nodes() {
  if (o_.node_rank != 0 || watch_.joinable()) return;
  watch_ = std::thread([this] {
    while (!stop_watch_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      for (std::size_t i = 0; i < nodes_.size() && !stop_watch_.load(); ++i) {
        if (!nodes_[i].peer_hung_up()) continue;
        std::fprintf(stderr, "deltaserve: fatal: node %zu of %d closed its connection; node 0 cannot run a step "
                     "without its ranks; exiting\n", i + 1, o_.nnodes);
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
  });
}

Status NodeLink::receive(std::vector<uint8_t>& out) {
  const Status st = nodes_[0].recv_frame_into(out, -1, std::size_t(1) << 30);
  if (!st.is_ok()) return error("node 0 at ", o_.addr.str(), " went away: ", st.message());
  return Status::ok();
}

}  // namespace deltaserve
