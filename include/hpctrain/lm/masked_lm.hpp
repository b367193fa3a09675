#pragma once
// Masked-language-model masking (RoBERTa's dynamic masking, as transformers' DataCollatorForLanguageModeling
// does it): of the non-special tokens, each is chosen with probability 15%; a chosen token becomes <mask> 80% of
// the time, a random non-special token 10%, and stays 10%; the labels are the original ids at chosen positions
// and lm::ignore_index elsewhere. The draw is a pure function of (seed, epoch, example, position) — counter-based
// hashing, no generator state — so a resumed run masks exactly as an unstopped one, and ranks never need to agree.
#include <cstdint>
#include <set>
#include <utility>

#include <torch/torch.h>

#include <hpctrain/error.hpp>
#include <hpctrain/lm/loss.hpp>

namespace hpctrain::lm {

/// How tokens are masked. Defaults: RoBERTa's and BERT's.
struct MaskingOptions {
  double probability = 0.15;           ///< share of non-special tokens chosen. Default: 0.15
  double mask_fraction = 0.8;          ///< of the chosen, replaced by <mask>. Default: 0.8
  double random_fraction = 0.1;        ///< of the chosen, replaced by a random non-special token. Default: 0.1
  std::int64_t mask_id = -1;           ///< the <mask> token (required)
  std::int64_t vocab_size = 0;         ///< random replacements are drawn from [0, vocab_size) (required)
  std::set<std::int64_t> special_ids;  ///< never chosen, never drawn (<s>, </s>, <pad>, <mask>, ...)
  std::uint64_t seed = 0;

  /// SpecError `[hpctrain.spec.masking.<field>]` for an invalid value.
  void validate() const {
    using hpctrain::detail::require;
    require(probability > 0 && probability < 1, "masking.probability", probability, "must be in (0, 1)");
    require(mask_fraction >= 0 && random_fraction >= 0 && mask_fraction + random_fraction <= 1, "masking.mask_fraction",
            mask_fraction, "mask_fraction + random_fraction must be in [0, 1]");
    require(mask_id >= 0 && mask_id < vocab_size, "masking.mask_id", mask_id, "must be a token id below vocab_size");
    require(static_cast<std::int64_t>(special_ids.size()) < vocab_size, "masking.special_ids", special_ids.size(),
            "leave no token to draw");
  }
};

namespace detail {
/// splitmix64: a well-mixed 64-bit hash, the counter-based generator of the draw.
inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
/// A uniform double in [0, 1) for (seed, epoch, example, position, stream).
inline double uniform(std::uint64_t seed, std::int64_t epoch, std::int64_t example, std::int64_t position,
                      std::uint64_t stream) {
  std::uint64_t h = mix(seed ^ 0x6d61736b6c6dULL);
  for (const auto v : {static_cast<std::uint64_t>(epoch), static_cast<std::uint64_t>(example),
                       static_cast<std::uint64_t>(position), stream})
    h = mix(h ^ v);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}
}  // namespace detail

/// {masked input ids, labels} of one example's `ids` ([T], int64) for `epoch`.
inline std::pair<torch::Tensor, torch::Tensor> mask_tokens(const torch::Tensor& ids, const MaskingOptions& options,
                                                           std::int64_t epoch, std::int64_t example) {
  auto inputs = ids.to(torch::kInt64).contiguous().clone();
  auto labels = torch::full_like(inputs, ignore_index);
  auto in = inputs.accessor<std::int64_t, 1>();
  auto out = labels.accessor<std::int64_t, 1>();
  for (std::int64_t t = 0; t < inputs.size(0); ++t) {
    const auto id = in[t];
    if (options.special_ids.count(id) || detail::uniform(options.seed, epoch, example, t, 0) >= options.probability)
      continue;
    out[t] = id;
    const double what = detail::uniform(options.seed, epoch, example, t, 1);
    if (what < options.mask_fraction) {
      in[t] = options.mask_id;
    } else if (what < options.mask_fraction + options.random_fraction) {
      std::int64_t drawn = id;
      for (std::uint64_t attempt = 2;; ++attempt) {  // a random non-special token
        drawn = static_cast<std::int64_t>(detail::uniform(options.seed, epoch, example, t, attempt) *
                                          static_cast<double>(options.vocab_size));
        if (!options.special_ids.count(drawn)) break;
      }
      in[t] = drawn;
    }
  }
  return {inputs, labels};
}

}  // namespace hpctrain::lm
