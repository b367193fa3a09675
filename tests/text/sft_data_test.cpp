// Issue 17, items 3, 5, 6 (torch-free part): tokenizer directories as transformers reads them (post-processors,
// special tokens) against AutoTokenizer and tokenizers, SFT JSONL in TRL's three shapes with errors naming the
// file and line, TRL's tokenization rules, and best-fit-decreasing packing.
#include <catch2/catch.hpp>

#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <hpctrain/text/chat_template.hpp>
#include <hpctrain/text/packing.hpp>
#include <hpctrain/text/pretrained_tokenizer.hpp>
#include <hpctrain/text/sft_jsonl.hpp>

#include "text_test_support.hpp"

namespace tx = hpctrain::text;

namespace {
std::filesystem::path write_file(const std::filesystem::path& path, const std::string& content) {
  std::ofstream(path) << content;
  return path;
}
/// The four tokenizer directories of pretrained_oracle.py (made once per build tree).
std::filesystem::path tokenizer_dirs() {
  const auto dir = text_test::cache_dir() / "pretrained";
  if (!std::filesystem::exists(dir / "expected.json")) {
    std::filesystem::create_directories(dir);
    const auto command = fmt::format("'{}' '{}/tests/text/pretrained_oracle.py' make '{}' > '{}/make.log' 2>&1",
                                     text_test::python(), text_test::source_dir().string(), dir.string(), dir.string());
    INFO(command);
    REQUIRE(std::system(command.c_str()) == 0);
  }
  return dir;
}
}  // namespace

TEST_CASE(
    "A tokenizer directory encodes as AutoTokenizer does: TemplateProcessing, RobertaProcessing, BertProcessing, none",
    "[text][pretrained]") {
  const auto dir = tokenizer_dirs();
  const auto expected = nlohmann::json::parse(text_test::read_file(dir / "expected.json"));
  for (const auto& [kind, cases] : expected.items()) {
    const auto tokenizer = tx::load_pretrained_tokenizer(dir / kind);
    for (const auto& example : cases) {
      const auto text = example["text"].get<std::string>();
      CAPTURE(kind, text);
      CHECK(tokenizer.encode(text, true) == example["with"].get<std::vector<tx::TokenId>>());
      CHECK(tokenizer.encode(text, false) == example["without"].get<std::vector<tx::TokenId>>());
      CHECK(tokenizer.encode(text, true) == example["tokenizers"].get<std::vector<tx::TokenId>>());
    }
  }
  const auto roberta = tx::load_pretrained_tokenizer(dir / "roberta");
  CHECK(roberta.bos_token() == "<s>");
  CHECK(roberta.pad_id() == roberta.tokenizer().token_id("<pad>"));
}

TEST_CASE("An unknown post-processor is refused naming the file and the JSON path", "[text][pretrained]") {
  const auto dir = text_test::scratch("bad-post-processor");
  const auto file = dir / "tokenizer.json";
  CHECK_THROWS_WITH(
      tx::PostProcessor::from_json(nlohmann::json::parse(R"({"type": "Mystery"})"), file),
      Catch::Contains(file.string()) && Catch::Contains("post_processor.type") && Catch::Contains("Mystery"));
  CHECK_THROWS_WITH(
      tx::PostProcessor::from_json(
          nlohmann::json::parse(R"({"type": "RobertaProcessing", "cls": ["<s>", 0], "sep": ["</s>"]})"), file),
      Catch::Contains("post_processor.sep"));
}

