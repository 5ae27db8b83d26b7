#include "engine/step_cost.h"

#include <algorithm>
#include <cmath>

namespace deltaserve {

namespace {
double average(double old, double x, double w) { return old > 0 ? old + w * (x - old) : x; }
}  // namespace

void StepCost::observe(int prefill_tokens, int decode_rows, double seconds, uint64_t setup_count) {
  const bool setup = setup_count != setup_count_;
  setup_count_ = setup_count;
  if (setup || !(seconds > 0) || !std::isfinite(seconds)) return;
  if (prefill_tokens <= 0) {
    if (decode_rows > 0) decode_s_ = average(decode_s_, seconds, kWeight);
    return;
  }
  if (prefill_tokens < kMinPrefillTokens) return;
  if (decode_rows > 0 && decode_s_ <= 0) return;  // the decode rows' share is not known yet
  const double beside = decode_rows > 0 ? decode_s_ : 0.0;
  prefill_token_s_ = average(prefill_token_s_, std::max(seconds - beside, 0.5 * seconds) / prefill_tokens, kWeight);
}

int StepCost::mixed_prefill_tokens(double ratio, int block, int cap) const {
  block = std::max(block, 1);
  if (decode_s_ <= 0 || prefill_token_s_ <= 0) return cap;
  const double tokens = std::max(ratio - 1.0, 0.0) * decode_s_ / prefill_token_s_;
  const double blocks = std::max(1.0, std::floor(tokens / block));
  return static_cast<int>(std::min<double>(blocks * block, cap));
}

}  // namespace deltaserve
