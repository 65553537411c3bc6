#!/usr/bin/env bash
# Installs the Debian packages mlakv builds with, only those that are missing.
# Safe to run repeatedly; needs root (or sudo) only when something is missing.
#   --fuzz   also clang and libFuzzer's runtime (the MLAKV_FUZZ build, docs/security.md)
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libfmt-dev libcli11-dev nlohmann-json3-dev libhwy-dev libpcre2-dev
  libgtest-dev libgmock-dev libbenchmark-dev
)
if [ "${1:-}" = "--fuzz" ]; then
  # clang drives -fsanitize=fuzzer; libclang-rt-dev holds libclang_rt.fuzzer (Debian 12: clang 14).
  packages+=(clang libclang-rt-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "mlakv: installing missing packages: ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "error: need root or sudo to install: ${missing[*]}" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
