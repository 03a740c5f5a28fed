#!/usr/bin/env bash
# Create .venv and install tracekit with every extra the demo and tests need. Idempotent and quick
# when nothing changed. torch is installed first, pinned, so pip never resolves a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${TRACEKIT_VENV:-.venv}
TORCH_SPEC=${TRACEKIT_TORCH_SPEC:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.tracekit-installed"
want="$(cat pyproject.toml setup.py tracekit/parse/kscan.c tracekit/whatif/kgraph.c tracekit/tables/kcolumns.c scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "[setup] installing $TORCH_SPEC" >&2
  "$VENV/bin/python" -m pip install -q "$TORCH_SPEC" 2>&1 | grep -v "is ignored: it is neither" >&2 || true
  "$VENV/bin/python" -c "import torch" 2>/dev/null || { echo "[setup] torch did not install" >&2; exit 1; }
fi
echo "[setup] installing tracekit[runtime,hta,ray,test]" >&2
"$VENV/bin/python" -m pip install -q -e ".[runtime,hta,ray,test]" 2>&1 | grep -v "is ignored: it is neither" >&2 || true
"$VENV/bin/python" -c "import tracekit, torch, pyarrow, msgspec, duckdb, hta" >/dev/null
"$VENV/bin/python" -c "import tracekit.parse.kscan, tracekit.whatif.kgraph, tracekit.tables.kcolumns" 2>/dev/null \
  || echo "[setup] no C compiler found: the parser decodes with msgspec alone and numpy replays the what-if graph (the same results, slower)" >&2
echo "$want" > "$stamp"
