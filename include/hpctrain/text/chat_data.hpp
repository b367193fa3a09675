#pragma once
// Conversations as training data gives them (TRL's and transformers' shapes), checked before a chat template
// sees them: messages with a role and content — a string, or a list of text parts `[{"type": "text", "text":
// "..."}]` —, assistant messages calling tools (`tool_calls: [{"type": "function", "function": {"name": ...,
// "arguments": {...} or a JSON string}}]`, content null or absent), tool messages answering them
// (`tool_call_id`, `name`), and lists of function schemas (`tools`). A message reaches the template as the data
// wrote it, its key order kept (apply_chat_template passes it through unchanged); what is malformed is a
// ChatDataError naming the field (`messages[2].tool_calls[0].function.name`) and the reason. Torch-free.
#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/text/chat.hpp>

namespace hpctrain::text {

/// A malformed conversation or tools list: the field and what is wrong with it.
struct ChatDataError {
  std::string where, reason;
  std::string message() const { return where + ": " + reason; }
};

namespace detail {
inline std::string is_not(const nlohmann::ordered_json& value, const char* wanted) {
  return fmt::format("is {}, not {}", value.type_name(), wanted);
}

/// A non-empty string at `object[key]`; ChatDataError naming `where.key` else.
inline void require_name(const nlohmann::ordered_json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end()) throw ChatDataError{where + "." + key, "missing"};
  if (!it->is_string()) throw ChatDataError{where + "." + key, is_not(*it, "a string")};
  if (it->get_ref<const std::string&>().empty()) throw ChatDataError{where + "." + key, "is empty"};
}
inline void optional_string(const nlohmann::ordered_json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it != object.end() && !it->is_string()) throw ChatDataError{where + "." + key, is_not(*it, "a string")};
}

/// The text of a content: the string, or its text parts joined.
inline std::string content_text(const nlohmann::ordered_json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw ChatDataError{where, is_not(content, "a string or a list of parts")};
  std::string text;
  for (std::size_t k = 0; k < content.size(); ++k) {
    const auto part_at = fmt::format("{}[{}]", where, k);
    const auto& part = content[k];
    if (!part.is_object()) throw ChatDataError{part_at, is_not(part, "an object")};
    const auto type = part.find("type");
    if (type == part.end()) throw ChatDataError{part_at + ".type", "missing"};
    if (!type->is_string()) throw ChatDataError{part_at + ".type", is_not(*type, "a string")};
    if (*type != "text")
      throw ChatDataError{part_at + ".type",
                          fmt::format("\"{}\": only text parts can be trained on", type->get<std::string>())};
    const auto value = part.find("text");
    if (value == part.end()) throw ChatDataError{part_at + ".text", "missing"};
    if (!value->is_string()) throw ChatDataError{part_at + ".text", is_not(*value, "a string")};
    text += value->get<std::string>();
  }
  return text;
}

/// An assistant's tool calls; their ids go to `ids`.
inline void check_tool_calls(const nlohmann::ordered_json& calls, const std::string& where,
                             std::set<std::string>& ids) {
  if (!calls.is_array() || calls.empty())
    throw ChatDataError{where, calls.is_array() ? "is empty" : is_not(calls, "a list")};
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const auto call_at = fmt::format("{}[{}]", where, k);
    const auto& call = calls[k];
    if (!call.is_object()) throw ChatDataError{call_at, is_not(call, "an object")};
    if (const auto type = call.find("type"); type != call.end() && *type != "function")
      throw ChatDataError{call_at + ".type", type->is_string()
                                                 ? fmt::format("\"{}\" is not \"function\"", type->get<std::string>())
                                                 : is_not(*type, "a string")};
    optional_string(call, "id", call_at);
    if (const auto id = call.find("id"); id != call.end()) ids.insert(id->get<std::string>());
    const auto function = call.find("function");
    if (function == call.end()) throw ChatDataError{call_at + ".function", "missing"};
    if (!function->is_object()) throw ChatDataError{call_at + ".function", is_not(*function, "an object")};
    require_name(*function, "name", call_at + ".function");
    const auto arguments = function->find("arguments");
    const auto arguments_at = call_at + ".function.arguments";
    if (arguments == function->end()) throw ChatDataError{arguments_at, "missing"};
    if (arguments->is_string()) {  // OpenAI's shape: the arguments as JSON text, passed on as the text
      const auto parsed =
          nlohmann::ordered_json::parse(arguments->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_object()) throw ChatDataError{arguments_at, "is a string that does not hold a JSON object"};
    } else if (!arguments->is_object()) {
      throw ChatDataError{arguments_at, is_not(*arguments, "an object or a JSON string")};
    }
  }
}
}  // namespace detail

