#!/usr/bin/env bash
# The demo: record a five-dimension run of the reference runtime with an injected fault,
# analyse it, and write the report. Sets up .venv first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=${1:-demo-out}
rm -rf "$OUT"
echo "[demo] running the reference runtime: pp2 x dp2 x cp2 x tp2 (16 gloo ranks), ep over dp x cp, rank 5 slowed 2x" >&2
.venv/bin/python -m instrumented_runtime --pp 2 --dp 2 --cp 2 --tp 2 --ep 4 --schedule 1f1b --microbatches 4 \
  --steps 4 --slow-rank 5 --slow-factor 2.0 --out "$OUT/traces"
echo "[demo] analysing" >&2
.venv/bin/python -m tracekit analyze "$OUT/traces" --out "$OUT/report"
ABS=$(cd "$OUT/report" && pwd)
echo
echo "Report:  $ABS/report.html"
echo "Summary: $ABS/summary.md"
