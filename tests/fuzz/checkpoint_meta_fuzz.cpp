// Fuzzes the reader of a checkpoint's meta.json (train/checkpoint/checkpoint_format.hpp), which decides which
// checkpoint a run resumes from and which archive files it opens: any bytes either parse into a description
// whose fields are in range and whose files are plain names inside the checkpoint directory, or are refused
// with `[hpctrain.runtime.checkpoint]` naming the file. What parses writes back (to_json) and reads again
// to the same description.
#include <string>

#include <hpctrain/train/checkpoint/checkpoint_format.hpp>

#include "fuzz_support.hpp"

namespace {
bool same(const hpctrain::CheckpointMeta& a, const hpctrain::CheckpointMeta& b) {
  if (a.state.step != b.state.step || a.state.epoch != b.state.epoch ||
      a.state.batch_in_epoch != b.state.batch_in_epoch || a.state.seed != b.state.seed ||
      a.world_size != b.world_size || a.strategy != b.strategy || a.files.size() != b.files.size() ||
      a.state.data_sources != b.state.data_sources)
    return false;
  for (std::size_t i = 0; i < a.files.size(); ++i)
    if (a.files[i].name != b.files[i].name || a.files[i].size != b.files[i].size || a.files[i].crc != b.files[i].crc)
      return false;
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const auto text = hpctrain::fuzz::as_text(data, size);
  hpctrain::fuzz::expect_clean_rejection([&] {
    const auto meta = hpctrain::detail::parse_checkpoint_meta(text, "checkpoints/step-0000000001/meta.json");
    FUZZ_CHECK(meta.state.step >= 0 && meta.state.epoch >= 0 && meta.state.batch_in_epoch >= 0);
    FUZZ_CHECK(meta.world_size >= 1 && meta.world_size <= hpctrain::detail::checkpoint_max_world_size);
    FUZZ_CHECK(!meta.strategy.empty());
    for (const auto& source : meta.state.data_sources) FUZZ_CHECK(source.rows >= 0 && source.position >= 0);
    FUZZ_CHECK(meta.files.size() <= static_cast<std::size_t>(meta.world_size));
    for (const auto& file : meta.files) {
      FUZZ_CHECK(!file.name.empty() && file.name != "." && file.name != "..");
      FUZZ_CHECK(file.name.find('/') == std::string::npos && file.name.find('\0') == std::string::npos);
    }
    const auto again = hpctrain::detail::parse_checkpoint_meta(meta.to_json().dump(2), "again/meta.json");
    FUZZ_CHECK(same(meta, again));
  });
  return 0;
}
