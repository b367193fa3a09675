// Hugging Face chat templates rendered in C++ exactly as jinja2 (in transformers' environment) and transformers'
// apply_chat_template render them: the templates of 30-odd public model families (tests/data/chat_templates/README.md),
// a ChatML one with {% generation %} markers and tool calls, and two exercising the rest of the subset, over
// conversations with system prompts, several turns, quotes, backslashes, braces, non-ASCII text, thinking tags,
// tool calls (arguments as objects and as JSON strings) and their results, content as lists of text parts, with
// and without tools and the generation prompt. The conversations a template rejects raise here too (with
// raise_exception's message), a template jinja2 cannot compile is refused at parse; the assistant spans equal
// transformers' generation indices, or the prefix-rendered ranges, and never hold a tool's result; an
// unsupported construct or a syntax error names the line and column.
#include <catch2/catch.hpp>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include <hpctrain/text/chat_data.hpp>
#include <hpctrain/text/chat_template.hpp>

#include "text_test_support.hpp"

namespace tx = hpctrain::text;

namespace {
std::filesystem::path templates_dir() { return text_test::source_dir() / "tests/data/chat_templates"; }

/// The local calendar day of `time` (strftime_now's day: the date templates such as Granite's print).
std::pair<int, int> local_day(std::time_t time) {
  std::tm local{};
  localtime_r(&time, &local);
  return {local.tm_year, local.tm_yday};
}

/// Whether `out` was made today (renderings print strftime_now's date) and after `script` and every fixture changed.
bool up_to_date(const std::filesystem::path& out, const std::filesystem::path& script) {
  if (!std::filesystem::exists(out)) return false;
  const auto made = std::filesystem::last_write_time(out);
  const auto made_at = std::chrono::system_clock::to_time_t(std::chrono::file_clock::to_sys(made));
  if (local_day(made_at) != local_day(std::time(nullptr))) return false;
  if (std::filesystem::last_write_time(script) > made || std::filesystem::last_write_time(templates_dir()) > made)
    return false;
  for (const auto& entry : std::filesystem::directory_iterator(templates_dir()))
    if (entry.last_write_time() > made) return false;
  return true;
}

/// The oracle's renderings, made by one Python process for all of them (jinja2 + transformers: a few seconds),
/// again only when a fixture or the oracle changed.
const nlohmann::ordered_json& oracle() {
  static const nlohmann::ordered_json renderings = [] {
    const auto out = text_test::cache_dir() / "chat_templates.json";
    const auto script = text_test::source_dir() / "tests/text/chat_template_oracle.py";
    if (up_to_date(out, script)) return nlohmann::ordered_json::parse(text_test::read_file(out));
    // A temporary per process (ctest may run two cases that both want it), kept only when the oracle succeeds.
    const auto made = fmt::format("{}.tmp.{}", out.string(), ::getpid());
    const auto command = fmt::format("'{}' '{}' render '{}' '{}' > '{}.log' 2>&1", text_test::python(), script.string(),
                                     templates_dir().string(), made, out.string());
    const int status = std::system(command.c_str());
    INFO(command << "\n" << text_test::read_file(out.string() + ".log"));
    REQUIRE(status == 0);
    std::filesystem::rename(made, out);
    return nlohmann::ordered_json::parse(text_test::read_file(out));
  }();
  return renderings;
}

std::vector<tx::ChatMessage> messages_of(const nlohmann::ordered_json& conversation) {
  return tx::chat_messages_from_json(conversation);
}

/// The options of an oracle rendering: the special tokens, the context every rendering gets and the template's own.
tx::ChatRenderOptions options_of(const nlohmann::ordered_json& entry, bool generation_prompt) {
  tx::ChatRenderOptions options;
  options.add_generation_prompt = generation_prompt;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  options.extra = oracle()["context"];
  for (const auto& [key, value] : entry["context"].items()) options.extra[key] = value;
  if (entry["tools"].get<bool>()) options.extra["tools"] = oracle()["tools"];
  return options;
}

using Spans = std::vector<std::pair<std::size_t, std::size_t>>;
Spans spans_of(const nlohmann::ordered_json& json) {
  Spans spans;
  for (const auto& span : json) spans.emplace_back(span[0].get<std::size_t>(), span[1].get<std::size_t>());
  return spans;
}

/// No tool message's content lies inside an assistant span: SFT never trains on a tool's result.
void check_tool_results_untrained(const std::string& text, const Spans& spans,
                                  const nlohmann::ordered_json& conversation) {
  for (const auto& message : conversation) {
    if (message["role"] != "tool" || !message["content"].is_string()) continue;
    const auto result = message["content"].get<std::string>();
    for (auto at = text.find(result); at != std::string::npos; at = text.find(result, at + 1))
      for (const auto& [begin, end] : spans) {
        CAPTURE(result, at, begin, end);
        CHECK((at + result.size() <= begin || at >= end));
      }
  }
}
}  // namespace

