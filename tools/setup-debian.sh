#!/usr/bin/env bash
# Installs the Debian packages gtrain needs to build, test and run its quickstart (as root).
# Idempotent and quiet when everything is already there. The CUDA toolkit is not a Debian package
# here: when /usr/local/cuda/bin/nvcc exists the CUDA backend is built too, otherwise it is skipped.
#   bash tools/setup-debian.sh            build + test + quickstart packages
#   bash tools/setup-debian.sh --slurm    also slurm-wlm, munge and iproute2 (the slurm and cluster tests)
set -euo pipefail

packages=(cmake make gcc g++ pkg-config
          libopenmpi-dev openmpi-bin
          libhdf5-openmpi-dev hdf5-tools
          libopenblas-openmp-dev libinih-dev
          fortunes python3 python3-venv python3-matplotlib)
packages+=(libjansson-dev)   # JSON of Hugging Face checkpoints: config.json, safetensors headers (model.init)
packages+=(shellcheck)   # tests: shellcheck of the GPU check scripts (tests/gpu.cmake)
packages+=(strace)       # tests: resume_save_is_durable checks the fsync before the rename
packages+=(libdnnl-dev)   # oneDNN: bf16 matrix products on the CPU (AMX, AVX512-BF16); optional for the build
if [[ "${1:-}" == "--slurm" ]]; then
  packages+=(slurm-wlm munge)
  packages+=(iproute2 util-linux)   # tests/cluster: network namespaces, nsenter, unshare
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup-debian: missing packages (${missing[*]}); run as root or install them" >&2
    exit 1
  fi
  echo "setup-debian: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
