// Fuzzes the chat-template engine (text/chat_template.hpp, text/jinja/): any bytes as a template are parsed
// and rendered over a small conversation, with and without the generation prompt, with assistant spans, and over
// a tool-calling conversation with tools.
// Only clean rejections (hpctrain errors: unsupported constructs, syntax errors, raise_exception, bounds) are
// allowed: no crash, no hang, no unbounded memory (the interpreter caps output and loop iterations).
#include <string>

#include <nlohmann/json.hpp>

#include <hpctrain/text/chat_data.hpp>
#include <hpctrain/text/chat_template.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  hpctrain::fuzz::expect_clean_rejection([&] {
    const auto parsed = hpctrain::text::ChatTemplate::parse(source, "fuzz");
    const std::vector<hpctrain::text::ChatMessage> messages{
        {"system", "s"}, {"user", "Q: {{x}} é"}, {"assistant", "A."}};
    hpctrain::text::ChatRenderOptions options;
    options.bos_token = "<s>";
    options.eos_token = "</s>";
    (void)parsed.render_with_assistant_spans(messages, options);
    options.add_generation_prompt = true;
    (void)parsed.render(nlohmann::json::array({{{"role", "user"}, {"content", "hi"}}}), options);
    // A tool-calling conversation with tools, its mappings in insertion order (arguments as an object and as text).
    static const auto calling = nlohmann::ordered_json::parse(R"([
      {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"unit": "c", "location": "Oslo"}}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Rome\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "12"},
      {"role": "assistant", "reasoning_content": "r", "content": "<think>t</think>12 °C."}])");
    static const auto tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"location": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}}}}])");
    options.add_generation_prompt = false;
    (void)parsed.render_with_assistant_spans(hpctrain::text::chat_messages_from_json(calling), options, tools);
  });
  return 0;
}
