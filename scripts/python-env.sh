#!/usr/bin/env bash
# The Python side of the build (the `mlakv` package and its tests): a virtual
# environment at $MLAKV_VENV (default <repo>/.venv) with nanobind, numpy and pytest
# from PyPI, created or completed only when something is missing. Prints the
# environment's python on stdout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MLAKV_VENV:-$ROOT/.venv}"
PY=python3
command -v "$PY" >/dev/null 2>&1 || { echo "error: python3 is needed for the Python package" >&2; exit 1; }
if [ ! -x "$VENV/bin/python" ]; then
  echo "mlakv: creating the Python environment $VENV" >&2
  "$PY" -m venv "$VENV" >&2 || { echo "error: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
fi
if ! "$VENV/bin/python" -c "import nanobind, numpy, pytest" >/dev/null 2>&1; then
  echo "mlakv: installing nanobind, numpy, pytest into $VENV" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "nanobind>=2.0" "numpy>=1.22" "pytest>=7" >&2
fi
echo "$VENV/bin/python"
