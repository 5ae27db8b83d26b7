#include "engine/node_command.h"

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

std::vector<uint8_t> encode_engine_config(const EngineConfig& c) {
  ByteWriter w;
  w.put<uint8_t>(c.dummy_weights);
  w.put<uint8_t>(c.custom_all_reduce);
  w.put<int32_t>(c.tp_size);
  w.put<int32_t>(c.max_running_requests);
  w.put<int32_t>(c.max_waiting_requests);
  w.put<int64_t>(c.context_length);
  w.put<int64_t>(c.kv_tokens);
  w.put<int32_t>(c.kv_block_size);
  w.put(c.kv_cache_dtype);
  w.put<int32_t>(c.chunked_prefill_size);
  w.put<int32_t>(c.max_prefill_tokens);
  w.put<uint8_t>(c.prefix_cache);
  w.put<int32_t>(c.checkpoint_slots);
  w.put<uint8_t>(c.decode_checkpoints);
  w.put<int32_t>(c.spec_num_steps);
  w.put<int32_t>(c.cuda_graph_max_bs);
  return std::move(w.bytes);
}

Status apply_engine_config(const std::vector<uint8_t>& bytes, EngineConfig& c) {
  ByteReader r(bytes);
  c.dummy_weights = r.get<uint8_t>() != 0;
  c.custom_all_reduce = r.get<uint8_t>() != 0;
  c.tp_size = r.get<int32_t>();
  c.max_running_requests = r.get<int32_t>();
  c.max_waiting_requests = r.get<int32_t>();
  c.context_length = r.get<int64_t>();
  c.kv_tokens = r.get<int64_t>();
  c.kv_block_size = r.get<int32_t>();
  c.kv_cache_dtype = r.get<DType>();
  c.chunked_prefill_size = r.get<int32_t>();
  c.max_prefill_tokens = r.get<int32_t>();
  c.prefix_cache = r.get<uint8_t>() != 0;
  c.checkpoint_slots = r.get<int32_t>();
  c.decode_checkpoints = r.get<uint8_t>() != 0;
  c.spec_num_steps = r.get<int32_t>();
  c.cuda_graph_max_bs = r.get<int32_t>();
  if (!r.ok() || !r.at_end()) return error("a malformed engine config from node 0 (another deltaserve build?)");
  return Status::ok();
}

}  // namespace deltaserve
