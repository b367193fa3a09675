// A slow or failing disk for one file, injected with LD_PRELOAD into the processes of a run (the tests' own code:
// the library has no switch for it). Every fsync(2) of a file whose path contains $SLOW_DISK_MATCH first sleeps
// $SLOW_DISK_DELAY_S seconds (as a file system that takes that long to make the data durable); the first
// $SLOW_DISK_FAILURES of them in each process then fail with EIO (as a disk that fails once). Other files, and
// every process where SLOW_DISK_MATCH is unset, see the real fsync.
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace {

/// The path `fd` was opened at, from /proc; empty when unknown.
std::string path_of(int fd) {
  char buffer[4096];
  const auto link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t length = ::readlink(link.c_str(), buffer, sizeof buffer - 1);
  return length > 0 ? std::string(buffer, static_cast<std::size_t>(length)) : std::string();
}

double number_from(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atof(value) : 0.0;
}

}  // namespace

extern "C" int fsync(int fd) {
  static const auto real = reinterpret_cast<int (*)(int)>(::dlsym(RTLD_NEXT, "fsync"));
  const char* match = std::getenv("SLOW_DISK_MATCH");
  if (match == nullptr || *match == '\0' || path_of(fd).find(match) == std::string::npos) return real(fd);
  std::this_thread::sleep_for(std::chrono::duration<double>(number_from("SLOW_DISK_DELAY_S")));
  static std::atomic<int> failures_left{static_cast<int>(number_from("SLOW_DISK_FAILURES"))};
  if (failures_left.fetch_sub(1) > 0) {
    errno = EIO;
    return -1;
  }
  return real(fd);
}
