#!/usr/bin/env bash
# mlakv's main job on an embedded default: installs what is missing, builds Release,
# runs `mlakv demo` (all four KV formats on a 16K-token DeepSeek-V3 layer).
# Extra arguments go to `mlakv demo` (e.g. --json, --context 4096).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
MLAKV_TARGET=mlakv_cli mlakv_configure_and_build "$ROOT/build" -DMLAKV_BUILD_TESTS=OFF -DMLAKV_BUILD_BENCH=OFF
exec "$ROOT/build/mlakv" demo "$@"
