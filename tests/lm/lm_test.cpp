// The language-model layer (lm/): the loss over counted targets, the SFT dataset's rows, and packing —
// a packed row must compute what its examples compute alone (loss and gradients, fp32, 1e-5), for GPT-2
// and for Llama (rotary positions per example, grouped-query attention); masked-LM masking and its blocks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <hpctrain/lm/lm.hpp>
#include <hpctrain/lm/masked_lm.hpp>
#include <hpctrain/lm/setting.hpp>
#include <hpctrain/lm/sft.hpp>
#include <hpctrain/lm/sft_dataset.hpp>
#include <hpctrain/models/models.hpp>
#include <hpctrain/text/prepare.hpp>
#include <hpctrain/train/data/mix.hpp>
#include <hpctrain/train/data/sampler.hpp>

#include "../models/models_test_support.hpp"

namespace hm = hpctrain::models;
namespace lm = hpctrain::lm;
namespace text = hpctrain::text;

namespace {

/// What the SFT source tests read: pretrained_oracle.py's tokenizer directories made below `dir` (llama3: a BPE of
/// 400 ids), a chat template with generation markers, and the fortunes' Q/A conversations (at 96 tokens some are
/// cut, some left without a trained token).
struct SftInputs {
  std::filesystem::path tokenizers, chat_template, conversations;
};
SftInputs sft_inputs(const std::filesystem::path& dir) {
  const auto tokenizers = dir / "tokenizers";
  std::filesystem::create_directories(tokenizers);
  models_test::run_python("../text/pretrained_oracle.py", fmt::format("make '{}'", tokenizers.string()),
                          dir / "make.log");
  const auto source_dir = std::filesystem::path(std::getenv("HPCTRAIN_SOURCE_DIR"));
  return {tokenizers, source_dir / "tests/data/chat_templates/chatml-generation.jinja",
          source_dir / "examples/data/fortunes_qa.jsonl"};
}

hm::GPT2 small_gpt2() {
  hm::GPT2Config config;
  config.vocab_size = 97;
  config.n_layer = 2;
  config.n_head = 2;
  config.n_embd = 32;
  config.n_positions = 64;
  config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0;
  return hm::GPT2(config);
}

hm::Llama small_llama() {
  hm::LlamaConfig config;
  config.vocab_size = 97;
  config.hidden_size = 32;
  config.intermediate_size = 64;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  return hm::Llama(config);
}

/// Three examples of different lengths; the first tokens of each are a "prompt" whose loss does not count.
std::vector<text::SftExample> three_examples() {
  std::vector<text::SftExample> examples;
  const std::vector<std::size_t> lengths{9, 5, 13};
  std::int64_t next = 3;
  for (const auto length : lengths) {
    text::SftExample example;
    for (std::size_t i = 0; i < length; ++i) {
      example.ids.push_back(next);
      next = (next * 31 + 7) % 97;
      example.trained.push_back(i >= 3 ? 1 : 0);
    }
    examples.push_back(example);
  }
  return examples;
}

/// {sum of the token losses, gradients of that sum} of `batch` through the lm step's logits.
std::pair<double, std::vector<torch::Tensor>> loss_and_gradients(hm::CausalLM& model,
                                                                 const hpctrain::data::Batch& batch) {
  model.zero_grad();
  torch::Tensor logits;
  if (batch.has("document_ids"))
    logits = model.forward(batch.inputs, hm::TokenLayout{batch.field("position_ids"), batch.field("document_ids")});
  else logits = model.forward(batch.inputs);
  const auto [sum, count] = lm::token_loss_sum(logits, batch.targets);
  sum.backward();
  std::vector<torch::Tensor> gradients;
  for (const auto& parameter : model.parameters()) gradients.push_back(parameter.grad().clone());
  return {sum.item<double>(), gradients};
}

void check_packed_equals_unpacked(hm::CausalLM& model) {
  const auto examples = three_examples();
  const auto unpacked = lm::SftDataset::unpacked(examples, /*pad_id=*/0);
  const lm::SftDataset packed(examples, {{2, 0, 1}}, /*pad_id=*/0);
  REQUIRE(packed.packed());

  double separate_loss = 0;
  std::vector<torch::Tensor> separate_gradients;
  for (std::int64_t i = 0; i < 3; ++i) {
    const auto [loss, gradients] = loss_and_gradients(model, unpacked->batch({i}));
    separate_loss += loss;
    if (separate_gradients.empty()) separate_gradients = gradients;
    else
      for (std::size_t p = 0; p < gradients.size(); ++p) separate_gradients[p] += gradients[p];
  }
  const auto [packed_loss, packed_gradients] = loss_and_gradients(model, packed.batch({0}));
  CAPTURE(separate_loss, packed_loss);
  CHECK(std::abs(packed_loss - separate_loss) <= 1e-5 * std::abs(separate_loss));
  for (std::size_t p = 0; p < packed_gradients.size(); ++p) {
    const double scale = separate_gradients[p].abs().max().item<double>() + 1e-12;
    const double difference = (packed_gradients[p] - separate_gradients[p]).abs().max().item<double>();
    CAPTURE(p, difference, scale);
    CHECK(difference <= 1e-5 * std::max(scale, 1.0));
  }
}

}  // namespace

