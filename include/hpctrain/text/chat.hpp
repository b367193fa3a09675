#pragma once
// The vocabulary of conversations that text/ and lm/ share (docs/lm.md, "Interfaces"): a message, and a
// conversation rendered to text with the byte ranges of the assistant's turns, which SFT trains on.
// Torch-free: the standard library and nlohmann/json (a message is the JSON object a data file holds).
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace hpctrain::text {

/// One turn of a conversation: `{"role": "user", "content": "..."}` in TRL's conversational JSONL.
struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string role, std::string content, nlohmann::ordered_json json = nullptr)
      : role(std::move(role)), content(std::move(content)), json(std::move(json)) {}

  std::string role;
  std::string content;  ///< the text: a string content, or a list of text parts joined; "" for none
  /// The whole message as the data gives it, in its key order — content as a string, a list of parts or null,
  /// tool_calls, tool_call_id, name, reasoning_content, ... —: what a chat template sees, as transformers passes
  /// it. Null (the default): `{"role": role, "content": content}`.
  nlohmann::ordered_json json;
  friend bool operator==(const ChatMessage&, const ChatMessage&) = default;
};

/// What a chat template sees of `message`.
inline nlohmann::ordered_json message_json(const ChatMessage& message) {
  if (!message.json.is_null()) return message.json;
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  json["role"] = message.role;
  json["content"] = message.content;
  return json;
}

/// A conversation rendered by a chat template: the text, and the byte ranges [begin, end) of `text` that
/// the assistant produced (the loss of a conversational SFT example falls on their tokens only).
struct RenderedChat {
  std::string text;
  std::vector<std::pair<std::size_t, std::size_t>> assistant_spans;
};

/// Renders a conversation with the function schemas it may call (`tools`: a JSON list, or null for none) — a
/// chat template bound to its special tokens, in lm/; throws on a conversation the template rejects
/// (raise_exception), naming the reason.
using ConversationRenderer =
    std::function<RenderedChat(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools)>;

}  // namespace hpctrain::text
