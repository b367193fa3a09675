#pragma once
// A tokenized SFT example, the one shape it has from the tokenizer (text/sft_jsonl.hpp) through the prepared
// token file (text/sft_prepare.hpp, text/sft_tokens.hpp) to the training batches (lm/sft_dataset.hpp). Torch-free.
#include <cstdint>
#include <vector>

#include <hpctrain/text/bpe.hpp>

namespace hpctrain::text {

/// A tokenized SFT example: ids, and per id whether its loss counts (the target role of the id).
struct SftExample {
  std::vector<TokenId> ids;
  std::vector<std::uint8_t> trained;
};

/// An example after the length rule (cut_sft_example): its ids and mask (none when left out), and what happened
/// to it (the SftRecordFlag bits: truncated, dropped, untrained).
struct SftCutExample : SftExample {
  std::uint32_t flags = 0;
};

}  // namespace hpctrain::text
