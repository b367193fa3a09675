#pragma once
// Preference data for DPO (lm/dpo.hpp) in TRL's shapes, read from JSONL: standard {"prompt", "chosen", "rejected"}
// as text, and conversational {"chosen", "rejected"} as message lists, with an explicit "prompt" message list or the
// messages both share taken as the implicit prompt (trl.data_utils.maybe_extract_prompt). Conversations are
// rendered with the model's chat template as trl.data_utils.maybe_apply_chat_template renders them (the prompt with
// the generation prompt, each completion as the rendering of prompt + completion after the prompt's text), then
// tokenized and cut as DPOTrainer.tokenize_row and concatenated_forward do (trl 0.24): the prompt, the chosen and the
// rejected text tokenized apart without special tokens, an EOS after each completion, the prompt's last
// max_prompt_length tokens, each completion's first max_completion_length, then each prompt + completion's last
// max_length tokens (truncation_mode "keep_end"). A row that cannot be a pair (a field missing, chosen equal to
// rejected, an empty completion, a prompt the template renders otherwise before a completion) is a SpecError
// `[hpctrain.spec.data.jsonl]` naming the file and the line: exit 2 before training.
//
// A batch of n pairs holds inputs and targets [n, 2, T] (chosen, rejected; right-padded, targets lm::ignore_index
// outside the completions, shifted as the causal-LM convention says) and, when the reference was computed before
// training, the field "reference_logps" [n, 2] (fp32: the completions' summed log-probabilities under the start
// weights).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/lm/loss.hpp>
#include <hpctrain/text/chat_template.hpp>
#include <hpctrain/text/pretrained_tokenizer.hpp>
#include <hpctrain/train/data/source.hpp>

namespace hpctrain::lm {

/// A pair as text: the prompt and the two completions that follow it.
struct PreferenceText {
  std::string prompt, chosen, rejected;
};

/// The lengths of TRL's DPOConfig (0: no limit).
struct PreferenceLengths {
  std::int64_t max_length = 1024;          ///< prompt + completion, the end kept. Default: 1024 (TRL's)
  std::int64_t max_prompt_length = 512;    ///< the prompt's last tokens. Default: 512 (TRL's)
  std::int64_t max_completion_length = 0;  ///< each completion's first tokens. Default: 0, none (TRL's None)
};

/// A tokenized pair: each side's ids (prompt then completion, cut) and where its completion starts.
struct PreferenceExample {
  std::vector<std::int64_t> chosen, rejected;
  std::int64_t chosen_start = 0, rejected_start = 0;
};

}  // namespace hpctrain::lm

// In hpctrain::detail, not lm::detail: a unit that parses this header before lm/pretrained.hpp's definitions must not
// find an lm::detail there (their `detail::make_model_instance` means hpctrain::detail's).
namespace hpctrain::detail {
/// SpecError naming `file:line` and the reason.
[[noreturn]] inline void bad_preference_row(const std::filesystem::path& file, std::size_t line,
                                            const std::string& why) {
  throw SpecError(errors::spec_data_jsonl, fmt::format("{}:{}", file.string(), line), why);
}

/// The longest common prefix of two strings (TRL's `takewhile(lambda x: x[0] == x[1], zip(a, b))`).
inline std::size_t common_prefix(const std::string& a, const std::string& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}
}  // namespace hpctrain::detail

