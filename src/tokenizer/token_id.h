#pragma once

#include <cstdint>

namespace deltaserve {

// A vocabulary index (model vocab and added tokens share one id space).
using TokenId = std::int32_t;

}  // namespace deltaserve
