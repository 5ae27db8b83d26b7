// Multi-node groups (--nnodes, engine/node_link.h) on the CPU, in this process: the TCP pieces
// (HOST:PORT, framed messages, the socket communicator against CpuCommunicator's sums), the
// rendezvous (welcome, refusals that name the mismatched flag, a missing node timing out), and
// whole engines whose tensor-parallel ranks sit on two "nodes" (node 0's Engine and a
// FollowerNode on another thread, talking over loopback TCP) against one node: greedy tokens
// identical, with MTP (run_mtp, state commits) and the prefix cache (slot copies) replayed.
// serve as two processes: tests/deploy/serve_process_test.cpp.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "backend/cpu/cpu_communicator.h"
#include "backend/cpu/socket_communicator.h"
#include "engine/engine.h"
#include "engine/follower_node.h"
#include "engine/node_command.h"
#include "engine/node_link.h"
#include "engine_fixture.h"

namespace deltaserve::test {
namespace {

// A port nobody listens on now (the listener closes at once).
int free_port() {
  auto l = TcpListener::listen({"127.0.0.1", 0});
  return l.is_ok() ? l->port() : 0;
}

TEST(HostPort, ParsesSglangsFormAndRefusesTheRest) {
  auto a = parse_host_port("10.0.0.1:5000");
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->host, "10.0.0.1");
  EXPECT_EQ(a->port, 5000);
  auto v6 = parse_host_port("[::1]:8080");
  ASSERT_TRUE(v6.is_ok()) << v6.status().message();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->str(), "[::1]:8080");
  // ("[]:P" bound every interface: stop 54.)
  for (const char* bad : {"node0", "node0:", ":5000", "node0:0", "node0:65536", "node0:50x", "a:b:1", "[::1]5000", "[]:5000"}) {
    auto r = parse_host_port(bad);
    EXPECT_FALSE(r.is_ok()) << bad;
    if (!r.is_ok()) EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().message();
  }
}