TEST_CASE("SFT JSONL: a bad line is an error naming the file and the line", "[text][sft]") {
  const auto dir = text_test::scratch("sft-jsonl");
  using Row = std::tuple<std::string, std::string>;
  auto [content, message] = GENERATE(table<std::string, std::string>({
      Row{"{\"text\": \"a\"}\n{\"text\": \"b\"\n", ":2: not JSON"},
      Row{"{\"text\": \"a\"}\n\n{\"prompt\": \"p\", \"completion\": \"c\"}\n",
          ":3: is {\"prompt\", \"completion\"} while the file's first line is {\"text\"}"},
      Row{"{\"prompt\": \"p\", \"completion\": \"\"}\n", ":1: \"completion\" is empty"},
      Row{"{\"prompt\": \"p\"}\n", ":1: no \"completion\""},
      Row{"{\"text\": 3}\n", ":1: \"text\" is number, not a string"},
      Row{"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
          ":1: the conversation has no assistant turn"},
      Row{"{\"messages\": [{\"role\": \"wizard\", \"content\": \"hi\"}]}\n",
          ":1: messages[0].role: \"wizard\" is none of"},
      Row{"{\"messages\": [{\"role\": \"user\"}]}\n", ":1: messages[0].content: missing"},
      Row{"[1, 2]\n", ":1: a line must be a JSON object, not array"},
      Row{"{\"other\": 1}\n", ":1: has none of"},
  }));
  CAPTURE(content);
  const auto file = write_file(dir / "data.jsonl", content);
  CHECK_THROWS_WITH(tx::validate_sft_data(file),
                    Catch::StartsWith("[hpctrain.spec.data.jsonl] " + file.string() + message));
}

TEST_CASE("SFT JSONL: the three shapes, streamed", "[text][sft]") {
  const auto dir = text_test::scratch("sft-shapes");
  const auto file = write_file(
      dir / "chat.jsonl",
      "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"u\"}, "
      "{\"role\": \"assistant\", \"content\": \"a\"}]}\n\n{\"messages\": [{\"role\": \"assistant\", \"content\": "
      "\"x\"}]}\n");
  const auto summary = tx::validate_sft_data(file);
  CHECK(summary.examples == 2);
  CHECK(summary.shape == tx::SftShape::conversational);
  tx::SftReader reader(file);
  tx::SftRecord record;
  REQUIRE(reader.next(record));
  CHECK(record.messages.size() == 3);
  REQUIRE(reader.next(record));
  CHECK(record.line == 3);
  CHECK_FALSE(reader.next(record));
}

TEST_CASE(
    "TRL's rules: text trains every token and EOS, prompt/completion the completion and EOS, a conversation its "
    "assistant bytes",
    "[text][sft]") {
  const auto tokenizer = tx::load_pretrained_tokenizer(tokenizer_dirs() / "llama3");
  const auto bos = *tokenizer.tokenizer().token_id("<|begin|>"), eos = *tokenizer.eos_id();
  tx::SftRecord text{tx::SftShape::text, "Hello there", {}, {}, {}, 1, {}};
  const auto a = tx::tokenize_sft(text, tokenizer, nullptr);
  CHECK(a.ids.front() == bos);
  CHECK(a.ids.back() == eos);
  CHECK(std::all_of(a.trained.begin(), a.trained.end(), [](auto t) { return t == 1; }));

  tx::SftRecord pair{tx::SftShape::prompt_completion, {}, "Q: Why?\nA:", " Because.", {}, 2, {}};
  const auto b = tx::tokenize_sft(pair, tokenizer, nullptr);
  const auto prompt = tokenizer.encode("Q: Why?\nA:", true), completion = tokenizer.encode(" Because.", false);
  REQUIRE(b.ids.size() == prompt.size() + completion.size() + 1);
  CHECK(std::vector<tx::TokenId>(b.ids.begin(), b.ids.begin() + static_cast<long>(prompt.size())) == prompt);
  CHECK(std::count(b.trained.begin(), b.trained.end(), 1) == static_cast<long>(completion.size() + 1));
  CHECK(b.trained[prompt.size() - 1] == 0);
  CHECK(b.trained[prompt.size()] == 1);

  // A fake renderer: "<|begin|>U: hi\nA: " + reply + "<|end|>", the reply and EOS the assistant's.
  const tx::ConversationRenderer render = [](const std::vector<tx::ChatMessage>& messages,
                                             const nlohmann::ordered_json&) {
    tx::RenderedChat out;
    out.text = "<|begin|>U: " + messages[0].content + "\nA: ";
    const auto begin = out.text.size();
    out.text += messages[1].content + "<|end|>";
    out.assistant_spans.push_back({begin, out.text.size()});
    return out;
  };
  tx::SftRecord chat{tx::SftShape::conversational, {}, {}, {}, {{"user", "hi"}, {"assistant", "fine thanks"}}, 3, {}};
  const auto c = tx::tokenize_sft(chat, tokenizer, &render);
  CHECK(c.ids == tokenizer.encode("<|begin|>U: hi\nA: fine thanks<|end|>", false));
  std::string trained_text;
  for (std::size_t i = 0; i < c.ids.size(); ++i)
    if (c.trained[i]) trained_text += tokenizer.decode(std::span<const tx::TokenId>(&c.ids[i], 1));
  CHECK(trained_text ==
        " fine thanks<|end|>");  // the token holding the span's first byte counts, as transformers marks it
  CHECK_THROWS_WITH(tx::tokenize_sft(chat, tokenizer, nullptr),
                    Catch::Contains("[hpctrain.spec.data.jsonl] line 3: a conversation needs"));
}

