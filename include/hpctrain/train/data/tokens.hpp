#pragma once
// A token-file dataset for language models: a flat binary of little-endian uint16 token ids (the
// nanoGPT `.bin` layout), memory-mapped so a file larger than memory costs nothing up front. Example i
// is the window starting at i * context: inputs are `context` tokens, targets the same window shifted
// by one. The sampler's per-epoch shuffle makes the windows random.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include <fcntl.h>     // open
#include <sys/mman.h>  // mmap: the file is paged in on demand
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hpctrain/error.hpp>
#include <hpctrain/train/data/source.hpp>

namespace hpctrain::data {

/// Memory-mapped uint16 tokens, served as (context, next-token) windows.
class TokenDataset : public Dataset {
 public:
  /// Maps `path`; throws if it cannot be read, has an odd size, or holds fewer than context + 1 tokens.
  TokenDataset(const std::filesystem::path& path, std::int64_t context) : context_(context) {
    hpctrain::detail::require(context > 0, "tokens.context", context, "must be positive");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw RuntimeError("data.tokens", fmt::format("{}: cannot open", path.string()));
    struct stat info {};
    ::fstat(fd, &info);
    bytes_ = static_cast<std::size_t>(info.st_size);
    if (bytes_ % 2 != 0 || static_cast<std::int64_t>(bytes_ / 2) < context + 1) {
      ::close(fd);
      throw RuntimeError("data.tokens", fmt::format("{}: {} bytes is not a uint16 token file with at least {} tokens",
                                                    path.string(), bytes_, context + 1));
    }
    mapping_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);  // the mapping keeps the file open
    if (mapping_ == MAP_FAILED) throw RuntimeError("data.tokens", fmt::format("{}: cannot mmap", path.string()));
  }
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;
  ~TokenDataset() override {
    if (mapping_ != MAP_FAILED) ::munmap(mapping_, bytes_);
  }

  /// Number of tokens in the file.
  std::int64_t tokens() const { return static_cast<std::int64_t>(bytes_ / 2); }
  std::int64_t size() const override { return (tokens() - 1) / context_; }
  Batch batch(const std::vector<std::int64_t>& indices) const override {
    const auto n = static_cast<std::int64_t>(indices.size());
    auto inputs = torch::empty({n, context_}, torch::kInt64);
    auto targets = torch::empty({n, context_}, torch::kInt64);
    const auto* token = static_cast<const std::uint16_t*>(mapping_);
    auto* in = inputs.data_ptr<std::int64_t>();
    auto* out = targets.data_ptr<std::int64_t>();
    for (std::int64_t row = 0; row < n; ++row) {
      const std::int64_t start = indices[static_cast<std::size_t>(row)] * context_;
      for (std::int64_t k = 0; k < context_; ++k) {
        in[row * context_ + k] = token[start + k];
        out[row * context_ + k] = token[start + k + 1];
      }
    }
    return {inputs, targets};
  }

 private:
  std::int64_t context_;
  std::size_t bytes_ = 0;
  void* mapping_ = MAP_FAILED;
};

/// A data source over a uint16 token file with windows of `context` tokens.
inline Source tokens(std::filesystem::path path, std::int64_t context) {
  hpctrain::detail::require(context > 0, "tokens.context", context, "must be positive");
  return Source([path, context] { return std::make_shared<TokenDataset>(path, context); },
                fmt::format("tokens({}, context={})", path.string(), context));
}

}  // namespace hpctrain::data