TEST_CASE(
    "Chat templates of public model families render as jinja2 and apply_chat_template render them, and reject what "
    "they reject",
    "[text][chat_template]") {
  const auto& data = oracle();
  std::map<std::string, tx::ChatTemplate> templates;
  std::size_t equal = 0, rejected = 0, span_checks = 0, compile_refused = 0;
  for (const auto& [name, message] : data["compile_errors"].items()) {
    CAPTURE(name, message.get<std::string>());
    CHECK_THROWS_WITH(tx::ChatTemplate::parse(text_test::read_file(templates_dir() / name), name),
                      Catch::StartsWith("[hpctrain.spec.chat_template] " + name + ":"));
    ++compile_refused;
  }
  for (const auto& entry : data["renderings"]) {
    const auto name = entry["template"].get<std::string>();
    if (!templates.count(name))
      templates.emplace(name, tx::ChatTemplate::parse(text_test::read_file(templates_dir() / name), name));
    const auto& parsed = templates.at(name);
    const auto& conversation = data["conversations"][entry["conversation"].get<std::size_t>()];
    const auto options = options_of(entry, entry["generation_prompt"].get<bool>());
    CAPTURE(name, entry["conversation"].get<int>(), options.add_generation_prompt, entry["tools"].get<bool>(),
            entry["context"].dump());
    if (entry.contains("error")) {
      // jinja2 raised: raise_exception's message must be the same; a TypeError or an undefined value used
      // must be a rejection too (a RuntimeError: jinja2 rejects the conversation, not the template).
      CAPTURE(entry["error_type"].get<std::string>(), entry["error"].get<std::string>());
      const auto expected = entry["error_type"] == "TemplateError" ? entry["error"].get<std::string>() : std::string();
      CHECK_THROWS_WITH(parsed.render(conversation, options),
                        Catch::StartsWith("[hpctrain.runtime.chat_template]") && Catch::Contains(expected));
      ++rejected;
      continue;
    }
    const auto expected = entry["text"].get<std::string>();
    std::string ours;
    try {
      ours = parsed.render(conversation, options);
    } catch (const hpctrain::Error& error) {
      FAIL_CHECK(error.what());
      continue;
    }
    CHECK(ours == expected);
    equal += ours == expected;
    const bool with_spans = entry.contains("spans") && parsed.has_generation_markers();
    if (with_spans || (!parsed.has_generation_markers() && !options.add_generation_prompt)) {
      const auto tools = options.extra.contains("tools") ? options.extra["tools"] : nlohmann::ordered_json();
      auto without_tools = options;
      without_tools.extra.erase("tools");
      if (!with_spans &&
          !entry.contains("prefix_spans")) {  // a prefix the template rejects, or that the whole does not extend
        CHECK_THROWS(parsed.render_with_assistant_spans(messages_of(conversation), without_tools, tools));
        continue;
      }
      const auto rendered = parsed.render_with_assistant_spans(messages_of(conversation), without_tools, tools);
      CHECK(rendered.text == expected);
      CHECK(rendered.assistant_spans == spans_of(entry[with_spans ? "spans" : "prefix_spans"]));
      check_tool_results_untrained(rendered.text, rendered.assistant_spans, conversation);
      ++span_checks;
    }
  }
  WARN(templates.size() << " templates x " << data["conversations"].size() << " conversations: " << equal
                        << " renderings equal to jinja2 and apply_chat_template, " << rejected
                        << " rejections on both sides, " << compile_refused
                        << " template(s) refused at parse as jinja2 refuses them; " << span_checks
                        << " assistant-span checks");
  CHECK(templates.size() >= 30);
  CHECK(equal >= 700);
  CHECK(rejected >= 100);
  CHECK(compile_refused >= 1);
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
    const auto first = rendered.text.substr(rendered.assistant_spans[0].first,
                                            rendered.assistant_spans[0].second - rendered.assistant_spans[0].first);
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
      Row{"{% macro f() %}{% generation %}x{% endgeneration %}{% endmacro %}",
          "t:1:19: '{% generation %}' inside a macro"},
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

TEST_CASE("Mappings keep insertion order, and a namespace shows no key of its own and refuses what jinja2 refuses",
          "[text][chat_template]") {
  // The data's order (a plain nlohmann::json would have sorted "unit" after "location"), a literal's, dictsort's.
  const auto messages =
      nlohmann::ordered_json::parse(R"([{"role": "assistant", "content": null, "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": {"unit": "c", "location": "Oslo", "days": 2}}}]}])");
  const auto render = [&](const std::string& source) {
    return tx::ChatTemplate::parse(source, "t").render(messages, {});
  };
  CHECK(render("{{ messages[0].tool_calls[0].function.arguments | tojson }}") ==
        R"({"unit": "c", "location": "Oslo", "days": 2})");
  CHECK(render("{% for k, v in messages[0].tool_calls[0].function.arguments.items() %}{{ k }};{% endfor %}") ==
        "unit;location;days;");
  CHECK(render("{{ messages[0] }}") ==
        "{'role': 'assistant', 'content': None, 'tool_calls': [{'type': 'function', 'function': {'name': 'f', "
        "'arguments': {'unit': 'c', "
        "'location': 'Oslo', 'days': 2}}}]}");
  CHECK(render("{{ {'b': 1, 'a': 2} | tojson }} {{ {'b': 1, 'a': 2} | dictsort | map('first') | join }} {{ {'b': 1, "
               "'a': 2} | tojson(sort_keys=true) }}") == R"({"b": 1, "a": 2} ab {"a": 2, "b": 1})");
  CHECK(render("{% set ns = namespace(b=1, a=2) %}{% set ns.c = 3 %}{{ ns.a }} {{ ns }} {{ ns is mapping }}") ==
        "2 <Namespace {'b': 1, 'a': 2, 'c': 3}> False");
  using Row = std::tuple<std::string, std::string>;
  auto [source, message] = GENERATE(table<std::string, std::string>({
      Row{"{% set ns = namespace(a=1) %}{{ ns | length }}", "t:1:38: object of type 'Namespace' has no len()"},
      Row{"{% set ns = namespace(a=1) %}{{ ns | tojson }}",
          "t:1:38: Object of type Namespace is not JSON serializable"},
      Row{"{% set ns = namespace(a=1) %}{{ 'a' in ns }}", "t:1:37: argument of type 'Namespace' is not iterable"},
      Row{"{% set ns = namespace(a=1) %}{% for x in ns %}{% endfor %}", "t:1:30: 'Namespace' object is not iterable"},
      Row{"{% set d = {'a': 1} %}{% set d.a = 2 %}", "cannot assign attribute on non-namespace object"},
      Row{"{{ messages[0].function.name }}", "t:1:25: 'dict object' has no attribute 'function'"},
  }));
  CAPTURE(source);
  CHECK_THROWS_WITH(render(source), Catch::StartsWith("[hpctrain.runtime.chat_template]") && Catch::Contains(message));
}

TEST_CASE(
    "A dict literal's key of a kind hpctrain does not keep is refused naming the place, and keys of different "
    "kinds do not sort, as in Python",
    "[text][chat_template]") {
  // What jinja2 renders with these keys (ints, floats, bools, None) is compared in dict-keys.jinja and seed-oss.jinja;
  // here, the kinds refused (jinja2 takes a tuple, Undefined, a namespace, Markup and an infinity as keys; a list is
  // refused too, as the parser cannot tell it from a tuple) and Python's TypeErrors, with their exact text.
  using Row = std::tuple<std::string, std::string>;
  auto [source, message] = GENERATE(table<std::string, std::string>({
      Row{"{{ {(1, 2): 3} }}",
          "[hpctrain.spec.chat_template] t:1:5: a dictionary key that is a tuple or a list is "
          "not supported by hpctrain's chat templates"},
      Row{"{{ {[1]: 3} }}", "[hpctrain.spec.chat_template] t:1:5: a dictionary key that is a tuple or a list"},
      Row{"{{ {x: 3} }}", "[hpctrain.spec.chat_template] t:1:5: a dictionary key that is undefined"},
      Row{"{{ {'a' | safe: 3} }}", "[hpctrain.spec.chat_template] t:1:11: a dictionary key that is a Markup string"},
      Row{"{% set ns = namespace() %}{{ {ns: 1} }}",
          "[hpctrain.spec.chat_template] t:1:31: a dictionary key that is a namespace"},
      Row{"{{ { {'a': 1}.items: 2} }}", "[hpctrain.spec.chat_template] t:1:15: a dictionary key that is a method"},
      Row{"{{ {1" + std::string(308, '0') + ".0 * 10: 3} }}",
          "[hpctrain.spec.chat_template] t:1:317: a dictionary key that is NaN or infinite"},
      Row{"{{ {'\xFF"
          "1': 1} }}",
          "[hpctrain.spec.chat_template] t:1:5: a dictionary key that is not UTF-8 text"},
      Row{"{% set k = {'a': 1} %}{{ {k: 3} }}", "[hpctrain.runtime.chat_template] t:1:27: unhashable type: 'dict'"},
      Row{"{{ {1: 'a', 'b': 2} | dictsort }}",
          "[hpctrain.runtime.chat_template] t:1:23: '<' not supported between instances of 'str' and 'int'"},
      Row{"{{ {none: 1, 1: 2} | tojson(sort_keys=true) }}",
          "[hpctrain.runtime.chat_template] t:1:22: '<' not supported between instances of 'int' and 'NoneType'"},
  }));
  CAPTURE(source);
  CHECK_THROWS_WITH(tx::ChatTemplate::parse(source, "t").render(nlohmann::json::array(), {}),
                    Catch::StartsWith(message));
  // A conversation's keys are strings (JSON's are, in Python too): '1' is there, 1 is not.
  const auto messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "x", "1": "one"}])");
  CHECK(tx::ChatTemplate::parse("{{ messages[0][1] is defined }} {{ messages[0]['1'] }} {{ 1 in messages[0] }}", "t")
            .render(messages, {}) == "False one False");
}

TEST_CASE("A hostile template cannot exhaust the stack or memory", "[text][chat_template]") {
  CHECK_THROWS_WITH(
      tx::ChatTemplate::parse("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}", "deep"),
      Catch::Contains("nested too deeply"));
  CHECK_THROWS_WITH(tx::ChatTemplate::parse(
                        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", "big")
                        .render(nlohmann::json::array(), {}),
                    Catch::Contains("too many loop iterations") || Catch::Contains("exceeds 64 MiB"));
}
