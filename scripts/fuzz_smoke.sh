#!/usr/bin/env bash
# CI smoke for the fuzz targets: builds them (clang, ASan + UBSan, libFuzzer) and runs
# each for MLAKV_FUZZ_SMOKE_SECONDS (default 45) from its seed corpus. Fails on any
# crash, sanitizer report or invariant violation (docs/security.md "Fuzzing").
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
exec bash "$ROOT/tools/fuzz.sh" "${MLAKV_FUZZ_SMOKE_SECONDS:-45}"
