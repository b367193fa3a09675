#pragma once
// One container description, four runtimes. The batch script stays on the host (where `scontrol` and
// `module` live); only the `srun` step enters the container, through the runtime's own flags:
// pyxis/enroot (`srun --container-*`), Apptainer/Singularity (`apptainer exec`), Charliecloud (`ch-run`).
// docs/containers.md has the mapping table.
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <hpctrain/error.hpp>

namespace hpctrain {

/// Tag for `Job::mount(src, dst, read_only)`.
struct ReadOnly {};
/// Mount read-only.
inline constexpr ReadOnly read_only{};

/// A host path made visible inside the container.
struct Mount {
  std::string source;
  std::string target;
  bool read_only = false;
  friend bool operator==(const Mount&, const Mount&) = default;
};

/// No container: the step runs the binary on the host.
struct NoContainer {};

/// NVIDIA pyxis + enroot: `srun --container-image=...`.
class Pyxis {
 public:
  /// `image` is a registry reference (`nvcr.io#nvidia/pytorch:24.05-py3`, `ubuntu:22.04`) or a squashfs
  /// file starting with `/` or `./`.
  explicit Pyxis(std::string image) : image_(std::move(image)) {
    detail::require(!image_.empty(), "container.image", "\"\"", "an image reference or squashfs path is required");
    detail::require(image_.find_first_of(" \t\n\r") == std::string::npos, "container.image", image_,
                    "an image reference holds no whitespace");
    const bool looks_like_file = image_.ends_with(".sqsh") || image_.ends_with(".squashfs");
    const bool anchored = image_.starts_with("/") || image_.starts_with("./");
    detail::require(!looks_like_file || anchored, "container.image", image_,
                    "a squashfs path must start with / or ./ (pyxis reads anything else as a registry reference)");
  }
  /// Mount the user's home inside (`--[no-]container-mount-home`). Default: true.
  Pyxis& mount_home(bool on) {
    mount_home_ = on;
    return *this;
  }
  /// `--container-writable` (true) or `--container-readonly` (false). Default: pyxis's own.
  Pyxis& writable(bool on) {
    writable_ = on;
    return *this;
  }
  /// A named container kept between steps of the job (`--container-name`). Default: none.
  Pyxis& name(std::string container_name) {
    detail::require(!container_name.empty() && container_name.find_first_of(" \t\n\r,:") == std::string::npos,
                    "container.name", container_name, "a container name is one word without , or :");
    name_ = std::move(container_name);
    return *this;
  }

  const std::string& image() const { return image_; }
  bool mount_home() const { return mount_home_; }
  const std::optional<bool>& writable() const { return writable_; }
  const std::optional<std::string>& name() const { return name_; }

 private:
  std::string image_;
  bool mount_home_ = true;
  std::optional<bool> writable_;
  std::optional<std::string> name_;
};

/// Apptainer (or Singularity): `srun apptainer exec --nv --bind ... --pwd ... image`.
class Apptainer {
 public:
  /// `image`: a `.sif` file, a sandbox directory or a `docker://` reference.
  explicit Apptainer(std::string image) : image_(std::move(image)) {
    detail::require(!image_.empty(), "container.image", "\"\"", "an image path or reference is required");
  }
  /// The command to run: `apptainer` or `singularity`. Default: `apptainer`.
  Apptainer& command(std::string name) {
    detail::require(name == "apptainer" || name == "singularity", "container.command", name,
                    "expected apptainer or singularity");
    command_ = std::move(name);
    return *this;
  }
  /// An environment variable set only inside the container (`--env K=V`).
  Apptainer& env(std::string name, std::string value) {
    detail::require(value.find(',') == std::string::npos, "container.env", value,
                    "apptainer --env splits on commas; export the variable on the Job instead");
    env_.emplace_back(std::move(name), std::move(value));
    return *this;
  }

  const std::string& image() const { return image_; }
  const std::string& command() const { return command_; }
  const std::vector<std::pair<std::string, std::string>>& env() const { return env_; }

 private:
  std::string image_;
  std::string command_ = "apptainer";
  std::vector<std::pair<std::string, std::string>> env_;
};

/// Charliecloud: `srun ch-run -b src:dst --cd dir image -- ...`.
class Charliecloud {
 public:
  /// `image`: an unpacked image directory or a SquashFS file.
  explicit Charliecloud(std::string image) : image_(std::move(image)) {
    detail::require(!image_.empty(), "container.image", "\"\"", "an image directory or squashfs path is required");
  }
  const std::string& image() const { return image_; }

 private:
  std::string image_;
};

/// The container a job's step runs in.
using Container = std::variant<NoContainer, Pyxis, Apptainer, Charliecloud>;

namespace detail {
/// The runtime's name, for messages.
inline std::string_view runtime_name(const Container& container) {
  switch (container.index()) {
    case 1: return "pyxis";
    case 2: return "apptainer";
    case 3: return "charliecloud";
    default: return "none";
  }
}

/// Throws SpecError when `mount` cannot be written in `container`'s flag syntax.
inline void check_mount_for(const Container& container, const Mount& mount) {
  const auto runtime = runtime_name(container);
  for (const auto& path : {mount.source, mount.target}) {
    detail::require(!path.empty() && path.starts_with("/"), "mount", path, "mount paths must be absolute");
    detail::require(path.find_first_of("\n\r") == std::string::npos, "mount", path,
                    "a mount path cannot hold a newline");
    if (std::holds_alternative<Pyxis>(container) || std::holds_alternative<Apptainer>(container))
      detail::require(
          path.find_first_of(",:") == std::string::npos, "mount", path,
          fmt::format("{} separates mounts with ',' and fields with ':', so a path cannot hold them", runtime));
    if (std::holds_alternative<Charliecloud>(container))
      detail::require(path.find(':') == std::string::npos, "mount", path,
                      "ch-run -b separates source and target with ':', so a path cannot hold one");
  }
  if (std::holds_alternative<Charliecloud>(container))
    detail::require(!mount.read_only, "mount", mount.source, "ch-run -b cannot make a bind mount read-only");
}
}  // namespace detail

/// The argv that prepares a squashfs image on the login node for pyxis:
/// `enroot import -o <output> docker://<image>` (`nvcr.io#nvidia/pytorch:24.05-py3` stays as written).
inline std::vector<std::string> enroot_import_command(std::string_view image, std::string_view output_sqsh) {
  detail::require(!image.empty(), "container.image", "\"\"", "an image reference is required");
  detail::require(output_sqsh.ends_with(".sqsh"), "enroot.output", output_sqsh, "the output file must end in .sqsh");
  std::string reference(image);
  if (!reference.starts_with("docker://") && !reference.starts_with("dockerd://")) reference = "docker://" + reference;
  return {"enroot", "import", "-o", std::string(output_sqsh), reference};
}

}  // namespace hpctrain
