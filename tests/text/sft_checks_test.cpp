// The SFT data checks (text/sft_checks.hpp) on hand-made examples: which examples count as a doubled BOS, an end of
// turn outside the loss, a turn ending in text, and which turn ends are tallied. The messages are checked end to end
// at --dry-run (tests/lm/sft_checks_test.sh).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <hpctrain/text/sft_checks.hpp>

namespace tx = hpctrain::text;

namespace {
// BOS 1, EOS 2, another special token 3 (an <|im_end|>), ordinary tokens from 10.
tx::SftCheckTokens check_tokens() { return tx::SftCheckTokens{1, 2, {1, 2, 3}}; }
}  // namespace

TEST_CASE("sft checks: each example counts once for each mistake it holds", "[text][sft_checks]") {
  using Ids = std::vector<tx::TokenId>;
  using Mask = std::vector<std::uint8_t>;
  auto [what, ids, mask, truncated, doubled, untrained_end, open, trained] =
      GENERATE(table<std::string, Ids, Mask, bool, int, int, int, int>({
          {"a clean turn ending with EOS", {1, 10, 11, 12, 2}, {0, 0, 1, 1, 1}, false, 0, 0, 0, 1},
          {"two BOS", {1, 1, 10, 11, 2}, {0, 0, 0, 1, 1}, false, 1, 0, 0, 1},
          {"EOS after the trained span", {1, 10, 11, 2, 12}, {0, 0, 1, 0, 0}, false, 0, 1, 0, 1},
          {"another special token after the trained span", {1, 10, 11, 3, 12}, {0, 0, 1, 0, 0}, false, 0, 1, 0, 1},
          {"a turn ending in text", {1, 10, 11, 12, 13}, {0, 0, 1, 0, 0}, false, 0, 0, 1, 1},
          {"a turn cut by the length rule", {1, 10, 11, 12}, {0, 0, 1, 1}, true, 0, 0, 0, 1},
          {"a turn reaching the end uncut", {1, 10, 11, 12}, {0, 0, 1, 1}, false, 0, 0, 1, 1},
          {"two turns, the second's end outside", {1, 10, 2, 11, 12, 2}, {0, 1, 1, 0, 1, 0}, false, 0, 1, 0, 1},
          {"only the first token trained", {1, 10, 11}, {1, 0, 0}, false, 0, 0, 0, 0},
      }));
  CAPTURE(what);
  tx::SftDataReport report;
  report.add(tx::SftExample{ids, mask}, 7, check_tokens(), truncated);
  CHECK(report.examples == 1);
  CHECK(report.doubled_bos == doubled);
  CHECK(report.untrained_end_of_turn == untrained_end);
  CHECK(report.open_turns == open);
  CHECK(report.trained == trained);
  if (doubled) CHECK((report.first_doubled_bos->line == 7 && report.first_doubled_bos->ids == Ids{1, 1}));
}

TEST_CASE("sft checks: the usual turn end is the special token most trained turns end with", "[text][sft_checks]") {
  tx::SftDataReport report;
  const auto tokens = check_tokens();
  report.add(tx::SftExample{{1, 10, 3}, {0, 1, 1}}, 1, tokens);
  report.add(tx::SftExample{{1, 10, 3, 11, 3}, {0, 1, 1, 1, 1}}, 2, tokens);
  report.add(tx::SftExample{{1, 10, 2}, {0, 1, 1}}, 3, tokens);
  CHECK(report.turn_ends.at(3) == 2);
  CHECK(report.usual_turn_end() == std::optional<tx::TokenId>(3));
  CHECK(report.untrained_end_of_turn == 0);
}

TEST_CASE("sft checks: an example the length rule left out counts as one without a trained token",
          "[text][sft_checks]") {
  tx::SftDataReport report;
  tx::SftCutExample left_out;
  left_out.flags = tx::sft_untrained;
  report.add(left_out, 4, check_tokens());
  CHECK(report.examples == 1);
  CHECK(report.trained == 0);
}
