#!/usr/bin/env bash
# The steps of containers/Dockerfile, one function each, so that every builder runs the same commands: Docker and
# podman through the Dockerfile's RUN lines, Apptainer from a definition file or the Docker image, a site's own
# scripts by calling this file. docs/containers.md, "An image for your cluster", says which flavour a driver needs.
#
#   recipe.sh system [--check]             a C++20 compiler, CMake, Ninja, python3-venv and the libraries
#                                          hpctrain's CMake package asks for (apt-get, Debian or Ubuntu)
#   recipe.sh libtorch FLAVOUR [--check]   torch (the version scripts/pins.sh pins) built for FLAVOUR (cu126, cu128,
#                                          cu130 or cpu) and pyarrow, in the venv $HPCTRAIN_VENV (/opt/venv)
#   recipe.sh slurm [--check]              Slurm's client commands (apt-get): a program built in the image starts
#                                          only there, its login modes (--submit, --status) too
#   recipe.sh efa VERSION                  AWS's EFA installer (libfabric and the aws-ofi-nccl plugin), user space only
#   recipe.sh hpctrain SOURCE PREFIX       hpctrain's package (headers, CMake files, the runtime's source) into PREFIX
#   recipe.sh program SOURCE BUILD [CMAKE_ARG...]
#                                          configures and builds a project that calls find_package(hpctrain): what a
#                                          user runs inside the image (containers/example is one)
#
# --check installs nothing and fails naming what is missing: the tests run the steps that way in an image built
# here (no base image can be pulled there), then the last two steps for real (tests/job/container_recipe_test.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../scripts/pins.sh"  # HPCTRAIN_TORCH_VERSION, HPCTRAIN_PYARROW_VERSION: one place for the pins
venv="${HPCTRAIN_VENV_IN_IMAGE:-/opt/venv}"

say() { echo "recipe: $*"; }
die() {
  echo "recipe: $*" >&2
  exit 1
}

# The Debian/Ubuntu packages (Ubuntu 22.04 and 24.04, Debian 12 have them all; gloo's headers are in universe on
# Ubuntu): the torch wheel carries fmt but not gloo's headers, which ProcessGroupGloo.hpp includes.
# libcurl4-openssl-dev: the W&B logger's live stream (HTTPS through OpenSSL; ca-certificates verifies api.wandb.ai).
system_packages="g++ cmake ninja-build python3-venv pkg-config libfmt-dev libcli11-dev nlohmann-json3-dev zlib1g-dev
  libpcre2-dev libgloo-dev libcurl4-openssl-dev ca-certificates"
# What those packages give hpctrain's build: the commands and one header of each library.
system_headers="fmt/core.h CLI/CLI.hpp nlohmann/json.hpp zlib.h pcre2.h gloo/algorithm.h curl/curl.h"

step_system() {
  if [ "${1:-}" != --check ]; then
    say "apt-get install $system_packages"
    apt-get update -qq
    # shellcheck disable=SC2086  # a list of package names
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $system_packages
    rm -rf /var/lib/apt/lists/*
  fi
  local command header missing=()
  for command in g++ cmake ninja python3; do command -v "$command" > /dev/null || missing+=("the command $command"); done
  for header in $system_headers; do
    printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <%s>\n' "$header" | g++ -std=c++20 -fsyntax-only -x c++ - \
      2> /dev/null || missing+=("the header <$header>")
  done
  ((${#missing[@]} == 0)) || die "missing: ${missing[*]} (the system step installs: $system_packages)"
  say "system: $(g++ --version | head -1), $(cmake --version | head -1), ninja $(ninja --version)"
}

# The CUDA version each flavour's wheel is built with (what torch.version.cuda says), "" for the CPU wheel.
flavour_cuda() {
  case "$1" in
    cu126) echo 12.6 ;;
    cu128) echo 12.8 ;;
    cu130) echo 13.0 ;;
    cpu) echo "" ;;
    *) die "libtorch: the flavour '$1' is not one of cu126, cu128, cu130, cpu (docs/containers.md: by driver version)" ;;
  esac
}

step_libtorch() {
  local flavour="${1:?recipe.sh libtorch FLAVOUR [--check]}" check="${2:-}" cuda
  cuda="$(flavour_cuda "$flavour")"
  if [ "$check" != --check ]; then
    say "torch==$HPCTRAIN_TORCH_VERSION from https://download.pytorch.org/whl/$flavour and pyarrow into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --no-cache-dir --disable-pip-version-check \
      --index-url "https://download.pytorch.org/whl/$flavour" "torch==$HPCTRAIN_TORCH_VERSION"
    "$venv/bin/pip" install -q --no-cache-dir --disable-pip-version-check "pyarrow==$HPCTRAIN_PYARROW_VERSION"
  fi
  [ -x "$venv/bin/python" ] || die "libtorch: no python in $venv"
  local found
  found="$("$venv/bin/python" -c 'import torch, pyarrow; print(torch.__version__, torch.version.cuda or "")')" ||
    die "libtorch: $venv/bin/python cannot import torch and pyarrow"
  read -r version found_cuda <<< "$found"
  [ "${version%%+*}" = "$HPCTRAIN_TORCH_VERSION" ] ||
    die "libtorch: $venv has torch $version, hpctrain is built and tested against $HPCTRAIN_TORCH_VERSION"
  [ "${found_cuda:-}" = "$cuda" ] ||
    die "libtorch: $venv's torch is built for CUDA '${found_cuda:-none}', the flavour $flavour means '${cuda:-none}'"
  if [ -n "$cuda" ]; then
    # ProcessGroupNCCL.hpp includes nccl.h; a CUDA image may lack it (runtime images do): the wheel's own header,
    # of the NCCL the program will load, made visible to the compiler.
    local include
    if [ ! -e /usr/include/nccl.h ] && [ ! -e /usr/local/cuda/include/nccl.h ] && [ ! -e /usr/local/include/nccl.h ]; then
      include="$(ls "$venv"/lib/python3*/site-packages/nvidia/nccl/include/nccl.h 2> /dev/null | head -1)"
      [ -n "$include" ] || die "libtorch: no nccl.h in the image nor in the wheel's nvidia/nccl"
      [ "$check" = --check ] || ln -s "$include" /usr/local/include/nccl.h
    fi
  fi
  say "libtorch: torch $version (CUDA ${found_cuda:-none}) in $venv"
}

