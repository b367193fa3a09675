#pragma once
// Shared by the job tests: a fixed rendering context (goldens must not depend on the machine), files,
// and the probe program that the Slurm tests submit.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <hpctrain/job/process.hpp>
#include <hpctrain/job/render.hpp>
#include <hpctrain/job/submit.hpp>

namespace job_test {

inline hpctrain::RenderContext fixed_context() {
  hpctrain::RenderContext context;
  context.program = "/home/user/project/build/train";
  context.argv = {"./build/train", "--dry-run"};
  context.worker_args = {};
  context.workdir = "/home/user/project";
  context.generated_at = "2026-01-01T00:00:00Z";
  context.environment.set("WANDB_PROJECT", "fashion runs");
  return context;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream content;
  content << file.rdbuf();
  return content.str();
}

inline void write_file(const std::filesystem::path& path, const std::string& content) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << content;
}

inline std::filesystem::path source_dir() {
  const char* dir = std::getenv("HPCTRAIN_SOURCE_DIR");
  return dir ? dir : HPCTRAIN_SOURCE_DIR_FALLBACK;
}

/// A fresh directory for one test under the build tree (both local nodes see this host's file system).
inline std::filesystem::path scratch_dir(const std::string& name) {
  const char* build = std::getenv("HPCTRAIN_BUILD_DIR");
  auto dir = std::filesystem::path(build ? build : "/tmp") / "job-test-scratch" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string probe() { return HPCTRAIN_JOB_PROBE; }

/// Runs the probe in `workdir` with `env` added (PROBE_* configure its job).
inline hpctrain::ProcessResult run_probe(const std::filesystem::path& workdir, std::vector<std::string> args,
                                         std::vector<std::pair<std::string, std::string>> env = {}) {
  args.insert(args.begin(), probe());
  return hpctrain::run_process(args, env, workdir.string());
}

/// Waits until the job left the queue and returns its final state (the cluster is shared: be patient).
inline hpctrain::JobState wait_for_end(const std::string& id, std::chrono::seconds limit = std::chrono::seconds(600)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto state = hpctrain::query_state(id);
  while (state.in_queue() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    state = hpctrain::query_state(id);
  }
  return state;
}

/// The value of `key` in `scontrol show job <id>` (e.g. JobState, Restarts); empty when it is not there.
inline std::string scontrol_field(const std::string& id, const std::string& key) {
  const auto shown = hpctrain::run_process({"scontrol", "--oneliner", "show", "job", id}).out;
  const auto at = shown.find(" " + key + "=");
  if (at == std::string::npos) return "";
  const auto begin = at + key.size() + 2;
  return shown.substr(begin, shown.find_first_of(" \n", begin) - begin);
}

/// Slurm holds a requeued job for about two minutes (Reason=BeginTime) before it may start again. The
/// tests release it early (as an operator may with `scontrol update StartTime=now`): what they check is
/// hpctrain's checkpoint, requeue and resume, not Slurm's back-off, and the suite would otherwise spend most
/// of its time waiting. Not within the seconds after the requeue, though: slurmd refuses a launch credential
/// issued in the second it revoked the job's last one ("Killing non-startable batch JobId=...: Job credential
/// revoked") and the job ends FAILED; so a hold is released once it has been seen for 3 s. Returns whether the
/// job was held.
inline bool release_requeue_hold(const std::string& id) {
  static std::map<std::string, std::chrono::steady_clock::time_point> first_seen;
  if (scontrol_field(id, "JobState") != "PENDING" || scontrol_field(id, "Reason") != "BeginTime") return false;
  const auto now = std::chrono::steady_clock::now();
  const auto seen = first_seen.try_emplace(id, now).first;
  if (now - seen->second < std::chrono::seconds(3)) return true;
  hpctrain::run_process({"scontrol", "update", "JobId=" + id, "StartTime=now"});
  first_seen.erase(seen);
  return true;
}

/// Waits until scontrol reports a final state (a job that is requeued passes through PENDING again, and
/// squeue may miss it for a moment while it is requeued; its requeue hold is released); returns that state.
inline std::string wait_for_final_state(const std::string& id, std::chrono::seconds limit = std::chrono::seconds(900)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::string state;
  for (;;) {
    release_requeue_hold(id);
    state = scontrol_field(id, "JobState");
    if (state == "COMPLETED" || state == "FAILED" || state == "CANCELLED" || state == "TIMEOUT" ||
        state == "NODE_FAIL" || state == "OUT_OF_MEMORY" || state == "PREEMPTED" || state == "BOOT_FAIL" ||
        state == "DEADLINE" || std::chrono::steady_clock::now() > deadline)
      return state;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

/// Waits until the job runs.
inline void wait_for_running(const std::string& id, std::chrono::seconds limit = std::chrono::seconds(600)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (hpctrain::query_state(id).state != "RUNNING" && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
}

/// The job id from the probe's "submitted job <id>" line.
inline std::string submitted_id(const std::string& out) {
  const std::string prefix = "submitted job ";
  const auto at = out.find(prefix);
  if (at == std::string::npos) return "";
  const auto begin = at + prefix.size();
  return out.substr(begin, out.find('\n', begin) - begin);
}

inline std::string hex(std::string_view text) {
  std::string out;
  const char* digits = "0123456789abcdef";
  for (unsigned char c : text) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

}  // namespace job_test
