#include "model/tensor_parallel.h"

namespace deltaserve {

Status check_tp_split(const ModelConfig& c, int tp, const std::string& source) {
  if (tp < 1) return error("--tp-size must be at least 1 (got ", tp, ")");
  if (tp == 1) return Status::ok();
  auto divides = [&](const char* field, int64_t n) -> Status {
    if (n % tp != 0) return error(source, ": --tp-size ", tp, " does not divide ", field, " (", n, ")");
    return Status::ok();
  };
  DS_RETURN_IF_ERROR(divides("intermediate_size", c.intermediate_size));
  if (c.n_attention_layers() > 0 || c.mtp_n_layers > 0) {
    DS_RETURN_IF_ERROR(divides("num_attention_heads", c.n_heads));
    // KV heads split evenly, or are replicated: each rank's query heads must then share one.
    if (c.n_kv_heads >= tp) DS_RETURN_IF_ERROR(divides("num_key_value_heads", c.n_kv_heads));
    else if (tp % c.n_kv_heads != 0)
      return error(source, ": --tp-size ", tp, " is neither a divisor nor a multiple of num_key_value_heads (",
                   c.n_kv_heads, ")");
  }
  if (c.mtp_n_layers > 0) DS_RETURN_IF_ERROR(divides("2 x hidden_size (the MTP fc's inputs)", 2 * c.hidden_size));
  // Vocabulary rows go in shares of ceil(V/P): the last rank's must not be empty (an empty lm_head).
  if (const int64_t per = (c.vocab_size + tp - 1) / tp; per * (tp - 1) >= c.vocab_size)
    return error(source, ": --tp-size ", tp, " leaves the last rank no rows of vocab_size (", c.vocab_size, ")");
  if (c.n_linear_layers() > 0) {
    DS_RETURN_IF_ERROR(divides("linear_num_key_heads", c.linear_n_key_heads));
    DS_RETURN_IF_ERROR(divides("linear_num_value_heads", c.linear_n_value_heads));
  }
  return Status::ok();
}

}  // namespace deltaserve
