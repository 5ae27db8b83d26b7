// TokenMap: the draft vocabulary of speculative decoding (--speculative-token-map, as SGLang's
// FR-Spec "hot token" map): the MTP head's drafts score only these tokens, so each draft step
// streams |map| rows of the lm_head instead of the whole vocabulary. Verification still scores
// every token, so the output is unchanged; only drafts of tokens outside the map are lost.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "util/status.h"

namespace deltaserve {

// Token ids as a JSON array of integers or as text separated by whitespace or commas; returned
// sorted and unique. Errors name the file and the problem: an id outside [0, vocab), no ids, or
// another format (SGLang's hot_token_id.pt, a torch.save file, is refused with how to convert it).
Result<std::vector<int32_t>> read_token_map(const std::filesystem::path& path, int64_t vocab);

}  // namespace deltaserve