/// Checks a list of function schemas (`[{"type": "function", "function": {"name": ..., "parameters": ...}}]`,
/// or schemas without the wrapper); `where` names it in the error.
inline void check_tools(const nlohmann::ordered_json& tools, const std::string& where) {
  if (!tools.is_array()) throw ChatDataError{where, detail::is_not(tools, "a list")};
  for (std::size_t k = 0; k < tools.size(); ++k) {
    const auto tool_at = fmt::format("{}[{}]", where, k);
    const auto& tool = tools[k];
    if (!tool.is_object()) throw ChatDataError{tool_at, detail::is_not(tool, "an object")};
    const auto function = tool.find("function");
    const auto type = tool.find("type");
    if (function != tool.end()) {
      if (!function->is_object()) throw ChatDataError{tool_at + ".function", detail::is_not(*function, "an object")};
      detail::require_name(*function, "name", tool_at + ".function");
    } else if (type != tool.end() && *type == "function") {
      throw ChatDataError{tool_at + ".function", "missing"};
    } else if (type == tool.end()) {
      detail::require_name(tool, "name", tool_at);
    }
  }
}

/// The messages of a conversation (`messages`: a JSON list), checked: roles system, user, assistant and tool;
/// content a string or a list of text parts (null or absent only beside an assistant's tool_calls); tool calls
/// with a function name and arguments (an object, or a string holding one); a tool message's tool_call_id, where
/// the calls before it have ids, one of theirs. Each message keeps the data's JSON for the template.
inline std::vector<ChatMessage> chat_messages_from_json(const nlohmann::ordered_json& messages) {
  if (!messages.is_array() || messages.empty()) throw ChatDataError{"messages", "must be a non-empty list"};
  static const std::set<std::string> roles{"system", "user", "assistant", "tool"};
  std::vector<ChatMessage> out;
  std::set<std::string> call_ids;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const auto where = fmt::format("messages[{}]", i);
    const auto& message = messages[i];
    if (!message.is_object()) throw ChatDataError{where, detail::is_not(message, "an object")};
    const auto role = message.find("role");
    if (role == message.end()) throw ChatDataError{where + ".role", "missing"};
    if (!role->is_string()) throw ChatDataError{where + ".role", detail::is_not(*role, "a string")};
    if (!roles.count(role->get<std::string>()))
      throw ChatDataError{where + ".role",
                          fmt::format("\"{}\" is none of system, user, assistant, tool", role->get<std::string>())};
    const auto calls = message.find("tool_calls");
    const bool calling = calls != message.end() && !calls->is_null();
    if (calling) {
      if (*role != "assistant") throw ChatDataError{where + ".tool_calls", "only an assistant message calls tools"};
      detail::check_tool_calls(*calls, where + ".tool_calls", call_ids);
    }
    if (*role == "tool") {
      detail::optional_string(message, "tool_call_id", where);
      detail::optional_string(message, "name", where);
      if (const auto id = message.find("tool_call_id");
          id != message.end() && !call_ids.empty() && !call_ids.count(id->get<std::string>()))
        throw ChatDataError{where + ".tool_call_id",
                            fmt::format("\"{}\" is the id of no tool call before it", id->get<std::string>())};
    }
    const auto content = message.find("content");
    std::string text;
    if (content == message.end() || content->is_null()) {
      if (!calling)
        throw ChatDataError{where + ".content",
                            content == message.end() ? "missing" : "is null, and the message calls no tool"};
    } else {
      text = detail::content_text(*content, where + ".content");
    }
    out.push_back({role->get<std::string>(), std::move(text), message});
  }
  return out;
}

}  // namespace hpctrain::text
