// TpShard: what rank `rank` of a tensor-parallel group of `size` holds (Megatron style):
//   attention: query(+gate) heads and KV heads [r*n/P, (r+1)*n/P); KV heads replicated when
//              P > num_key_value_heads (rank r keeps the one its query heads use);
//   GDN:       key heads and value heads the same way (in_proj_qkv's q, k and v ranges, conv1d,
//              A_log and dt_bias follow); MLP: gate/up rows [r*I/P, ...);
//   o_proj / out_proj / down_proj: the matching input columns (the partial sums are all-reduced);
//   embedding and lm_head: vocabulary rows [r*ceil(V/P), ...) (vocabulary-parallel);
//   MTP fc: input columns [r*2H/P, ...) (row-parallel, all-reduced); norms: replicated.
// check_tp_split refuses, in one line naming the config field, a shape that does not split.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/communicator.h"
#include "model/config.h"

namespace deltaserve {

// Rows [begin, end) of a tensor's first dimension (or columns, where said).
struct RowRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  RowRange scaled(int64_t k) const { return {begin * k, end * k}; }
  RowRange shifted(int64_t d) const { return {begin + d, end + d}; }
};

struct TpShard {
  int rank = 0;
  int size = 1;

  // The shard of a communicator's rank (nullptr: the whole model).
  static TpShard of(const Communicator* comm) { return comm ? TpShard{comm->rank(), comm->size()} : TpShard{}; }

  // An even share of n (heads, intermediate rows); check_tp_split guarantees size divides n.
  RowRange part(int64_t n) const { return {n / size * rank, n / size * (rank + 1)}; }
  // KV heads: an even share, or with size > n_kv the one head this rank's query heads use.
  RowRange kv_heads(int64_t n_kv) const {
    if (size <= n_kv) return part(n_kv);
    const int64_t h = rank / (size / n_kv);
    return {h, h + 1};
  }
  // Vocabulary rows: ceil(V / size) per rank, the last rank's share shorter.
  int64_t vocab_per_rank(int64_t vocab) const { return (vocab + size - 1) / size; }
  RowRange vocab(int64_t v) const {
    const int64_t per = vocab_per_rank(v), b = std::min<int64_t>(v, per * rank);
    return {b, std::min<int64_t>(v, b + per)};
  }
};

// Ok when every sharded dimension of `c` splits over tp_size ranks; else "<source>: --tp-size N
// does not divide <field> (M)".
Status check_tp_split(const ModelConfig& c, int tp_size, const std::string& source);

}  // namespace deltaserve
