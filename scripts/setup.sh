#!/usr/bin/env bash
# Installs what specdec builds with, from Debian's packages; idempotent (installs only what is
# missing, so a machine that has everything runs no apt at all). A tool already on PATH (cmake,
# ninja, g++, node, e.g. from a Python environment) counts as present. The CUDA toolkit and NCCL
# come with the machine's CUDA install (/usr/local/cuda) and are used when present.
# Required packages that cannot be installed fail the script; optional ones (PCRE2, cpp-httplib,
# node: the tokenizer's pre-tokenizer, `serve`, the web demo) only warn, and the build says what
# it leaves out.
set -euo pipefail
required=(cmake ninja-build g++ libeigen3-dev doctest-dev libbenchmark-dev nlohmann-json3-dev
          pkg-config)
optional=(libpcre2-dev libcpp-httplib-dev nodejs)
present() {  # PACKAGE: installed, or its tool is on PATH
  case $1 in
    cmake) command -v cmake >/dev/null && return 0 ;;
    ninja-build) command -v ninja >/dev/null && return 0 ;;
    g++) command -v g++ >/dev/null && return 0 ;;
    nodejs) command -v node >/dev/null && return 0 ;;
  esac
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}
missing_of() { for p in "$@"; do present "$p" || echo "$p"; done; }
mapfile -t missing < <(missing_of "${required[@]}" "${optional[@]}")
[ ${#missing[@]} -eq 0 ] && exit 0
echo "setup: installing ${missing[*]}"
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
apt_opts=(-o Acquire::Retries=0 -o Acquire::http::Timeout=20 -o Acquire::https::Timeout=20)
install() {  # PACKAGE...: one apt transaction (a package apt does not know fails it whole)
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get "${apt_opts[@]}" install -y -qq "$@"
}
if timeout 300 $sudo_cmd apt-get "${apt_opts[@]}" update -qq; then
  mapfile -t need < <(missing_of "${required[@]}")
  [ ${#need[@]} -eq 0 ] || install "${need[@]}" || true
  for p in $(missing_of "${optional[@]}"); do install "$p" || true; done
else
  echo "setup: apt-get update failed (no network?); nothing installed" >&2
fi
mapfile -t still_required < <(missing_of "${required[@]}")
mapfile -t still_optional < <(missing_of "${optional[@]}")
if [ ${#still_optional[@]} -gt 0 ]; then
  echo "setup: optional, still missing (the build leaves out what needs them):" \
       "${still_optional[*]}" >&2
fi
if [ ${#still_required[@]} -gt 0 ]; then
  echo "setup: required, still missing: ${still_required[*]}" >&2
  exit 1
fi
