#pragma once
// The vocabulary of conversations that text/ and lm/ share (docs/lm.md, "Interfaces"): a message, and a
// conversation rendered to text with the byte ranges of the assistant's turns, which SFT trains on.
// Torch-free, standard library only.
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace hpctrain::text {

/// One turn of a conversation: `{"role": "user", "content": "..."}` in TRL's conversational JSONL.
struct ChatMessage {
  std::string role;
  std::string content;
  friend bool operator==(const ChatMessage&, const ChatMessage&) = default;
};

/// A conversation rendered by a chat template: the text, and the byte ranges [begin, end) of `text` that
/// the assistant produced (the loss of a conversational SFT example falls on their tokens only).
struct RenderedChat {
  std::string text;
  std::vector<std::pair<std::size_t, std::size_t>> assistant_spans;
};

/// Renders a conversation (a chat template bound to its special tokens, in lm/); throws on a conversation
/// the template rejects (raise_exception), naming the reason.
using ConversationRenderer = std::function<RenderedChat(const std::vector<ChatMessage>&)>;

}  // namespace hpctrain::text
