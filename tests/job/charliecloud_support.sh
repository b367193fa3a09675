# Sourced by the Charliecloud tests of containers and LibTorch (container_*_test.sh).
#
# No image can be downloaded here, so an image is a directory built from nothing: the mount points ch-run needs
# (/etc/passwd and /etc/group, which it binds; /proc, /dev, /sys, /tmp, /home), /bin, /lib and /lib64 pointing into
# /usr as in Debian's merged /usr, and an empty /usr that the tests fill by binding the host's (its compiler, CMake,
# glibc and libstdc++: the image's own, as far as the binaries inside can tell). No LibTorch: that is the point.

# charliecloud_or_skip: ch-run is there, or the test is skipped (exit 77, ctest's SKIP_RETURN_CODE) saying why.
charliecloud_or_skip() {
  command -v ch-run > /dev/null || { echo "SKIP: no ch-run (Debian charliecloud-runtime)"; exit 77; }
}

# charliecloud_image DIR [MOUNT_POINT...]: builds the image directory DIR with the given extra mount points
# (absolute paths, created empty inside).
charliecloud_image() {
  local root="$1" dir
  shift
  mkdir -p "$root"
  for dir in usr proc dev sys tmp etc home root mnt run var/tmp; do mkdir -p "$root/$dir"; done
  touch "$root/etc/passwd" "$root/etc/group" "$root/etc/hosts" "$root/etc/resolv.conf"
  ln -s usr/bin "$root/bin"
  ln -s usr/lib "$root/lib"
  ln -s usr/lib64 "$root/lib64"
  for dir in "$@"; do mkdir -p "$root$dir"; done
}

# libtorch_lib BINARY: the entry of BINARY's RUNPATH that holds libtorch_cpu.so (LibTorch's lib directory).
libtorch_lib() {
  local entry IFS=:
  for entry in $(readelf -d "$1" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]$/\1/p'); do
    [ -e "$entry/libtorch_cpu.so" ] && { echo "$entry"; return 0; }
  done
  return 1
}

# libtorch_venv BINARY: the directory to mount for the LibTorch that BINARY's RUNPATH names — the venv holding it
# (the nearest directory above torch/lib with a pyvenv.cfg), else the site-packages directory holding torch/ (the
# wheel's libraries find CUDA's beside it, in nvidia/). The user's recipe in docs/containers.md, as a function.
libtorch_venv() {
  local lib dir
  lib="$(libtorch_lib "$1")" || return 1
  dir="$lib"
  while [ "$dir" != / ]; do
    [ -e "$dir/pyvenv.cfg" ] && { echo "$dir"; return 0; }
    dir="$(dirname "$dir")"
  done
  dirname "$(dirname "$(dirname "$lib")")"
}
