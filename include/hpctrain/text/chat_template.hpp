#pragma once
// Hugging Face chat templates in C++: the Jinja subset they use (text/jinja/), rendered as transformers'
// `apply_chat_template` renders them (jinja2 with trim_blocks and lstrip_blocks, `raise_exception`,
// `strftime_now`, `bos_token`/`eos_token`, `add_generation_prompt`), and the byte ranges of the assistant's
// turns that SFT trains on: from `{% generation %}` markers where the template has them (what
// transformers' `return_assistant_tokens_mask` marks), else by rendering prefixes of the conversation.
// Conversations and tools keep their mappings' key order, as Python's dicts do. An unsupported construct is
// an error naming the template's line and column, never a silent difference.
// Torch-free.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/text/chat.hpp>
#include <hpctrain/text/jinja/interpreter.hpp>
#include <hpctrain/text/jinja/lexer.hpp>
#include <hpctrain/text/jinja/parser.hpp>

namespace hpctrain::text {

/// What a rendering gets besides the messages.
struct ChatRenderOptions {
  bool add_generation_prompt = false;  ///< end with the start of an assistant turn. Default: false
  std::string bos_token, eos_token;    ///< the tokenizer's special tokens, as the template sees them
  /// More variables (tools, documents, date_string, enable_thinking, ...), their mappings in insertion order.
  /// `tools` and `documents` are None unless given, as transformers passes them.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

/// A parsed chat template.
class ChatTemplate {
 public:
  /// Parses `source`; SpecError `[hpctrain.spec.chat_template]` naming `origin:line:column` for a syntax error
  /// or a construct hpctrain does not implement.
  static ChatTemplate parse(std::string source, std::string origin) {
    ChatTemplate parsed;
    parsed.origin_ = std::move(origin);
    parsed.has_generation_ = source.find("generation") != std::string::npos;
    parsed.nodes_ = std::make_shared<const std::vector<jinja::Node>>(
        jinja::Parser(jinja::lex(source, parsed.origin_), parsed.origin_).parse());
    parsed.has_generation_ = parsed.has_generation_ && contains_generation(*parsed.nodes_);
    return parsed;
  }

  /// The text of `messages` (a JSON array of {"role", "content", ...}, its mappings' key order kept: pass an
  /// nlohmann::ordered_json parsed from the data, as a plain nlohmann::json has sorted its keys already);
  /// RuntimeError `[hpctrain.runtime.chat_template]` when the template raises (a conversation it rejects).
  std::string render(const nlohmann::ordered_json& messages, const ChatRenderOptions& options) const {
    jinja::Interpreter interpreter(origin_, context(messages, options));
    return interpreter.render(*nodes_);
  }

  /// The text and the assistant's byte ranges of `messages`, with `tools` (a list of function schemas; null:
  /// options.extra's, else none) passed to the template as `tools`.
  RenderedChat render_with_assistant_spans(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options,
                                           const nlohmann::ordered_json& tools = nullptr) const {
    if (!tools.is_null()) {
      auto with_tools = options;
      with_tools.extra["tools"] = tools;
      return render_with_assistant_spans(messages, with_tools);
    }
    const auto json = to_json(messages);
    RenderedChat out;
    if (has_generation_) {
      jinja::Interpreter interpreter(origin_, context(json, options));
      out.text = interpreter.render(*nodes_);
      for (const auto& span : interpreter.generation_spans())
        if (span.second > span.first) out.assistant_spans.push_back(span);
      return out;
    }
    // No markers: an assistant turn is what rendering it adds after the conversation before it with the
    // generation prompt — its content and the end-of-turn tokens the template writes after it.
    out.text = render(json, options);
    for (std::size_t i = 0; i < messages.size(); ++i) {
      if (messages[i].role != "assistant") continue;
      auto before = options;
      before.add_generation_prompt = true;
      const auto prefix = render(to_json({messages.begin(), messages.begin() + static_cast<long>(i)}), before);
      auto through = options;
      through.add_generation_prompt = false;
      const auto upto = render(to_json({messages.begin(), messages.begin() + static_cast<long>(i) + 1}), through);
      // The turn ends where the conversation so far and the whole one part (a template may close the
      // conversation differently, e.g. Phi-3's final EOS).
      std::size_t end = 0;
      while (end < upto.size() && end < out.text.size() && upto[end] == out.text[end]) ++end;
      if (out.text.compare(0, prefix.size(), prefix) != 0 || end <= prefix.size())
        throw RuntimeError(
            errors::runtime_chat_template,
            fmt::format(
                "{}: the rendering of message {} is not an extension of the conversation before it, so its assistant "
                "tokens cannot be found; add {{% generation %}} markers to the template",
                origin_, i));
      out.assistant_spans.emplace_back(prefix.size(), end);
    }
    return out;
  }

  /// Whether the template marks the assistant's turns with `{% generation %}`.
  bool has_generation_markers() const { return has_generation_; }

 private:
  static nlohmann::ordered_json to_json(const std::vector<ChatMessage>& messages) {
    auto json = nlohmann::ordered_json::array();
    for (const auto& message : messages) json.push_back(message_json(message));
    return json;
  }
  static nlohmann::ordered_json context(const nlohmann::ordered_json& messages, const ChatRenderOptions& options) {
    auto context = options.extra.is_object() ? options.extra : nlohmann::ordered_json::object();
    for (const char* none : {"tools", "documents"})  // transformers passes them, None when absent: defined, but none
      if (!context.contains(none)) context[none] = nullptr;
    context["messages"] = messages;
    context["add_generation_prompt"] = options.add_generation_prompt;
    context["bos_token"] = options.bos_token;
    context["eos_token"] = options.eos_token;
    return context;
  }
  static bool contains_generation(const std::vector<jinja::Node>& nodes) {
    for (const auto& node : nodes) {
      if (node.kind == jinja::Node::Kind::generation) return true;
      for (const auto& body : node.bodies)
        if (contains_generation(body)) return true;
    }
    return false;
  }

  std::string origin_;
  std::shared_ptr<const std::vector<jinja::Node>> nodes_;
  bool has_generation_ = false;
};

}  // namespace hpctrain::text
