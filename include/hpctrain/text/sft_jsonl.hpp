#pragma once
// Supervised fine-tuning data as TRL reads it, one example a line of a JSONL file (or a row of a Hugging Face
// dataset on disk, text/rows.hpp), in one of three shapes chosen by the keys of the first line (every line must
// have that shape):
//   {"text": "..."}                                        language modelling: the loss on every token
//   {"prompt": "...", "completion": "..."}                 the loss on the completion
//   {"messages": [{"role": "user", "content": "..."}, ...]}  conversational: the loss on the assistant turns
// A conversational line may call tools in TRL's shape (text/chat_data.hpp: assistant `tool_calls`, `tool`
// messages, content as a list of text parts) and carry the function schemas it may call (`"tools": [...]`);
// a whole file's schemas can come from a JSON file instead (SftJsonlOptions::tools). Messages reach the chat
// template as the line wrote them, key order included.
// Streamed and validated line by line: every error names the file and the line (SpecError
// `[hpctrain.spec.data.jsonl]`, "FILE:LINE: reason"; a dataset's `[hpctrain.spec.data.dataset]`, "FILE, row group
// G, row R: reason"), so a login node refuses a broken file before anything is queued. `tokenize_sft` turns a record
// into ids and a per-token "trained" flag by TRL's rules. Torch-free.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/text/chat.hpp>
#include <hpctrain/text/chat_data.hpp>
#include <hpctrain/text/pretrained_tokenizer.hpp>
#include <hpctrain/text/rows.hpp>
#include <hpctrain/text/sft_example.hpp>

namespace hpctrain::text {

/// The shape of an SFT file (TRL's dataset types).
enum class SftShape { text, prompt_completion, conversational };

/// One line of an SFT file.
struct SftRecord {
  SftShape shape = SftShape::text;
  std::string text, prompt, completion;  ///< by shape
  std::vector<ChatMessage> messages;     ///< conversational
  std::size_t line = 0;                  ///< 1-based line number in the file
  /// Conversational: the function schemas the template gets as `tools` (the line's "tools", else the file's
  /// from SftJsonlOptions::tools); null: none.
  nlohmann::ordered_json tools;
};

/// How an SFT file is read.
struct SftJsonlOptions {
  /// A JSON file holding a list of function schemas, given to the chat template as `tools` with every
  /// conversation that has no "tools" of its own. Default: none.
  std::optional<std::filesystem::path> tools;
};

/// The columns an SFT record is made of; a dataset's other columns are not read.
inline const std::vector<std::string>& sft_columns() {
  static const std::vector<std::string> columns{"text", "prompt", "completion", "messages", "tools"};
  return columns;
}

/// Reads SFT data one record at a time: a JSONL file (blank lines skipped), or a Hugging Face dataset on disk
/// where the program links hpctrain::datasets (text/rows.hpp), each row read as the line of the same keys.
class SftReader {
 public:
  explicit SftReader(std::filesystem::path file, const SftJsonlOptions& options = {})
      : file_(std::move(file)), rows_(open_rows(file_, sft_columns())) {
    if (options.tools) tools_ = read_tools(*options.tools);
  }

  /// The next record; false at the end. SpecError naming the file and the line (the row) for a malformed one.
  bool next(SftRecord& record) {
    nlohmann::ordered_json row;
    if (rows_->next(row)) {
      record = parse(row);
      return true;
    }
    if (!shape_) throw SpecError(rows_->error_id(), file_.string(), "holds no example");
    return false;
  }
  const std::filesystem::path& file() const { return file_; }
  /// The line (a dataset's row) of the record next() returned last (1-based).
  std::int64_t line() const { return rows_->row(); }

 private:
  [[noreturn]] void fail(const std::string& reason) const {
    throw SpecError(rows_->error_id(), rows_->where(), reason);
  }

  static const char* name_of(SftShape shape) {
    switch (shape) {
      case SftShape::text: return "{\"text\"}";
      case SftShape::prompt_completion: return "{\"prompt\", \"completion\"}";
      default: return "{\"messages\"}";
    }
  }

  std::string string_field(const nlohmann::ordered_json& json, const char* key, bool may_be_empty) const {
    const auto it = json.find(key);
    if (it == json.end()) fail(fmt::format("no \"{}\"", key));
    if (!it->is_string()) fail(fmt::format("\"{}\" is {}, not a string", key, it->type_name()));
    auto value = it->get<std::string>();
    if (!may_be_empty && value.empty()) fail(fmt::format("\"{}\" is empty", key));
    return value;
  }

  /// The list of function schemas in the JSON file `path`; SpecError naming the file else.
  static nlohmann::ordered_json read_tools(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw SpecError(errors::spec_data_jsonl, path.string(), "cannot open the tools file");
    nlohmann::ordered_json tools;
    try {
      tools = nlohmann::ordered_json::parse(in);
    } catch (const nlohmann::json::exception& error) {
      throw SpecError(errors::spec_data_jsonl, path.string(), fmt::format("not JSON ({})", error.what()));
    }
    try {
      check_tools(tools, "tools");
    } catch (const ChatDataError& error) {
      throw SpecError(errors::spec_data_jsonl, path.string(), error.message());
    }
    return tools;
  }

