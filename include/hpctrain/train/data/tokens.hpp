#pragma once
// A token-file dataset for language models, memory-mapped so a file larger than memory costs nothing up
// front. It reads hpctrain's token files (text/token_file.hpp: a header, then uint16 or uint32 ids) and
// refuses one made by another tokenizer or with another width when told what to expect; nanoGPT's raw
// uint16 `.bin` (no header) is read only when asked for explicitly, since nothing in it says what it is.
// Example i is the window starting at i * context: inputs are `context` tokens, targets the same window
// shifted by one. The sampler's per-epoch shuffle makes the windows random.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include <fcntl.h>     // open
#include <sys/mman.h>  // mmap: the file is paged in on demand
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hpctrain/error.hpp>
#include <hpctrain/text/token_file.hpp>
#include <hpctrain/train/data/source.hpp>

namespace hpctrain::data {

/// How to read a token file (plain data, chained setters).
struct TokenFileOptions {
  /// Refuse a file made by a tokenizer with another fingerprint (Tokenizer::fingerprint()). Default: any.
  TokenFileOptions& fingerprint(std::uint64_t value) {
    expect.fingerprint = value;
    return *this;
  }
  /// Refuse a file whose ids are not `bytes` wide (2 or 4). Default: either.
  TokenFileOptions& token_bytes(std::uint32_t value) {
    hpctrain::detail::require(value == 2 || value == 4, "tokens.token_bytes", value, "must be 2 or 4");
    expect.token_bytes = value;
    return *this;
  }
  /// Read a headerless nanoGPT `.bin` (flat little-endian uint16). Default: false.
  TokenFileOptions& raw_uint16(bool value = true) {
    raw_uint16_ = value;
    return *this;
  }

  text::TokenFileExpectation expect;
  bool raw_uint16_ = false;
};

/// Memory-mapped uint16 or uint32 tokens, served as (context, next-token) windows.
class TokenDataset : public Dataset {
 public:
  /// Maps `path`; throws if it cannot be read, its header is bad or not what `options` expect, or it
  /// holds fewer than context + 1 tokens.
  TokenDataset(const std::filesystem::path& path, std::int64_t context, const TokenFileOptions& options = {})
      : context_(context) {
    hpctrain::detail::require(context > 0, "tokens.context", context, "must be positive");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw RuntimeError(errors::runtime_data_tokens, fmt::format("{}: cannot open", path.string()));
    struct stat info {};
    ::fstat(fd, &info);
    bytes_ = static_cast<std::size_t>(info.st_size);
    if (bytes_ > 0) mapping_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);  // the mapping keeps the file open
    if (bytes_ > 0 && mapping_ == MAP_FAILED)
      throw RuntimeError(errors::runtime_data_tokens, fmt::format("{}: cannot mmap", path.string()));
    try {
      read_layout(path, options);
    } catch (...) {
      unmap();
      throw;
    }
  }
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;
  ~TokenDataset() override { unmap(); }

  /// Number of tokens in the file.
  std::int64_t tokens() const { return tokens_; }
  /// 2 (uint16) or 4 (uint32).
  std::uint32_t token_bytes() const { return token_bytes_; }
  /// The header (nullopt for a raw `.bin`).
  const std::optional<text::TokenFileHeader>& header() const { return header_; }
  std::int64_t size() const override { return (tokens() - 1) / context_; }
  Batch batch(const std::vector<std::int64_t>& indices) const override {
    const auto n = static_cast<std::int64_t>(indices.size());
    auto inputs = torch::empty({n, context_}, torch::kInt64);
    auto targets = torch::empty({n, context_}, torch::kInt64);
    auto* in = inputs.data_ptr<std::int64_t>();
    auto* out = targets.data_ptr<std::int64_t>();
    for (std::int64_t row = 0; row < n; ++row) {
      const std::int64_t start = indices[static_cast<std::size_t>(row)] * context_;
      for (std::int64_t k = 0; k < context_; ++k) {
        in[row * context_ + k] = token(start + k);
        out[row * context_ + k] = token(start + k + 1);
      }
    }
    return {inputs, targets};
  }

 private:
  std::int64_t token(std::int64_t i) const {
    if (token_bytes_ == 2) return static_cast<const std::uint16_t*>(data_)[i];
    return static_cast<const std::uint32_t*>(data_)[i];
  }

  /// Where the ids start and how wide they are: from the header, or (asked for) a raw uint16 file.
  void read_layout(const std::filesystem::path& path, const TokenFileOptions& options) {
    const std::span<const char> bytes(static_cast<const char*>(mapping_ == MAP_FAILED ? nullptr : mapping_), bytes_);
    if (text::has_token_file_magic(bytes)) {
      header_ = text::parse_token_file_header(bytes, bytes_, path, options.expect);
      data_ = bytes.data() + text::token_file_header_size;
      token_bytes_ = header_->token_bytes;
      tokens_ = static_cast<std::int64_t>(header_->tokens);
    } else if (options.raw_uint16_) {
      if (bytes_ % 2 != 0)
        throw RuntimeError(errors::runtime_data_tokens,
                           fmt::format("{}: {} bytes is not a uint16 token file", path.string(), bytes_));
      if (options.expect.token_bytes.value_or(2) != 2)
        throw RuntimeError(errors::runtime_data_tokens,
                           fmt::format("{}: a raw .bin holds uint16 ids, expected {} bytes per token", path.string(),
                                       *options.expect.token_bytes));
      data_ = bytes.data();
      token_bytes_ = 2;
      tokens_ = static_cast<std::int64_t>(bytes_ / 2);
    } else {
      throw RuntimeError(errors::runtime_data_tokens,
                         fmt::format("{}: no \"HPCTOKEN\" header (not made by prepare_tokens); "
                                     "for a raw nanoGPT uint16 .bin pass TokenFileOptions().raw_uint16()",
                                     path.string()));
    }
    if (tokens_ < context_ + 1)
      throw RuntimeError(errors::runtime_data_tokens, fmt::format("{}: {} tokens, fewer than context + 1 = {}",
                                                                  path.string(), tokens_, context_ + 1));
  }
  void unmap() {
    if (mapping_ != MAP_FAILED) ::munmap(mapping_, bytes_);
    mapping_ = MAP_FAILED;
  }

  std::int64_t context_;
  std::size_t bytes_ = 0;
  void* mapping_ = MAP_FAILED;
  const void* data_ = nullptr;
  std::uint32_t token_bytes_ = 2;
  std::int64_t tokens_ = 0;
  std::optional<text::TokenFileHeader> header_;
};

/// A data source over a token file with windows of `context` tokens (see TokenFileOptions).
inline Source tokens(std::filesystem::path path, std::int64_t context, TokenFileOptions options = {}) {
  hpctrain::detail::require(context > 0, "tokens.context", context, "must be positive");
  return Source([path, context, options] { return std::make_shared<TokenDataset>(path, context, options); },
                fmt::format("tokens({}, context={})", path.string(), context));
}

}  // namespace hpctrain::data
