#pragma once
// The SFT data mistakes that silently ruin a fine-tune, found in the tokenized examples before anything trains:
//  - a doubled BOS: the chat template writes `{{ bos_token }}` and the tokenizer adds its own (TRL #1400,
//    OpenRLHF #393): every example starts with a pair the model never sees at inference;
//  - an end of turn outside the loss: the template's `{% generation %}` block closes before its `<|im_end|>` or
//    EOS (TRL #1623, #734): the model never learns to stop;
//  - the tokenizer's EOS differing from the token the template ends assistant turns with (LLaMA-Factory #7454):
//    generation stops on the wrong token;
//  - no trained token in the whole file: nothing to learn.
// The login node checks a sample of the file (lm::SftJsonl::check_at_login), the job's preparation every example
// (text::prepare_sft_tokens); both refuse the first two and a file without a trained token, and warn of the rest.
// Torch-free.
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/text/pretrained_tokenizer.hpp>
#include <hpctrain/text/sft_example.hpp>
#include <hpctrain/text/sft_tokens.hpp>

namespace hpctrain::text {

/// The tokens the checks look for: BOS, EOS, and the special tokens (an end of turn is one).
struct SftCheckTokens {
  std::optional<TokenId> bos, eos;
  std::set<TokenId> special;  ///< the added tokens marked special, and EOS

  static SftCheckTokens of(const PretrainedTokenizer& tokenizer) {
    SftCheckTokens tokens{tokenizer.bos_id(), tokenizer.eos_id(), {}};
    for (const auto& added : tokenizer.tokenizer().added_tokens())
      if (added.special) tokens.special.insert(added.id);
    if (tokens.eos) tokens.special.insert(*tokens.eos);
    return tokens;
  }
};

/// Where a check first fired: the record's line and the ids in question.
struct SftFinding {
  std::size_t line = 0;
  std::vector<TokenId> ids;
};

/// What the checks found over the examples they saw.
struct SftDataReport {
  std::int64_t examples = 0;               ///< examples checked
  std::int64_t trained = 0;                ///< of them, with a trained token after the first
  std::int64_t doubled_bos = 0;            ///< starting with BOS twice
  std::int64_t untrained_end_of_turn = 0;  ///< with a trained turn followed by an untrained special token
  std::int64_t open_turns = 0;             ///< with a trained turn that ends in text, no special token after it
  std::optional<SftFinding> first_doubled_bos, first_untrained_end, first_open_turn;
  /// The special tokens trained turns end with, and how many turns end with each.
  std::map<TokenId, std::int64_t> turn_ends;

  /// Checks one tokenized example of `line`; `truncated`: cut by the length rule, so a turn that reaches its end
  /// has lost its end of turn and is not judged.
  void add(const SftExample& example, std::size_t line, const SftCheckTokens& tokens, bool truncated = false) {
    ++examples;
    const auto& ids = example.ids;
    const auto& mask = example.trained;
    if (ids.size() >= 2 && tokens.bos && ids[0] == *tokens.bos && ids[1] == *tokens.bos) {
      ++doubled_bos;
      if (!first_doubled_bos) first_doubled_bos = SftFinding{line, {ids[0], ids[1]}};
    }
    bool any_trained = false, untrained_end = false, open = false;
    for (std::size_t i = 0; i < ids.size();) {
      if (!mask[i]) {
        ++i;
        continue;
      }
      std::size_t end = i;
      while (end < ids.size() && mask[end]) ++end;
      any_trained = any_trained || end > 1;  // a trained token after the first (the first is no target)
      const TokenId last = ids[end - 1];
      if (truncated && end == ids.size()) {
        // cut inside the turn: its end is not in the example
      } else if (tokens.special.count(last) != 0) {
        ++turn_ends[last];
      } else if (end < ids.size() && tokens.special.count(ids[end]) != 0) {
        if (!untrained_end && !first_untrained_end) first_untrained_end = SftFinding{line, {ids[end]}};
        untrained_end = true;
      } else {
        if (!open && !first_open_turn) first_open_turn = SftFinding{line, {last}};
        open = true;
      }
      i = end;
    }
    trained += any_trained;
    untrained_end_of_turn += untrained_end;
    open_turns += open;
  }

