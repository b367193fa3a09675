// Issue 17, item 4: Hugging Face chat templates rendered in C++ exactly as jinja2 (in transformers'
// environment) and transformers' apply_chat_template render them — five families' templates, one with
// {% generation %} markers, one exercising the rest of the subset — over conversations with system prompts,
// several turns, quotes, backslashes, braces and non-ASCII text, with and without the generation prompt; the
// conversations a template rejects raise here too; the assistant spans equal transformers' generation indices;
// an unsupported construct or a syntax error names the line and column.
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include <hpctrain/text/chat_template.hpp>

#include "text_test_support.hpp"

namespace tx = hpctrain::text;

namespace {
std::filesystem::path templates_dir() { return text_test::source_dir() / "tests/data/chat_templates"; }

/// The oracle's renderings (made once per build tree: jinja2 + transformers take a few seconds).
const nlohmann::json& oracle() {
  static const nlohmann::json renderings = [] {
    const auto out = text_test::cache_dir() / "chat_templates.json";
    const auto command = fmt::format("'{}' '{}/tests/text/chat_template_oracle.py' '{}' '{}' > '{}.log' 2>&1", text_test::python(),
                                     text_test::source_dir().string(), templates_dir().string(), out.string(), out.string());
    INFO(command << "\n" << text_test::read_file(out.string() + ".log"));
    REQUIRE(std::system(command.c_str()) == 0);
    return nlohmann::json::parse(text_test::read_file(out));
  }();
  return renderings;
}

std::vector<tx::ChatMessage> messages_of(const nlohmann::json& conversation) {
  std::vector<tx::ChatMessage> out;
  for (const auto& m : conversation) out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return out;
}
}  // namespace

TEST_CASE("Chat templates of five families render as jinja2 and apply_chat_template render them, and reject what they reject",
          "[text][chat_template]") {
  const auto& data = oracle();
  std::map<std::string, tx::ChatTemplate> templates;
  std::size_t checked = 0, rejected = 0;
  for (const auto& entry : data["renderings"]) {
    const auto name = entry["template"].get<std::string>();
    if (!templates.count(name))
      templates.emplace(name, tx::ChatTemplate::parse(text_test::read_file(templates_dir() / name), name));
    const auto& conversation = data["conversations"][entry["conversation"].get<std::size_t>()];
    tx::ChatRenderOptions options;
    options.add_generation_prompt = entry["generation_prompt"].get<bool>();
    options.bos_token = "<s>";
    options.eos_token = "</s>";
    CAPTURE(name, entry["conversation"].get<int>(), options.add_generation_prompt);
    if (entry.contains("error")) {
      CHECK_THROWS_WITH(templates.at(name).render(conversation, options),
                        Catch::Contains("[hpctrain.runtime.chat_template]") && Catch::Contains(entry["error"].get<std::string>()));
      ++rejected;
      continue;
    }
    const auto expected = entry["text"].get<std::string>();
    CHECK(templates.at(name).render(conversation, options) == expected);
    if (entry.contains("spans") && templates.at(name).has_generation_markers()) {
      const auto rendered = templates.at(name).render_with_assistant_spans(messages_of(conversation), options);
      CHECK(rendered.text == expected);
      std::vector<std::pair<std::size_t, std::size_t>> spans;
      for (const auto& span : entry["spans"]) spans.emplace_back(span[0].get<std::size_t>(), span[1].get<std::size_t>());
      CHECK(rendered.assistant_spans == spans);
    }
    ++checked;
  }
  CHECK(templates.size() >= 7);
  CHECK(checked >= 60);
  CHECK(rejected >= 6);
}

TEST_CASE("Without generation markers the assistant spans come from rendering prefixes and hold the assistant's words",
          "[text][chat_template]") {
  const auto conversation = messages_of(oracle()["conversations"][1]);
  for (const char* name : {"llama3.jinja", "qwen2.5.jinja", "phi3.jinja"}) {
    CAPTURE(name);
    const auto parsed = tx::ChatTemplate::parse(text_test::read_file(templates_dir() / name), name);
    tx::ChatRenderOptions options;
    options.bos_token = "<s>";
    options.eos_token = "</s>";
    const auto rendered = parsed.render_with_assistant_spans(conversation, options);
    REQUIRE(rendered.assistant_spans.size() == 2);
    const auto first = rendered.text.substr(rendered.assistant_spans[0].first, rendered.assistant_spans[0].second - rendered.assistant_spans[0].first);
    CHECK_THAT(first, Catch::StartsWith("Rayleigh scattering."));
    const auto second = rendered.text.substr(rendered.assistant_spans[1].first);
    CHECK_THAT(second, Catch::Contains("Longer path, more red."));
  }
}

TEST_CASE("A syntax error or an unsupported construct names the template's line and column", "[text][chat_template]") {
  using Row = std::tuple<std::string, std::string>;
  auto [source, message] = GENERATE(table<std::string, std::string>({
      Row{"{% call f() %}x{% endcall %}", "t:1:4: '{% call %}' is not supported"},
      Row{"line one\n{{ messages | frobnicate }}", "t:2:15: no filter named 'frobnicate' (jinja2 refuses it too)"},
      Row{"{% if false %}{{ x | wordwrap(3) }}{% endif %}", "t:1:22: the filter 'wordwrap' is not supported"},
      Row{"{% if false %}{{ '{}'.format(1) }}{% endif %}", "t:1:23: the method 'format' is not supported"},
      Row{"{{ x is frobnicated }}", "t:1:9: no test named 'frobnicated'"},
      Row{"{{ xs | map('wordwrap') }}", "t:1:13: map() with the filter 'wordwrap' is not supported"},
      Row{"{% macro f() %}{% generation %}x{% endgeneration %}{% endmacro %}", "t:1:19: '{% generation %}' inside a macro"},
      Row{"{% for m in messages %}", "the template ends before '{% endfor %}'"},
      Row{"{{ 'unterminated }}", "t:1:"},
      Row{"ok\n  {{ a +* b }}", "t:2:"},
      Row{"{% include 'x' %}", "'{% include %}' is not supported"},
      Row{"{{ x", "this tag is never closed"},
  }));
  CAPTURE(source);
  bool raised = false;
  try {
    tx::ChatTemplate::parse(source, "t").render(nlohmann::json::array(), {});
  } catch (const hpctrain::Error& error) {
    raised = true;
    CHECK_THAT(std::string(error.what()), Catch::Contains(message));
    CHECK_THAT(std::string(error.what()), Catch::StartsWith("[hpctrain.spec.chat_template]"));
  }
  CHECK(raised);
}

TEST_CASE("A hostile template cannot exhaust the stack or memory", "[text][chat_template]") {
  CHECK_THROWS_WITH(tx::ChatTemplate::parse("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}", "deep"),
                    Catch::Contains("nested too deeply"));
  CHECK_THROWS_WITH(tx::ChatTemplate::parse("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", "big")
                        .render(nlohmann::json::array(), {}),
                    Catch::Contains("too many loop iterations") || Catch::Contains("exceeds 64 MiB"));
}