namespace hpctrain::lm {

/// The text of one JSONL row (`row`, line `line` of `file`); `chat`: the model's chat template (conversations need
/// it), `options` its special tokens. SpecError naming the file and the line for a row that is not a pair.
inline PreferenceText render_preference(const nlohmann::ordered_json& row, const text::ChatTemplate* chat,
                                        const text::ChatRenderOptions& options, const std::filesystem::path& file,
                                        std::size_t line) {
  const auto bad = [&](const std::string& why) { hpctrain::detail::bad_preference_row(file, line, why); };
  if (!row.is_object()) bad("not a JSON object");
  for (const char* field : {"chosen", "rejected"})
    if (!row.contains(field)) bad(fmt::format("no \"{}\" field (a preference row has chosen and rejected)", field));
  const auto& chosen = row["chosen"];
  const auto& rejected = row["rejected"];
  if (chosen == rejected) bad("\"chosen\" equals \"rejected\": the pair prefers nothing");
  if (chosen.is_string()) {  // standard: text
    if (!rejected.is_string()) bad("\"chosen\" is text but \"rejected\" is not");
    if (!row.contains("prompt") || !row["prompt"].is_string())
      bad("no \"prompt\" text (text rows need one; implicit prompts are read from conversations only)");
    PreferenceText out{row["prompt"].get<std::string>(), chosen.get<std::string>(), rejected.get<std::string>()};
    if (out.chosen.empty() || out.rejected.empty()) bad("an empty completion");
    return out;
  }
  if (!chosen.is_array() || !rejected.is_array())
    bad("\"chosen\" and \"rejected\" must both be text or both be lists of messages");
  nlohmann::ordered_json prompt = nlohmann::ordered_json::array(), chosen_turns = chosen, rejected_turns = rejected;
  if (row.contains("prompt")) {
    if (!row["prompt"].is_array()) bad("\"prompt\" must be a list of messages when the completions are");
    prompt = row["prompt"];
  } else {  // the implicit prompt: the messages both share (trl.data_utils.extract_prompt)
    std::size_t shared = 0;
    while (shared < chosen.size() && shared < rejected.size() && chosen[shared] == rejected[shared]) ++shared;
    for (std::size_t i = 0; i < shared; ++i) prompt.push_back(chosen[i]);
    chosen_turns = nlohmann::ordered_json::array();
    rejected_turns = nlohmann::ordered_json::array();
    for (std::size_t i = shared; i < chosen.size(); ++i) chosen_turns.push_back(chosen[i]);
    for (std::size_t i = shared; i < rejected.size(); ++i) rejected_turns.push_back(rejected[i]);
  }
  if (prompt.empty()) bad("no prompt: the conversations share no first message and no \"prompt\" is given");
  if (chosen_turns.empty() || rejected_turns.empty()) bad("an empty completion");
  const auto& last = prompt.back();
  if (!last.is_object() || !last.contains("role") || last["role"] != "user")
    bad("the prompt's last message is not the user's (continuing an assistant's message is not implemented)");
  if (chat == nullptr) bad("conversational, and the tokenizer has no chat template");
  auto with_generation = options;
  with_generation.add_generation_prompt = true;
  PreferenceText out;
  std::string prompt_chosen, prompt_rejected;
  try {
    out.prompt = chat->render(prompt, with_generation);
    auto joined = prompt;
    for (const auto& turn : chosen_turns) joined.push_back(turn);
    prompt_chosen = chat->render(joined, options);
    joined = prompt;
    for (const auto& turn : rejected_turns) joined.push_back(turn);
    prompt_rejected = chat->render(joined, options);
  } catch (const Error& error) {
    bad(fmt::format("the chat template does not render it: {}", error.what()));
  }
  // TRL keeps the prompt's common prefix with each rendering (a template that renders the generation prompt
  // otherwise); a prompt that is not a prefix of both renderings is refused here instead.
  if (!prompt_chosen.starts_with(out.prompt) || !prompt_rejected.starts_with(out.prompt))
    bad("the rendered prompt is not a prefix of the rendered prompt + completion (the chat template renders the "
        "prompt otherwise once a completion follows)");
  out.chosen = prompt_chosen.substr(out.prompt.size());
  out.rejected = prompt_rejected.substr(out.prompt.size());
  if (out.chosen.empty() || out.rejected.empty()) bad("an empty completion once rendered");
  if (out.chosen == out.rejected) bad("\"chosen\" and \"rejected\" render to the same text");
  return out;
}

/// DPOTrainer.tokenize_row (add_special_tokens False, as for decoder-only models) and concatenated_forward's
/// keep_end truncation of one pair.
inline PreferenceExample tokenize_preference(const PreferenceText& pair, const text::PretrainedTokenizer& tokenizer,
                                             const PreferenceLengths& lengths) {
  const auto eos = tokenizer.eos_id();
  if (!eos)
    throw SpecError(errors::spec_tokenizer, "eos_token",
                    "DPO ends every completion with the tokenizer's EOS, and it has none");
  const auto ids = [&](const std::string& text) {
    const auto encoded = tokenizer.encode(text, /*add_special_tokens=*/false);
    return std::vector<std::int64_t>(encoded.begin(), encoded.end());
  };
  auto prompt = ids(pair.prompt);
  if (lengths.max_prompt_length > 0 && static_cast<std::int64_t>(prompt.size()) > lengths.max_prompt_length)
    prompt.erase(prompt.begin(), prompt.end() - lengths.max_prompt_length);
  const auto side = [&](const std::string& completion_text, std::vector<std::int64_t>& out, std::int64_t& start) {
    auto completion = ids(completion_text);
    completion.push_back(*eos);
    if (lengths.max_completion_length > 0 &&
        static_cast<std::int64_t>(completion.size()) > lengths.max_completion_length)
      completion.resize(static_cast<std::size_t>(lengths.max_completion_length));
    out = prompt;
    out.insert(out.end(), completion.begin(), completion.end());
    start = static_cast<std::int64_t>(prompt.size());
    if (lengths.max_length > 0 && static_cast<std::int64_t>(out.size()) > lengths.max_length) {
      const auto cut = static_cast<std::int64_t>(out.size()) - lengths.max_length;
      out.erase(out.begin(), out.begin() + cut);
      start = std::max<std::int64_t>(0, start - cut);
    }
  };
  PreferenceExample example;
  side(pair.chosen, example.chosen, example.chosen_start);
  side(pair.rejected, example.rejected, example.rejected_start);
  return example;
}

/// Every row of `file` rendered (SpecError naming the file and the line of the first bad one), with its line.
inline std::vector<std::pair<std::size_t, PreferenceText>> read_preference_jsonl(
    const std::filesystem::path& file, const text::ChatTemplate* chat, const text::ChatRenderOptions& options) {
  std::ifstream in(file);
  if (!in) throw SpecError(errors::spec_data_jsonl, file.string(), "cannot open");
  std::vector<std::pair<std::size_t, PreferenceText>> rows;
  std::string text;
  for (std::size_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::ordered_json row;
    try {
      row = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception& error) {
      hpctrain::detail::bad_preference_row(file, line, fmt::format("not JSON: {}", error.what()));
    }
    rows.emplace_back(line, render_preference(row, chat, options, file, line));
  }
  if (rows.empty()) throw SpecError(errors::spec_data_jsonl, file.string(), "holds no preference row");
  return rows;
}

/// Tokenized pairs as a dataset (the batch layout at the top of this file).
class PreferenceDataset : public data::Dataset {
 public:
  PreferenceDataset(std::vector<PreferenceExample> examples, std::int64_t pad_id)
      : examples_(std::move(examples)), pad_id_(pad_id) {}
  std::int64_t size() const override { return static_cast<std::int64_t>(examples_.size()); }
  const std::vector<PreferenceExample>& examples() const { return examples_; }
  /// The completions' summed log-probabilities under the reference, [size(), 2] fp32 (lm/dpo.hpp computes them);
  /// an undefined tensor drops them.
  void set_reference(torch::Tensor logps) { reference_ = std::move(logps); }
  bool has_reference() const { return reference_.defined(); }