TEST_CASE("SFT JSONL: a malformed tool call, tool message, content part or tools list names the field", "[text][sft]") {
  const auto dir = text_test::scratch("sft-tool-errors");
  const std::string user = R"({"role": "user", "content": "Weather?"})";
  const auto line = [&](const std::string& assistant, const std::string& rest = "") {
    return R"({"messages": [)" + user + ", " + assistant + rest + "]}\n";
  };
  using Row = std::tuple<std::string, std::string>;
  auto [content, message] = GENERATE_COPY(table<std::string, std::string>({
      Row{line(R"({"role": "assistant", "tool_calls": [{"type": "function", "function": {"arguments": {}}}]})"),
          ":1: messages[1].tool_calls[0].function.name: missing"},
      Row{line(
              R"({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": 7, "arguments": {}}}]})"),
          ":1: messages[1].tool_calls[0].function.name: is number, not a string"},
      Row{line(R"({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]})"),
          ":1: messages[1].tool_calls[0].function.arguments: missing"},
      Row{line(
              R"({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"a\": "}}]})"),
          ":1: messages[1].tool_calls[0].function.arguments: is a string that does not hold a JSON object"},
      Row{line(
              R"({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": 3}}]})"),
          ":1: messages[1].tool_calls[0].function.arguments: is number, not an object or a JSON string"},
      Row{line(
              R"({"role": "assistant", "tool_calls": [{"type": "retrieval", "function": {"name": "f", "arguments": {}}}]})"),
          ":1: messages[1].tool_calls[0].type: \"retrieval\" is not \"function\""},
      Row{line(R"({"role": "assistant", "tool_calls": [{"type": "function"}]})"),
          ":1: messages[1].tool_calls[0].function: missing"},
      Row{line(R"({"role": "assistant", "tool_calls": []})"), ":1: messages[1].tool_calls: is empty"},
      Row{line(R"({"role": "assistant", "content": null})"),
          ":1: messages[1].content: is null, and the message calls no tool"},
      Row{line(R"({"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "image", "url": "x"}]})"),
          ":1: messages[1].content[1].type: \"image\": only text parts can be trained on"},
      Row{line(R"({"role": "assistant", "content": [{"type": "text"}]})"), ":1: messages[1].content[0].text: missing"},
      Row{line(R"({"role": "assistant", "content": 5})"),
          ":1: messages[1].content: is number, not a string or a list of parts"},
      Row{R"({"messages": [{"role": "user", "content": "x", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}]})"
          "\n",
          ":1: messages[0].tool_calls: only an assistant message calls tools"},
      Row{line(
              R"({"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {}}}]})",
              R"(, {"role": "tool", "tool_call_id": "call_2", "content": "r"}, {"role": "assistant", "content": "ok"})"),
          ":1: messages[2].tool_call_id: \"call_2\" is the id of no tool call before it"},
      Row{line(R"({"role": "assistant", "content": "a"})", R"(, {"role": "tool", "name": 3, "content": "r"})"),
          ":1: messages[2].name: is number, not a string"},
      Row{R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "tools": {"name": "f"}})"
          "\n",
          ":1: tools: is object, not a list"},
      Row{R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "tools": [{"type": "function", "function": {"description": "d"}}]})"
          "\n",
          ":1: tools[0].function.name: missing"},
  }));
  CAPTURE(content);
  const auto file = write_file(dir / "data.jsonl", content);
  CHECK_THROWS_WITH(tx::validate_sft_data(file),
                    Catch::StartsWith("[hpctrain.spec.data.jsonl] " + file.string() + message));
}