# The login modes of a program built in the image run in the image (its RUNPATH names the image's LibTorch), and
# call sbatch, squeue, scontrol, sacct and scancel there. They reach the cluster through the host's slurm.conf
# directory and munge socket, bound in at run time (docs/quickstart-gpu.md); the client's release must be one the
# cluster's slurmctld accepts: the same, or up to two releases older (Ubuntu 24.04's is 23.11, Debian 12's 22.05).
slurm_commands="sbatch squeue scontrol sacct scancel"
step_slurm() {
  if [ "${1:-}" != --check ]; then
    say "apt-get install slurm-client"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-client
    rm -rf /var/lib/apt/lists/*
  fi
  local command missing=()
  for command in $slurm_commands; do command -v "$command" > /dev/null || missing+=("$command"); done
  ((${#missing[@]} == 0)) || die "slurm: missing the command(s) ${missing[*]} (the slurm step installs slurm-client)"
  # sbatch --version reads slurm.conf first, which an image does not have until the run binds it in.
  local release
  release="$(dpkg-query -W -f '${Version}' slurm-client 2> /dev/null)" || release="of the image's /usr"
  say "slurm: client $release (a cluster's slurmctld accepts its own release and the two before it)"
}

# AWS's EFA installer, user space only (the kernel module and the limits are the host's), as AWS's own container
# recipes run it: libfabric with its EFA provider under /opt/amazon/efa and, since installer 1.29, the aws-ofi-nccl
# plugin under /opt/amazon/ofi-nccl. The job puts their lib directories on LD_LIBRARY_PATH (Job::prepend_env).
step_efa() {
  local version="${1:?recipe.sh efa VERSION (e.g. 1.44.0; AWS lists them in its EFA documentation)}" dir
  dir="$(mktemp -d)"
  (cd "$dir" && apt-get update -qq && apt-get install -y -qq --no-install-recommends curl &&
    curl -fsSL -o efa.tar.gz "https://efa-installer.amazonaws.com/aws-efa-installer-$version.tar.gz" &&
    tar -xf efa.tar.gz && cd aws-efa-installer && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify)
  rm -rf "$dir" /var/lib/apt/lists/*
  ls /opt/amazon/ofi-nccl/lib* > /dev/null 2>&1 || die "efa: the installer left no /opt/amazon/ofi-nccl/lib"
  say "efa: libfabric in /opt/amazon/efa, aws-ofi-nccl in /opt/amazon/ofi-nccl"
}

step_hpctrain() {
  local source="${1:?recipe.sh hpctrain SOURCE PREFIX}" prefix="${2:?recipe.sh hpctrain SOURCE PREFIX}" build
  build="$(mktemp -d)"
  cmake -S "$source" -B "$build" -G Ninja --log-level=WARNING -DHPCTRAIN_PYTHON="$venv/bin/python" \
    -DHPCTRAIN_TESTS=OFF -DHPCTRAIN_EXAMPLES=OFF -DHPCTRAIN_BENCH=OFF -DCMAKE_INSTALL_PREFIX="$prefix"
  cmake --install "$build" > /dev/null
  rm -rf "$build"
  [ -e "$prefix/include/hpctrain/hpctrain.hpp" ] || die "hpctrain: nothing installed under $prefix"
  say "hpctrain: installed into $prefix"
}

step_program() {
  local source="${1:?recipe.sh program SOURCE BUILD [CMAKE_ARG...]}" build="${2:?recipe.sh program SOURCE BUILD}"
  shift 2
  cmake -S "$source" -B "$build" -G Ninja --log-level=WARNING -DHPCTRAIN_PYTHON="$venv/bin/python" "$@"
  cmake --build "$build"
  say "program: built in $build"
}

step="${1:-}"
shift || true
case "$step" in
  system | libtorch | slurm | efa | hpctrain | program) "step_$step" "$@" ;;
  *) die "usage: recipe.sh system|libtorch|slurm|efa|hpctrain|program ... (the comment at the top of $0)" ;;
esac
