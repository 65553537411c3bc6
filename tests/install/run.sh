#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then configures, builds and runs a
# downstream project that finds the package (find_package(mlakv)) and links mlakv::mlakv.
#   usage: run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"; src="$2"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
"$tmp/consumer/consumer"
test -x "$tmp/prefix/bin/mlakv"
echo "install: package found, consumer built and ran, CLI installed"
