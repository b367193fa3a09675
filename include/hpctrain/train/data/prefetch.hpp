#pragma once
// Background prefetch: while the step computes on batch k, a thread assembles batch k + 1 (and k + 2),
// so the step never waits on gathering or I/O it could overlap. Batches come out in order.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <hpctrain/train/data/source.hpp>

namespace hpctrain::data {

/// Produces `make(k)` for k = first, first + 1, ..., last - 1 on a thread, at most `depth` ahead.
class Prefetcher {
 public:
  Prefetcher(std::function<Batch(std::int64_t)> make, std::int64_t first, std::int64_t last, std::size_t depth = 2)
      : make_(std::move(make)), next_to_make_(first), last_(last), depth_(depth) {
    worker_ = std::thread([this] { produce(); });
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  ~Prefetcher() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    worker_.join();
  }

  /// The next batch in order; rethrows what the producer threw.
  Batch next() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !ready_.empty() || error_ || finished_; });
    if (ready_.empty() && error_) std::rethrow_exception(error_);
    if (ready_.empty()) throw std::out_of_range("Prefetcher::next: every batch was already taken");
    Batch batch = std::move(ready_.front());
    ready_.pop_front();
    changed_.notify_all();
    return batch;
  }

 private:
  void produce() {
    try {
      for (;;) {
        std::int64_t k = 0;
        {
          std::unique_lock lock(mutex_);
          changed_.wait(lock, [&] { return stopping_ || ready_.size() < depth_; });
          if (next_to_make_ >= last_) finished_ = true;
          if (stopping_ || finished_) {
            changed_.notify_all();
            return;
          }
          k = next_to_make_++;
        }
        Batch batch = make_(k);  // outside the lock: this is the work that overlaps the step
        std::lock_guard lock(mutex_);
        ready_.push_back(std::move(batch));
        changed_.notify_all();
      }
    } catch (...) {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
      changed_.notify_all();
    }
  }

  std::function<Batch(std::int64_t)> make_;
  std::int64_t next_to_make_;
  std::int64_t last_;
  std::size_t depth_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> ready_;
  std::exception_ptr error_;
  bool stopping_ = false;
  bool finished_ = false;
  std::thread worker_;
};

}  // namespace hpctrain::data