TEST_CASE("The causal-LM loss is the mean over the counted targets, in fp32, and 0 when none counts", "[lm]") {
  torch::manual_seed(0);
  const auto logits = torch::randn({2, 4, 11}, torch::kBFloat16);
  auto targets = torch::randint(0, 11, {2, 4}, torch::kInt64);
  targets[0][1] = lm::ignore_index;
  targets[1][3] = lm::ignore_index;
  const auto loss = lm::token_loss(logits, targets);
  CHECK(loss.scalar_type() == torch::kFloat32);
  const auto expected =
      torch::nn::functional::cross_entropy(logits.reshape({-1, 11}).to(torch::kFloat32), targets.reshape({-1}),
                                           torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
  CHECK(loss.item<double>() == Approx(expected.item<double>()).epsilon(1e-6));
  CHECK(lm::token_loss(logits, torch::full({2, 4}, lm::ignore_index, torch::kInt64)).item<double>() == 0.0);
}

TEST_CASE("An SFT row shifts targets, masks untrained ones and padding, and restarts positions per packed example",
          "[lm]") {
  std::vector<text::SftExample> examples{{{10, 11, 12, 13}, {0, 0, 1, 1}}, {{20, 21, 22}, {0, 1, 1}}};
  const lm::SftDataset packed(examples, {{0, 1}}, /*pad_id=*/5);
  const auto batch = packed.batch({0});
  CHECK(batch.inputs.equal(torch::tensor({{10, 11, 12, 20, 21}}, torch::kInt64)));
  CHECK(batch.targets.equal(torch::tensor({{-100, 12, 13, 21, 22}}, torch::kInt64)));
  CHECK(batch.field("position_ids").equal(torch::tensor({{0, 1, 2, 0, 1}}, torch::kInt64)));
  CHECK(batch.field("document_ids").equal(torch::tensor({{0, 0, 0, 1, 1}}, torch::kInt32)));

  const auto unpacked = lm::SftDataset::unpacked(examples, /*pad_id=*/5)->batch({0, 1});
  CHECK_FALSE(unpacked.has("position_ids"));
  CHECK(unpacked.inputs.equal(torch::tensor({{10, 11, 12}, {20, 21, 5}}, torch::kInt64)));
  CHECK(unpacked.targets.equal(torch::tensor({{-100, 12, 13}, {21, 22, -100}}, torch::kInt64)));

  // Padded to a multiple of 4 tokens (pad_to_multiple_of), never past the limit unless the longest row is longer.
  auto rounded = lm::SftDataset::unpacked(examples, /*pad_id=*/5);
  rounded->round_lengths(4, 8);
  const auto four = rounded->batch({0, 1});
  CHECK(four.inputs.equal(torch::tensor({{10, 11, 12, 5}, {20, 21, 5, 5}}, torch::kInt64)));
  CHECK(four.targets.equal(torch::tensor({{-100, 12, 13, -100}, {21, 22, -100, -100}}, torch::kInt64)));
  rounded->round_lengths(4, 3);
  CHECK(rounded->batch({0, 1}).inputs.size(1) == 3);
  rounded->round_lengths(4, 2);
  CHECK(rounded->batch({0, 1}).inputs.size(1) == 3);  // the longest row: 3 inputs
  auto rounded_packed = std::make_shared<lm::SftDataset>(examples, std::vector<std::vector<std::size_t>>{{0, 1}}, 5);
  rounded_packed->round_lengths(8, 64);
  const auto eight = rounded_packed->batch({0});
  CHECK(eight.inputs.size(1) == 8);
  CHECK(eight.field("document_ids").equal(torch::tensor({{0, 0, 0, 1, 1, -1, -1, -1}}, torch::kInt32)));
}

TEST_CASE(
    "The padding an SFT epoch's batches carry is counted on the batches as formed: their longest row, rounded, every "
    "rank",
    "[lm]") {
  // Four examples of 3, 2, 6 and 1 input tokens (ids minus one): 12 tokens.
  std::vector<text::SftExample> examples;
  for (const std::size_t ids : {4, 3, 7, 2})
    examples.push_back({std::vector<text::TokenId>(ids, 7), std::vector<std::uint8_t>(ids, 1)});
  auto unpacked = lm::SftDataset::unpacked(examples, /*pad_id=*/0);
  // fill() is what batch() makes: the tokens of its rows, and rows × the padded length.
  for (const auto& indices : std::vector<std::vector<std::int64_t>>{{0, 1}, {2, 3}, {1, 3}, {0, 1, 2, 3}}) {
    CAPTURE(indices);
    const auto fill = unpacked->fill(indices);
    REQUIRE(fill);
    CHECK(fill->slots == unpacked->batch(indices).inputs.numel());
    CHECK(fill->tokens ==
          unpacked->batch(indices).targets.ne(lm::ignore_index).sum().item<std::int64_t>());  // every id trained here
  }
  // One rank, dataset order, batches of 2: {0, 1} pads to 3 (6 slots, 5 tokens), {2, 3} to 6 (12 slots, 7 tokens): 1/3
  // padding.
  const hpctrain::data::DistributedSampler in_order(4, 1, 0, /*seed=*/1, /*shuffle=*/false);
  auto fill = hpctrain::data::epoch_fill(*unpacked, in_order, 1, 0, 2, 2);
  REQUIRE(fill);
  CAPTURE(fill->tokens, fill->slots, fill->padding());
  CHECK(fill->tokens == 12);
  CHECK(fill->slots == 18);
  CHECK(fill->padding() == Approx(1.0 / 3.0));
  // Rounded to multiples of 4 (at most 8): 4 and 8 tokens a row, 24 slots: half of them padding.
  unpacked->round_lengths(4, 8);
  CHECK(hpctrain::data::epoch_fill(*unpacked, in_order, 1, 0, 2, 2)->slots == 24);
  unpacked->round_lengths(1, 8);
  // Two ranks, one batch of 2 each: rank 0 has examples 0 and 2 (2 × 6 slots, 9 tokens), rank 1 has 1 and 3 (2 × 2, 3).
  fill = hpctrain::data::epoch_fill(*unpacked, hpctrain::data::DistributedSampler(4, 2, 0, 1, false), 2, 0, 2, 1);
  CHECK(fill->tokens == 12);
  CHECK(fill->slots == 16);
  // Packed into rows {2} and {0, 1, 3} of 6 tokens each: no padding left.
  const lm::SftDataset packed(examples, {{2}, {0, 1, 3}}, /*pad_id=*/0);
  fill = hpctrain::data::epoch_fill(packed, hpctrain::data::DistributedSampler(2, 1, 0, 1, false), 1, 0, 2, 1);
  CHECK(fill->slots == packed.batch({0, 1}).inputs.numel());
  CHECK(fill->padding() == 0.0);
  // Shuffled, the same sampler as the Trainer's: every example counted once an epoch.
  CHECK(hpctrain::data::epoch_fill(*unpacked, hpctrain::data::DistributedSampler(4, 1, 0, 5), 1, 3, 2, 2)->tokens ==
        12);
  // A dataset of fixed-size examples reports none.
  hpctrain::data::TensorDataset fixed;
  fixed.inputs = torch::zeros({4, 3});
  fixed.targets = torch::zeros({4});
  CHECK_FALSE(hpctrain::data::epoch_fill(fixed, in_order, 1, 0, 2, 2));
}

TEST_CASE("An optional path from a knob: the knob's value, none when it is empty (--tools), the program's own value",
          "[lm]") {
  hpctrain::Knobs knobs;
  knobs.declare<std::string>("tools", "", "function schemas");
  const lm::Setting<std::filesystem::path> from_knob(lm::knob("tools"));
  CHECK_FALSE(from_knob.get_optional(knobs));
  CHECK(from_knob.get_optional(knobs.with_arguments({"--tools", "t.json"})) == std::filesystem::path("t.json"));
  CHECK(lm::Setting<std::filesystem::path>("/x/tools.json").get_optional(knobs) ==
        std::filesystem::path("/x/tools.json"));
}

TEST_CASE("An SFT split that holds out every n-th example needs n of at least 2: 0 would divide by zero", "[lm][sft]") {
  for (const std::int64_t every : {0, 1, -16}) {
    CAPTURE(every);
    CHECK_THROWS_WITH(
        lm::sft_jsonl("train.jsonl").split(lm::Split::train, every),
        fmt::format("[hpctrain.spec.sft.split] sft.split = {}: holds out every n-th example: n must be at least 2",
                    every));
  }
  CHECK_NOTHROW(lm::sft_jsonl("train.jsonl").split(lm::Split::validation, 2));
}

TEST_CASE(
    "An SFT source makes the same rows from the job's prepared file as tokenized in each rank, unpacked and packed, "
    "both splits",
    "[lm][sft]") {
  const auto dir = models_test::scratch("sft-prepared-rows");
  const auto [tokenizers, chat_template, jsonl] = sft_inputs(dir);
  hpctrain::Knobs knobs;
  knobs.declare<bool>("packing", false, "pack");
  const auto prepared_dir = dir / "prepare";
  for (const bool packing : {false, true}) {
    const auto values = knobs.with_arguments({packing ? "--packing=true" : "--packing=false"});
    for (const auto split : {lm::Split::train, lm::Split::validation}) {
      CAPTURE(packing, split == lm::Split::train);
      const auto source = lm::sft_jsonl(jsonl)
                              .tokenizer(tokenizers / "llama3")
                              .chat_template(chat_template)
                              .max_length(96)
                              .packing(lm::knob("packing"))
                              .split(split);
      const hpctrain::RunContext alone{values, 0, 1, dir / "run", std::nullopt, std::nullopt, std::nullopt};
      const auto in_rank = source(alone).load();
      source.prepare_in_job(values, std::nullopt, prepared_dir);  // once for both splits: the second finds it
      const hpctrain::RunContext in_job{values, 0, 1, dir / "run", prepared_dir, std::nullopt, std::nullopt};
      const auto from_file = source(in_job).load();
      REQUIRE(from_file->size() == in_rank->size());
      std::vector<std::int64_t> all(static_cast<std::size_t>(in_rank->size()));
      std::iota(all.begin(), all.end(), std::int64_t{0});
      const auto expected = in_rank->batch(all), got = from_file->batch(all);
      CHECK(got.inputs.equal(expected.inputs));
      CHECK(got.targets.equal(expected.targets));
      CHECK(got.fields.size() == expected.fields.size());
      for (const auto& [name, tensor] : expected.fields) CHECK(got.field(name).equal(tensor));
    }
  }
  // One prepared file for the file, tokenizer, template and length, whatever the split and packing; a ranks
  // reads it (a corrupt one is refused naming it, never silently replaced by tokenizing).
  std::vector<std::filesystem::path> prepared;
  for (const auto& entry : std::filesystem::directory_iterator(prepared_dir / "sft")) prepared.push_back(entry.path());
  REQUIRE(prepared.size() == 1);
  std::filesystem::resize_file(prepared[0], std::filesystem::file_size(prepared[0]) - 1);
  const hpctrain::RunContext in_job{knobs, 0, 1, dir / "run", prepared_dir, std::nullopt, std::nullopt};
  const auto source = lm::sft_jsonl(jsonl).tokenizer(tokenizers / "llama3").chat_template(chat_template).max_length(96);
  CHECK_THROWS_WITH(source(in_job).load(),
                    Catch::StartsWith("[hpctrain.runtime.text.sft_tokens] " + prepared[0].string() + ": header: "));
  // Another length is another file: the ranks tokenize it themselves until the step prepares it.
  const auto other = lm::sft_jsonl(jsonl).tokenizer(tokenizers / "llama3").chat_template(chat_template).max_length(97);
  CHECK(other(in_job).load()->size() > 0);
}

TEST_CASE(
    "Two SFT sources given with weights in the program: the training split mixes them by weight, each slot one of "
    "their examples, and the held-out split keeps each source's examples once",
    "[lm][sft][mix]") {
  const auto dir = models_test::scratch("sft-mix");
  const auto [tokenizers, chat_template, qa] = sft_inputs(dir);
  const auto few = dir / "few.jsonl";  // the first 40 conversations
  {
    std::ifstream in(qa);
    std::ofstream out(few);
    std::string line;
    for (int i = 0; i < 40 && std::getline(in, line); ++i) out << line << "\n";
  }
  hpctrain::Knobs knobs;
  knobs.declare<std::int64_t>("show_example", 0, "a program's built-in knob, read by the login check");
  const auto configured = [&](lm::SftJsonl source, lm::Split split) {
    return source.tokenizer(tokenizers / "llama3").chat_template(chat_template).max_length(96).split(split);
  };
  hpctrain::RunContext run{knobs, 0, 1, dir / "run", std::nullopt, std::nullopt, std::nullopt};
  run.seed = 5;
  const auto alone_qa = configured(lm::sft_jsonl(qa), lm::Split::train)(run).load();
  const auto alone_few = configured(lm::sft_jsonl(few), lm::Split::train)(run).load();
  const auto mixed_source = configured(lm::sft_jsonl({{qa, 3.0}, {few, 1.0}}), lm::Split::train);
  const auto mixed = mixed_source(run).load();
  REQUIRE(mixed->mixture() != nullptr);
  const auto& plan = mixed->mixture()->plan();
  REQUIRE(plan.parts().size() == 2);
  CHECK(plan.parts()[0].rows == alone_qa->size());
  CHECK(plan.parts()[1].rows == alone_few->size());
  CHECK(mixed->size() == alone_qa->size() + alone_few->size());
  CHECK(plan.per_epoch()[0] == (3 * mixed->size() + 2) / 4);  // 3/4 of the slots, rounded to the nearest
  // Every slot of an epoch is the example its source holds at that row.
  for (std::int64_t slot = 0; slot < mixed->size(); slot += 7) {
    CAPTURE(slot);
    const auto row = plan.row(2, slot);
    const bool first = row < alone_qa->size();
    const auto expected = first ? alone_qa->batch({row}) : alone_few->batch({row - alone_qa->size()});
    const auto got = mixed->batch_in_epoch({slot}, 2);
    CHECK(got.inputs.equal(expected.inputs));
    CHECK(got.targets.equal(expected.targets));
  }
  // The login check reads both; the size it gives is the slots of an epoch.
  const auto at_login = mixed_source.check_at_login(knobs);
  REQUIRE(at_login);
  CHECK(at_login->examples >= mixed->size());  // records kept by the split, before the length rule
  CHECK_THAT(at_login->what, Catch::Contains("2 sources"));
  // Held out: each source's examples once, concatenated.
  const auto held_out = configured(lm::sft_jsonl({{qa, 3.0}, {few, 1.0}}), lm::Split::validation)(run).load();
  CHECK(held_out->mixture() == nullptr);
  CHECK(held_out->size() == configured(lm::sft_jsonl(qa), lm::Split::validation)(run).load()->size() +
                                configured(lm::sft_jsonl(few), lm::Split::validation)(run).load()->size());
}

TEST_CASE("A packed GPT-2 row gives the loss and gradients of its examples alone (fp32, 1e-5)", "[lm]") {
  torch::manual_seed(1);
  auto model = small_gpt2();
  check_packed_equals_unpacked(*model);
}

TEST_CASE(
    "A packed Llama row (rotary positions per example, grouped-query attention) gives the loss and gradients of its "
    "examples alone",
    "[lm]") {
  torch::manual_seed(2);
  auto model = small_llama();
  check_packed_equals_unpacked(*model);
}

TEST_CASE("The packed attention mask is causal and never crosses examples", "[lm]") {
  const auto mask = hm::packed_attention_mask(torch::tensor({{0, 0, 1, 1, -1}}, torch::kInt32));
  const auto expected = torch::tensor(
      {{1, 0, 0, 0, 0}, {1, 1, 0, 0, 0}, {0, 0, 1, 0, 0}, {0, 0, 1, 1, 0}, {0, 0, 0, 0, 1}}, torch::kBool);
  CHECK(mask.sizes() == torch::IntArrayRef({1, 1, 5, 5}));
  CHECK(mask[0][0].equal(expected));
}

TEST_CASE("Packed rows as variable-length sequences: one per example and per row's padding, never across rows",
          "[lm]") {
  // Two rows: examples 0 (2 tokens) and 1 (2) then padding; example 2 (3) then example 3 (2).
  const auto packed = hm::varlen_sequences(torch::tensor({{0, 0, 1, 1, -1}, {2, 2, 2, 3, 3}}, torch::kInt64));
  CHECK(packed.cu_seqlens.equal(torch::tensor({0, 2, 4, 5, 8, 10}, torch::kInt32)));
  CHECK(packed.max_length == 3);
  CHECK_FALSE(packed.mask.defined());
  // The same id at the end of one row and the start of the next is two sequences (rows never attend across).
  CHECK(hm::varlen_sequences(torch::tensor({{0, 1, 1}, {1, 1, 2}}, torch::kInt64))
            .cu_seqlens.equal(torch::tensor({0, 1, 3, 5, 6}, torch::kInt32)));
  // On the CPU (and in fp32 anywhere) packed rows take the mask: flash has neither.
  const auto on_cpu = hm::packed_attention(torch::tensor({{0, 0, 1}}, torch::kInt64), torch::zeros({1, 3, 4}));
  CHECK(on_cpu.mask.defined());
  CHECK_FALSE(on_cpu.cu_seqlens.defined());
}

TEST_CASE("A padded vocabulary rounds up to the multiple and generation stays inside the tokenizer's ids", "[lm]") {
  CHECK(lm::padded_vocab_size(50257, 64) == 50304);
  CHECK(lm::padded_vocab_size(50304, 64) == 50304);
  CHECK(lm::padded_vocab_size(50257, 1) == 50257);
  CHECK(lm::padded_vocab_size(32000, 128) == 32000);
  // Logits whose padded ids (90..96) are the likeliest: the next token is never one of them, greedy or sampled.
  const auto logits = torch::arange(97).to(torch::kFloat32);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(0);
  hm::GenerationOptions options;
  CHECK(hm::detail::next_token(logits, options, generator) == 96);  // the test can fail
  options.vocabulary = 90;
  CHECK(hm::detail::next_token(logits, options, generator) == 89);
  options.temperature = 0.5;
  for (int i = 0; i < 20; ++i) CHECK(hm::detail::next_token(logits, options, generator) < 90);
}

TEST_CASE(
    "Masked-LM masking chooses 15% of the non-special tokens, 80/10/10, never a special one, the same for the same "
    "(seed, epoch, example)",
    "[lm][masked_lm]") {
  lm::MaskingOptions options;
  options.mask_id = 4;
  options.vocab_size = 1000;
  options.special_ids = {0, 1, 2, 3, 4};
  options.seed = 17;
  options.validate();
  torch::manual_seed(5);
  auto ids = torch::randint(0, 1000, {200000}, torch::kInt64);
  ids.index_put_({torch::arange(0, 200000, 10)}, 2);  // every 10th token special
  const auto [inputs, labels] = lm::mask_tokens(ids, options, /*epoch=*/0, /*example=*/7);
  const auto special = ids.le(4);
  const auto chosen = labels.ne(lm::ignore_index);
  CHECK(chosen.logical_and(special).sum().item<std::int64_t>() == 0);
  CHECK(labels.masked_select(chosen).equal(ids.masked_select(chosen)));
  const double candidates = static_cast<double>(special.logical_not().sum().item<std::int64_t>());
  const double n = static_cast<double>(chosen.sum().item<std::int64_t>());
  CHECK(n / candidates == Approx(0.15).margin(0.005));
  const double masked = static_cast<double>(inputs.masked_select(chosen).eq(4).sum().item<std::int64_t>());
  const double kept =
      static_cast<double>(inputs.masked_select(chosen).eq(ids.masked_select(chosen)).sum().item<std::int64_t>());
  CHECK(masked / n == Approx(0.8).margin(0.01));
  CHECK(kept / n == Approx(0.1).margin(0.01));  // (a random draw equal to the original counts here too: 0.1% of them)
  CHECK(inputs.masked_select(chosen.logical_not()).equal(ids.masked_select(chosen.logical_not())));
  CHECK(inputs.masked_select(chosen).gt(4).logical_or(inputs.masked_select(chosen).eq(4)).all().item<bool>());
  const auto again = lm::mask_tokens(ids, options, 0, 7);
  CHECK(again.first.equal(inputs));
  CHECK(again.second.equal(labels));
  CHECK_FALSE(
      lm::mask_tokens(ids, options, /*epoch=*/1, 7).second.equal(labels));  // dynamic: another epoch, other masks
  CHECK_FALSE(lm::mask_tokens(ids, options, 0, /*example=*/8).second.equal(labels));
}

TEST_CASE("Masked-LM blocks are <s>, the prepared stream, </s>, masked anew each epoch, the same on every call",
          "[lm][masked_lm]") {
  const auto tokenizer_file =
      std::filesystem::path(std::getenv("HOME")) / ".cache/hpctrain/roberta-fortunes/tokenizer.json";
  if (!std::filesystem::exists(tokenizer_file)) {
    WARN("skipped: no RoBERTa tokenizer at " << tokenizer_file.string() << " (scripts/setup makes it)");
    return;
  }
  const auto tokenizer = hpctrain::text::load_tokenizer(tokenizer_file);
  const auto dir = models_test::scratch("masked-blocks");
  const std::vector<std::filesystem::path> inputs{"/usr/share/games/fortunes/computers"};
  const auto prepared =
      hpctrain::text::prepare_tokens(inputs, tokenizer, dir, hpctrain::text::PrepareOptions().threads(1));
  const auto tokens = lm::MaskedLmTokens::of(tokenizer);
  CHECK(std::vector<std::int64_t>{tokens.bos, tokens.pad, tokens.eos, tokens.mask} ==
        std::vector<std::int64_t>{0, 1, 2, 4});
  CHECK(tokens.special == std::set<std::int64_t>{0, 1, 2, 3, 4});
  lm::MaskingOptions masking;
  masking.mask_id = tokens.mask, masking.vocab_size = tokens.vocab_size, masking.special_ids = tokens.special,
  masking.seed = 3;
  const std::int64_t length = 64;
  auto windows = std::make_shared<hpctrain::data::TokenDataset>(prepared.train, length - 2);
  const lm::MaskedBlocks blocks(windows, tokens.bos, tokens.eos, masking);
  REQUIRE(blocks.size() == windows->size());
  const std::vector<std::int64_t> indices{0, 5, 17};
  const auto epoch0 = blocks.batch_in_epoch(indices, 0);
  REQUIRE(epoch0.inputs.sizes() == torch::IntArrayRef({3, length}));
  const auto stream = windows->batch(indices).inputs;  // the original tokens between <s> and </s>
  const auto original = torch::cat(
      {torch::full({3, 1}, tokens.bos, torch::kInt64), stream, torch::full({3, 1}, tokens.eos, torch::kInt64)}, 1);
  const auto chosen = epoch0.targets.ne(lm::ignore_index);
  CHECK(epoch0.targets.masked_select(chosen).equal(original.masked_select(chosen)));
  CHECK(epoch0.inputs.masked_select(chosen.logical_not()).equal(original.masked_select(chosen.logical_not())));
  CHECK(chosen.select(1, 0).any().item<bool>() == false);           // <s> never chosen
  CHECK(chosen.select(1, length - 1).any().item<bool>() == false);  // nor </s>
  const double share = chosen.sum().item<double>() / static_cast<double>(chosen.numel());
  CHECK(share > 0.05);
  CHECK(share < 0.30);
  CHECK(blocks.batch(indices).targets.equal(epoch0.targets));  // evaluation: epoch 0's masks
  CHECK(blocks.batch_in_epoch(indices, 0).inputs.equal(epoch0.inputs));
  CHECK_FALSE(blocks.batch_in_epoch(indices, 1).targets.equal(epoch0.targets));
}