TEST(ByteReader, ReadsWhatWasWrittenAndRefusesShortMessages) {
  ByteWriter w;
  w.put<int32_t>(-7);
  w.put_string("abc");
  const int32_t xs[3] = {1, 2, 3};
  w.put_array(xs, 3);
  ByteReader r(w.bytes);
  EXPECT_EQ(r.get<int32_t>(), -7);
  EXPECT_EQ(r.get_string(), "abc");
  EXPECT_EQ(r.get_array<int32_t>(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(r.ok() && r.at_end());
  // Cut anywhere: never a read past the end, and ok() says so.
  for (std::size_t cut = 0; cut < w.bytes.size(); ++cut) {
    std::vector<uint8_t> part(w.bytes.begin(), w.bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    ByteReader s(part);
    (void)s.get<int32_t>();
    (void)s.get_string();
    (void)s.get_array<int32_t>();
    EXPECT_FALSE(s.ok()) << cut;
  }
}

// A node joining before node 0 listens retries connect(); when the port is in the ephemeral
// range the kernel can pick it as the source port and join the socket to itself (CI saw the
// joining node read its own hello and node 0 find its port taken). Here a socket bound to a port
// connects to that same port: a self-connection on Linux, which is_self_connection names, while
// an ordinary connection to a listener is not one.
TEST(TcpConnect, ASocketJoinedToItselfIsRecognised) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
  EXPECT_TRUE(is_self_connection(fd));
  ::close(fd);

  auto l = TcpListener::listen({"127.0.0.1", 0});
  ASSERT_TRUE(l.is_ok()) << l.status().message();
  auto c = tcp_connect({"127.0.0.1", l->port()}, 5.0);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_FALSE(is_self_connection(c->fd()));
}

TEST(SocketCommunicator, SumsAndGathersBitForBitAsCpuCommunicator) {
  constexpr int P = 3, N = 4099;
  auto listener = TcpListener::listen({"127.0.0.1", 0});
  ASSERT_TRUE(listener.is_ok()) << listener.status().message();
  std::vector<TcpStream> hub, own[P];
  for (int r = 1; r < P; ++r) {
    auto c = tcp_connect({"127.0.0.1", listener->port()}, 5);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    own[r].push_back(std::move(*c));
    auto a = listener->accept(5);
    ASSERT_TRUE(a.is_ok());
    hub.push_back(std::move(*a));
  }
  own[0] = std::move(hub);
  std::vector<std::unique_ptr<Communicator>> sock, cpu = make_cpu_communicators(P);
  for (int r = 0; r < P; ++r) sock.push_back(make_socket_communicator(r, P, std::move(own[r])));
  // Values whose float sums depend on the order.
  std::vector<std::vector<float>> in(P, std::vector<float>(N)), a(P), b(P), ga(P), gb(P);
  for (int r = 0; r < P; ++r)
    for (int i = 0; i < N; ++i) in[r][i] = std::ldexp(1.0f + 0.001f * float((i * 7 + r * 13) % 997), (i + r * 5) % 40 - 20);
  auto run = [&](std::vector<std::unique_ptr<Communicator>>& comms, std::vector<std::vector<float>>& sums,
                 std::vector<std::vector<float>>& gathered) {
    std::vector<std::thread> ts;
    for (int r = 0; r < P; ++r)
      ts.emplace_back([&, r] {
        sums[r] = in[r];
        comms[r]->all_reduce_sum(Tensor(sums[r].data(), DType::F32, {N}));
        gathered[r].assign(std::size_t(P) * 5, 0.0f);
        comms[r]->all_gather(Tensor(in[r].data(), DType::F32, {5}), Tensor(gathered[r].data(), DType::F32, {P * 5}));
        comms[r]->barrier();
      });
    for (auto& t : ts) t.join();
  };
  run(sock, a, ga);
  run(cpu, b, gb);
  for (int r = 0; r < P; ++r) {
    EXPECT_EQ(std::memcmp(a[r].data(), b[r].data(), N * 4), 0) << "rank " << r;
    EXPECT_EQ(ga[r], gb[r]) << "rank " << r;
    for (int q = 0; q < P; ++q) EXPECT_EQ(ga[r][q * 5 + 2], in[q][2]);
  }
}

NodeLinkOptions link_options(int port, int nnodes, int node, int tp) {
  NodeLinkOptions o;
  o.addr = {"127.0.0.1", port};
  o.nnodes = nnodes;
  o.node_rank = node;
  o.tp_size = tp;
  o.device = "cpu";
  o.model_identity = "config.json 0123, --load-format auto";
  o.timeout_s = 20;
  return o;
}

TEST(NodeLink, EveryNodeGetsTheWelcomeAndItsRanks) {
  const int port = free_port();
  const std::vector<uint8_t> welcome = {1, 2, 3, 250};
  auto n1 = std::async(std::launch::async, [&] { return NodeLink::join(link_options(port, 3, 1, 6)); });
  auto n2 = std::async(std::launch::async, [&] { return NodeLink::join(link_options(port, 3, 2, 6)); });
  auto lead = NodeLink::lead(link_options(port, 3, 0, 6), welcome);
  ASSERT_TRUE(lead.is_ok()) << lead.status().message();
  auto l1 = n1.get(), l2 = n2.get();
  ASSERT_TRUE(l1.is_ok()) << l1.status().message();
  ASSERT_TRUE(l2.is_ok()) << l2.status().message();
  EXPECT_EQ((*l1)->welcome(), welcome);
  EXPECT_EQ((*l2)->welcome(), welcome);
  EXPECT_EQ((*l2)->first_rank(), 4);
  EXPECT_EQ((*l2)->local_ranks(), 2);
  // Rank streams: rank 0 (node 0) holds one per other rank; every other rank one to rank 0.
  auto s1 = std::async(std::launch::async, [&] { return (*l1)->rank_streams(); });
  auto s2 = std::async(std::launch::async, [&] { return (*l2)->rank_streams(); });
  auto s0 = (*lead)->rank_streams();
  ASSERT_TRUE(s0.is_ok()) << s0.status().message();
  EXPECT_EQ((*s0)[0].size(), 5u);
  EXPECT_EQ((*s0)[1].size(), 1u);
  EXPECT_EQ(s1.get()->at(1).size(), 1u);
  EXPECT_EQ(s2.get()->at(0).size(), 1u);
  // Commands reach both nodes in order; node 0 going away ends them with an empty command.
  (*lead)->send({9, 8});
  (*lead)->send({7});
  std::vector<uint8_t> cmd;
  for (auto* l : {&*l1, &*l2}) {
    ASSERT_TRUE((*l)->receive(cmd).is_ok());
    EXPECT_EQ(cmd, (std::vector<uint8_t>{9, 8}));
    ASSERT_TRUE((*l)->receive(cmd).is_ok());
    EXPECT_EQ(cmd, (std::vector<uint8_t>{7}));
  }
  (*lead)->stop_nodes();
  lead->reset();
  ASSERT_TRUE((*l1)->receive(cmd).is_ok());
  EXPECT_TRUE(cmd.empty());
  ASSERT_TRUE((*l2)->receive(cmd).is_ok());
  EXPECT_TRUE(cmd.empty());
  // After the stop, the connection is gone: an error, not a hang.
  EXPECT_FALSE((*l1)->receive(cmd).is_ok());
}

// Stop 54: as serve does, each node connects its ranks as soon as it is welcomed. Node 0 welcomed
// node 1 while it still waited for node 2, so node 1's rank introductions reached the wait for
// nodes (which skipped them) and --nnodes 3 never started. And a node 0 that goes away without
// stop_nodes() (it failed) ends the others with an error, not a clean stop.
TEST(NodeLink, ThreeNodesThatConnectTheirRanksAtOnceStart) {
  const int port = free_port();
  auto joined = [&](int node) {
    return std::async(std::launch::async, [&, node]() -> Result<std::unique_ptr<NodeLink>> {
      if (node == 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      DS_ASSIGN_OR_RETURN(auto l, NodeLink::join(link_options(port, 3, node, 3)));
      DS_ASSIGN_OR_RETURN(auto streams, l->rank_streams());
      if (streams.size() != 1 || streams[0].size() != 1) return error("node ", node, ": wrong rank streams");
      return l;
    });
  };
  auto n1 = joined(1), n2 = joined(2);
  auto lead = NodeLink::lead(link_options(port, 3, 0, 3), {});
  ASSERT_TRUE(lead.is_ok()) << lead.status().message();
  auto s0 = (*lead)->rank_streams();
  ASSERT_TRUE(s0.is_ok()) << s0.status().message();
  EXPECT_EQ((*s0)[0].size(), 2u);
  auto l1 = n1.get(), l2 = n2.get();
  ASSERT_TRUE(l1.is_ok()) << l1.status().message();
  ASSERT_TRUE(l2.is_ok()) << l2.status().message();
  lead->reset();  // node 0 failed: no stop command
  std::vector<uint8_t> cmd;
  EXPECT_FALSE((*l1)->receive(cmd).is_ok());
  EXPECT_FALSE((*l2)->receive(cmd).is_ok());
}

TEST(NodeLink, AMismatchedLaunchIsRefusedOnBothSidesNamingTheFlag) {
  struct Case {
    int tp, nnodes;
    std::string device, model;
    const char* flag;
  };
  for (const Case& c : {Case{4, 2, "cpu", "m", "--tp-size 4"}, Case{2, 3, "cpu", "m", "--nnodes 3"},
                        Case{2, 2, "cuda", "m", "--device cuda"}, Case{2, 2, "cpu", "other", "another model"}}) {
    const int port = free_port();
    NodeLinkOptions mine = link_options(port, 2, 0, 2);
    mine.model_identity = "m";
    NodeLinkOptions theirs = link_options(port, c.nnodes, 1, c.tp);
    theirs.device = c.device;
    theirs.model_identity = c.model;
    auto n1 = std::async(std::launch::async, [&] { return NodeLink::join(theirs); });
    auto lead = NodeLink::lead(mine, {});
    auto joined = n1.get();
    ASSERT_FALSE(lead.is_ok()) << c.flag;
    ASSERT_FALSE(joined.is_ok()) << c.flag;
    EXPECT_NE(lead.status().message().find(c.flag), std::string::npos) << lead.status().message();
    EXPECT_NE(joined.status().message().find(c.flag), std::string::npos) << joined.status().message();
    EXPECT_NE(joined.status().message().find("refused node 1"), std::string::npos) << joined.status().message();
  }
}

// Stop 54: a node's own settings were replaced by node 0's welcome without a word (--context-length
// 100 on node 1 did nothing). A setting given to a node that differs from node 0's is refused on both
// sides naming the flag; the same value, or one node 0 has and the node was not given, is fine.
TEST(NodeLink, ASettingGivenToANodeThatDiffersFromNodeZerosIsRefused) {
  for (const bool differs : {true, false}) {
    const int port = free_port();
    NodeLinkOptions mine = link_options(port, 2, 0, 2);
    mine.settings = {{"context-length", "131072"}, {"max-running-requests", "16"}};
    NodeLinkOptions theirs = link_options(port, 2, 1, 2);
    theirs.settings = {{"context-length", differs ? "100" : "131072"}};
    auto n1 = std::async(std::launch::async, [&] { return NodeLink::join(theirs); });
    auto lead = NodeLink::lead(mine, {});
    auto joined = n1.get();
    if (!differs) {
      EXPECT_TRUE(lead.is_ok()) << lead.status().message();
      EXPECT_TRUE(joined.is_ok()) << joined.status().message();
      continue;
    }
    ASSERT_FALSE(lead.is_ok());
    ASSERT_FALSE(joined.is_ok());
    EXPECT_NE(lead.status().message().find("--context-length 100, node 0 with 131072"), std::string::npos)
        << lead.status().message();
    EXPECT_NE(joined.status().message().find("--context-length 100"), std::string::npos) << joined.status().message();
  }
}

TEST(NodeLink, ANodeThatNeverComesIsAnErrorAfterTheTimeout) {
  const int port = free_port();
  NodeLinkOptions o = link_options(port, 3, 0, 3);
  o.timeout_s = 1;
  auto n2 = std::async(std::launch::async, [&] {
    NodeLinkOptions j = link_options(port, 3, 2, 3);
    return NodeLink::join(j);
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto lead = NodeLink::lead(o, {});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(lead.is_ok());
  EXPECT_NE(lead.status().message().find("node(s) 1 of --nnodes 3"), std::string::npos) << lead.status().message();
  EXPECT_NE(lead.status().message().find("--dist-timeout"), std::string::npos) << lead.status().message();
  EXPECT_LT(took, 10.0);
  EXPECT_FALSE(n2.get().is_ok());  // node 2 is never welcomed: node 0 failed before all came
  // Nobody listening: the joining node gives up after its timeout, naming the address.
  NodeLinkOptions j = link_options(free_port(), 2, 1, 2);
  j.timeout_s = 1;
  auto alone = NodeLink::join(j);
  ASSERT_FALSE(alone.is_ok());
  EXPECT_NE(alone.status().message().find(j.addr.str()), std::string::npos) << alone.status().message();
  EXPECT_NE(alone.status().message().find("--dist-init-addr"), std::string::npos) << alone.status().message();
}

// A node stuck in a step (on GPUs: an NCCL collective) after node 0 went away exits naming it
// rather than waiting forever; one that reads node 0's stop exits normally long before.
TEST(NodeLinkDeathTest, ANodeStuckAfterNodeZeroLeftExits) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const int port = free_port();
        auto joined = std::async(std::launch::async, [&] { return NodeLink::join(link_options(port, 2, 1, 2)); });
        auto lead = NodeLink::lead(link_options(port, 2, 0, 2), {});
        auto node1 = joined.get();
        if (!lead.is_ok() || !node1.is_ok()) std::exit(3);
        (*node1)->watch_node_zero(0.5);
        lead->reset();  // node 0 goes; node 1 never reads its stop (as if stuck in a step)
        std::this_thread::sleep_for(std::chrono::seconds(10));
        std::exit(4);
      },
      ::testing::ExitedWithCode(1), "node 0 at 127.0.0.1:[0-9]+ closed its connection");
}

TEST(NodeCommand, TheEngineConfigAndEveryCommandSurviveTheWire) {
  EngineConfig c = small_engine_config();
  c.kv_cache_dtype = DType::BF16;
  c.spec_num_steps = 3;
  c.prefix_cache = true;
  c.checkpoint_slots = 5;
  c.cuda_graph_max_bs = 0;
  c.spec_token_map = {3, 17, 4000};  // --speculative-token-map: every node loads the same draft rows
  c.weight_dtype = WeightDType::F32;  // --dtype: every node's matmuls alike
  EngineConfig d;
  ASSERT_TRUE(apply_engine_config(encode_engine_config(c), d).is_ok());
  EXPECT_EQ(d.spec_token_map, c.spec_token_map);
  EXPECT_EQ(d.kv_tokens, c.kv_tokens);
  EXPECT_EQ(d.kv_cache_dtype, DType::BF16);
  EXPECT_EQ(d.spec_num_steps, 3);
  EXPECT_EQ(d.checkpoint_slots, 5);
  EXPECT_EQ(d.cuda_graph_max_bs, 0);
  EXPECT_EQ(d.prefix_cache, true);
  EXPECT_EQ(d.weight_dtype, WeightDType::F32);
  std::vector<uint8_t> cut = encode_engine_config(c);
  cut.pop_back();
  EXPECT_FALSE(apply_engine_config(cut, d).is_ok());

  // Node 0's mirror to a joined node: what it sends decodes to the same calls.
  const int port = free_port();
  auto joined = std::async(std::launch::async, [&] { return NodeLink::join(link_options(port, 2, 1, 2)); });
  auto lead = NodeLink::lead(link_options(port, 2, 0, 2), {});
  ASSERT_TRUE(lead.is_ok()) << lead.status().message();
  auto node1 = joined.get();
  ASSERT_TRUE(node1.is_ok()) << node1.status().message();
  NodeMirror mirror(**lead);
  const std::vector<int32_t> toks = {5, 6, 7}, blocks = {9, 2}, one = {11}, blocks2 = {4}, rows = {2, 0};
  const RunItem items[2] = {RunItem{toks, 30, blocks, 3, true, false, false, 1, 7},
                            RunItem{one, 12, blocks2, 1, false, false, true}};
  mirror.run_mtp(items, ModelRunner::HiddenFrom::Mtp, rows);
  const StateCommit commits[1] = {StateCommit{3, 2, 1, 6}};
  mirror.commit_state(commits);
  mirror.copy_slot(4, 9);
  std::vector<uint8_t> cmd;
  DecodedBatch b;
  ASSERT_TRUE((*node1)->receive(cmd).is_ok());
  ByteReader r(cmd);
  ASSERT_EQ(r.get<NodeOp>(), NodeOp::RunMtp);
  ASSERT_TRUE(decode_batch(r, NodeOp::RunMtp, b));
  ASSERT_EQ(b.items.size(), 2u);
  EXPECT_EQ(std::vector<int32_t>(b.items[0].tokens.begin(), b.items[0].tokens.end()), toks);
  EXPECT_EQ(std::vector<int32_t>(b.items[0].blocks.begin(), b.items[0].blocks.end()), blocks);
  EXPECT_EQ(b.items[0].n_past, 30);
  EXPECT_EQ(b.items[0].slot, 3);
  EXPECT_TRUE(b.items[0].logits_all);
  EXPECT_EQ(b.items[0].checkpoint_at, 1);
  EXPECT_EQ(b.items[0].checkpoint_slot, 7);
  EXPECT_EQ(std::vector<int32_t>(b.items[1].tokens.begin(), b.items[1].tokens.end()), one);
  EXPECT_TRUE(b.items[1].defer_state);
  EXPECT_FALSE(b.items[1].logits_all);
  EXPECT_EQ(b.from, ModelRunner::HiddenFrom::Mtp);
  EXPECT_EQ(b.hidden_rows, rows);
  ASSERT_TRUE((*node1)->receive(cmd).is_ok());
  ByteReader rc(cmd);
  ASSERT_EQ(rc.get<NodeOp>(), NodeOp::CommitState);
  ASSERT_TRUE(decode_commits(rc, b));
  ASSERT_EQ(b.commits.size(), 1u);
  EXPECT_EQ(b.commits[0].slot, 3);
  EXPECT_EQ(b.commits[0].n_tokens, 2);
  EXPECT_EQ(b.commits[0].checkpoint_slot, 6);
  ASSERT_TRUE((*node1)->receive(cmd).is_ok());
  ByteReader rs(cmd);
  EXPECT_EQ(rs.get<NodeOp>(), NodeOp::CopySlot);
  EXPECT_EQ(rs.get<int32_t>(), 4);
  EXPECT_EQ(rs.get<int32_t>(), 9);
  EXPECT_TRUE(rs.ok() && rs.at_end());
}

// tp ranks over two nodes in this process: node 0's engine and a follower on another thread.
std::vector<std::vector<int32_t>> two_node_run(const EngineConfig& base, int tp,
                                               const std::vector<std::vector<int32_t>>& prompts, int n) {
  const int port = free_port();
  EngineConfig c = base;
  c.tp_size = tp;
  std::promise<Status> follower_done;
  std::thread follower([&] {
    auto link = NodeLink::join(link_options(port, 2, 1, tp));
    if (!link.is_ok()) return follower_done.set_value(link.status());
    EngineConfig fc;
    fc.model_dir = base.model_dir;
    fc.n_threads = 1;
    if (Status s = apply_engine_config((*link)->welcome(), fc); !s) return follower_done.set_value(s);
    auto node = FollowerNode::create(fc, **link);
    if (!node.is_ok()) return follower_done.set_value(node.status());
    follower_done.set_value((*node)->run());
  });
  std::vector<std::vector<int32_t>> out;
  {
    auto link = NodeLink::lead(link_options(port, 2, 0, tp), encode_engine_config(c));
    EXPECT_TRUE(link.is_ok()) << link.status().message();
    if (link.is_ok()) {
      c.node_link = link->get();
      c.n_threads = 1;
      auto e = Engine::create(c);
      EXPECT_TRUE(e.is_ok()) << e.status().message();
      if (e.is_ok()) {
        EXPECT_EQ((*e)->tp_size(), tp);
        EXPECT_NE((*e)->tp_transport().find("TCP through rank 0"), std::string::npos) << (*e)->tp_transport();
        (*e)->start();
        out = greedy_continuations(**e, prompts, n);
        out.push_back(greedy_continuations(**e, {prompts[0]}, n)[0]);  // a prefix-cache hit
        (*e)->stop();
      }
      (*link)->stop_nodes();  // a clean stop: the follower is told to stop (exit 0)
    }
  }
  auto done = follower_done.get_future();
  follower.join();
  const Status s = done.get();
  EXPECT_TRUE(s.is_ok()) << s.message();
  return out;
}

struct NodeCase {
  const char* model;
  int tp, spec_steps;
};

class MultiNodeEngine : public ::testing::TestWithParam<NodeCase> {};

TEST_P(MultiNodeEngine, GreedyTokensEqualOneNode) {
  const NodeCase nc = GetParam();
  EngineConfig c = small_engine_config(nc.model);
  c.spec_num_steps = nc.spec_steps;
  c.chunked_prefill_size = 24;  // the longer prompt prefills in chunks, beside the other's decode
  c.max_prefill_tokens = 48;
  c.prefix_cache = true;
  c.checkpoint_slots = 4;
  c.check_integrity_every_step = true;
  const int64_t V = load_model_config(source_dir() / nc.model)->vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < 3; ++p) {
    std::vector<int32_t> ids;
    for (int i = 0; i < 10 + 25 * p; ++i) ids.push_back(static_cast<int32_t>((i * 37 + p * 101 + 5) % V));
    prompts.push_back(ids);
  }
  auto one = Engine::create(c);
  ASSERT_TRUE(one.is_ok()) << one.status().message();
  (*one)->start();
  std::vector<std::vector<int32_t>> ref = greedy_continuations(**one, prompts, 20);
  ref.push_back(greedy_continuations(**one, {prompts[0]}, 20)[0]);
  (*one)->stop();
  const std::vector<std::vector<int32_t>> two = two_node_run(c, nc.tp, prompts, 20);
  ASSERT_EQ(two.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(ref[i].size(), 20u);
    EXPECT_EQ(two[i], ref[i]) << nc.model << " request " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, MultiNodeEngine,
                         ::testing::Values(NodeCase{"models/tiny-coder", 2, 0}, NodeCase{"models/tiny-coder", 2, 3},
                                           NodeCase{"tests/fixtures/qwen35-tiny", 2, 2},
                                           NodeCase{"tests/fixtures/qwen3-tiny", 4, 0}),
                         [](const auto& info) {
                           std::string n = std::filesystem::path(info.param.model).filename().string();
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n + "_tp" + std::to_string(info.param.tp) + "_mtp" +
                                  std::to_string(info.param.spec_steps);
                         });

}  // namespace
}  // namespace deltaserve::test