  /// The pairs (and their reference log-probabilities, if set) as bytes: LibTorch's archive of the ids of each side
  /// end to end with their offsets, the completions' starts, the padding id and the reference.
  std::string serialized() const {
    std::vector<std::int64_t> ids[2], offsets[2] = {{0}, {0}}, starts;
    for (const auto& e : examples_) {
      for (int s = 0; s < 2; ++s) {
        const auto& side = s == 0 ? e.chosen : e.rejected;
        ids[s].insert(ids[s].end(), side.begin(), side.end());
        offsets[s].push_back(static_cast<std::int64_t>(ids[s].size()));
      }
      starts.insert(starts.end(), {e.chosen_start, e.rejected_start});
    }
    const auto tensor = [](const std::vector<std::int64_t>& v) { return torch::tensor(v, torch::kInt64); };
    std::vector<torch::Tensor> parts{tensor(ids[0]),
                                     tensor(offsets[0]),
                                     tensor(ids[1]),
                                     tensor(offsets[1]),
                                     tensor(starts),
                                     torch::tensor({pad_id_}, torch::kInt64),
                                     reference_.defined() ? reference_ : torch::empty({0}, torch::kFloat32)};
    std::ostringstream out;
    torch::save(parts, out);
    return out.str();
  }

  /// What serialized() wrote; `from` names the file in the error (SpecError `[hpctrain.spec.data.jsonl]`) of bytes
  /// that are not such an archive.
  static std::shared_ptr<PreferenceDataset> deserialized(const std::string& bytes, const std::filesystem::path& from) {
    std::vector<torch::Tensor> parts;
    try {
      std::istringstream in(bytes);
      torch::load(parts, in);
    } catch (const c10::Error& error) {
      throw SpecError(errors::spec_data_jsonl, from.string(),
                      fmt::format("not prepared preference pairs: {}", error.what_without_backtrace()));
    }
    const bool shaped = parts.size() == 7 && parts[1].numel() >= 1 && parts[3].numel() == parts[1].numel() &&
                        parts[4].numel() == 2 * (parts[1].numel() - 1) && parts[5].numel() == 1;
    if (!shaped) throw SpecError(errors::spec_data_jsonl, from.string(), "not prepared preference pairs: bad shapes");
    const auto n = parts[1].numel() - 1;
    std::vector<PreferenceExample> examples(static_cast<std::size_t>(n));
    for (int s = 0; s < 2; ++s) {
      const auto ids = parts[2 * s].contiguous(), offsets = parts[2 * s + 1].contiguous();
      const auto* id = ids.data_ptr<std::int64_t>();
      const auto* offset = offsets.data_ptr<std::int64_t>();
      if (offset[0] != 0 || offset[n] != ids.numel())
        throw SpecError(errors::spec_data_jsonl, from.string(), "not prepared preference pairs: bad offsets");
      for (std::int64_t i = 0; i < n; ++i) {
        if (offset[i + 1] < offset[i])
          throw SpecError(errors::spec_data_jsonl, from.string(), "not prepared preference pairs: bad offsets");
        (s == 0 ? examples[static_cast<std::size_t>(i)].chosen : examples[static_cast<std::size_t>(i)].rejected)
            .assign(id + offset[i], id + offset[i + 1]);
      }
    }
    const auto starts = parts[4].contiguous();
    for (std::int64_t i = 0; i < n; ++i) {
      examples[static_cast<std::size_t>(i)].chosen_start = starts[2 * i].item<std::int64_t>();
      examples[static_cast<std::size_t>(i)].rejected_start = starts[2 * i + 1].item<std::int64_t>();
    }
    auto dataset = std::make_shared<PreferenceDataset>(std::move(examples), parts[5].item<std::int64_t>());
    if (parts[6].numel() > 0) {
      if (parts[6].sizes() != torch::IntArrayRef{n, 2})
        throw SpecError(errors::spec_data_jsonl, from.string(), "not prepared preference pairs: bad reference");
      dataset->set_reference(parts[6]);
    }
    return dataset;
  }