  /// An example after the length rule (text/sft_prepare.hpp): one that was left out (dropped, or untrained) counts
  /// as an example without a trained token.
  void add(const SftCutExample& cut, std::size_t line, const SftCheckTokens& tokens) {
    if (cut.ids.empty()) {
      ++examples;
      return;
    }
    add(cut, line, tokens, (cut.flags & sft_truncated) != 0);
  }

  /// The special token most trained turns end with, if any.
  std::optional<TokenId> usual_turn_end() const {
    std::optional<TokenId> best;
    std::int64_t count = 0;
    for (const auto& [id, n] : turn_ends)
      if (n > count) best = id, count = n;
    return best;
  }
};

namespace detail {
inline std::string quoted_tokens(const PretrainedTokenizer& tokenizer, std::span<const TokenId> ids) {
  std::string out;
  for (const auto id : ids)
    out += fmt::format("{}{:?} ({})", out.empty() ? "" : ", ", tokenizer.decode(std::span<const TokenId>(&id, 1)), id);
  return out;
}
}  // namespace detail

/// SpecError `[hpctrain.spec.data.jsonl]` naming the file, the first line and the ids for a doubled BOS or an end of
/// turn outside the loss, and for a file of `report.examples` examples none of which trains a token. `whole`: the
/// report covers every example (else a sample, and a sample without a trained token proves nothing).
inline void refuse_sft_mistakes(const SftDataReport& report, const std::filesystem::path& file,
                                const PretrainedTokenizer& tokenizer, bool whole) {
  const auto where = [&](const SftFinding& finding) { return fmt::format("{}:{}", file.string(), finding.line); };
  if (report.first_doubled_bos)
    throw SpecError(
        errors::spec_data_jsonl, where(*report.first_doubled_bos),
        fmt::format("the example starts with BOS twice ({}; {} of {} examples checked): the chat template writes "
                    "{{{{ bos_token }}}} and the tokenizer adds its own, or the text itself begins with it; remove one "
                    "(the template's bos_token, or add_bos_token / the post-processor's BOS in the tokenizer's files)",
                    detail::quoted_tokens(tokenizer, report.first_doubled_bos->ids), report.doubled_bos,
                    report.examples));
  if (report.first_untrained_end)
    throw SpecError(errors::spec_data_jsonl, where(*report.first_untrained_end),
                    fmt::format("an assistant turn ends before {}, which takes no loss ({} of {} examples checked): "
                                "the model would never learn to stop; put the end-of-turn token inside the chat "
                                "template's {{% generation %}} block",
                                detail::quoted_tokens(tokenizer, report.first_untrained_end->ids),
                                report.untrained_end_of_turn, report.examples));
  if (whole && report.examples > 0 && report.trained == 0)
    throw SpecError(errors::spec_data_jsonl, file.string(),
                    fmt::format("no example has a trained token ({} read): nothing to learn (the assistant turns, "
                                "completions or texts are empty, or --max-length cuts every one before them)",
                                report.examples));
}

/// The warnings of a report, one line each (empty when there is nothing to say).
inline std::vector<std::string> sft_warnings(const SftDataReport& report, const std::filesystem::path& file,
                                             const PretrainedTokenizer& tokenizer, const SftCheckTokens& tokens) {
  std::vector<std::string> lines;
  if (report.open_turns > 0)
    lines.push_back(fmt::format(
        "hpctrain: warning: {}: {} of {} examples have an assistant turn that ends in text, with no end-of-turn "
        "token trained after it (first: line {}, last token {}): the chat template ends turns without one, and "
        "generation will stop only at the token limit",
        file.string(), report.open_turns, report.examples, report.first_open_turn->line,
        detail::quoted_tokens(tokenizer, report.first_open_turn->ids)));
  if (const auto end = report.usual_turn_end(); end && tokens.eos && *end != *tokens.eos)
    lines.push_back(fmt::format(
        "hpctrain: warning: the tokenizer's EOS is {} but the chat template ends assistant turns with {}: generation "
        "stops at EOS, so set eos_token (and generation_config.json's eos_token_id) to the end-of-turn token",
        detail::quoted_tokens(tokenizer, std::span<const TokenId>(&*tokens.eos, 1)),
        detail::quoted_tokens(tokenizer, std::span<const TokenId>(&*end, 1))));
  return lines;
}

}  // namespace hpctrain::text
