# Shared by scripts/demo.sh and scripts/test.sh (sourced, not run).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${MLAKV_JOBS:-$(nproc 2>/dev/null || echo 2)}"

mlakv_configure_and_build() {  # build_dir [cmake args...]; MLAKV_TARGET limits the build to one target
  local dir="$1"; shift
  bash "$ROOT/scripts/install-deps.sh"
  cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  # Build progress goes to stderr so that the commands' stdout (e.g. demo --json) stays clean.
  cmake --build "$dir" -j "$JOBS" ${MLAKV_TARGET:+--target "$MLAKV_TARGET"} >&2
}