  data::Batch batch(const std::vector<std::int64_t>& indices) const override {
    std::int64_t length = 1;
    for (const auto i : indices) {
      const auto& e = examples_[static_cast<std::size_t>(i)];
      length = std::max(
          {length, static_cast<std::int64_t>(e.chosen.size()) - 1, static_cast<std::int64_t>(e.rejected.size()) - 1});
    }
    const auto n = static_cast<std::int64_t>(indices.size());
    auto inputs = torch::full({n, 2, length}, pad_id_, torch::kInt64);
    auto targets = torch::full({n, 2, length}, ignore_index, torch::kInt64);
    auto in = inputs.accessor<std::int64_t, 3>(), out = targets.accessor<std::int64_t, 3>();
    for (std::int64_t r = 0; r < n; ++r) {
      const auto& e = examples_[static_cast<std::size_t>(indices[static_cast<std::size_t>(r)])];
      const auto fill = [&](int s, const std::vector<std::int64_t>& ids, std::int64_t start) {
        for (std::size_t k = 0; k + 1 < ids.size(); ++k) {  // input k predicts id k + 1
          in[r][s][static_cast<std::int64_t>(k)] = ids[k];
          if (static_cast<std::int64_t>(k) + 1 >= start) out[r][s][static_cast<std::int64_t>(k)] = ids[k + 1];
        }
      };
      fill(0, e.chosen, e.chosen_start);
      fill(1, e.rejected, e.rejected_start);
    }
    if (!reference_.defined()) return {inputs, targets};
    return {inputs, targets, {{"reference_logps", reference_.index_select(0, torch::tensor(indices))}}};
  }

 private:
  std::vector<PreferenceExample> examples_;
  std::int64_t pad_id_;
  torch::Tensor reference_;
};

}  // namespace hpctrain::lm