  SftRecord parse(const nlohmann::ordered_json& json) {
    SftShape shape;
    if (json.contains("messages")) shape = SftShape::conversational;
    else if (json.contains("prompt") || json.contains("completion")) shape = SftShape::prompt_completion;
    else if (json.contains("text")) shape = SftShape::text;
    else fail("has none of \"text\", \"prompt\"/\"completion\", \"messages\"");
    if (!shape_) shape_ = shape;
    if (shape != *shape_)
      fail(fmt::format("is {} while the file's first line is {}", name_of(shape), name_of(*shape_)));

    SftRecord record;
    record.shape = shape;
    record.line = static_cast<std::size_t>(rows_->row());
    if (shape == SftShape::text) {
      record.text = string_field(json, "text", false);
    } else if (shape == SftShape::prompt_completion) {
      record.prompt = string_field(json, "prompt", true);
      record.completion = string_field(json, "completion", false);
    } else {
      try {
        record.messages = chat_messages_from_json(json.at("messages"));
        if (const auto tools = json.find("tools"); tools != json.end() && !tools->is_null()) {
          check_tools(*tools, "tools");
          record.tools = *tools;
        } else {
          record.tools = tools_;
        }
      } catch (const ChatDataError& error) {
        fail(error.message());
      }
      if (std::none_of(record.messages.begin(), record.messages.end(),
                       [](const ChatMessage& m) { return m.role == "assistant"; }))
        fail("the conversation has no assistant turn to train on");
    }
    return record;
  }

  std::filesystem::path file_;
  std::unique_ptr<RowSource> rows_;
  std::optional<SftShape> shape_;
  nlohmann::ordered_json tools_;  // the file's tools (SftJsonlOptions::tools), null for none
};

/// What validate_sft_data found.
struct SftFileSummary {
  SftShape shape = SftShape::text;
  std::size_t examples = 0;
};

/// Reads the whole of `file` line by line (never all at once), checking every line; SpecError naming the
/// first bad line.
inline SftFileSummary validate_sft_data(const std::filesystem::path& file, const SftJsonlOptions& options = {}) {
  SftReader reader(file, options);
  SftRecord record;
  SftFileSummary summary;
  while (reader.next(record)) {
    summary.shape = record.shape;
    ++summary.examples;
  }
  return summary;
}

/// TRL's SFTTrainer rules: text → its tokens with special tokens, then EOS, all trained; prompt/completion →
/// the prompt's tokens (with special tokens, not trained) then the completion's and EOS (trained) — tokenized
/// apart, so the boundary is a token boundary (TRL tokenizes prompt + completion whole and masks the prompt's
/// length: the same ids whenever the prompt's ids are a prefix of the whole's); conversational → the text
/// `render` gives, tokenized as it is (the template writes its own special tokens; apply_chat_template adds
/// none), a token trained when its bytes overlap an assistant span. SpecError naming the line for a
/// conversational record without a renderer (the model has no chat template).
inline SftExample tokenize_sft(const SftRecord& record, const PretrainedTokenizer& tokenizer,
                               const ConversationRenderer* render) {
  SftExample example;
  const auto append = [&](const std::vector<TokenId>& ids, bool trained) {
    example.ids.insert(example.ids.end(), ids.begin(), ids.end());
    example.trained.insert(example.trained.end(), ids.size(), trained ? 1 : 0);
  };
  const auto eos = tokenizer.eos_id();
  if (record.shape == SftShape::text) {
    append(tokenizer.encode(record.text, true), true);
    if (eos && (example.ids.empty() || example.ids.back() != *eos)) append({*eos}, true);
  } else if (record.shape == SftShape::prompt_completion) {
    append(tokenizer.encode(record.prompt, true), false);
    append(tokenizer.encode(record.completion, false), true);
    if (eos && example.ids.back() != *eos) append({*eos}, true);
  } else {
    if (render == nullptr || !*render)
      throw SpecError(errors::spec_data_jsonl, fmt::format("line {}", record.line),
                      "a conversation needs the model's chat template, and its tokenizer has none (chat_template in "
                      "tokenizer_config.json, "
                      "or chat_template.jinja)");
    const auto rendered = (*render)(record.messages, record.tools);
    example.ids = tokenizer.encode(rendered.text, false);
    example.trained.assign(example.ids.size(), 0);
    std::size_t offset = 0;
    for (std::size_t i = 0; i < example.ids.size(); ++i) {
      const std::size_t end = offset + tokenizer.decode(std::span<const TokenId>(&example.ids[i], 1)).size();
      for (const auto& [begin, stop] : rendered.assistant_spans)
        if (offset < stop && begin < end) example.trained[i] = 1;
      offset = end;
    }
  }
  return example;
}

}  // namespace hpctrain::text
