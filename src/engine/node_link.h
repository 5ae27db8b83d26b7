// NodeLink: the nodes of one multi-node deployment (SGLang's --nnodes N --node-rank R
// --dist-init-addr HOST:PORT). Node 0 listens at HOST:PORT. Every other node connects, says who
// it is (node rank, group shape, device, model) and gets node 0's welcome: the engine config it
// must build (node 0's memory plan) and, on GPUs, NCCL's unique id. From then on node 0 sends
// the commands of every step (engine/node_command.h) and the other nodes replay them on their own
// ranks (engine/follower_node.h); only node 0 schedules and serves HTTP. The tensor-parallel
// ranks are numbered node by node (node r holds ranks r*L .. r*L+L-1, L = tp_size / nnodes) and
// talk to each other directly: NCCL over all nodes, or on the CPU SocketCommunicator, whose
// streams reach rank 0 through the same port. A node that does not arrive within the timeout, a
// mismatched launch, or node 0 going away is an error naming it, never a hang.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "util/status.h"
#include "util/tcp.h"

namespace deltaserve {

struct NodeLinkOptions {
  HostPort addr;               // --dist-init-addr
  int nnodes = 1;              // --nnodes
  int node_rank = 0;           // --node-rank
  int tp_size = 1;             // --tp-size (over all nodes)
  std::string device;          // "cpu" or "cuda": every node must say the same
  std::string model_identity;  // what must match between nodes (config.json's hash, the load format)
  double timeout_s = 300;      // --dist-timeout: how long a node waits for the others
  // Node 0: its effective serve settings (flag name, value); nodes 1..N-1: the settings they were
  // given explicitly, other than their own per-node ones. Node 0 decides every setting for the
  // group, so a given one that differs from node 0's is refused naming the flag (it would be
  // ignored on that node).
  std::vector<std::pair<std::string, std::string>> settings;
};

class NodeLink {
 public:
  // Node 0: listens, waits for nodes 1..N-1 (each within timeout_s), checks what each says and
  // sends it `welcome` (plus NCCL's id on GPUs). A node that says something else is refused (it
  // exits with node 0's reason) and the launch fails naming it.
  static Result<std::unique_ptr<NodeLink>> lead(const NodeLinkOptions& o, const std::vector<uint8_t>& welcome);
  // Nodes 1..N-1: connects (retrying until timeout_s), introduces itself, reads the welcome.
  static Result<std::unique_ptr<NodeLink>> join(const NodeLinkOptions& o);
  ~NodeLink();

  int nnodes() const { return o_.nnodes; }
  int node_rank() const { return o_.node_rank; }
  int tp_size() const { return o_.tp_size; }
  int local_ranks() const { return o_.tp_size / o_.nnodes; }
  int first_rank() const { return o_.node_rank * local_ranks(); }
  const HostPort& addr() const { return o_.addr; }
  const std::vector<uint8_t>& welcome() const { return welcome_; }
  const std::vector<uint8_t>& nccl_id() const { return nccl_id_; }

  // CPU: the TCP streams of this node's ranks for make_socket_communicator (element i: rank
  // first_rank() + i's). Node 0 accepts every other rank's connection; call on every node once.
  Result<std::vector<std::vector<TcpStream>>> rank_streams();

  // Node 0: a command to every other node. A node that is gone ends this process naming it (a
  // step cannot go on without its ranks).
  void send(const std::vector<uint8_t>& command);
  // Node 0: a thread that ends this process (exit 1, naming the node) once another node's
  // connection closes, so that an idle node 0 does not report healthy with a node gone (a step
  // would find it only when it is sent). stop_nodes() ends the watch first.
  void watch_nodes();
  // Node 0, stopping cleanly: an empty command tells the other nodes to stop too (exit 0). Without
  // it (node 0 failed) they see the connection close and exit 1.
  void stop_nodes();
  // Nodes 1..N-1: the next command from node 0 into `out` (empty: node 0 stopped); an error when
  // node 0 went away.
  Status receive(std::vector<uint8_t>& out);
  // Nodes 1..N-1: a thread that ends this process (exit 1, naming node 0) once node 0's connection
  // has been closed for grace_s seconds without this node stopping. A step stuck in an NCCL
  // collective whose node 0 is gone would otherwise wait forever; a node 0 that stops normally
  // sends its stop first, which this node reads long before the grace ends.
  void watch_node_zero(double grace_s);

 private:
  NodeLink() = default;
  NodeLinkOptions o_;
  TcpListener listener_;             // node 0
  std::vector<TcpStream> nodes_;     // node 0: node r's control stream at r - 1; others: node 0's at 0
  std::vector<uint8_t> welcome_, nccl_id_;
  std::mutex send_mu_;
  std::thread watch_;
  std::atomic<bool> stop_watch_{false};
};

}  // namespace deltaserve