TEST_CASE("SFT JSONL: tool calls reach the template as the line wrote them, with the line's tools or the file's",
          "[text][sft]") {
  const auto dir = text_test::scratch("sft-tools");
  const std::string call_line =
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Oslo?"}]}, )"
      R"({"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"unit": "celsius", "location": "Oslo"}}}]}, )"
      R"({"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "12"}, {"role": "assistant", "content": "12 °C."}]})";
  const std::string own_tools_line =
      R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "tools": [{"type": "function", "function": {"name": "own", "parameters": {}}}]})";
  const auto file = write_file(dir / "tools.jsonl", call_line + "\n" + own_tools_line + "\n");
  const auto tools_file =
      write_file(dir / "tools.json",
                 R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])");

  tx::SftReader reader(file, tx::SftJsonlOptions{tools_file});
  tx::SftRecord record;
  REQUIRE(reader.next(record));
  REQUIRE(record.messages.size() == 4);
  CHECK(record.messages[0].content == "Weather in Oslo?");  // the text parts joined; the template sees the parts
  CHECK(record.messages[0].json["content"].is_array());
  CHECK(record.messages[1].json["tool_calls"][0]["function"]["arguments"].dump() ==
        R"({"unit":"celsius","location":"Oslo"})");
  CHECK(record.messages[2].json.dump() == R"({"role":"tool","tool_call_id":"c1","name":"get_weather","content":"12"})");
  CHECK(record.tools[0]["function"]["name"] == "get_weather");  // the file's tools
  REQUIRE(reader.next(record));
  CHECK(record.tools[0]["function"]["name"] == "own");  // the line's own
  CHECK_FALSE(reader.next(record));
  tx::SftReader without(file);
  REQUIRE(without.next(record));
  CHECK(record.tools.is_null());

  CHECK_THROWS_WITH(tx::SftReader(file, tx::SftJsonlOptions{dir / "missing.json"}),
                    Catch::StartsWith("[hpctrain.spec.data.jsonl] " + (dir / "missing.json").string() +
                                      ": cannot open the tools file"));
  const auto bad_tools = write_file(dir / "bad.json", R"([{"type": "function", "function": {}}])");
  CHECK_THROWS_WITH(
      tx::validate_sft_data(file, tx::SftJsonlOptions{bad_tools}),
      Catch::StartsWith("[hpctrain.spec.data.jsonl] " + bad_tools.string() + ": tools[0].function.name: missing"));
}

