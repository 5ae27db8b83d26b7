#include "engine/follower_node.h"

#include "engine/engine.h"

namespace deltaserve {

Result<std::unique_ptr<FollowerNode>> FollowerNode::create(const EngineConfig& config, NodeLink& link) {
  EngineConfig c = config;
  c.node_link = &link;
  std::unique_ptr<FollowerNode> f(new FollowerNode(link));
  DS_ASSIGN_OR_RETURN(f->ranks_, RankGroup::create(rank_group_options(c)));
  const Model& model = f->ranks_->model();
  if (c.spec_num_steps > 0 && !model.has_mtp())
    return error(c.model_dir.string(), ": speculative decoding needs an MTP head, and this model has none");
  f->cache_ = std::make_unique<CacheMemory>(f->ranks_->backends(), model.memory_spec(), cache_config(c, model));
  f->runner_ = std::make_unique<ModelRunner>(*f->ranks_, *f->cache_, runner_limits(c, *f->cache_));
  return f;
}

Status FollowerNode::run() {
  for (;;) {
    DS_RETURN_IF_ERROR(link_.receive(cmd_));
    const std::vector<uint8_t>& cmd = cmd_;
    if (cmd.empty()) return Status::ok();  // node 0 stopped
    ByteReader r(cmd);
    const NodeOp op = r.get<NodeOp>();
    bool ok = r.ok();
    switch (op) {
      case NodeOp::Run:
        ok = ok && decode_batch(r, op, batch_);
        if (ok) runner_->run(batch_.items, nullptr, ModelRunner::Fetch::None);
        break;
      case NodeOp::RunMtp:
        ok = ok && decode_batch(r, op, batch_);
        if (ok) runner_->run_mtp(batch_.items, batch_.from, batch_.hidden_rows, ModelRunner::Fetch::None);
        break;
      case NodeOp::CommitState:
        ok = ok && decode_commits(r, batch_);
        if (ok) runner_->commit_state(batch_.commits);
        break;
      case NodeOp::ZeroSlot: {
        const int slot = r.get<int32_t>();
        ok = r.ok() && r.at_end();
        if (ok) cache_->zero_slot_storage(slot);
        break;
      }
      case NodeOp::CopySlot: {
        const int src = r.get<int32_t>(), dst = r.get<int32_t>();
        ok = r.ok() && r.at_end();
        if (ok) cache_->copy_slot_storage(src, dst);
        break;
      }
      default:
        ok = false;
    }
    if (!ok) return error("node ", link_.node_rank(), ": a malformed command from node 0 (op ", int(op), ", ",
                          cmd.size(), " bytes); are both nodes the same deltaserve build?");
  }
}

}  // namespace deltaserve
