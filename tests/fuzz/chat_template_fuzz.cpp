// Fuzzes the chat-template engine (text/chat_template.hpp, text/jinja/): any bytes as a template are parsed
// and rendered over a small conversation, with and without the generation prompt, and with assistant spans.
// Only clean rejections (hpctrain errors: unsupported constructs, syntax errors, raise_exception, bounds) are
// allowed: no crash, no hang, no unbounded memory (the interpreter caps output and loop iterations).
#include <string>

#include <nlohmann/json.hpp>

#include <hpctrain/text/chat_template.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  hpctrain::fuzz::expect_clean_rejection([&] {
    const auto parsed = hpctrain::text::ChatTemplate::parse(source, "fuzz");
    const std::vector<hpctrain::text::ChatMessage> messages{{"system", "s"}, {"user", "Q: {{x}} é"}, {"assistant", "A."}};
    hpctrain::text::ChatRenderOptions options;
    options.bos_token = "<s>";
    options.eos_token = "</s>";
    (void)parsed.render_with_assistant_spans(messages, options);
    options.add_generation_prompt = true;
    (void)parsed.render(nlohmann::json::array({{{"role", "user"}, {"content", "hi"}}}), options);
  });
  return 0;
}