TEST_CASE(
    "SFT on tool calls: the tokens and the loss mask are transformers' (generation markers) or the prefix-rendered "
    "ones, tool results never trained",
    "[text][sft][chat_template]") {
  const auto dir = text_test::scratch("sft-tool-masks");
  const auto tokenizer_dir = tokenizer_dirs() / "llama3";
  const auto tokenizer = tx::load_pretrained_tokenizer(tokenizer_dir);
  // Tool calls with object and string arguments, parallel calls, unicode; tools on a line, and the file's.
  const std::string lines[] = {
      R"({"messages": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris and Oslo?"}, )"
      R"({"role": "assistant", "content": null, "tool_calls": [{"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}}, )"
      R"({"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Oslo\"}"}}]}, )"
      R"({"role": "tool", "tool_call_id": "a", "content": "TOOL-RESULT-ONE 21 °C"}, {"role": "tool", "tool_call_id": "b", "content": "TOOL-RESULT-TWO 12 °C"}, )"
      R"({"role": "assistant", "content": "Paris 21 °C, Oslo 12 °C — ünïcödé."}]})",
      R"({"messages": [{"role": "user", "content": "Find docs."}, )"
      R"({"role": "assistant", "content": "Searching.", "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": "docs", "limit": 3}}}]}, )"
      R"({"role": "tool", "name": "search", "content": "TOOL-RESULT-THREE"}, {"role": "assistant", "content": "Found them."}], )"
      R"("tools": [{"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}}}]})",
  };
  const auto file = write_file(dir / "tools.jsonl", lines[0] + "\n" + lines[1] + "\n");
  const auto tools_file = write_file(
      dir / "tools.json",
      R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {"type": "object", "properties": {"location": {"type": "string"}, "unit": {"type": "string"}}}}}])");
  // One oracle process for both templates: one with generation markers, Qwen2.5's without.
  const auto templates = text_test::source_dir() / "tests/data/chat_templates";
  const auto out = dir / "masks.json";
  text_test::run(
      fmt::format("'{}' '{}/tests/text/chat_template_oracle.py' masks '{}' '{}' '{}' '{}' '{}' '{}' > '{}.log' 2>&1",
                  text_test::python(), text_test::source_dir().string(), tokenizer_dir.string(), file.string(),
                  tools_file.string(), out.string(), (templates / "chatml-tools-generation.jinja").string(),
                  (templates / "qwen2.5.jinja").string(), out.string()));
  const auto masks = nlohmann::json::parse(text_test::read_file(out));
  for (const char* name : {"chatml-tools-generation.jinja", "qwen2.5.jinja"}) {
    CAPTURE(name);
    const auto template_path = templates / name;
    const auto& expected = masks.at(name);
    const auto parsed =
        std::make_shared<const tx::ChatTemplate>(tx::ChatTemplate::parse(text_test::read_file(template_path), name));
    tx::ChatRenderOptions options;
    options.bos_token = tokenizer.bos_token();
    options.eos_token = tokenizer.eos_token();
    const tx::ConversationRenderer render = [parsed, options](const std::vector<tx::ChatMessage>& messages,
                                                              const nlohmann::ordered_json& tools) {
      return parsed->render_with_assistant_spans(messages, options, tools);
    };
    tx::SftReader reader(file, tx::SftJsonlOptions{tools_file});
    tx::SftRecord record;
    for (std::size_t k = 0; reader.next(record); ++k) {
      CAPTURE(k);
      const auto example = tx::tokenize_sft(record, tokenizer, &render);
      CHECK(std::vector<std::int64_t>(example.ids.begin(), example.ids.end()) ==
            expected[k]["ids"].get<std::vector<std::int64_t>>());
      CHECK(std::vector<int>(example.trained.begin(), example.trained.end()) ==
            expected[k]["mask"].get<std::vector<int>>());
      std::string trained, untrained;
      for (std::size_t i = 0; i < example.ids.size(); ++i)
        (example.trained[i] ? trained : untrained) +=
            tokenizer.decode(std::span<const tx::TokenId>(&example.ids[i], 1));
      CHECK_THAT(trained, Catch::Contains("get_weather") || Catch::Contains("search"));  // the calls are trained
      CHECK_THAT(trained, !Catch::Contains("TOOL-RESULT"));                              // their results never are
      CHECK_THAT(untrained, Catch::Contains("TOOL-RESULT"));
    }
  }
}

TEST_CASE("Best-fit-decreasing packing places every example once, within capacity, in no more rows than first-fit",
          "[text][packing]") {
  using Row = std::tuple<std::vector<std::size_t>, std::size_t, std::size_t>;
  auto [lengths, capacity, rows_expected] = GENERATE(table<std::vector<std::size_t>, std::size_t, std::size_t>({
      Row{{5, 5, 5, 5}, 10, 2},
      Row{{7, 3, 6, 4, 2, 8}, 10, 3},
      Row{{1}, 1, 1},
      Row{{9, 9, 9}, 10, 3},
      Row{{4, 4, 4, 4, 4, 4, 2, 2, 2}, 12, 3},
  }));
  CAPTURE(lengths, capacity);
  const auto rows = tx::pack_best_fit_decreasing(lengths, capacity);
  CHECK(rows.size() == rows_expected);
  std::multiset<std::size_t> seen;
  for (const auto& row : rows) {
    std::size_t used = 0;
    for (const auto e : row) {
      seen.insert(e);
      used += lengths[e];
    }
    CHECK(used <= capacity);
  }
  std::vector<std::size_t> all(lengths.size());
  std::iota(all.begin(), all.end(), std::size_t{0});
  CHECK(seen == std::multiset<std::size_t>(all.begin(), all.end()));
  CHECK_THROWS_WITH(tx::pack_best_fit_decreasing({3, 11}, 10),
                    "[hpctrain.spec.packing.length] packing.length = 11 (example 1): exceeds the row capacity 10");
  CHECK(tx::padding_fraction({{0, 1}}, {4, 4}, 10) == Approx(0.2));
}
