#!/usr/bin/env bash
# Installs what specdec builds with, from Debian's packages; idempotent (installs only what is
# missing, so a machine that has everything runs no apt at all). The CUDA toolkit and NCCL come
# with the machine's CUDA install (/usr/local/cuda) and are used when present.
set -euo pipefail
packages=(cmake ninja-build g++ libeigen3-dev doctest-dev libbenchmark-dev nlohmann-json3-dev libpcre2-dev libcpp-httplib-dev pkg-config nodejs)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi
