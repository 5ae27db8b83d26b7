#include "engine/node_command.h"

#include <type_traits>

namespace deltaserve {

namespace {

enum ItemFlags : uint8_t { kLogitsAll = 1, kNoLogits = 2, kDeferState = 4 };

void put_items(ByteWriter& w, std::span<const RunItem> items) {
  w.put<uint32_t>(static_cast<uint32_t>(items.size()));
  for (const RunItem& it : items) {
    w.put<int32_t>(it.n_past);
    w.put<int32_t>(it.slot);
    w.put<uint8_t>((it.logits_all ? kLogitsAll : 0) | (it.no_logits ? kNoLogits : 0) | (it.defer_state ? kDeferState : 0));
    w.put<int32_t>(it.checkpoint_at);
    w.put<int32_t>(it.checkpoint_slot);
    w.put_array(it.tokens.data(), it.tokens.size());
    w.put_array(it.blocks.data(), it.blocks.size());
  }
}

}  // namespace

void NodeMirror::send() { link_.send(w_.bytes); }

void NodeMirror::run(std::span<const RunItem> items) {
  w_.bytes.clear();
  w_.put(NodeOp::Run);
  put_items(w_, items);
  send();
}

void NodeMirror::run_mtp(std::span<const RunItem> items, ModelRunner::HiddenFrom from,
                         std::span<const int32_t> hidden_rows) {
  w_.bytes.clear();
  w_.put(NodeOp::RunMtp);
  put_items(w_, items);
  w_.put(from);
  w_.put_array(hidden_rows.data(), hidden_rows.size());
  send();
}

void NodeMirror::commit_state(std::span<const StateCommit> commits) {
  w_.bytes.clear();
  w_.put(NodeOp::CommitState);
  w_.put_array(commits.data(), commits.size());
  send();
}

void NodeMirror::zero_slot(int slot) {
  w_.bytes.clear();
  w_.put(NodeOp::ZeroSlot);
  w_.put<int32_t>(slot);
  send();
}

void NodeMirror::copy_slot(int src, int dst) {
  w_.bytes.clear();
  w_.put(NodeOp::CopySlot);
  w_.put<int32_t>(src);
  w_.put<int32_t>(dst);
  send();
}

bool decode_batch(ByteReader& r, NodeOp op, DecodedBatch& out) {
  const uint32_t n = r.get<uint32_t>();
  if (!r.ok() || n > (1u << 20)) return false;
  out.items.assign(n, RunItem{});
  out.data.clear();
  // Spans are set once every array is read (data may move while it grows).
  auto& tok = out.tokens_at;
  auto& blk = out.blocks_at;
  tok.assign(n, {});
  blk.assign(n, {});
  for (uint32_t i = 0; i < n; ++i) {
    RunItem& it = out.items[i];
    it.n_past = r.get<int32_t>();
    it.slot = r.get<int32_t>();
    const uint8_t f = r.get<uint8_t>();
    it.logits_all = f & kLogitsAll;
    it.no_logits = f & kNoLogits;
    it.defer_state = f & kDeferState;
    it.checkpoint_at = r.get<int32_t>();
    it.checkpoint_slot = r.get<int32_t>();
    for (auto* range : {&tok[i], &blk[i]}) {
      const std::size_t at = out.data.size();
      *range = {at, r.append_array(out.data)};
    }
  }
  for (uint32_t i = 0; i < n; ++i) {
    out.items[i].tokens = std::span<const int32_t>(out.data.data() + tok[i].first, tok[i].second);
    out.items[i].blocks = std::span<const int32_t>(out.data.data() + blk[i].first, blk[i].second);
  }
  if (op == NodeOp::RunMtp) {
    out.from = r.get<ModelRunner::HiddenFrom>();
    out.hidden_rows.clear();
    r.append_array(out.hidden_rows);
  }
  return r.ok() && r.at_end();
}

bool decode_commits(ByteReader& r, DecodedBatch& out) {
  out.commits.clear();
  r.append_array(out.commits);
  return r.ok() && r.at_end();
}

namespace {

// The welcome's fields, in order: what every node must build alike. Encoding and decoding both
// walk this one list.
template <typename Fn>
void for_each_shared_field(EngineConfig& c, Fn&& fn) {
  fn(c.dummy_weights);
  fn(c.weight_dtype);  // --dtype: every rank's matmuls in the same dtype
  fn(c.custom_all_reduce);
  fn(c.tp_size);
  fn(c.max_running_requests);
  fn(c.max_waiting_requests);
  fn(c.context_length);
  fn(c.kv_tokens);
  fn(c.kv_block_size);
  fn(c.kv_cache_dtype);
  fn(c.state_dtype);
  fn(c.chunked_prefill_size);
  fn(c.max_prefill_tokens);
  fn(c.prefix_cache);
  fn(c.checkpoint_slots);
  fn(c.decode_checkpoints);
  fn(c.spec_num_steps);
  fn(c.cuda_graph_max_bs);
}

}  // namespace

std::vector<uint8_t> encode_engine_config(const EngineConfig& config) {
  EngineConfig c = config;
  ByteWriter w;
  for_each_shared_field(c, [&](auto& v) { w.put(v); });
  w.put_array(c.spec_token_map.data(), c.spec_token_map.size());
  return std::move(w.bytes);
}

Status apply_engine_config(const std::vector<uint8_t>& bytes, EngineConfig& c) {
  ByteReader r(bytes);
  for_each_shared_field(c, [&](auto& v) { v = r.get<std::remove_reference_t<decltype(v)>>(); });
  c.spec_token_map = r.get_array<int32_t>();
  if (!r.ok() || !r.at_end()) return error("a malformed engine config from node 0 (another deltaserve build?)");
  return Status::ok();
}

}  // namespace deltaserve
