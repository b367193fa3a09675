// Token preparation as the job's preparation step, on the local two-node cluster: it runs once, on one task,
// before the ranks, which all read the same token files; a bad tokenizer fails the job before any rank
// starts, naming the file; a missing input is refused at --submit, before anything is queued.
#include <chrono>
#include <thread>

#include <hpctrain/job/process.hpp>
#include <hpctrain/job/submit.hpp>
#include <hpctrain/text/prepare.hpp>
#include <hpctrain/text/tiktoken.hpp>

#include "text_test_support.hpp"

namespace {

hpctrain::ProcessResult submit(const std::filesystem::path& dir, const std::string& name, const std::string& tokenizer,
                               const std::string& inputs) {
  return hpctrain::run_process({HPCTRAIN_PREPARE_TOKENS_PROBE, "--submit"},
                               {{"PROBE_NAME", name}, {"PROBE_TOKENIZER", tokenizer}, {"PROBE_INPUTS", inputs}},
                               dir.string());
}

std::string submitted_id(const std::string& out) {
  const std::string prefix = "submitted job ";
  const auto at = out.find(prefix);
  if (at == std::string::npos) return "";
  const auto begin = at + prefix.size();
  return out.substr(begin, out.find('\n', begin) - begin);
}

hpctrain::JobState wait_for_end(const std::string& id) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  auto state = hpctrain::query_state(id);
  while (state.in_queue() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    state = hpctrain::query_state(id);
  }
  return state;
}

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

}  // namespace

TEST_CASE(
    "On two nodes the token preparation runs once before the ranks, which read its files, a bad tokenizer "
    "fails the job before any rank starts",
    "[prepare][slurm]") {
  const auto dir = text_test::scratch("prepare-job");
  const std::string inputs = "/usr/share/games/fortunes/computers:/usr/share/games/fortunes/science";
  text_test::write_file(dir / "broken.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}");
  const auto ok = submit(dir, "tokens-ok", text_test::gpt2_ranks().string(), inputs);
  const auto bad = submit(dir, "tokens-bad", (dir / "broken.json").string(), inputs);
  CAPTURE(ok.out, ok.err, bad.out, bad.err);
  REQUIRE(ok.exit_code == 0);
  REQUIRE(bad.exit_code == 0);
  const auto ok_id = submitted_id(ok.out);
  const auto bad_id = submitted_id(bad.out);

  const auto ok_state = wait_for_end(ok_id);
  const auto ok_log =
      text_test::read_file(dir / "hpctrain-jobs" / "tokens-ok" / ok_id / fmt::format("slurm-{}.out", ok_id));
  CAPTURE(ok_log);
  CHECK(ok_state.state == "COMPLETED");
  CHECK(count(ok_log, "hpctrain: prepared ") == 1);
  CHECK(ok_log.find("hpctrain: prepared ") < ok_log.find("tokens rank="));
  // Both ranks, on both nodes, read the same files: the header the step wrote, with GPT-2's fingerprint.
  const auto tokenizer = hpctrain::text::load_tiktoken(text_test::gpt2_ranks());
  const auto prepared = dir / "hpctrain-jobs" / "tokens-ok" / ok_id / "prepare" / "tokens";
  const auto header = hpctrain::text::read_token_file_header(prepared / "train.tokens", {tokenizer.fingerprint(), 2});
  CHECK(header.tokens > 10000);
  for (const auto* node : {"n1", "n2"})
    CHECK(count(ok_log, fmt::format("node={} train.tokens tokens={} fingerprint={:016x}\n", node, header.tokens,
                                    tokenizer.fingerprint())) == 1);

  const auto bad_state = wait_for_end(bad_id);
  const auto bad_log =
      text_test::read_file(dir / "hpctrain-jobs" / "tokens-bad" / bad_id / fmt::format("slurm-{}.out", bad_id));
  CAPTURE(bad_log);
  CHECK(bad_state.state == "FAILED");
  CHECK(
      bad_log.find(fmt::format("hpctrain: preparation failed: [hpctrain.runtime.text.tokenizer] {}: model.type: model "
                               "type \"WordPiece\" is not supported (byte-level BPE only)\n",
                               (dir / "broken.json").string())) != std::string::npos);
  CHECK(bad_log.find("tokens rank=") == std::string::npos);
}

TEST_CASE("A job whose preparation names a missing input is refused at --submit, before anything is queued",
          "[prepare]") {
  const auto dir = text_test::scratch("prepare-job-missing");
  const auto refused = submit(dir, "tokens-missing", text_test::gpt2_ranks().string(), (dir / "nope.txt").string());
  CHECK(refused.exit_code == 2);
  CHECK(refused.err.find(fmt::format("[hpctrain.spec.prepare.inputs] prepare.inputs = {}: no such file",
                                     (dir / "nope.txt").string())) != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "hpctrain-jobs"));
}
